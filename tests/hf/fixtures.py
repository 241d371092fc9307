"""The committed real exports of ``tests/fixtures/hf/`` (``make_fixtures.py`` says how they were made): copies in a
test's folder, the inputs they declare, and their outputs in onnxruntime and in our evaluator."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference.op_run import RuntimeTypeError

from onnx_light_ref import reference_evaluator
from tests.checks import onnxruntime_session

__all__ = ["CHECKPOINTS", "FIXTURES", "copy_fixture", "evaluate", "feeds_for", "run_ort"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"
CHECKPOINTS = {
    "llama": "checkpoint/model.safetensors.index.json",
    "qwen2": "checkpoint/model.safetensors",
    "bert": "checkpoint/model.safetensors",
}
_SEQ, _VOCAB = 8, 128


def copy_fixture(model: str, tmp_path: Path) -> Path:
    """A copy of ``tests/fixtures/hf/<model>`` in ``tmp_path`` (its checkpoint and every export)."""
    folder = tmp_path / model
    shutil.copytree(FIXTURES / model, folder)
    return folder


def feeds_for(path: Path) -> dict[str, np.ndarray]:
    """Every input the ``.onnx`` declares, as ``make_fixtures.py`` documents them."""
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    values = {
        "input_ids": (np.arange(_SEQ) % _VOCAB).reshape(1, _SEQ),
        "position_ids": np.arange(_SEQ).reshape(1, _SEQ),
        "logits_to_keep": np.array(0),
    }
    ones = np.ones((1, _SEQ), dtype=np.int64)
    return {i.name: values.get(i.name, ones).astype(np.int64) for i in graph.input if i.name not in initializers}


def run_ort(path: Path) -> list[np.ndarray]:
    """The outputs of an onnxruntime CPU session."""
    return [np.asarray(out) for out in onnxruntime_session(path).run(None, feeds_for(path))]


def evaluate(path: Path) -> list[np.ndarray]:
    """The outputs of our lazy evaluator (the only one that runs the bfloat16 Qwen2: onnxruntime has no bf16 Mul).

    Skips the calling test (after what it checked before) when the installed onnx's evaluator cannot compute in
    bfloat16 (onnx 1.17, the floor: "Output type mismatch ... (operator 'MatMul')"; onnx >= 1.19 computes with
    ml_dtypes).
    """
    with reference_evaluator(str(path)) as evaluator:
        try:
            return [np.asarray(out) for out in evaluator.run(None, feeds_for(path))]
        except RuntimeTypeError as exc:
            if "bfloat16" not in str(exc):
                raise
            pytest.skip(f"onnx {onnx.__version__}'s evaluator cannot compute in bfloat16: {str(exc)[:80]}")
