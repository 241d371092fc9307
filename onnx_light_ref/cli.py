"""The ``onnx-light-ref`` command line: a thin dispatcher over ``onnx_light_ref.commands``.

Each sub-command lives in its own module under ``onnx_light_ref/commands/`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func`` to a callable ``(args) -> int`` (exit status).
This module only wires them together, so adding a command never touches another command's code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

# Imported lazily by name so that `onnx-light-ref --help` stays fast and a broken optional command cannot break the
# others at import time.
_COMMAND_MODULES = ("align", "inspect", "verify", "run", "undelay", "demo", "generate_tests")


def build_parser() -> argparse.ArgumentParser:
    """Return the full argument parser with every registered sub-command."""
    from onnx_light_ref import __version__

    parser = argparse.ArgumentParser(
        prog="onnx-light-ref",
        description="Evaluate ai.rt::DelayedInitializer models lazily and rewrite ONNX external weights "
        "(re-align, share) without loading them.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"onnx_light_ref.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"onnx_light_ref.commands.{name}":
                raise
            continue  # command not shipped in this build
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args))
