"""The ``onnx-light-ref`` command line: a thin dispatcher over ``onnx_light_ref._commands``.

Each sub-command lives in its own module under ``onnx_light_ref/_commands/`` and exposes ``register(subparsers) ->
None``; the parser it adds sets ``func`` to the module's handler, named ``<command>_command(args) -> int`` (exit
status). This module only wires them together, so adding a command never touches another command's code. Each handler
turns the errors a user can cause into one ``error:`` line and exit status 1; any other exception is a bug, reported by
:func:`main` in one line (:func:`~onnx_light_ref._commands.errors.bug_exit`; the traceback with the global ``--debug``)
with status 70.

Exit statuses, the same for every command: 0 success; 1 a refusal (one ``error: ...`` line, or a difference found by
``verify``); 2 a bad command line (argparse prints the usage and the problem); 3 the output is published but a step
after its commit failed (one ``error: ... is published ..., but ...`` line); 70 a bug (one ``error: ... this is a bug
...`` line, the command's cleanup done); 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM. On either signal the
command's own rollback runs: :func:`main` turns the signal into :class:`Interrupted` (a ``KeyboardInterrupt``), so every
``except BaseException`` / ``finally`` cleanup on the way out (the publish transaction's temp files, the folders a
command created) runs, then it prints one ``error: interrupted`` line instead of a traceback. Further SIGINT/SIGTERM are
ignored while that cleanup runs, so a second Ctrl-C cannot cut it short. A signal that arrives while Python runs a
finalizer or a weak-reference callback (where an exception only prints "Exception ignored in ..." and the work goes on)
is delivered again, so it still ends the command.

The handlers are the first thing :func:`main` installs, before the parser is built (which imports every command
module) and before the arguments are parsed: a Ctrl-C there is an interrupt like any other, never a
``KeyboardInterrupt`` traceback. Option parsing imports nothing heavy (no onnx, no numpy: ``_commands/sizes.py``).
Once the command has returned its status the work is done: a signal arriving after it (while the handlers are put
back, or, for the console script, :func:`console_main`, while the interpreter exits and flushes stdout) does not turn
that status into an interrupt or a death by signal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.machinery
import logging
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from onnx_light_ref._commands.errors import UsageError, bug_exit

if TYPE_CHECKING:
    from sys import UnraisableHookArgs

EPILOG = (
    "exit status: 0 success; 1 refused (one 'error: ...' line on stderr, nothing written) or, for verify, a "
    "difference, for inspect, a broken reference; 2 bad arguments (usage printed); 3 written, but a step after the "
    "commit failed (one 'error: DST is published ..., but ...' line: the fsync that makes it durable, or removing the "
    "previous versions); 70 a bug in onnx-light-ref (one 'error: ...' line asking to report it; --debug prints the "
    "traceback); 130 interrupted by SIGINT, 143 by SIGTERM (the destination as it was, temp files and folders "
    "the command created removed; or, when the signal came while the new files were moved into place, complete). "
    "Each COMMAND --help says what its own statuses mean."
)
"""The exit-status paragraph at the end of ``onnx-light-ref --help``; each command's ``--help`` ends with its own
(:func:`~onnx_light_ref._commands.help_text.exit_statuses`)."""

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
    # In the unraisable hook an exception would be lost as well; inside a C extension's initialization (onnx's
    # pybind11 module imports Python modules while it initializes itself) one crashed the process (SIGSEGV). Send the
    # signal again, later, until it lands in plain Python code.
    if _in_unraisable_hook.is_set() or _initializing_an_extension(frame):
        _send_again(signum)
        return
    for other in _SIGNALS:  # the first signal wins: the cleanup it starts must not be cut short by a second one
        signal.signal(other, signal.SIG_IGN)
    raise Interrupted(signum)


def _initializing_an_extension(frame: FrameType | None) -> bool:
    """True when ``frame`` runs inside the creation or execution of a C extension module (a ``create_module`` or
    ``exec_module`` of an ``ExtensionFileLoader`` on the stack): the signal reached Python code that the extension's
    initialization called, and an exception raised there unwinds through C++ code that does not expect it."""
    while frame is not None:
        if frame.f_code.co_name in ("create_module", "exec_module") and isinstance(
            frame.f_locals.get("self"), importlib.machinery.ExtensionFileLoader
        ):
            return True
        frame = frame.f_back
    return False


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
def _signals_raise(*, ignore_after: bool = False) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` for the block (main thread only), then restore them, or,
    with ``ignore_after``, ignore them from then on (the process is about to exit: its work is done).

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
            after = signal.SIG_IGN if ignore_after else handler if handler is not None else signal.SIG_DFL
            signal.signal(signum, after)
        sys.unraisablehook = previous_hook


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but a word is never cut: not at a hyphen, not when longer than the line. The help
    texts hold URLs (``.../onnx-light-ref/blob/main/docs/json.md``) that a cut would break for the reader who copies
    them; a long one overflows its line instead."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = textwrap.wrap(
            " ".join(text.split()), width - len(indent), break_on_hyphens=False, break_long_words=False
        )
        return "\n".join(indent + line for line in lines)


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
        formatter_class=_HelpFormatter,
        epilog=EPILOG,
        description="Rewrite ONNX external weights without loading them (align, shard, deduplicate, externalize, "
        "verify, inspect), and evaluate ai.rt::DelayedInitializer models lazily (run, undelay, conformance cases).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument(
        "--debug", action="store_true", help="on a bug in onnx-light-ref (exit status 70), print its traceback too"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"onnx_light_ref._commands.{name}").register(subparsers)
    for command in subparsers.choices.values():
        command.formatter_class = _HelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line: parse it, run the command, return its exit status.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` when None).

    Returns:
        The process exit status: the command's; 2 when no command was given (help printed to stderr) or an argument is
            invalid (argparse's ``SystemExit(2)``, usage printed); 70 when the command raised an exception it does not
            report itself (a bug: one ``error:`` line, the traceback too with ``--debug``); 130 / 143 when SIGINT /
            SIGTERM interrupted the parsing or the command (one ``error: interrupted`` line on stderr, after the
            command's cleanup ran). A signal that arrives once the command has returned does not change its status.
    """
    return _run(argv, exiting=False)


