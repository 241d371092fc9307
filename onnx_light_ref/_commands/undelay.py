"""``onnx-light-ref undelay SRC.onnx DST.onnx``: turn DelayedInitializer nodes into standard external initializers.

A thin wrapper over :func:`onnx_light_ref.undelay_initializers`: parses the options, creates the missing folders of
DST.onnx and ``--weights`` (unlike the Python API, which refuses them), shows a byte progress bar (on a terminal,
unless ``--no-progress``), prints what was written, and a ``note:`` line when SRC.onnx has no DelayedInitializer node
(the output is then a plain copy of the model, its external tensors gathered into one weights file). Every refusal
is one ``error: ...`` line with exit status 1 (nothing is written then, and the folders the command created are
removed again, also when the run is interrupted). A relative ``--weights`` is relative to DST.onnx's folder, as in
``align``. A failure after the commit (the model is published) is one ``error: 'DST' is published ..., but ...``
line and exit status 3. It never reads a weight byte into memory.
"""

from __future__ import annotations

import argparse
import os

from onnx_light_ref._commands.errors import error_exit, published_exit
from onnx_light_ref._commands.folders import created_folders
from onnx_light_ref._commands.help_text import REFUSED, exit_statuses
from onnx_light_ref._commands.options import add_option, add_options
from onnx_light_ref._commands.paths import shown_path, warn_unless_onnx, weights_path
from onnx_light_ref._commands.progress import byte_progress
from onnx_light_ref.errors import PublishedWithErrorsError


def count_delayed_nodes(model_path: str) -> int:
    """The ``ai.rt::DelayedInitializer`` nodes of the model at ``model_path``, in every graph and subgraph.

    Args:
        model_path: the ``.onnx`` (parsed without its weights).

    Returns:
        How many nodes ``undelay`` turns into initializers.

    Raises:
        FileNotFoundError, InvalidModelError: as :func:`onnx_light_ref.io._read.model_file.load_model_metadata`.
    """
    import onnx

    from onnx_light_ref.io._read.model_file import load_model_metadata
    from onnx_light_ref.ops._schema import DOMAIN, OP_TYPE

    def count(graph: onnx.GraphProto) -> int:
        total = 0
        for node in graph.node:
            total += node.domain == DOMAIN and node.op_type == OP_TYPE
            for attribute in node.attribute:
                total += sum(
                    count(sub) for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs)
                )
        return total

    return count(load_model_metadata(model_path).graph)


def undelay_command(args: argparse.Namespace) -> int:
    """The ``undelay`` handler: 0 on success, 1 with one ``error:`` line on stderr otherwise."""
    from onnx_light_ref import undelay_initializers

    weights = weights_path(os.path.dirname(args.dst), args.weights)
    try:
        nodes = count_delayed_nodes(args.src)
        folders = [os.path.dirname(os.path.abspath(path)) for path in (args.dst, weights or args.dst)]
        with created_folders(folders), byte_progress("undelay", hidden=args.no_progress) as progress:
            written = undelay_initializers(
                args.src,
                args.dst,
                weights,
                args.alignment,
                allow_outside_folder=args.allow_outside_folder,
                durable=not args.no_fsync,
                progress=progress,
                replace_shared=args.replace_shared,
                overwrite=args.overwrite,
            )
    except PublishedWithErrorsError as exc:  # the model is written, but a step after the commit failed
        return published_exit(exc)
    except (ValueError, OSError) as exc:  # InvalidModelError and ExternalDataError are ValueErrors
        return error_exit(exc)
    shown = shown_path(weights if weights is not None else f"{args.dst}.data")
    where = f" and {shown} ({written} bytes)" if written else " (no weights file needed)"
    warn_unless_onnx(args.dst)  # after success: a refusal's one error line says enough
    print(f"wrote {shown_path(args.dst)}{where}")
    if nodes == 0:
        print(
            f"note: {shown_path(args.src)} has no ai.rt::DelayedInitializer node; {shown_path(args.dst)} is the same "
            "model (its external tensors, if any, gathered into the weights file)"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``undelay`` sub-command."""
    parser = subparsers.add_parser(
        "undelay",
        epilog=exit_statuses("the model and its weights file are written", REFUSED, writes=True),
        help="turn ai.rt::DelayedInitializer nodes into external initializers (run the model anywhere)",
        description="Write DST.onnx where every ai.rt::DelayedInitializer node of SRC.onnx (main graph and "
        "subgraphs) is an initializer stored as external data in an aligned weights file, its bytes copied file to "
        "file. Files named by SRC.onnx must be inside its folder unless --allow-outside-folder.",
    )
    parser.add_argument("src", metavar="SRC.onnx", help="model with DelayedInitializer nodes")
    parser.add_argument("dst", metavar="DST.onnx", help="model to write (its folder is created if missing)")
    add_options(parser, "--weights", "--alignment")
    add_option(parser, "--allow-outside-folder", subject="SRC.onnx")
    add_option(parser, "--replace-shared", what="the weights file")
    add_option(parser, "--overwrite", example="an existing --weights file the previous DST.onnx does not reference")
    add_options(parser, "--no-fsync", "--no-progress")
    parser.set_defaults(func=undelay_command)
