"""``onnx-light-ref align-models SRC.onnx... --out DIR``: a family of models over one set of weights files.

A thin front end of :func:`onnx_light_ref.align_models`: the layout options are the aligner's (``--alignment``,
``--align-threshold``, ``--max-shard-size``, ``--size-threshold``, ``--format``, ``--shard-names``, sizes with K/M/G
suffixes), plus ``--weights NAME`` (relative to DIR), ``--replace-shared`` and ``--overwrite``. Unlike the Python
function, the command creates DIR (and the weights file's folder) when missing, and removes what it created if the
run fails or is interrupted (:mod:`onnx_light_ref._commands.folders`). It draws a byte progress bar, then prints one
line per member (its path, tensors, shared tensors) and one for the family (weights files, bytes written, unique
bytes, bytes saved against separate copies, time), and a ``note:`` naming files of DIR no model uses any more
(deleted with ``--delete-stale`` when no other model uses them). A refusal prints one ``error: ...`` line and exits 1;
the library has then written nothing. A
failure once a member is published (the fsync that makes it durable, removing previous versions, or a move that
could not be undone) prints one ``error: ... published ..., but ...`` line naming the members that are new (and
those still previous) and exits 3.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING

from onnx_light_ref._commands.errors import error_exit, published_exit
from onnx_light_ref._commands.folders import created_folders
from onnx_light_ref._commands.help_text import REFUSED, docs_url, exit_statuses
from onnx_light_ref._commands.hints import (
    config_note,
    inline_hint,
    kept_inline_note,
    oversized_note,
    stale_notes,
    transformers_js_note,
)
from onnx_light_ref._commands.options import add_option, add_options
from onnx_light_ref._commands.paths import shown_path, weights_path
from onnx_light_ref._commands.progress import byte_progress
from onnx_light_ref._commands.text import printable
from onnx_light_ref.errors import PublishedWithErrorsError

if TYPE_CHECKING:  # the library (and onnx) is imported when the command runs, not when the CLI starts
    from onnx_light_ref.io._results import FamilyResult


def split_member_argument(text: str) -> str | tuple[str, str]:
    """A member on the command line: ``SRC.onnx`` or ``SRC.onnx=NAME`` (a path that exists as written stays a path,
    and a NAME never holds a ``/``)."""
    path, sep, name = text.rpartition("=")
    if not sep or not path or os.path.exists(text) or "/" in name:
        return text
    return path, name


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``align-models`` sub-command."""
    parser = subparsers.add_parser(
        "align-models",
        epilog=exit_statuses("every member and the weights files are written", REFUSED, writes=True),
        help="write a family of models (e.g. a decoder and a decoder-with-past) over one set of aligned weights "
        "files holding each distinct tensor once",
        description="Write DIR/<file name of each SRC.onnx, or its NAME> and one set of aligned weights files in DIR "
        "that every member points into, each distinct payload stored once (tensors compared byte for byte, whatever "
        "their names and owners). Sources may live in different folders; they are never modified. The family is "
        "published as one transaction; re-running over the same DIR with the same members replaces it as a whole.",
    )
    parser.add_argument(
        "sources",
        metavar="SRC.onnx[=NAME]",
        nargs="+",
        type=split_member_argument,
        help="the members' models; each is written as DIR/<its file name>, or DIR/NAME with SRC.onnx=NAME (every "
        "exporter writes model.onnx: a/model.onnx=decoder_model.onnx b/model.onnx=decoder_with_past_model.onnx)",
    )
    parser.add_argument("--out", metavar="DIR", required=True, help="folder to write the family to (created)")
    add_option(
        parser,
        "--weights",
        {"metavar": "NAME"},
        what="the (first) shared weights file",
        folder="DIR",
        default="weights.data; model.safetensors with --format safetensors; weights.onnx_data with --shard-names "
        "transformers.js",
    )
    add_options(parser, "--alignment")
    add_option(parser, "--chunk-size", buffers="also each buffer of the read/write fallback and of the dedup compares")
    add_options(parser, "--align-threshold")
    add_option(parser, "--max-shard-size", weights="the shared weights")
    add_option(parser, "--size-threshold", where="the shared weights")
    add_option(
        parser,
        "--format",
        layout="each distinct tensor under the name of its first user",
        docs=docs_url("align_models.md"),
    )
    add_option(parser, "--shard-names", stem="weights")
    add_option(parser, "--replace-shared", what="a weights file of DIR")
    add_option(
        parser,
        "--overwrite",
        owner="the family",
        owned="the members' .onnx, the files their previous versions reference and files named after them or like "
        "shards of their weights",
        example="a weights.data of DIR that another tool wrote",
    )
    add_option(parser, "--allow-outside-folder", subject="the sources")
    add_options(parser, "--no-fsync", "--update-config", "--delete-stale", "--no-progress")
    parser.set_defaults(
        func=align_models_command,
        option_hints={"--dedup": "a family always stores identical payloads once; no option is needed"},
    )


