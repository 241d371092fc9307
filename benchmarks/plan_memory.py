"""Memory of the aligner's plan on a metadata-heavy model: tracemalloc in this process, peak RSS in a fresh child.

Usage: ``python -m benchmarks.plan_memory [--tensors 32768] [--tensor-bytes 65536] [--dedup] [--dir DIR]``.

The model mirrors the ``small`` shape of :func:`benchmarks.models.make_align_model` (``N`` tensors of 64 KiB in 4
data files, 64 bytes before each), but its data files are sparse (``truncate``): only metadata matters here, and the
source costs no disk. Two figures:

* ``plan``: :func:`onnx_light_ref.io._plan.align_plan.plan_alignment` under ``tracemalloc``: Python bytes the plan keeps
  (minus the parsed model, measured alone) and the planning peak, both per tensor;
* ``child``: ``align_external_data_streaming`` (``durable=False``) in a fresh interpreter through
  :func:`benchmarks.child.run_in_child`: ``VmHWM`` above the post-import baseline, the README's figure.

Writes only inside ``--dir`` (default: a temporary folder, removed afterwards).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import tracemalloc

from benchmarks.child import run_in_child
from benchmarks.models import _external_tensor, _identity_model, _save_proto

__all__ = ["make_sparse_model", "measure_plan"]

_FILES = 4
_GAP = 64


def make_sparse_model(folder: str, count: int, tensor_bytes: int) -> str:
    """Write ``model.onnx`` with ``count`` external tensors over 4 sparse data files; return its path."""
    os.makedirs(folder, exist_ok=True)
    initializers = []
    per_file = -(-count // _FILES)
    for file_index in range(_FILES):
        location = f"weights-{file_index}.data"
        offset = 0
        for index in range(file_index * per_file, min(count, (file_index + 1) * per_file)):
            offset += _GAP
            initializers.append(_external_tensor(f"w{index:05d}", [tensor_bytes // 4], location, offset, tensor_bytes))
            offset += tensor_bytes
        with open(os.path.join(folder, location), "wb") as data:
            data.truncate(offset)
    path = os.path.join(folder, "model.onnx")
    _save_proto(_identity_model(initializers), path)
    return path


def measure_plan(src: str, dst: str, count: int, dedup: bool) -> dict[str, float]:
    """Bytes per tensor kept by the plan (beyond the parsed model) and at the planning peak, under tracemalloc."""
    from onnx_light_ref.io._plan.align_plan import plan_alignment
    from onnx_light_ref.io._read.model_file import load_model_metadata

    gc.collect()
    tracemalloc.start()
    model = load_model_metadata(src)
    model_bytes = tracemalloc.get_traced_memory()[0]
    del model
    gc.collect()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    plan = plan_alignment(src, dst, alignment=4096, dedup=dedup)
    gc.collect()
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del plan
    plan_kept = kept - base - model_bytes
    return {
        "model_mib": round(model_bytes / 2**20, 2),
        "plan_kept_bytes_per_tensor": round(plan_kept / count, 1),
        "plan_peak_bytes_per_tensor": round((peak - base - model_bytes) / count, 1),
        "plan_kept_mib": round(plan_kept / 2**20, 2),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=32768)
    parser.add_argument("--tensor-bytes", type=int, default=64 * 1024)
    parser.add_argument("--dedup", action="store_true")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    folder = args.dir or tempfile.mkdtemp(prefix="plan_memory_")
    try:
        src = make_sparse_model(os.path.join(folder, "src"), args.tensors, args.tensor_bytes)
        out = os.path.join(folder, "out")
        os.makedirs(out, exist_ok=True)
        record: dict[str, object] = {"tensors": args.tensors, "onnx_mib": round(os.path.getsize(src) / 2**20, 2)}
        record.update(measure_plan(src, os.path.join(out, "plan.onnx"), args.tensors, args.dedup))
        child = run_in_child(
            "align_streaming",
            {
                "src": src,
                "dst": os.path.join(out, "model.onnx"),
                "alignment": 4096,
                "chunk_size": 4 * 1024 * 1024,
                "durable": False,
                "dedup": args.dedup,
            },
        )
        record["child_delta_mib"] = child["delta_mib"]
        record["child_seconds"] = round(child["seconds"], 2)
        print(json.dumps(record))
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
