"""``onnx-light-ref align SRC.onnx DST.onnx``: re-align weights into aligned external data without loading them.

Options map one to one to the library's: ``--align-threshold``, ``--max-shard-size``, ``--dedup``,
``--size-threshold`` (sizes with K/M/G suffixes, parsed by :mod:`onnx_light_ref._commands.sizes`).

A thin front end of :func:`onnx_light_ref.align_external_data_streaming`: a progress bar (bytes) fed by its
``progress`` callback, then one summary line (tensors, weights files, externalized and deduplicated tensors, bytes
written, padding, time, throughput) on stdout, and a ``note:`` line naming shard files an earlier run left at the
destination (deleted with ``--delete-stale`` when no other model uses them), taken from the
:class:`~onnx_light_ref.io._results.AlignResult` it
returns. Unlike the Python API, the command creates missing
destination folders, as users expect from a command line (and removes those it created if the run fails or is
interrupted; see :mod:`onnx_light_ref._commands.folders`). A relative ``--weights`` is relative to DST.onnx's folder
(:func:`~onnx_light_ref._commands.paths.weights_path`). A problem
with the input (bad argument, unsafe or out-of-bounds reference, destination that is a source, missing file, I/O
error) prints one ``error: ...`` line on stderr and exits with status 1, without a traceback; the library has then
written nothing. A failure after the commit (the model is published; the fsync that makes it durable, or removing
the previous versions, failed) prints one ``error: 'DST' is published ..., but ...`` line instead and exits with
status 3.
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
    DELETE_STALE_HELP,
    UPDATE_CONFIG_HELP,
    config_note,
    inline_hint,
    kept_inline_note,
    oversized_note,
    stale_notes,
    transformers_js_note,
)
from onnx_light_ref._commands.paths import shown_path, warn_unless_onnx, weights_argument, weights_path
from onnx_light_ref._commands.progress import byte_progress
from onnx_light_ref._commands.sizes import alignment_argument, bounded_size, size_argument
from onnx_light_ref._commands.text import printable
from onnx_light_ref.errors import PublishedWithErrorsError

if TYPE_CHECKING:  # the library (and onnx) is imported when the command runs, not when the CLI starts
    from onnx_light_ref.io._results import AlignResult


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``align`` sub-command."""
    parser = subparsers.add_parser(
        "align",
        epilog=exit_statuses("the model and its weights files are written", REFUSED, writes=True),
        help="re-align weights into aligned (optionally sharded, deduplicated) external data files; move inline "
        "weights out of a .onnx with --size-threshold",
        description="Copy every external tensor of SRC.onnx (and, with --size-threshold, every large inline one) "
        "into weights files, each at an offset that is a multiple of --alignment, and write DST.onnx pointing at "
        "them. Weights are copied file to file (in the kernel when possible), never loaded into memory. "
        "Source files are never modified; outputs appear "
        "atomically. DST.onnx may be SRC.onnx when --weights names a new file. To move inline weights out of a "
        ".onnx (e.g. one near or past protobuf's 2 GiB limit) into an external weights file: --size-threshold 1K.",
    )
    parser.add_argument("src", metavar="SRC.onnx", help="model whose external weights are re-aligned")
    parser.add_argument("dst", metavar="DST.onnx", help="model to write (may be SRC.onnx)")
    parser.add_argument(
        "--weights",
        metavar="PATH",
        type=weights_argument,
        help="weights file to write (with --max-shard-size, the first of PATH, PATH.1...); a relative PATH is "
        "relative to DST.onnx's folder, not the current one, and must stay inside it (default: DST.onnx.data)",
    )
    parser.add_argument(
        "--alignment",
        metavar="N",
        type=alignment_argument,
        default=4096,
        help="power of two every tensor offset is a multiple of, e.g. 4096 or 64K; 0 or 1 = packed (default: 4096)",
    )
    parser.add_argument(
        "--chunk-size",
        metavar="SIZE",
        type=bounded_size("chunk_size", minimum=1),
        default=4 * 1024 * 1024,
        help="bytes moved per system call, the only buffer in the read/write fallback (default: 4M)",
    )
    parser.add_argument(
        "--align-threshold",
        metavar="SIZE",
        type=size_argument,
        default=0,
        help="only tensors of at least SIZE bytes are aligned; smaller ones are packed (default: 0, align all)",
    )
    parser.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        type=bounded_size("max_shard_size", minimum=1),
        default=None,
        help="split the weights over files of at most SIZE bytes (W, W.1, W.2...; a tensor is never split, one "
        "larger than SIZE gets its own file); default: one file",
    )
    parser.add_argument(
        "--dedup",
        action="store_true",
        help="store byte-identical tensors once (compared byte for byte, whatever their names or sources)",
    )
    parser.add_argument(
        "--size-threshold",
        metavar="SIZE",
        type=size_argument,
        default=None,
        help="also move inline tensors of at least SIZE bytes to the weights, copied out of SRC.onnx without "
        "loading it; keep it above the size of shape tensors (e.g. 1K) so onnxruntime can still infer shapes "
        "(default: inline tensors stay inline)",
    )
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="skip every fsync: outputs still appear atomically with the same bytes, but may be lost on a crash "
        "(for scratch copies and comparisons with tools that never fsync)",
    )
    parser.add_argument(
        "--allow-outside-folder",
        action="store_true",
        help="trust the model's data layout: follow symbolic links in data paths, e.g. the Hugging Face cache "
        "(snapshots/<rev>/model.onnx.data -> ../../blobs/<sha>); refused by default, as onnx's loader refuses them",
    )
    parser.add_argument(
        "--format",
        choices=("onnx", "safetensors"),
        default="onnx",
        help="weights file format: raw external data (onnx, default) or safetensors files that safetensors "
        "loaders read too (default name DST.safetensors; with --max-shard-size, DST-00001-of-0000N.safetensors "
        f"plus DST.safetensors.index.json); see {docs_url('safetensors.md')}",
    )
    parser.add_argument(
        "--shard-names",
        choices=("hf", "transformers.js"),
        default=None,
        help="name weights files for a consumer: hf (model-00001-of-0000N.data, default for safetensors) or "
        "transformers.js (model.onnx_data, model.onnx_data_1, ...; at most 100 files); default: W, W.1, W.2...",
    )
    parser.add_argument(
        "--replace-shared",
        action="store_true",
        help="replace a weights file even when another model uses it (a .onnx in its folder or above, through "
        "external data or DelayedInitializer filenames; that model then computes with the new weights); without "
        "it, such a run is refused and names the other models",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing files the destination does not own (anything but DST.onnx, the files the previous "
        "DST.onnx references and files named after it: e.g. a PyTorch model.safetensors where --format "
        "safetensors would write); without it, such a run is refused and names the files",
    )
    parser.add_argument("--update-config", metavar="CONFIG.json", help=UPDATE_CONFIG_HELP)
    parser.add_argument("--delete-stale", action="store_true", help=DELETE_STALE_HELP)
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    parser.set_defaults(func=align_command)


def align_command(args: argparse.Namespace) -> int:
    """Run the command; return the exit status."""
    from onnx_light_ref.io._align import align_external_data_streaming

    started = time.perf_counter()
    weights = weights_path(os.path.dirname(args.dst), args.weights)
    try:
        folders = [os.path.dirname(os.path.abspath(path)) for path in (args.dst, weights or args.dst)]
        with created_folders(folders), byte_progress("align", hidden=args.no_progress) as progress:
            result = align_external_data_streaming(
                args.src,
                args.dst,
                weights,
                args.alignment,
                args.chunk_size,
                align_threshold=args.align_threshold,
                max_shard_size=args.max_shard_size,
                dedup=args.dedup,
                size_threshold=args.size_threshold,
                progress=progress,
                durable=not args.no_fsync,
                allow_outside_folder=args.allow_outside_folder,
                weights_format=args.format,
                shard_names=args.shard_names,
                replace_shared=args.replace_shared,
                overwrite=args.overwrite,
                delete_stale=args.delete_stale,
                update_config=args.update_config,
            )
    except PublishedWithErrorsError as exc:  # before OSError's clause: the model is written, exit status 3
        return published_exit(exc)
    except (ValueError, OSError) as exc:  # ExternalDataError is a ValueError; FileNotFoundError an OSError
        return error_exit(exc)  # created_folders removed the folders it made; an interrupt propagates to the CLI
    elapsed = time.perf_counter() - started
    warn_unless_onnx(args.dst)  # after success: a refusal's one error line says enough
    print(_written(args.dst, result, elapsed))
    notes: list[str | None] = [*stale_notes(result.stale_weights_files, result.removed_files, args.delete_stale)]
    notes += [kept_inline_note(result.kept_inline_names), oversized_note(result.weights_files, args.max_shard_size)]
    models = [(os.path.abspath(args.dst), result.weights_files)]
    notes.append(config_note(result.config_file, models))
    if result.config_file is None:
        notes.append(transformers_js_note(args.shard_names, models))
    if result.tensors == 0 and args.size_threshold is None:
        notes.append(inline_hint(args.src))
    for note in notes:
        if note is not None:
            print(printable(note))
    return 0


def _written(dst_onnx: str, result: AlignResult, elapsed: float) -> str:
    from onnx_light_ref.io._results import summarize_names

    if result.tensors == 0:
        return f"{shown_path(dst_onnx)}: no external tensor, nothing to align (model written, no weights file)."
    speed = result / (1024 * 1024) / elapsed if elapsed > 0 else float("inf")
    files = result.weights_files  # what was written (shards, hub names), not the --weights asked for
    where = shown_path(files[0])
    if len(files) > 1:
        where += f" (+{len(files) - 1} shards: {len(files)} files)"
    extras = []
    if result.externalized_tensors:
        extras.append(f"{result.externalized_tensors} moved out of the .onnx")
    if result.kept_inline_tensors:  # named by reason in a note (kept_inline_note)
        extras.append(f"{result.kept_inline_tensors} left in the .onnx")
    if result.deduplicated_tensors:
        extras.append(f"{result.deduplicated_tensors} deduplicated: {result.deduplicated_bytes} bytes saved")
    if result.unaligned_tensors:
        names = summarize_names([printable(name) for name in result.unaligned_tensors])
        extras.append(f"{len(result.unaligned_tensors)} large tensor(s) not aligned: {names}")
    if result.index_file:
        extras.append(f"index {shown_path(result.index_file)}")
    detail = f" ({', '.join(extras)})" if extras else ""
    return (
        f"{where}: {result.tensors} tensors{detail}, {result} bytes written ({result.padding} padding) "
        f"in {elapsed:.2f} s, {speed:.1f} MiB/s"
    )
