"""Models whose external data onnx-ir's ``save_safetensors`` wrote go through every entry point like any other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from safetensors import safe_open

from onnx_light_ref import align_external_data_streaming, verify_models
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.ops import delay_initializers, reference_evaluator, undelay_initializers
from tests.checks import run_onnxruntime
from tests.models import mlp_model

WEIGHTS = {
    "w1": np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32),
    "b1": np.random.default_rng(1).standard_normal(16).astype(np.float32),
    "w2": np.random.default_rng(2).standard_normal((16, 4)).astype(np.float32),
    "b2": np.random.default_rng(3).standard_normal(4).astype(np.float32),
}


@pytest.fixture(params=[None, 600], ids=["one-file", "sharded"])
def ir_model(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, onnx.ModelProto, dict[str, np.ndarray]]:
    """An MLP saved by onnx-ir with its weights in safetensors (sharded: model-0000i-of-0000N.safetensors)."""
    proto = mlp_model(WEIGHTS)
    folder = tmp_path / "ir"
    folder.mkdir()
    path = folder / "model.onnx"
    ir.save_safetensors(ir.from_proto(proto), path, size_threshold_bytes=0, max_shard_size_bytes=request.param)
    feeds = {proto.graph.input[0].name: np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)}
    return path, proto, feeds


def test_onnx_ir_output_is_real_safetensors_and_loads(ir_model: tuple[Path, onnx.ModelProto, dict]) -> None:
    path, _proto, feeds = ir_model
    files = sorted(path.parent.glob("*.safetensors"))
    assert files
    for file in files:
        with safe_open(str(file), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                assert np.array_equal(f.get_tensor(key), WEIGHTS[key])
    assert run_onnxruntime(path, feeds)


def test_align_verify_and_inspect_read_onnx_ir_safetensors(
    ir_model: tuple[Path, onnx.ModelProto, dict], tmp_path: Path
) -> None:
    path, _proto, feeds = ir_model
    expected = run_onnxruntime(path, feeds)
    for fmt in ("onnx", "safetensors"):
        dst = tmp_path / fmt / "model.onnx"
        dst.parent.mkdir()
        align_external_data_streaming(path, dst, weights_format=fmt)  # type: ignore[arg-type]
        onnx.checker.check_model(str(dst), full_check=True)
        assert all(np.array_equal(a, b) for a, b in zip(expected, run_onnxruntime(dst, feeds), strict=True))
        assert verify_models(path, dst).equal
    report = build_layout_report(path)
    assert report.ok
    assert all(file.safetensors is not None and file.safetensors_ok for file in report.files)
    out = subprocess.run(
        [sys.executable, "-m", "onnx_light_ref", "inspect", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and "data section fully covered" in out.stdout


def test_undelay_and_the_lazy_evaluator_read_onnx_ir_safetensors(ir_model: tuple[Path, onnx.ModelProto, dict]) -> None:
    path, _proto, feeds = ir_model
    expected = run_onnxruntime(path, feeds)
    evaluator = reference_evaluator(path)
    got = evaluator.run(None, feeds)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(expected, got, strict=True))
    delayed = path.parent / "delayed.onnx"
    delayed.write_bytes(delay_initializers(path).SerializeToString())
    undelayed = path.parent / "undelayed.onnx"
    undelay_initializers(delayed, undelayed)
    assert all(np.array_equal(a, b) for a, b in zip(expected, run_onnxruntime(undelayed, feeds), strict=True))


def test_inspect_says_a_data_section_not_fully_covered_is_refused(tmp_path: Path) -> None:
    proto = mlp_model(WEIGHTS)
    path = tmp_path / "model.onnx"
    ir.save_safetensors(ir.from_proto(proto), path, size_threshold_bytes=0)
    with open(tmp_path / "model.safetensors", "ab") as file:  # trailing bytes no tensor covers
        file.write(b"\0" * 100)
    report = build_layout_report(path)
    (file_layout,) = report.files
    assert not file_layout.safetensors_ok
    assert (
        file_layout.safetensors is not None and "NOT fully covered: 100 bytes in 1 range(s)" in file_layout.safetensors
    )
    out = subprocess.run(
        [sys.executable, "-m", "onnx_light_ref", "inspect", str(path)], capture_output=True, text=True, check=False
    )
    assert "REFUSED by the safetensors library: safetensors header" in out.stdout and "NOT fully covered" in out.stdout
    # safetensors refuses the file, so inspect does not call the model OK (onnx still loads its weights).
    assert not report.ok and {t.status for t in report.tensors} == {"safetensors refuses"}
    assert out.returncode == 1 and f"status: {len(report.tensors)} error(s)" in out.stdout
