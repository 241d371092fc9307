"""``onnx-light-ref undelay SRC DST``: turn DelayedInitializer nodes into standard external initializers.

A thin wrapper over :func:`onnx_light_ref.ops.undelay_initializers`: parses the options, creates the missing
folders of DST and ``--weights`` (unlike the Python API, which refuses them), prints what was written, and reports
every refusal as one ``error: ...`` line with exit status 1 (nothing is written then, and the folders the command
created are removed again).
"""

from __future__ import annotations

import argparse
import os

from onnx_light_ref.commands.errors import error_exit
from onnx_light_ref.commands.folders import make_folders, remove_created_folders
from onnx_light_ref.errors import InvalidModelError

__all__ = ["register", "undelay_command"]


def undelay_command(args: argparse.Namespace) -> int:
    """The ``undelay`` handler: 0 on success, 1 with one ``error:`` line on stderr otherwise."""
    from onnx_light_ref.ops import undelay_initializers

    created: list[str] = []
    try:
        weights = args.weights if args.weights is not None else args.dst
        created = make_folders(os.path.dirname(os.path.abspath(path)) for path in (args.dst, weights))
        written = undelay_initializers(
            args.src,
            args.dst,
            args.weights,
            args.alignment,
            allow_outside_folder=args.allow_outside_folder,
            durable=not args.no_fsync,
            replace_shared=args.replace_shared,
        )
    except (OSError, ValueError, TypeError, InvalidModelError) as exc:
        remove_created_folders(created)
        return error_exit(exc)
    weights = args.weights or f"{args.dst}.data"
    where = f" and {weights} ({written} bytes)" if written else " (no weights file needed)"
    print(f"wrote {args.dst}{where}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``undelay`` sub-command."""
    parser = subparsers.add_parser(
        "undelay",
        help="turn ai.rt::DelayedInitializer nodes into external initializers (run the model anywhere)",
        description="Write DST where every ai.rt::DelayedInitializer node of SRC (main graph and subgraphs) is an "
        "initializer stored as external data in an aligned weights file, its bytes copied file to file. Files "
        "named by SRC must be inside SRC's folder unless --allow-outside-folder.",
    )
    parser.add_argument("src", help="the model with DelayedInitializer nodes")
    parser.add_argument("dst", help="the .onnx file to write (its folder is created if missing)")
    parser.add_argument(
        "--weights", default=None, help="weights file, inside DST's folder, created if missing (default: DST.data)"
    )
    parser.add_argument(
        "--alignment", type=int, default=4096, help="byte alignment of each tensor (power of two; 0 or 1: packed)"
    )
    parser.add_argument(
        "--allow-outside-folder",
        action="store_true",
        help="trust absolute filenames outside SRC's folder (the spec's examples use /tmp paths)",
    )
    parser.add_argument(
        "--replace-shared",
        action="store_true",
        help="replace the weights file even when another .onnx in DST's folder uses it (that model then computes "
        "with the new weights); without it, such a run is refused and names the other models",
    )
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync (same bytes, no crash durability)")
    parser.set_defaults(func=undelay_command)
