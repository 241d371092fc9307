"""``inspect`` compares every reference into a ``.safetensors`` file with the file's own header.

The story of the issue: a model linked to a checkpoint (no byte copied), then the checkpoint re-saved with
``metadata={"format": "pt"}``: the header grew, every tensor moved, the linked model read header text and the wrong
tensors' bytes as its weights. ``verify`` noticed; ``inspect`` said OK, since every reference was still in bounds. Now
such a reference is a ``header mismatch`` error, in the API and the CLI (exit status 1), and what a writer of this
package writes still inspects OK.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import safetensors.numpy as st_numpy

from onnx_light_ref import link_external_data, verify_models
from onnx_light_ref.errors import SafetensorsReferenceError
from onnx_light_ref.io._layout_report import build_layout_report
from tests.checks import sha256_of_tree
from tests.cli_runner import run_cli
from tests.models import external_tensor, make_model, mlp_model, save_external, value_info

RNG = np.random.default_rng(11)
WEIGHTS = {
    "w1": RNG.standard_normal((16, 32)).astype(np.float32),
    "b1": RNG.standard_normal(32).astype(np.float32),
    "w2": RNG.standard_normal((32, 4)).astype(np.float32),
    "b2": RNG.standard_normal(4).astype(np.float32),
}


def _inspect(path: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("inspect", str(path))


def _linked(folder: Path, checkpoint: dict[str, np.ndarray], name_map: dict[str, str] | None = None) -> Path:
    src = save_external(mlp_model(WEIGHTS), folder / "src.onnx", "src.data")
    st_numpy.save_file(checkpoint, str(folder / "ckpt.safetensors"))
    link_external_data(src, folder / "ckpt.safetensors", folder / "linked.onnx", name_map=name_map, size_threshold=0)
    assert build_layout_report(folder / "linked.onnx").ok
    return folder / "linked.onnx"


def test_a_checkpoint_re_saved_with_metadata_makes_every_linked_reference_a_header_mismatch(tmp_path: Path) -> None:
    linked = _linked(tmp_path, WEIGHTS)
    st_numpy.save_file(WEIGHTS, str(tmp_path / "ckpt.safetensors"), metadata={"format": "pt"})  # the header grows
    before = sha256_of_tree(tmp_path)
    report = build_layout_report(linked)
    assert not report.ok
    assert {t.name: t.status for t in report.tensors} == dict.fromkeys(WEIGHTS, "header mismatch")
    messages = " ".join(t.message for t in report.tensors)
    assert "disagree with the safetensors header entry of the same key" in messages
    out = _inspect(linked)
    assert out.returncode == 1
    assert f"status: {len(WEIGHTS)} error(s)" in out.stdout and "status: OK" not in out.stdout
    assert "header mismatch: tensor 'w1': bytes [" in out.stdout
    # verify refuses what inspect reports, with its message (before: it compared the wrong bytes, "different").
    with pytest.raises(SafetensorsReferenceError) as refused:
        verify_models(tmp_path / "src.onnx", linked)
    assert str(refused.value) in {t.message for t in report.tensors}
    assert sha256_of_tree(tmp_path) == before  # inspect and verify read headers, never write


def test_a_reference_reaching_into_the_header_says_it_would_read_header_text(tmp_path: Path) -> None:
    linked = _linked(tmp_path, WEIGHTS)
    # A long metadata value pushes every tensor past its old offset: the first one now starts inside the header.
    st_numpy.save_file(WEIGHTS, str(tmp_path / "ckpt.safetensors"), metadata={"note": "x" * 4096})
    report = build_layout_report(linked)
    overlapping = [t for t in report.tensors if "overlap its safetensors header" in t.message]
    assert overlapping and all(t.status == "header mismatch" for t in overlapping)
    assert "header text as weights" in overlapping[0].message
    out = _inspect(linked)
    assert out.returncode == 1 and "overlap its safetensors header (file offsets [0, " in out.stdout


def test_a_tensor_linked_through_a_name_map_is_checked_against_the_key_it_reads(tmp_path: Path) -> None:
    checkpoint = {"layers.0.w": WEIGHTS["w1"], "layers.0.b": WEIGHTS["b1"], "w2": WEIGHTS["w2"], "b2": WEIGHTS["b2"]}
    linked = _linked(tmp_path, checkpoint, {"w1": "layers.0.w", "b1": "layers.0.b"})
    st_numpy.save_file(checkpoint, str(tmp_path / "ckpt.safetensors"), metadata={"format": "pt"})
    report = build_layout_report(linked)
    statuses = {t.name: t.status for t in report.tensors}
    assert statuses == dict.fromkeys(WEIGHTS, "header mismatch")
    mapped = {t.name: t.message for t in report.tensors}["w1"]
    assert "are no key of the safetensors header" in mapped or "overlap its safetensors header" in mapped
    assert _inspect(linked).returncode == 1


def _hand_linked(folder: Path, dtype: int, dims: list[int], offset: int, length: int, name: str = "w") -> Path:
    """A model whose one tensor points at ``[offset, offset + length)`` of ``ckpt.safetensors``."""
    array = np.zeros(dims, onnx.helper.tensor_dtype_to_np_dtype(dtype))
    entries = [("location", "ckpt.safetensors"), ("offset", str(offset)), ("length", str(length))]
    tensor = external_tensor(name, array, entries)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", [name], ["y"])], "g", [], [value_info("y", dtype, dims)], [tensor]
    )
    path = folder / "model.onnx"
    path.write_bytes(make_model(graph).SerializeToString())
    return path


def _data_start(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("other dtype", "the safetensors header entry of the same key is F32 [4], not I32 [4] (16 bytes)"),
        ("other shape", "the safetensors header entry of the same key is F32 [4], not F32 [2, 2] (16 bytes)"),
        ("other key's bytes", "; they are key 'v' (F32 [4])"),
        ("half of its key", "disagree with the safetensors header entry of the same key"),
        ("straddling keys", "are no key of the safetensors header; they cut across key(s) 'v', 'w'"),
    ],
)
def test_a_reference_that_disagrees_with_the_header_entry_is_an_error(tmp_path: Path, case: str, message: str) -> None:
    st_numpy.save_file(
        {"v": np.ones(4, np.float32), "w": np.arange(4, dtype=np.float32)}, str(tmp_path / "ckpt.safetensors")
    )
    start = _data_start(tmp_path / "ckpt.safetensors")  # "v" at [0, 16), "w" at [16, 32) (sorted by name)
    float_ = onnx.TensorProto.FLOAT
    model = {
        "other dtype": lambda: _hand_linked(tmp_path, onnx.TensorProto.INT32, [4], start + 16, 16),
        "other shape": lambda: _hand_linked(tmp_path, float_, [2, 2], start + 16, 16),
        "other key's bytes": lambda: _hand_linked(tmp_path, float_, [4], start, 16),
        "half of its key": lambda: _hand_linked(tmp_path, float_, [2], start + 16, 8),
        "straddling keys": lambda: _hand_linked(tmp_path, float_, [4], start + 8, 16, name="x"),
    }[case]()
    report = build_layout_report(model)
    (tensor,) = report.tensors
    assert tensor.status == "header mismatch", tensor.message
    assert message in tensor.message
    out = _inspect(model)
    assert out.returncode == 1 and "header mismatch: " in out.stdout


def test_a_reference_by_range_to_a_key_of_its_dtype_and_shape_is_ok(tmp_path: Path) -> None:
    """A tensor whose name is no key (linked through a name map) reading exactly one key's bytes of its type."""
    st_numpy.save_file({"v": np.ones(4, np.float32)}, str(tmp_path / "ckpt.safetensors"))
    model = _hand_linked(tmp_path, onnx.TensorProto.FLOAT, [4], _data_start(tmp_path / "ckpt.safetensors"), 16, "y0")
    report = build_layout_report(model)
    assert report.ok, report.tensors
    out = _inspect(model)
    assert out.returncode == 0 and "status: OK" in out.stdout
