"""What rule 1 of the writer contract costs (issue 38): re-aligning a 64-byte model whose destination has a large
``.onnx`` two folders up, which the guard reads for the files it references.

* ``guard``: ``align_external_data_streaming`` of a model with one 64-byte tensor into a fresh ``a/b/model.onnx``,
  alone, and with an ``ancestor.onnx`` two folders above it: a valid model of 2 GiB (just under protobuf's limit;
  16 MiB below ``1G``) whose bulk is one ``raw_data``, its ``doc_string``, packed ``float_data``, or ``string_data``
  of 64 KiB strings (:func:`benchmarks.models.make_ancestor_model`: holes of sparse files, generated once). The
  ancestor references ``elsewhere.bin``, so every write succeeds: what is measured is reading it.

Before this change the guard parsed such a model (all but its large ``raw_data``) 3-4 times per write: 5.6-8.7 s
and +512 MiB of peak RSS for a 256 MiB ``.onnx``; over 2 GiB it counted as unreadable and refused the write
(``benchmarks/README.md`` has the before and after of a 2 GiB one). Targets (``python -m benchmarks.report``): at
most 0.5 s and 32 MiB above the baseline whatever the ancestor holds.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from benchmarks.checks import ALIGNMENT, DEFAULT_CHUNK, require
from benchmarks.conftest import BenchConfig, Method
from benchmarks.models import ANCESTOR_KINDS, GIB, MIB, make_ancestor_model

ANCESTOR_AT_1G = 2 * GIB  # the size; the file stays just under protobuf's 2 GiB (valid for onnx.load)
ANCESTOR_SMALL = 16 * MIB


@pytest.fixture(scope="module")
def guard_scene(tmp_path_factory: pytest.TempPathFactory, bench_config: BenchConfig) -> Iterator[dict[str, Any]]:
    """The 64-byte source model and one ancestor per kind, deleted when the module ends."""
    root = tmp_path_factory.mktemp("bench-guard")
    weights = onnx.numpy_helper.from_array(np.arange(16, dtype=np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["w"], ["y"])],
        "source",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [16])],
        initializer=[weights],
    )
    source = str(root / "source.onnx")
    onnx.save_model(onnx.helper.make_model(graph), source, save_as_external_data=True, location="w.bin",
                    size_threshold=0)  # fmt: skip
    size = ANCESTOR_AT_1G if bench_config.total >= GIB else ANCESTOR_SMALL
    ancestors = {kind: make_ancestor_model(root / f"{kind}.onnx", kind, size) for kind in ANCESTOR_KINDS}
    yield {"source": source, "ancestors": ancestors, "size": size}
    shutil.rmtree(root, ignore_errors=True)


def test_guard(compare: Any, benchmark: Any, guard_scene: dict[str, Any]) -> None:
    common = {"src": guard_scene["source"], "dst": "{fresh}/a/b/model.onnx", "alignment": ALIGNMENT,
              "chunk_size": DEFAULT_CHUNK}  # fmt: skip
    methods = [Method("alone", "align_below", common)]
    methods += [
        Method(kind, "align_below", {**common, "ancestor": path}) for kind, path in guard_scene["ancestors"].items()
    ]
    summary = compare(
        "guard",
        methods,
        ancestor_bytes=guard_scene["size"],
        file_bytes={kind: Path(path).stat().st_size for kind, path in guard_scene["ancestors"].items()},
    )
    require(summary, ["alone", *ANCESTOR_KINDS], benchmark.extra_info.get("skipped"))
    for label in ("alone", *ANCESTOR_KINDS):
        assert summary[label]["extra"]["bytes_written"] == 64  # the one tensor, at offset 0
