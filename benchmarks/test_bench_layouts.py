"""Layouts of issue 11: dedup, size-capped shards and verify, against plain streaming, onnx-ir and raw reads.

* ``dedup-none``: ``dedup=True`` on the ``large`` model (64 tensors of equal length, no two identical: every tensor
  is a candidate and must be read once more) vs plain streaming;
* ``dedup-30``: the same shape where 30 % of the tensors repeat earlier ones: plain streaming writes them all,
  ``dedup=True`` writes exactly the unique bytes (asserted here);
* ``shards``: streaming with ``max_shard_size`` (256 MiB at 1 GiB: 4 files) vs one file, and onnx-ir's
  ``ir.save(max_shard_size_bytes=..., alignment=4096, align_threshold=0)`` on the same model (± fsync);
* ``verify``: ``verify_models`` of the ``large`` model against a distinct copy at aligned offsets vs reading both
  weight sets once with a plain ``preadv`` loop (the reads verify cannot avoid).

No assertion here is about time or memory: targets are checked and printed by ``python -m benchmarks.report``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.checks import ALIGNMENT, DEFAULT_CHUNK, aligned_size, require
from benchmarks.conftest import BenchConfig, Method, ModelCache
from benchmarks.models import MIB, AlignModel, DedupModel, make_aligned_copy, make_dedup_model, scaled

DUPLICATE_FRACTION = 0.3
SHARD_AT_1G = 256 * MIB
_DST = "{fresh}/out.onnx"


class LayoutModels:
    """The models only this module uses, generated on first use and deleted when the module ends."""

    def __init__(self, root: Path, total: int, shared: ModelCache) -> None:
        self.root, self.total, self.shared = root, total, shared
        self._dedup: DedupModel | None = None
        self._aligned_copy: AlignModel | None = None

    def dedup(self) -> DedupModel:
        if self._dedup is None:
            self._dedup = make_dedup_model(self.root / "dedup", self.total, DUPLICATE_FRACTION)
        return self._dedup

    def aligned_copy(self) -> AlignModel:
        if self._aligned_copy is None:
            self._aligned_copy = make_aligned_copy(self.shared.align("large"), self.root / "aligned-copy")
        return self._aligned_copy


@pytest.fixture(scope="module")
def layout_models(
    tmp_path_factory: pytest.TempPathFactory, bench_config: BenchConfig, models: ModelCache
) -> Iterator[LayoutModels]:
    root = tmp_path_factory.mktemp("bench-layouts")
    yield LayoutModels(root, bench_config.total, models)
    shutil.rmtree(root, ignore_errors=True)


def _streaming(label: str, model: AlignModel, **options: Any) -> Method:
    args = {"src": model.onnx_path, "dst": _DST, "alignment": ALIGNMENT, "chunk_size": DEFAULT_CHUNK}
    return Method(label, "align_streaming", {**args, "list_files": True, **options})


def _info(model: AlignModel) -> dict[str, Any]:
    return {
        "shape": model.shape,
        "tensor_count": model.tensor_count,
        "tensor_bytes": model.tensor_bytes,
        "payload_bytes": model.payload_bytes,
        "chunk_size": DEFAULT_CHUNK,
    }


def test_dedup_no_duplicates(compare: Any, benchmark: Any, models: ModelCache) -> None:
    model = models.align("large")
    summary = compare("dedup-none", [_streaming("streaming", model), _streaming("dedup", model, dedup=True)],
                      **_info(model), unique_bytes=model.payload_bytes)  # fmt: skip
    require(summary, ["streaming", "dedup"], benchmark.extra_info.get("skipped"))
    expected = aligned_size(model.tensor_count, model.tensor_bytes)
    assert summary["streaming"]["extra"]["bytes_written"] == expected
    assert summary["dedup"]["extra"]["bytes_written"] == expected  # nothing merged: no two tensors are equal
    for label in ("streaming", "dedup"):
        assert summary[label]["extra"]["deduplicated_tensors"] == summary[label]["extra"]["deduplicated_bytes"] == 0


def test_dedup_duplicates(compare: Any, benchmark: Any, layout_models: LayoutModels) -> None:
    model = layout_models.dedup()
    assert 0.25 < 1 - model.unique_count / model.tensor_count < 0.35
    summary = compare("dedup-30", [_streaming("streaming", model), _streaming("dedup", model, dedup=True)],
                      **_info(model), unique_bytes=model.unique_bytes, unique_count=model.unique_count)  # fmt: skip
    require(summary, ["streaming", "dedup"], benchmark.extra_info.get("skipped"))
    assert summary["streaming"]["extra"]["bytes_written"] == aligned_size(model.tensor_count, model.tensor_bytes)
    # Tensor sizes are multiples of the alignment: the deduplicated file is exactly the unique bytes, no padding.
    assert summary["dedup"]["extra"]["bytes_written"] == model.unique_bytes
    assert sum(summary["dedup"]["extra"]["files"].values()) == model.unique_bytes
    duplicates = model.tensor_count - model.unique_count
    assert summary["dedup"]["extra"]["deduplicated_tensors"] == duplicates
    assert summary["dedup"]["extra"]["deduplicated_bytes"] == duplicates * model.tensor_bytes
    assert summary["dedup"]["extra"]["payload_bytes"] == model.unique_bytes
    assert summary["streaming"]["extra"]["deduplicated_tensors"] == 0  # equal bytes, distinct source ranges


def test_shards(compare: Any, benchmark: Any, models: ModelCache, bench_config: BenchConfig) -> None:
    model = models.align("large")
    shard = scaled(bench_config.total, SHARD_AT_1G)
    ir_args = {"src": model.onnx_path, "dst": _DST, "location": "out.onnx.data", "alignment": ALIGNMENT,
               "max_shard_size": shard, "align_threshold": 0}  # fmt: skip
    methods = [
        _streaming("one_file", model),
        _streaming("sharded", model, max_shard_size=shard),
        Method("onnx_ir_sharded", "onnx_ir_save", {**ir_args, "fsync": False}),
        Method("onnx_ir_sharded_fsync", "onnx_ir_save", {**ir_args, "fsync": True}),
    ]
    summary = compare("shards", methods, **_info(model), max_shard_size=shard)
    require(summary, [m.label for m in methods], benchmark.extra_info.get("skipped"))
    total = aligned_size(model.tensor_count, model.tensor_bytes)
    assert summary["one_file"]["extra"]["files"] == {"out.onnx.data": total}
    files = summary["sharded"]["extra"]["files"]
    per_shard = shard // model.tensor_bytes
    count = -(-model.tensor_count // per_shard)
    assert count > 1
    assert sorted(files) == sorted(["out.onnx.data", *(f"out.onnx.data.{i}" for i in range(1, count))])
    assert summary["sharded"]["extra"]["weights_files"] == ["out.onnx.data", *(f"out.onnx.data.{i}" for i in
                                                                             range(1, count))]  # fmt: skip
    assert summary["sharded"]["extra"]["shard_count"] == count
    assert summary["one_file"]["extra"]["shard_count"] == 1
    assert all(size <= shard for size in files.values())
    assert sum(files.values()) == summary["sharded"]["extra"]["bytes_written"] == total  # offsets restart at 0
    assert len(summary["onnx_ir_sharded"]["extra"]["files"]) > 1
    assert summary["onnx_ir_sharded"]["extra"]["bytes_written"] >= model.payload_bytes


def test_verify(compare: Any, benchmark: Any, models: ModelCache, layout_models: LayoutModels) -> None:
    a, b = models.align("large"), layout_models.aligned_copy()
    methods = [
        Method("verify", "verify", {"a": a.onnx_path, "b": b.onnx_path, "chunk_size": DEFAULT_CHUNK}),
        Method("read_both", "read_ranges", {"models": [a.onnx_path, b.onnx_path], "chunk_size": DEFAULT_CHUNK}),
    ]
    summary = compare("verify", methods, **_info(a))
    require(summary, ["verify", "read_both"], benchmark.extra_info.get("skipped"))
    assert summary["verify"]["extra"] == {"equal": True, "bytes_compared": a.payload_bytes}
    assert summary["read_both"]["extra"]["bytes_read"] == 2 * a.payload_bytes
