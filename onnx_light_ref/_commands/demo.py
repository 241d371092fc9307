"""``onnx-light-ref demo [--size SIZE] [--keep DIR]``: the whole package at work on a generated model.

Builds a two-file MLP, re-aligns it, saves a variant sharing its weights, evaluates everything lazily (and with
onnxruntime when installed) and prints a short report; the logic lives in :mod:`onnx_light_ref._commands.demo_scenario`.
Works in a temporary folder removed at the end unless ``--keep DIR`` is given. Free space is checked first (the bytes
the demo writes at most, :func:`~onnx_light_ref._commands.demo_scenario.disk_bytes`), and a ``--keep`` run that fails
anyway (a disk filled meanwhile) leaves nothing behind: one ``error:`` line naming the file and the cause. Exit status 0
when every output agrees, else 1; 3 when a publication of the demo is in place but a step after its commit failed, as
for every writing command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from typing import Any

from onnx_light_ref._commands.errors import error_exit, published_exit
from onnx_light_ref._commands.help_text import exit_statuses
from onnx_light_ref._commands.options import add_options
from onnx_light_ref._commands.paths import shown_path
from onnx_light_ref._commands.sizes import size_argument
from onnx_light_ref.errors import PublishedWithErrorsError


def _check_keep_folder(keep: str) -> str | None:
    """Why ``--keep`` cannot be used (checked before anything is created), or None."""
    if os.path.lexists(keep) and not os.path.isdir(keep):
        return f"--keep {keep!r} exists and is not a folder."
    if os.path.isdir(keep):
        return f"--keep folder {keep!r} is not empty." if os.listdir(keep) else None
    parent = os.path.dirname(os.path.abspath(keep))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"--keep {keep!r} cannot be created: {parent!r} is not a folder."
    return None


def _demo_size(text: str) -> int:
    """``--size``: a size the demo can build a model of (64K and up), else a usage error (exit 2)."""
    from onnx_light_ref._commands.demo_scenario import (
        mlp_shape,  # imports onnx: only once the command line asks for a demo
    )

    size = size_argument(text)
    try:
        mlp_shape(size)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return size


def _run_kept(size: int, keep: str, progress: bool) -> Any:
    """The demo in ``keep`` (absent or empty: checked), created if missing. A run that fails or is interrupted
    leaves nothing: what it wrote in ``keep`` (all of it is the run's) and the folders it created are removed. A
    publication in place whose later step failed (exit status 3) keeps its files."""
    from onnx_light_ref._commands.demo_scenario import run_demo
    from onnx_light_ref._commands.folders import make_folders, remove_created_folders

    created = make_folders([keep])
    try:
        return run_demo(size, keep, progress=progress)
    except PublishedWithErrorsError:
        raise
    except BaseException:
        for entry in os.scandir(keep):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        remove_created_folders(created)
        raise


def demo_command(args: argparse.Namespace) -> int:
    """Run the demo for the parsed ``args``; print its report; return the exit status (1 on any problem)."""
    from onnx_light_ref._commands.demo_scenario import check_free_space, run_demo

    progress = not args.no_progress and sys.stderr.isatty()
    try:
        if args.keep is not None:
            problem = _check_keep_folder(args.keep)
            if problem is not None:
                return error_exit(problem)
            check_free_space(args.size, args.keep)
            result = _run_kept(args.size, os.path.abspath(args.keep), progress)
        else:
            check_free_space(args.size, tempfile.gettempdir())
            with tempfile.TemporaryDirectory(prefix="onnx-light-ref-demo-") as workdir:
                result = run_demo(args.size, workdir, progress=progress)
    except PublishedWithErrorsError as exc:  # before OSError's clause: a model is published, exit status 3
        return published_exit(exc)
    except (ValueError, OSError) as exc:
        return error_exit(exc)
    print("\n".join(result.lines))
    if args.keep is not None:
        print(f"files kept in {shown_path(result.workdir)}")
    for problem in result.problems:
        print(f"MISMATCH: {problem}", file=sys.stderr)
    return 0 if result.ok else 1


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "demo",
        epilog=exit_statuses(
            "every step ran and the outputs agree", "a step failed: one 'error: ...' line on stderr", writes=True
        ),
        help="build a model with weights in two files, re-align it, save a variant sharing its weights, "
        "evaluate all of them lazily and check the outputs agree",
        description="Runs the package's main job end to end on a generated MLP and prints bytes, alignment, "
        "peak memory and times. Exit status 1 if any output disagrees.",
    )
    parser.add_argument(
        "--size", type=_demo_size, default="64M", help="total weight bytes, with optional K/M/G suffix (default 64M)"
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (created, must be empty) and keep the files")
    add_options(parser, "--no-progress")
    parser.set_defaults(func=demo_command)
