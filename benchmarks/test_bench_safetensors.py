"""Issue 21: streaming safetensors output against onnx-ir's ``save_safetensors``, and ``link`` of a checkpoint.

* ``safetensors-large`` / ``safetensors-small``: ``align_external_data_streaming(weights_format="safetensors")``
  (durable, and ``durable=False``) vs onnx-ir ``ir.load`` + ``ir.save_safetensors`` (± fsync; it materializes each
  shard in memory) vs ``copy_file_range`` of the same ranges to aligned offsets + fsync (the disk's limit);
* ``link``: ``link_external_data`` of the *small* model (many tensors) to a safetensors checkpoint of the same
  tensors, in the checkpoint's folder (durable, and ``durable=False`` to show what the fsyncs cost): bytes written
  (the ``.onnx`` only) and time per 1000 tensors, vs writing the same safetensors file again with the streaming
  aligner (what a copy costs).

No assertion here is about time or memory: they only check that every contender did its job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.checks import ALIGNMENT, DEFAULT_CHUNK, require
from benchmarks.conftest import Method, ModelCache
from benchmarks.models import AlignModel

_DST = "{fresh}/model.onnx"


def _info(model: AlignModel) -> dict[str, Any]:
    return {
        "shape": model.shape,
        "tensor_count": model.tensor_count,
        "tensor_bytes": model.tensor_bytes,
        "payload_bytes": model.payload_bytes,
        "chunk_size": DEFAULT_CHUNK,
    }


def _streaming(label: str, model: AlignModel, **options: Any) -> Method:
    args = {"src": model.onnx_path, "dst": _DST, "alignment": ALIGNMENT, "chunk_size": DEFAULT_CHUNK}
    return Method(label, "align_streaming", {**args, "list_files": True, "weights_format": "safetensors", **options})


@pytest.mark.parametrize("shape", ["large", "small"])
def test_safetensors_output(compare: Any, benchmark: Any, models: ModelCache, shape: str) -> None:
    model = models.align(shape)
    ir_args = {"src": model.onnx_path, "dst": _DST}
    methods = [
        _streaming("streaming", model),
        _streaming("streaming_no_fsync", model, durable=False),
        Method("onnx_ir", "onnx_ir_save_safetensors", {**ir_args, "fsync": False}),
        Method("onnx_ir_fsync", "onnx_ir_save_safetensors", {**ir_args, "fsync": True}),
        Method(
            "copy_ranges",
            "copy_file_range_ranges",
            {"src": model.onnx_path, "dst": "{fresh}/copy.data", "alignment": ALIGNMENT},
        ),
    ]
    summary = compare(f"safetensors-{shape}", methods, **_info(model))
    require(summary, [m.label for m in methods], benchmark.extra_info.get("skipped"))
    for label in ("streaming", "streaming_no_fsync"):
        extra = summary[label]["extra"]
        assert extra["files"].keys() == {"model.safetensors"}
        assert extra["payload_bytes"] == model.payload_bytes
        assert extra["bytes_written"] == extra["files"]["model.safetensors"]
    assert summary["onnx_ir"]["extra"]["bytes_written"] >= model.payload_bytes


def test_link(compare: Any, benchmark: Any, models: ModelCache, tmp_path_factory: pytest.TempPathFactory) -> None:
    from onnx_light_ref.io import align_external_data_streaming

    model = models.align("small")
    folder = Path(tmp_path_factory.mktemp("checkpoint"))
    align_external_data_streaming(model.onnx_path, folder / "model.onnx", weights_format="safetensors", durable=False)
    checkpoint = str(folder / "model.safetensors")
    linked = str(folder / "linked-{run_id}.onnx")
    methods = [
        Method("link", "link", {"src": model.onnx_path, "checkpoint": checkpoint, "dst": linked}, (linked,)),
        Method(
            "link_no_fsync",
            "link",
            {"src": model.onnx_path, "checkpoint": checkpoint, "dst": linked, "durable": False},
            (linked,),
        ),
        _streaming("copy_safetensors", model),
    ]
    summary = compare("link", methods, **_info(model))
    require(summary, [m.label for m in methods], benchmark.extra_info.get("skipped"))
    extra = summary["link"]["extra"]
    assert extra["linked_tensors"] == model.tensor_count and extra["written_tensors"] == 0
    assert extra["linked_bytes"] == model.payload_bytes
    assert extra["bytes_written"] < model.payload_bytes
