"""The ``onnx-light-ref`` command line: a thin dispatcher over ``onnx_light_ref.commands``.

Each sub-command lives in its own module under ``onnx_light_ref/commands/`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func`` to the module's handler, named
``<command>_command(args) -> int`` (exit status). This module only wires them together, so adding a command never
touches another command's code. It never catches errors of a command: each handler turns the ones a user can cause
into one ``error:`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

# Every module is part of the package; one that fails to import is a broken install, reported as the import error.
_COMMAND_MODULES = ("align", "inspect", "verify", "run", "undelay", "link", "demo", "generate_tests")


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
        description="Rewrite ONNX external weights without loading them (align, shard, deduplicate, externalize, "
        "verify, inspect), and evaluate ai.rt::DelayedInitializer models lazily (run, undelay, conformance cases).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"onnx_light_ref.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` when None).

    Returns:
        The process exit status: the command's, or 2 when no command was given (help printed to stderr).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args))
