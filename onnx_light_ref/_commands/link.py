"""``onnx-light-ref link MODEL.onnx CHECKPOINT DST.onnx``: point a model at a safetensors checkpoint, zero bytes copied.

A thin front end of :func:`onnx_light_ref.io._link.link_external_data`: ``CHECKPOINT`` is a ``.safetensors`` file or a
sharded set's ``*.safetensors.index.json`` inside DST.onnx's folder; ``--map names.json`` maps model tensor names to
checkpoint keys (one flat JSON object of strings; a repeated name, nesting, a name the model lacks, a key the
checkpoint lacks, or two tensors sent to one key are refused before anything is written). Prints one summary line
(tensors and bytes linked and written) on stdout; a problem prints one ``error: ...`` line on stderr and exits with
status 1, without a traceback, having written nothing. A failure after the commit (the model is published) is one
``error: 'DST' is published ..., but ...`` line and exit status 3. Never writes to the checkpoint.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from onnx_light_ref._commands.errors import PUBLISHED_WITH_ERRORS, error_exit, published_exit
from onnx_light_ref._commands.help_text import REFUSED, exit_statuses
from onnx_light_ref._commands.hints import stale_notes
from onnx_light_ref._commands.options import add_option, add_options
from onnx_light_ref._commands.paths import shown_path, warn_unless_onnx, weights_path
from onnx_light_ref._commands.progress import byte_progress
from onnx_light_ref._commands.text import printable
from onnx_light_ref.errors import PublishedWithErrorsError

if TYPE_CHECKING:
    from onnx_light_ref.io._results import LinkResult
    from onnx_light_ref.io._write.contract import WritePlan


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
    add_options(parser, "--map")
    parser.add_argument(
        "--map-by-content",
        action="store_true",
        help="pair the tensors names (and --map) leave with keys of the same data type, shape and bytes (hashed, "
        "then compared): tied and renamed weights; also finds tensors that are a key's transpose. Reads their bytes",
    )
    parser.add_argument(
        "--transpose",
        action="store_true",
        help="link tensors that are a key's 2-D transpose (torch's optimize=True, the legacy exporter) through a "
        "Transpose node over the key: no weight stored twice, outputs bit-identical; compares bytes like "
        "--map-by-content",
    )
    parser.add_argument(
        "--write-map",
        metavar="FILE",
        help="write the pairing (every tensor linked under another name) as a --map file to review or edit; an "
        "existing FILE needs --overwrite",
    )
    add_option(parser, "--weights", what="the model's own weights file (tensors not linked)")
    add_option(parser, "--alignment", tensor="tensor written to DST.onnx.data (linked ones keep the checkpoint's)")
    add_option(parser, "--align-threshold", tensors="tensors written to DST.onnx.data")
    add_option(
        parser,
        "--size-threshold",
        {"default": 1024},
        where="DST.onnx.data when the checkpoint does not hold them",
        default="1K",
    )
    add_option(parser, "--allow-outside-folder", subject="MODEL.onnx and CHECKPOINT")
    add_option(parser, "--replace-shared", what="DST.onnx.data")
    add_option(parser, "--overwrite", example="a DST that is neither an ONNX model nor named *.onnx")
    add_options(parser, "--no-fsync", "--delete-stale", "--no-progress")
    parser.set_defaults(func=link_command)


def _read_map(path: str) -> dict[str, str]:
    from onnx_light_ref.io._plan.name_map import MAX_NAME_MAP_SIZE, parse_name_map

    with open(path, "rb") as file:
        text = file.read(MAX_NAME_MAP_SIZE + 1)
    return parse_name_map(text, f"--map {path!r}")


def link_command(args: argparse.Namespace) -> int:
    """Run the command; return the exit status."""
    from onnx_light_ref.io._link import link_external_data

    dst_weights = weights_path(os.path.dirname(args.dst), args.weights)  # a usage error, before anything else
    try:
        name_map = _read_map(args.map) if args.map is not None else None
        map_plan = _map_plan(args) if args.write_map is not None else None
        with byte_progress("link", hidden=args.no_progress) as progress:
            result = link_external_data(
                args.model,
                args.checkpoint,
                args.dst,
                name_map=name_map,
                dst_weights_path=dst_weights,
                alignment=args.alignment,
                size_threshold=args.size_threshold,
                durable=not args.no_fsync,
                progress=progress,
                allow_outside_folder=args.allow_outside_folder,
                replace_shared=args.replace_shared,
                overwrite=args.overwrite,
                map_by_content=args.map_by_content,
                transpose=args.transpose,
                align_threshold=args.align_threshold,
                delete_stale=args.delete_stale,
            )
    except PublishedWithErrorsError as exc:  # the model is written, but a step after the commit failed
        return published_exit(exc)
    except (ValueError, OSError) as exc:  # ExternalDataError is a ValueError; FileNotFoundError an OSError
        return error_exit(exc)
    warn_unless_onnx(args.dst)  # after success: a refusal's one error line says enough
    print(_summary(args, result))
    if map_plan is not None:
        try:
            _write_map(map_plan, result)
        except (ValueError, OSError) as exc:
            error_exit(f"{args.dst!r} is published, but --write-map {args.write_map!r} was not written: {exc}")
            return PUBLISHED_WITH_ERRORS
        print(f"wrote the pairing to {shown_path(args.write_map)} (a --map file)")
    return 0


def _summary(args: argparse.Namespace, result: LinkResult) -> str:
    """The summary line and its notes (what was paired how, what would help)."""
    from onnx_light_ref.io._results import summarize_names

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
    for note in stale_notes(result.stale_weights_files, result.removed_files, args.delete_stale):
        line += f"\n{note}"
    return line + "".join(f"\n{note}" for note in _pairing_notes(args, result))


def _pairing_notes(args: argparse.Namespace, result: LinkResult) -> list[str]:
    from onnx_light_ref.io._results import summarize_names

    notes = [
        f"  {printable(p.name)} -> {printable(p.key)} ({p.how})" for p in result.pairings if p.how in ("content", "map")
    ]
    notes += [
        f"  {printable(p.name)} = Transpose({printable(p.key)})"
        + ("" if p.name in result.transposed_tensors else " (written: --transpose links it)")
        for p in result.pairings
        if p.how == "transpose"
    ]
    if notes:
        notes.insert(0, "pairing (model tensor -> checkpoint key):")
    if result.transpose_candidates:
        names = summarize_names([printable(name) for name in result.transpose_candidates])
        notes.append(
            f"note: {len(result.transpose_candidates)} tensor(s) have the swapped dims of a checkpoint key, probably "
            f"pre-transposed weights (torch's optimize=True, the legacy exporter): {names}; export with "
            "optimize=False to keep the checkpoint's layout, or link them with --transpose"
        )
    if result.unaligned_linked:
        notes.append(
            f"note: {result.unaligned_linked} linked tensor(s) keep the checkpoint's offsets, which are not multiples "
            f"of --alignment {args.alignment} (a link never moves the checkpoint's bytes)"
        )
    return notes


def _map_plan(args: argparse.Namespace) -> WritePlan:
    """The --write-map file as the writer contract's plan, checked before the link writes anything."""
    from onnx_light_ref.io._read.locations import file_identity
    from onnx_light_ref.io._write.contract import PlannedFile, WriteOptions, WritePlan, check_plan

    reads = {identity: path for path in (args.model, args.checkpoint) if (identity := file_identity(path))}
    plan = WritePlan(
        "link --write-map",
        [],
        [PlannedFile(os.path.abspath(args.write_map), "data", 0, format="json")],
        WriteOptions(args.replace_shared, args.overwrite, args.allow_outside_folder),
        reads,
        rename_hint="another --write-map",
    )
    check_plan(plan)  # the name: before the link writes anything; the content once it is known
    return plan


def _write_map(plan: WritePlan, result: LinkResult) -> None:
    import json

    from onnx_light_ref.io._write.contract import PlannedFile
    from onnx_light_ref.io._write.execute import execute

    pairs = {p.name: p.key for p in result.pairings if p.how in ("map", "content")}
    data = (json.dumps(pairs, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    plan.files = [PlannedFile(plan.files[0].path, "data", len(data), writes=[(0, data)], format="json")]
    execute(plan, lambda _stats: None)
