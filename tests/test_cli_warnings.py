"""Silent full copies (issue 29): a link that matches no checkpoint key, and a shared save of a model loaded with its
weights, both succeed by writing every byte again. The library warns (``logging``, so the CLI shows it on stderr),
naming the fix; a call that does share or link stays silent."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from safetensors.numpy import save_file

from onnx_light_ref import link_external_data, save_model_with_shared_external_data, verify_models
from tests.models import make_external_model

WEIGHTS = {f"layer{i}.weight": np.full((32, 32), i, np.float32) for i in range(4)}  # 4 KiB each
KEYS = {f"layer{i}.weight": f"model.layers.{i}.w" for i in range(4)}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """``layers.onnx`` (+ its data file) and ``ckpt.safetensors`` holding the same tensors under other names."""
    make_external_model(tmp_path, WEIGHTS, name="layers.onnx")
    save_file({KEYS[name]: array for name, array in WEIGHTS.items()}, str(tmp_path / "ckpt.safetensors"))
    return tmp_path


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("onnx_light")]


def test_a_link_matching_no_key_warns_that_it_is_a_full_copy(folder: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        result = link_external_data(folder / "layers.onnx", folder / "ckpt.safetensors", folder / "linked.onnx")

    assert (result.linked_tensors, result.written_tensors, result.written_bytes) == (0, 4, 4 * 4096)
    (warning,) = warnings_of(caplog)
    assert warning.startswith("no tensor was linked: none of the model's names is a checkpoint key")
    assert f"{folder / 'linked.onnx.data'} holds a full copy of the weights (4 tensors, 16384 bytes)" in warning
    assert "name_map= (command line: --map names.json)" in warning
    assert "Model tensors: layer0.weight, layer1.weight, layer2.weight, layer3.weight" in warning
    assert "checkpoint keys: model.layers.0.w, model.layers.1.w, model.layers.2.w, model.layers.3.w." in warning
    assert verify_models(folder / "layers.onnx", folder / "linked.onnx").equal  # a valid model, just not linked


def test_a_link_that_links_is_silent(folder: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        result = link_external_data(
            folder / "layers.onnx", folder / "ckpt.safetensors", folder / "linked.onnx", name_map=KEYS
        )

    assert (result.linked_tensors, result.written_bytes) == (4, 0)
    assert warnings_of(caplog) == []


def test_the_cli_shows_the_link_warning(folder: Path) -> None:
    """In a child: the command line's logging set-up (pytest's own handlers would catch the record in-process)."""
    argv = ["link", "layers.onnx", "ckpt.safetensors", "linked.onnx", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "onnx_light_ref", *argv], cwd=folder, capture_output=True, text=True, check=False
    )

    assert done.returncode == 0, done.stderr
    assert "0 tensors linked to the checkpoint" in done.stdout
    (line,) = done.stderr.splitlines()
    assert line.startswith("WARNING no tensor was linked") and "--map names.json" in line


def test_a_shared_save_of_a_model_loaded_with_its_weights_warns(folder: Path, caplog) -> None:
    """The usual slip: ``onnx.load(path)`` reads every weight in and drops the references the saver would reuse."""
    variant = onnx.load(folder / "layers.onnx")  # load_external_data=True: the slip

    with caplog.at_level(logging.WARNING):
        written = save_model_with_shared_external_data(variant, folder / "variant.onnx")

    assert (written.reused_tensors, written.new_tensors) == (0, 4)
    (warning,) = warnings_of(caplog)
    assert warning.startswith("nothing is shared: no tensor of the model is external, so all 4 of them")
    assert f"(16384 bytes) are written to {folder / 'variant.onnx.data'}" in warning
    assert "onnx.load(path, load_external_data=False)" in warning


def test_a_shared_save_that_reuses_is_silent(folder: Path, caplog) -> None:
    variant = onnx.load(folder / "layers.onnx", load_external_data=False)
    variant.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.zeros((32, 32), np.float32), "layer0.weight"))

    with caplog.at_level(logging.WARNING):
        written = save_model_with_shared_external_data(variant, folder / "variant.onnx")

    assert (written.reused_tensors, written.new_tensors) == (3, 1)
    assert warnings_of(caplog) == []
