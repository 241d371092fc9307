"""``onnx-light-ref align SRC.onnx DST.onnx``: re-align external weights into one file without loading them.

A thin front end of :func:`onnx_light_ref.align_external_data_streaming`: a tqdm progress bar (bytes) fed by its
``progress`` callback, then one summary line (tensors, bytes written, padding, time, throughput) on stdout. A problem
with the input (bad argument, unsafe or out-of-bounds reference, destination that is a source, missing file, I/O
error) prints one ``error: ...`` line on stderr and exits with status 1, without a traceback; the library has then
written nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tqdm import tqdm

from onnx_light_ref.commands.sizes import size_argument

__all__ = ["register", "run_align"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``align`` sub-command."""
    parser = subparsers.add_parser(
        "align",
        help="re-align external weights into one file, every tensor at a multiple of N bytes",
        description="Copy every external tensor of SRC.onnx into one weights file, each at an offset that is a "
        "multiple of --alignment, and write DST.onnx pointing at it. Weights are copied file to file (in the "
        "kernel when possible), never loaded into memory. Source files are never modified; outputs appear "
        "atomically. DST.onnx may be SRC.onnx when --weights names a new file.",
    )
    parser.add_argument("src", metavar="SRC.onnx", help="model whose external weights are re-aligned")
    parser.add_argument("dst", metavar="DST.onnx", help="model to write (may be SRC.onnx)")
    parser.add_argument(
        "--weights",
        metavar="PATH",
        help="weights file to write, inside DST.onnx's folder (default: DST.onnx.data)",
    )
    parser.add_argument(
        "--alignment",
        metavar="N",
        type=size_argument,
        default=4096,
        help="power of two every tensor offset is a multiple of, e.g. 4096 or 64K; 0 or 1 = packed (default: 4096)",
    )
    parser.add_argument(
        "--chunk-size",
        metavar="SIZE",
        type=size_argument,
        default=4 * 1024 * 1024,
        help="bytes moved per system call, the only buffer in the read/write fallback (default: 4M)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    parser.set_defaults(func=run_align)


def run_align(args: argparse.Namespace) -> int:
    """Run the command; return the exit status."""
    from onnx_light_ref.io.align import align_external_data_streaming

    bar = tqdm(
        desc="align",
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=True if args.no_progress else None,  # None: shown on a terminal only
        file=sys.stderr,
    )

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    started = time.perf_counter()
    try:
        written = align_external_data_streaming(
            args.src, args.dst, args.weights, args.alignment, args.chunk_size, progress=progress
        )
    except (ValueError, OSError) as exc:  # ExternalDataError is a ValueError; FileNotFoundError an OSError
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    bar.close()
    elapsed = time.perf_counter() - started
    print(_summary(args.dst, args.weights, written, elapsed))
    return 0


def _summary(dst_onnx: str, dst_weights: str | None, written: int, elapsed: float) -> str:
    """One line from the written model: tensors, bytes, padding (bytes no tensor uses), time and throughput."""
    import onnx

    from onnx_light_ref.io.locations import is_external
    from onnx_light_ref.io.walker import iter_tensors

    model = onnx.load_model(dst_onnx, load_external_data=False)
    ranges = set()
    tensors = 0
    for site in iter_tensors(model):
        if is_external(site.tensor):
            entries = {e.key: e.value for e in site.tensor.external_data}
            ranges.add((int(entries["offset"]), int(entries["length"])))
            tensors += 1
    if tensors == 0:
        return f"{dst_onnx}: no external tensor, nothing to align (model written, no weights file)."
    padding = written - sum(length for _, length in ranges)
    weights = dst_weights if dst_weights is not None else f"{dst_onnx}.data"
    speed = written / (1024 * 1024) / elapsed if elapsed > 0 else float("inf")
    return (
        f"{os.fspath(weights)}: {tensors} tensors, {written} bytes written ({padding} padding) "
        f"in {elapsed:.2f} s, {speed:.1f} MiB/s"
    )
