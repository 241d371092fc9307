"""``onnx-light-ref link MODEL.onnx CHECKPOINT DST.onnx``: point a model at a safetensors checkpoint, zero bytes copied.

A thin front end of :func:`onnx_light_ref.io.link.link_external_data`: ``CHECKPOINT`` is a ``.safetensors`` file or a
sharded set's ``*.safetensors.index.json`` inside DST.onnx's folder; ``--map names.json`` maps model tensor names to
checkpoint keys (one flat JSON object of strings; a repeated name, nesting, a name the model lacks, a key the
checkpoint lacks, or two tensors sent to one key are refused before anything is written). Prints one summary line
(tensors and bytes linked and written) on stdout; a problem prints one ``error: ...`` line on stderr and exits with
status 1, without a traceback, having written nothing. A failure after the commit (the model is published) is one
``error: 'DST' is published ..., but ...`` line and exit status 3. Never writes to the checkpoint.
"""

from __future__ import annotations

import argparse

from onnx_light_ref.commands.align import weights_path
from onnx_light_ref.commands.errors import error_exit, published_exit
from onnx_light_ref.commands.help_text import REFUSED, exit_statuses
from onnx_light_ref.commands.paths import shown_path, warn_unless_onnx
from onnx_light_ref.commands.progress import byte_progress
from onnx_light_ref.commands.sizes import alignment_argument, size_argument
from onnx_light_ref.commands.text import printable
from onnx_light_ref.errors import PublishedWithErrorsError

__all__ = ["link_command", "register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``link`` sub-command."""
    parser = subparsers.add_parser(
        "link",
        epilog=exit_statuses("the model is written, pointing at the checkpoint", REFUSED, writes=True),
        help="point a model's tensors at an existing safetensors checkpoint (no byte copied)",
        description="Write DST.onnx so that every tensor of MODEL.onnx whose name (through --map) is a key of "
        "CHECKPOINT with the same data type and shape points at the checkpoint's bytes: one copy of the weights "
        "serves safetensors loaders and ONNX runtimes. Other tensors go to DST.onnx.data. CHECKPOINT (a "
        ".safetensors file or a *.safetensors.index.json) must be inside DST.onnx's folder; its headers are "
        "checked before anything is written.",
    )
    parser.add_argument("model", metavar="MODEL.onnx", help="the model to link")
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a .safetensors file or a .safetensors.index.json")
    parser.add_argument("dst", metavar="DST.onnx", help="model to write, in the checkpoint's folder (or above it)")
    parser.add_argument("--map", metavar="NAMES.json", help="JSON object: model tensor name -> checkpoint key")
    parser.add_argument(
        "--weights",
        metavar="PATH",
        help="the model's own weights file (tensors not linked); a relative PATH is relative to DST.onnx's folder and "
        "must stay inside it (default: DST.onnx.data)",
    )
    parser.add_argument(
        "--alignment",
        metavar="N",
        type=alignment_argument,
        default=4096,
        help="alignment of the tensors written to DST.onnx.data (default: 4096; 0 or 1 = packed)",
    )
    parser.add_argument(
        "--size-threshold",
        metavar="SIZE",
        type=size_argument,
        default=1024,
        help="inline tensors of at least SIZE bytes not found in the checkpoint move to DST.onnx.data (default: 1K)",
    )
    parser.add_argument(
        "--allow-outside-folder",
        action="store_true",
        help="trust the layout: follow symbolic links to the checkpoint and the model's data files, e.g. the Hugging "
        "Face cache (snapshots/<rev>/model.safetensors -> ../../blobs/<sha>); refused by default, as onnx's loader "
        "refuses them (onnxruntime follows them)",
    )
    parser.add_argument(
        "--replace-shared",
        action="store_true",
        help="replace DST.onnx.data even when another model uses it (a .onnx in its folder or above; that model then "
        "computes with the new weights); without it, such a run is refused and names the other models",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing files DST.onnx does not own (e.g. a DST that is not an ONNX model); without it, such "
        "a run is refused and names the files",
    )
    parser.add_argument("--no-fsync", action="store_true", help="skip every fsync (outputs still appear atomically)")
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    parser.set_defaults(func=link_command)


def _read_map(path: str) -> dict[str, str]:
    from onnx_light_ref.io.plan.name_map import MAX_NAME_MAP_SIZE, parse_name_map

    with open(path, "rb") as file:
        text = file.read(MAX_NAME_MAP_SIZE + 1)
    return parse_name_map(text, f"--map {path!r}")


def link_command(args: argparse.Namespace) -> int:
    """Run the command; return the exit status."""
    from onnx_light_ref.io.link import link_external_data
    from onnx_light_ref.io.results import summarize_names

    try:
        name_map = _read_map(args.map) if args.map is not None else None
        with byte_progress("link", hidden=args.no_progress) as progress:
            result = link_external_data(
                args.model,
                args.checkpoint,
                args.dst,
                name_map=name_map,
                dst_weights_path=weights_path(args.dst, args.weights),
                alignment=args.alignment,
                size_threshold=args.size_threshold,
                durable=not args.no_fsync,
                progress=progress,
                allow_outside_folder=args.allow_outside_folder,
                replace_shared=args.replace_shared,
                overwrite=args.overwrite,
            )
    except PublishedWithErrorsError as exc:  # the model is written, but a step after the commit failed
        return published_exit(exc)
    except (ValueError, OSError) as exc:  # ExternalDataError is a ValueError; FileNotFoundError an OSError
        return error_exit(exc)
    warn_unless_onnx(args.dst)  # after success: a refusal's one error line says enough
    line = (
        f"{shown_path(args.dst)}: {result.linked_tensors} tensors linked to the checkpoint ({result.linked_bytes} "
        f"bytes, none copied), {result.written_tensors} written ({result.written_bytes} bytes"
        + (f" to {shown_path(result.weights_files[0])})" if result.weights_files else ")")
    )
    if result.mismatched_tensors:
        names = summarize_names([printable(name) for name in result.mismatched_tensors])
        line += (
            f"\nnote: {len(result.mismatched_tensors)} tensor(s) named like a checkpoint key have another data type "
            f"or shape and were written, not linked: {names}"
        )
    if result.kept_inline_tensors:
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(result.kept_inline_reasons.items()))
        line += f"\nnote: {result.kept_inline_tensors} tensor(s) kept inline where onnx needs them inline: {reasons}"
    if result.stale_weights_files:
        line += (
            f"\nnote: {len(result.stale_weights_files)} file(s) left by an earlier run at this destination are not "
            f"used by {args.dst} and were not deleted: {', '.join(result.stale_weights_files)} (delete them if "
            "nothing else uses them)"
        )
    print(line)
    return 0