def _run(argv: Sequence[str] | None, *, exiting: bool) -> int:
    """:func:`main`; ``exiting``: the process ends next, so SIGINT and SIGTERM stay ignored after the command."""
    status: int | None = None
    try:
        with _signals_raise(ignore_after=exiting):  # first: parsing imports the command modules, which takes time
            parser = build_parser()
            args, unknown = parser.parse_known_args(argv)
            if unknown:
                _refuse_unknown(parser, args, unknown)
            logging.basicConfig(
                level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
            )
            func = getattr(args, "func", None)
            if func is None:
                parser.print_help(sys.stderr)
                return 2
            try:
                status = int(func(args))
            except UsageError:
                raise
            except Exception as exc:  # the handlers report what a user can cause: anything else is a bug
                return bug_exit(exc, debug=args.debug)
            return status
    except UsageError as exc:  # an argument argparse could not judge alone: reported as argparse reports
        print(f"onnx-light-ref {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Interrupted, or a KeyboardInterrupt raised before the handlers were set
        if status is not None:  # the command had finished: its outputs are complete, the signal came too late
            return status
        print("error: interrupted", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)


def _refuse_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]) -> None:
    """Exit 2 for arguments no parser took, with the command's usage (argparse's own error prints the top-level
    one, which names none of the command's options) and a hint for each: an option of the program given after the
    command (``-v``), an option another command has, or what the command says about it (its ``option_hints``
    default: ``align-models`` has no ``--dedup``, it always stores identical payloads once)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    command = commands.get(args.command) if args.command else None
    if command is None:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    top_level = {option for action in parser._actions for option in action.option_strings}
    own_hints: dict[str, str] = getattr(args, "option_hints", {})
    hints = []
    for argument in unknown:
        option = argument.split("=", 1)[0]
        if option in top_level:
            hints.append(f"{option} goes before the command: onnx-light-ref {option} {args.command} ...")
        elif option in own_hints:
            hints.append(f"{option}: {own_hints[option]}")
        elif option.startswith("-"):
            others = [n for n, p in commands.items() if any(option in a.option_strings for a in p._actions)]
            if others:
                hints.append(f"{option} is an option of {', '.join(others)}, not of {args.command}")
    command.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else ""))


def console_main() -> int:
    """Entry point of the ``onnx-light-ref`` console script and of ``python -m onnx_light_ref``: :func:`main` on
    ``sys.argv``, after which SIGINT and SIGTERM stay ignored until the process exits.

    The command's work is done when :func:`main` returns; what remains (the interpreter's exit, flushing stdout) must
    not be cut short by a late Ctrl-C or SIGTERM, whose default action would kill the process (exit by signal
    instead of the command's status, and a summary lost in a pipe's buffer).

    Returns:
        The process exit status (see :func:`main`).
    """
    return _run(None, exiting=True)
