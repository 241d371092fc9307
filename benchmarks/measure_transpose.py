"""What ``link --transpose`` costs at session creation: onnxruntime on a pre-transposed export vs the linked one.

An export with torch's ``optimize=True`` stores each Linear weight pre-transposed (``x @ W.T`` as ``MatMul(x, Wt)``
with ``Wt`` an initializer). ``link --map-by-content --transpose`` links the checkpoint's ``W`` instead and inserts
``Transpose(W)``: onnxruntime folds it into a new initializer when the session is created. This script builds both
(``LAYERS`` layers of ``WIDTH x WIDTH`` float32 weights, a safetensors checkpoint beside them), then creates a session
on each in a fresh child process (:func:`benchmarks.child.run_in_child`), ``ROUNDS`` times interleaved, and prints
the median creation time, the peak memory the creation added and the anonymous RSS after one run.

Run: ``python -m benchmarks.measure_transpose [WIDTH] [LAYERS] [ROUNDS]`` (default 2048 8 3: 128 MiB of weights).
Numbers on a shared machine are noisy: compare the two rows of one run only.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import safetensors.numpy as st_numpy
from onnx import TensorProto, helper, numpy_helper

from benchmarks.child import run_in_child
from onnx_light_ref import link_external_data


def _pre_transposed(folder: Path, weights: dict[str, np.ndarray], width: int) -> Path:
    nodes, inits, previous = [], [], "x"
    for index, w in enumerate(weights.values()):
        initializer = numpy_helper.from_array(np.ascontiguousarray(w.T), f"val_{index}")
        inits.append(initializer)
        out = "y" if index == len(weights) - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [previous, initializer.name], [out]))
        previous = out
    graph = helper.make_graph(
        nodes,
        "export",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = folder / "export" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")
    return path


def main(width: int = 2048, layers: int = 8, rounds: int = 3) -> None:
    rng = np.random.default_rng(0)
    weights = {f"layers.{i}.weight": rng.standard_normal((width, width), dtype=np.float32) / 64 for i in range(layers)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        st_numpy.save_file(weights, str(folder / "model.safetensors"))
        export = _pre_transposed(folder, weights, width)
        linked = folder / "linked.onnx"
        result = link_external_data(export, folder / "model.safetensors", linked, map_by_content=True, transpose=True)
        assert len(result.transposed_tensors) == layers and int(result) == 0
        records: dict[str, list[dict]] = {"pre-transposed": [], "linked + Transpose": []}
        for _ in range(rounds):
            for label, model in (("pre-transposed", export), ("linked + Transpose", linked)):
                records[label].append(run_in_child("ort_session", {"model": str(model), "width": width}))
        checksums = {label: {r["extra"]["checksum"] for r in runs} for label, runs in records.items()}
        assert len(set().union(*checksums.values())) == 1, checksums  # the same bits
        print(f"{layers} x {width}x{width} float32 ({layers * width * width * 4 / 2**20:.0f} MiB), {rounds} rounds")
        for label, runs in records.items():
            seconds = statistics.median(r["phases"]["construct"]["seconds"] for r in runs)
            delta = statistics.median(r["phases"]["construct"]["delta_mib"] for r in runs)
            anon = statistics.median(r["rss_anon_end_mib"] for r in runs)
            print(f"{label:>20}: session creation {seconds:.3f} s, +{delta:.0f} MiB peak, {anon:.0f} MiB anonymous RSS")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:]))
