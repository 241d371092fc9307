"""``onnx-light-ref demo [--size SIZE] [--keep DIR]``: the whole package at work on a generated model.

Builds a two-file MLP, re-aligns it, saves a variant sharing its weights, evaluates everything lazily (and with
onnxruntime when installed) and prints a short report; the logic lives in :mod:`onnx_light_ref.demo`. Works in a
temporary folder removed at the end unless ``--keep DIR`` is given. Exit status 0 when every output agrees, else 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from onnx_light_ref.commands.sizes import size_argument

__all__ = ["register", "run_demo_command"]


def run_demo_command(args: argparse.Namespace) -> int:
    from onnx_light_ref.demo import run_demo

    progress = not args.no_progress and sys.stderr.isatty()
    try:
        if args.keep is not None:
            os.makedirs(args.keep, exist_ok=True)
            if os.listdir(args.keep):
                print(f"error: --keep folder {args.keep!r} is not empty.", file=sys.stderr)
                return 1
            result = run_demo(args.size, os.path.abspath(args.keep), progress=progress)
        else:
            with tempfile.TemporaryDirectory(prefix="onnx-light-ref-demo-") as workdir:
                result = run_demo(args.size, workdir, progress=progress)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(result.lines))
    if args.keep is not None:
        print(f"files kept in {result.workdir}")
    for problem in result.problems:
        print(f"MISMATCH: {problem}", file=sys.stderr)
    return 0 if result.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo",
        help="build a model with weights in two files, re-align it, save a variant sharing its weights, "
        "evaluate all of them lazily and check the outputs agree",
        description="Runs the package's main job end to end on a generated MLP and prints bytes, alignment, "
        "peak memory and times. Exit status 1 if any output disagrees.",
    )
    parser.add_argument(
        "--size", type=size_argument, default="64M", help="total weight bytes, with optional K/M/G suffix (default 64M)"
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (created, must be empty) and keep the files")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (default: shown on a terminal)")
    parser.set_defaults(func=run_demo_command)
