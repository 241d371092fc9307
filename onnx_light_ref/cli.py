"""The ``onnx-light-ref`` command line: a thin dispatcher over ``onnx_light_ref.commands``.

Each sub-command lives in its own module under ``onnx_light_ref/commands/`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func`` to the module's handler, named
``<command>_command(args) -> int`` (exit status). This module only wires them together, so adding a command never
touches another command's code. It never catches errors of a command: each handler turns the ones a user can cause
into one ``error:`` line and exit status 1.

Exit statuses, the same for every command: 0 success; 1 a refusal (one ``error: ...`` line, or a difference found by
``verify``); 2 a bad command line (argparse prints the usage and the problem); 3 the output is published but a step
after its commit failed (one ``error: ... is published ..., but ...`` line); 130 interrupted by SIGINT (Ctrl-C),
143 by SIGTERM. On either signal the command's own rollback runs: :func:`main` turns the signal into
:class:`Interrupted` (a ``KeyboardInterrupt``), so every ``except BaseException`` / ``finally`` cleanup on the way out
(the publish transaction's temp files, the folders a command created) runs, then it prints one ``error:
interrupted`` line instead of a traceback. Further SIGINT/SIGTERM are ignored while that cleanup runs, so a second
Ctrl-C cannot cut it short. A signal that arrives while Python runs a finalizer or a weak-reference callback (where an
exception only prints "Exception ignored in ..." and the work goes on) is delivered again, so it still ends the
command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from onnx_light_ref.commands.errors import UsageError

if TYPE_CHECKING:
    from sys import UnraisableHookArgs

__all__ = ["EPILOG", "Interrupted", "build_parser", "main"]

EPILOG = (
    "exit status: 0 success; 1 refused (one 'error: ...' line on stderr, nothing written) or, for verify, a "
    "difference; 2 bad arguments (usage printed); 3 written, but a step after the commit failed (one 'error: DST is "
    "published ..., but ...' line: the fsync that makes it durable, or removing the previous versions); 130 "
    "interrupted by SIGINT, 143 by SIGTERM (the destination as it was, temp files and folders the command created "
    "removed; or, when the signal came while the new files were being moved into place, complete)."
)
"""The exit-status paragraph shown at the end of every ``--help``."""

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while a command ran; :attr:`signum` says which (exit status ``128 + signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


REDELIVERY_DELAY = 0.01
"""Seconds between an :class:`Interrupted` that Python swallowed and the signal sent again to the main thread: enough
for the hook that saw it to return, so the new one is raised in the code that runs next."""

_in_unraisable_hook = threading.Event()
"""Set while the hook of :func:`_swallowed_interrupts_sent_again` runs: a signal handled there would be lost too."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if _in_unraisable_hook.is_set():  # an exception raised here would be lost as well: send the signal again, later
        _send_again(signum)
        return
    for other in _SIGNALS:  # the first signal wins: the cleanup it starts must not be cut short by a second one
        signal.signal(other, signal.SIG_IGN)
    raise Interrupted(signum)


def _send_again(signum: int) -> None:
    """Make SIGINT and SIGTERM raise again, and send ``signum`` to the main thread after :data:`REDELIVERY_DELAY`."""
    for other in _SIGNALS:
        signal.signal(other, _interrupt)
    main_thread = threading.main_thread().ident
    assert main_thread is not None  # the main thread has started: this code runs in it

    def send() -> None:
        time.sleep(REDELIVERY_DELAY)
        with contextlib.suppress(ProcessLookupError):  # the main thread has ended meanwhile: nothing to interrupt
            signal.pthread_kill(main_thread, signum)  # to the main thread: a system call it waits in returns EINTR

    threading.Thread(target=send, name="onnx-light-ref-interrupt", daemon=True).start()


def _swallowed_interrupts_sent_again(
    previous: Callable[[UnraisableHookArgs], object],
) -> Callable[[UnraisableHookArgs], None]:
    """A ``sys.unraisablehook`` that sends again the signal of an :class:`Interrupted` Python could not raise.

    The signal handler runs in whatever Python code the main thread runs, a ``__del__`` or a weak-reference callback
    included: seen in ``run``, in the callback of the import system's module locks, which runs after each import (onnx's
    reference operators import inside their functions). An exception raised there is not raised in the caller: Python
    passes it to this hook and goes on, so the Ctrl-C was lost and, the handlers having been set to ignore, every later
    one too (an interrupted ``run`` went on until SIGKILL). Every other unraisable exception goes to ``previous``.
    """

    def hook(unraisable: UnraisableHookArgs) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous(unraisable)
            return
        _in_unraisable_hook.set()
        try:
            _send_again(unraisable.exc_value.signum)
        finally:
            _in_unraisable_hook.clear()

    return hook


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` for the block (main thread only), then restore them.

    An :class:`Interrupted` that Python swallows (raised in a finalizer) is raised again: see
    :func:`_swallowed_interrupts_sent_again`.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _swallowed_interrupts_sent_again(previous_hook)
    for signum in _SIGNALS:
        signal.signal(signum, _interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        sys.unraisablehook = previous_hook


# Every module is part of the package; one that fails to import is a broken install, reported as the import error.
_COMMAND_MODULES = (
    "align",
    "align_models",
    "inspect",
    "verify",
    "run",
    "delay",
    "undelay",
    "link",
    "demo",
    "generate_tests",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the full argument parser with every sub-command registered.

    Returns:
        The ``onnx-light-ref`` parser; ``parse_args`` sets ``func`` to the chosen command's handler.

    Raises:
        ImportError: a command module cannot be imported (a broken installation); never skipped silently.
    """
    from onnx_light_ref import __version__

    parser = argparse.ArgumentParser(
        prog="onnx-light-ref",
        epilog=EPILOG,
        description="Rewrite ONNX external weights without loading them (align, shard, deduplicate, externalize, "
        "verify, inspect), and evaluate ai.rt::DelayedInitializer models lazily (run, undelay, conformance cases).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"onnx_light_ref.commands.{name}").register(subparsers)
    for command in subparsers.choices.values():  # every command's --help ends with the exit statuses
        command.epilog = EPILOG
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` when None).

    Returns:
        The process exit status: the command's; 2 when no command was given (help printed to stderr) or an argument
        is invalid (argparse's ``SystemExit(2)``, usage printed); 130 / 143 when SIGINT / SIGTERM interrupted the
        command (one ``error: interrupted`` line on stderr, after the command's cleanup ran).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        with _signals_raise():
            return int(func(args))
    except UsageError as exc:  # an argument argparse could not judge alone: reported as argparse reports
        print(f"onnx-light-ref {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Interrupted, or a KeyboardInterrupt raised before the handlers were set
        print("error: interrupted", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)
