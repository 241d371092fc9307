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
    config_note,
    inline_hint,
    kept_inline_note,
    oversized_note,
    stale_notes,
    transformers_js_note,
)
from onnx_light_ref._commands.options import add_option, add_options
from onnx_light_ref._commands.paths import shown_path, warn_unless_onnx, weights_path
from onnx_light_ref._commands.progress import byte_progress
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
    add_option(parser, "--weights", what="weights file to write (with --max-shard-size, the first of PATH, PATH.1...)")
    add_options(parser, "--alignment")
    add_option(
        parser,
        "--chunk-size",
        buffers="also the one buffer of the read/write fallback and each of the two buffers --dedup compares with",
    )
    add_options(parser, "--align-threshold", "--max-shard-size")
    parser.add_argument(
        "--dedup",
        action="store_true",
        help="store byte-identical tensors once (compared byte for byte, whatever their names or sources)",
    )
    add_option(parser, "--size-threshold", where="the weights, copied out of SRC.onnx without loading it")
    add_options(parser, "--no-fsync")
    add_option(parser, "--allow-outside-folder", subject="SRC.onnx")
    add_option(
        parser,
        "--format",
        layout="default name DST.safetensors; with --max-shard-size, DST-00001-of-0000N.safetensors plus "
        "DST.safetensors.index.json",
        docs=docs_url("safetensors.md"),
    )
    add_option(parser, "--shard-names", stem="model")
    add_option(parser, "--replace-shared", what="a weights file")
    add_option(parser, "--overwrite", example="a PyTorch model.safetensors where --format safetensors would write")
    add_options(parser, "--update-config", "--delete-stale", "--no-progress")
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
