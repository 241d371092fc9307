"""Per-tensor cost (issue 43): ``align`` and ``verify`` of a model of 100,000 external tensors of 256 bytes, back
to back in one file (25.6 MB of bytes: the cost is the metadata), against ``onnx.load`` of the same metadata.

A mixture-of-experts export carries tens of thousands of tensors (a DeepSeek-V3-sized one ~90,000): Python spent
per tensor becomes the whole run. The aligner re-aligns at 64 bytes (every tensor stays where it is: no padding to
copy); ``verify`` compares the source with that copy in another folder (every byte read from both files). At
``tiny`` size the model has 2,000 tensors (the suite's quick check that the scenario works); at every real size,
100,000: the targets are absolute (at most 1 s each).

No assertion here is about time: ``python -m benchmarks.report`` prints each against its target.
"""

from __future__ import annotations

from typing import Any

from benchmarks.conftest import BenchConfig, Method, ModelCache
from benchmarks.models import make_metadata_model

_TENSORS = 100_000
_TINY_TENSORS = 2_000
_TENSOR_BYTES = 256
_ALIGNMENT = 64
_CHUNK = 4 * 1024 * 1024


def test_metadata(compare: Any, models: ModelCache, bench_config: BenchConfig) -> None:
    from onnx_light_ref import align_external_data_streaming

    count = _TINY_TENSORS if bench_config.is_tiny else _TENSORS
    model = make_metadata_model(models.root / f"metadata-{count}", count, _TENSOR_BYTES)
    copy = models.root / f"metadata-{count}-aligned" / "model.onnx"
    if not copy.exists():
        copy.parent.mkdir()
        align_external_data_streaming(model.onnx_path, copy, alignment=_ALIGNMENT, durable=False)
    methods = [
        Method(
            "align",
            "align_streaming",
            {"src": model.onnx_path, "dst": "{fresh}/out.onnx", "alignment": _ALIGNMENT, "chunk_size": _CHUNK},
        ),
        Method("verify", "verify", {"a": model.onnx_path, "b": str(copy), "chunk_size": _CHUNK}),
        Method("onnx_load", "onnx_load_metadata", {"src": model.onnx_path}),
    ]
    summary = compare("metadata", methods, tensor_count=count, tensor_bytes=_TENSOR_BYTES, alignment=_ALIGNMENT)
    assert summary["align"]["extra"]["bytes_written"] == count * _TENSOR_BYTES
    assert summary["verify"]["extra"]["equal"] is True
    assert summary["verify"]["extra"]["bytes_compared"] == count * _TENSOR_BYTES
    assert summary["onnx_load"]["extra"]["tensors"] == count
