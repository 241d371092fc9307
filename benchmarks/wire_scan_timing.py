"""Timing of the wire-format scan (``io.wire.load_model_stripped``) on many small tensors, against ``onnx.load``.

Usage::

    python -m benchmarks.wire_scan_timing [--count 20000] [--min-length 0 4096] [--rounds 7] [--compare-with FILE]

Builds three models in a temporary folder (``count`` external initializers; ``count`` inline 64-byte initializers;
``count`` inline 1 KiB initializers) and times, in interleaved rounds, ``load_model_stripped(path, min_length)`` for
each ``--min-length`` and ``onnx.load(path, load_external_data=False)``. ``--compare-with`` loads another version of
``onnx_light_ref/io/_read/wire.py`` by path and times it in the same rounds, e.g. the version before a change::

    git show 5dd8794:onnx_light_ref/io/_read/wire.py > /tmp/wire_before.py
    python -m benchmarks.wire_scan_timing --compare-with /tmp/wire_before.py

Prints the best and median time of each. Not part of the pytest suite (no timed asserts anywhere); it writes only
in its own temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_light_ref.io._read import wire

__all__ = ["build_models", "main"]


def _save(initializers: list[onnx.TensorProto], path: Path) -> None:
    first = initializers[0]
    output = helper.make_tensor_value_info(first.name, first.data_type, list(first.dims))
    graph = helper.make_graph([], "g", [], [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path.write_bytes(model.SerializeToString())


def build_models(folder: Path, count: int) -> dict[str, Path]:
    """Write the three models into ``folder``; return their paths by name."""
    external = []
    for i in range(count):
        tensor = onnx.TensorProto(name=f"w{i}", data_type=onnx.TensorProto.FLOAT, dims=[16])
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", "weights.bin"), ("offset", str(i * 64)), ("length", "64")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        external.append(tensor)
    paths = {name: folder / f"{name}.onnx" for name in ("external", "inline64", "inline1k")}
    _save(external, paths["external"])
    _save([numpy_helper.from_array(np.full(16, i, np.float32), f"w{i}") for i in range(count)], paths["inline64"])
    _save([numpy_helper.from_array(np.full(256, i, np.float32), f"w{i}") for i in range(count)], paths["inline1k"])
    return paths


def _load_module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("wire_compared", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path!r} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--min-length", type=int, nargs="+", default=[0, 4096])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare-with", help="another io/_read/wire.py to time in the same rounds")
    args = parser.parse_args(argv)
    versions: dict[str, ModuleType] = {"current": wire}
    if args.compare_with:
        versions = {"compared": _load_module(args.compare_with), **versions}
    with tempfile.TemporaryDirectory(prefix="wire_scan_timing_") as tmp:
        paths = build_models(Path(tmp), args.count)
        for name, path in paths.items():
            runs: dict[str, Callable[[], object]] = {}
            for min_length in args.min_length:
                for label, module in versions.items():
                    runs[f"{label} min_length={min_length}"] = partial(module.load_model_stripped, path, min_length)
            runs["onnx.load"] = partial(onnx.load, str(path), load_external_data=False)
            times: dict[str, list[float]] = {label: [] for label in runs}
            for _ in range(args.rounds):
                for label, run in runs.items():
                    start = time.perf_counter()
                    run()
                    times[label].append(time.perf_counter() - start)
            print(f"{name} ({args.count} initializers, {path.stat().st_size} bytes)")
            for label, values in times.items():
                best, median = min(values) * 1000, statistics.median(values) * 1000
                print(f"  {label:28s} best {best:7.1f} ms  median {median:7.1f} ms")


if __name__ == "__main__":
    main()
