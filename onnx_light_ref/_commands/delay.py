"""``onnx-light-ref delay SRC.onnx DST.onnx``: external initializers as ``ai.rt::DelayedInitializer`` nodes.

A thin front end of :func:`onnx_light_ref.ops.write_delayed_model` (the writer contract's ``delay`` writer): no weight
byte is copied, DST.onnx's nodes read SRC.onnx's data files where they are, named relative to DST.onnx's folder (so
DST.onnx goes in SRC.onnx's folder or a folder above it; another place is refused naming the node). Creates DST.onnx's
folder when missing (and removes it if the run fails). Prints what was delayed and kept; a refusal is one
``error: ...`` line and exit status 1 (nothing written); a failure after the commit is one
``error: 'DST' is published ..., but ...`` line and exit status 3. ``undelay`` turns the nodes back.
"""

from __future__ import annotations

import argparse
import os

from onnx_light_ref._commands.errors import error_exit, published_exit
from onnx_light_ref._commands.folders import created_folders
from onnx_light_ref._commands.help_text import REFUSED, exit_statuses
from onnx_light_ref._commands.options import add_option, add_options
from onnx_light_ref._commands.paths import shown_path, warn_unless_onnx
from onnx_light_ref._commands.sizes import size_argument
from onnx_light_ref._commands.text import printable
from onnx_light_ref.errors import PublishedWithErrorsError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``delay`` sub-command."""
    parser = subparsers.add_parser(
        "delay",
        help="turn external initializers into ai.rt::DelayedInitializer nodes reading the same files (undelay: back)",
        description="Write DST.onnx where every external initializer of SRC.onnx (main graph and subgraphs) is an "
        "ai.rt::DelayedInitializer node reading the same bytes of the same file: no weight is copied. The nodes' "
        "filenames are relative to DST.onnx's folder, which must reach SRC.onnx's data files (SRC.onnx's folder or "
        "a folder above it).",
        epilog=exit_statuses("DST.onnx is written", REFUSED, writes=True),
    )
    parser.add_argument("src", metavar="SRC.onnx", help="model with external initializers")
    parser.add_argument("dst", metavar="DST.onnx", help="model to write (may be SRC.onnx)")
    add_options(parser, "--load-device")
    parser.add_argument(
        "--min-size",
        metavar="SIZE",
        type=size_argument,
        default=0,
        help="initializers smaller than SIZE bytes stay initializers (default: 0, convert all)",
    )
    parser.add_argument(
        "--portable",
        action="store_true",
        help="convert only the 14 element types onnx-light's C++ runtime reads; bfloat16, float8, int4... stay "
        "initializers",
    )
    add_option(parser, "--replace-shared", what="DST.onnx")
    add_option(parser, "--overwrite", example="a DST that is neither an ONNX model nor named *.onnx")
    add_options(parser, "--no-fsync")
    parser.set_defaults(func=delay_command)


def delay_command(args: argparse.Namespace) -> int:
    """The ``delay`` handler: 0 on success, 1 with one ``error:`` line on stderr otherwise."""
    from onnx_light_ref.io._results import summarize_names
    from onnx_light_ref.ops._delay_write import write_delayed_model

    try:
        with created_folders([os.path.dirname(os.path.abspath(args.dst))]):
            result = write_delayed_model(
                args.src,
                args.dst,
                args.load_device,
                min_size=args.min_size,
                portable=args.portable,
                durable=not args.no_fsync,
                replace_shared=args.replace_shared,
                overwrite=args.overwrite,
            )
    except PublishedWithErrorsError as exc:  # the model is written, but a step after the commit failed
        return published_exit(exc)
    except (ValueError, OSError) as exc:  # InvalidModelError and ExternalDataError are ValueErrors
        return error_exit(exc)
    warn_unless_onnx(args.dst)
    files = ", ".join(shown_path(path) for path in result.data_files) or "no file"
    print(
        f"wrote {shown_path(result.path)}: {result.delayed_tensors} initializer(s) delayed ({result.delayed_bytes} "
        f"bytes read from {files}, none copied)"
    )
    for reason, names in sorted(result.kept.items()):
        print(printable(f"note: {len(names)} kept as initializer(s) ({reason}): {summarize_names(list(names))}"))
    return 0