def align_models_command(args: argparse.Namespace) -> int:
    """Run the command; return the exit status."""
    from onnx_light_ref.io._align_models import align_models

    started = time.perf_counter()
    folder = os.path.abspath(args.out)
    weights = weights_path(folder, args.weights)
    try:
        folders = [folder, os.path.dirname(os.path.abspath(weights)) if weights is not None else folder]
        with created_folders(folders), byte_progress("align-models", hidden=args.no_progress) as progress:
            result = align_models(
                args.sources,
                folder,
                weights_name=weights,
                alignment=args.alignment,
                chunk_size=args.chunk_size,
                align_threshold=args.align_threshold,
                max_shard_size=args.max_shard_size,
                size_threshold=args.size_threshold,
                weights_format=args.format,
                shard_names=args.shard_names,
                replace_shared=args.replace_shared,
                overwrite=args.overwrite,
                allow_outside_folder=args.allow_outside_folder,
                durable=not args.no_fsync,
                progress=progress,
                delete_stale=args.delete_stale,
                update_config=args.update_config,
            )
    except PublishedWithErrorsError as exc:  # before OSError's clause: members are published, exit status 3
        return published_exit(exc)
    except (ValueError, OSError) as exc:  # ExternalDataError is a ValueError; FileNotFoundError an OSError
        return error_exit(exc)  # created_folders removed the folders it made; an interrupt propagates to the CLI
    print(_summary(result, time.perf_counter() - started))
    notes: list[str | None] = [*stale_notes(result.stale_weights_files, result.removed_files, args.delete_stale)]
    notes += [kept_inline_note(member.kept_inline_names, shown_path(member.path)) for member in result.members]
    notes.append(oversized_note(result.weights_files, args.max_shard_size))
    models = [(member.path, result.weights_files if member.tensors else ()) for member in result.members]
    notes.append(config_note(result.config_file, models))
    if result.config_file is None:
        notes.append(transformers_js_note(args.shard_names, models))
    if not result.weights_files and args.size_threshold is None:
        notes += [inline_hint(source if isinstance(source, str) else source[0]) for source in args.sources]
    for note in notes:
        if note is not None:
            print(printable(note))
    return 0


def _summary(result: FamilyResult, elapsed: float) -> str:
    """One line per member and one for the family (paths shown by :func:`~onnx_light_ref._commands.paths.shown_path`:
    absolute and escaped)."""
    lines = []
    for member in result.members:
        extras = []
        if member.externalized_tensors:
            extras.append(f"{member.externalized_tensors} moved out of the .onnx")
        if member.kept_inline_reasons:
            kept = sum(member.kept_inline_reasons.values())
            extras.append(f"{kept} left in the .onnx")
        detail = f" ({', '.join(extras)})" if extras else ""
        shared = f"{member.shared_tensors} on bytes another member uses"
        lines.append(f"{shown_path(member.path)}: {member.tensors} tensors, {shared}{detail}")
    if result.weights_files:
        files = len(result.weights_files)
        where = shown_path(result.weights_files[0]) + (f" (+{files - 1} shards: {files} files)" if files > 1 else "")
        speed = result.unique_bytes / (1024 * 1024) / elapsed if elapsed > 0 else float("inf")
        index = f", index {shown_path(result.index_file)}" if result.index_file else ""
        lines.append(
            f"{where}: {len(result.members)} members, {result.tensors} tensors, {result} bytes written "
            f"({result.unique_bytes} unique, {result.padding} padding{index}), {result.saved_bytes} bytes saved "
            f"against separate copies ({len(result.shared_tensors)} distinct payloads used by several members) in "
            f"{elapsed:.2f} s, "
            f"{speed:.1f} MiB/s"
        )
    else:
        lines.append(f"{len(result.members)} members written: no external tensor, no weights file.")
    return "\n".join(lines)
