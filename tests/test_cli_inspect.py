"""``onnx-light-ref inspect``: a user points it at a model and reads which tensors sit where, and what is broken."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref._cli import main
from onnx_light_ref._commands.inspect import format_alignment
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read.alignment import offset_alignment
from tests.models import make_model


def write_model(folder: Path, refs: dict[str, tuple[str, int]], files: dict[str, int]) -> Path:
    """A model with one float32 [16] (64-byte) initializer per entry of ``refs`` (name -> (location, offset)).

    ``files`` maps each data file to create to its size in bytes (zero-filled: inspect never reads the bytes).
    """
    for name, size in files.items():
        (folder / name).write_bytes(b"\0" * size)
    initializers = []
    for name, (location, offset) in refs.items():
        tensor = numpy_helper.from_array(np.zeros(16, dtype=np.float32), name)
        set_external_data(tensor, location, offset=offset, length=64)
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        initializers.append(tensor)
    nodes = [helper.make_node("Identity", [name], [f"out_{name}"]) for name in refs]
    outputs = [helper.make_tensor_value_info(f"out_{name}", TensorProto.FLOAT, [16]) for name in refs]
    graph = helper.make_graph(nodes, "layout", [], outputs, initializers)
    path = folder / "model.onnx"
    path.write_bytes(make_model(graph).SerializeToString())
    return path


def inspect(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["inspect", str(path)])
    return status, capsys.readouterr().out


def row(out: str, name: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.startswith(name + " "))


def test_packed_layout_from_onnx_writer(tmp_path, capsys):
    path = write_model(tmp_path, {"a": ("w.data", 0), "b": ("w.data", 64), "c": ("w.data", 128)}, {"w.data": 192})

    status, out = inspect(path, capsys)

    assert status == 0
    assert row(out, "a") == ["a", "w.data", "0", "64", "any", "ok"]
    assert row(out, "b") == ["b", "w.data", "64", "64", "64", "ok"]
    assert "w.data: 3 tensors, 192 bytes used of 192, 0 gap bytes in 0 gaps" in out
    assert "every offset is aligned to 64" in out
    assert out.rstrip().endswith("status: OK")


def test_aligned_layout_after_streaming_realignment(tmp_path, capsys):
    src = write_model(tmp_path, {"a": ("w.data", 0), "b": ("w.data", 64), "c": ("w.data", 128)}, {"w.data": 192})
    aligned = tmp_path / "aligned.onnx"
    align_external_data_streaming(src, aligned, alignment=4096)

    status, out = inspect(aligned, capsys)

    assert status == 0
    assert row(out, "c")[2:5] == ["8192", "64", "8K"]
    assert "every offset is aligned to 4K (4096 bytes)" in out
    # Padding between tensors is reported as gaps: 2 × (4096 - 64).
    assert "aligned.onnx.data: 3 tensors, 192 bytes used of 8256, 8064 gap bytes in 2 gaps" in out
    assert build_layout_report(aligned).common_alignment == 4096


def test_identical_ranges_are_shared_not_errors(tmp_path, capsys):
    path = write_model(tmp_path, {"a": ("w.data", 0), "tied": ("w.data", 0), "b": ("w.data", 64)}, {"w.data": 128})

    status, out = inspect(path, capsys)

    assert status == 0
    assert row(out, "a")[-2:] == ["shared", "(2)"]
    assert row(out, "tied")[-2:] == ["shared", "(2)"]
    assert "w.data: 3 tensors, 128 bytes used of 128" in out
    report = build_layout_report(path)
    assert report.tensors[0].shared_with == ["tied"]


def test_partial_overlap_is_an_error(tmp_path, capsys):
    path = write_model(tmp_path, {"a": ("w.data", 0), "b": ("w.data", 32), "c": ("w.data", 128)}, {"w.data": 192})

    status, out = inspect(path, capsys)

    assert status == 1
    assert row(out, "a")[-1] == "overlap" and row(out, "b")[-1] == "overlap" and row(out, "c")[-1] == "ok"
    assert "tensor 'a': range [0, +64 bytes) of 'w.data' partially overlaps [32, +64 bytes) of 'b'" in out
    # Used bytes count the union once; the bytes after 'b' until 'c' are a gap.
    assert "w.data: 3 tensors, 160 bytes used of 192, 32 gap bytes in 1 gap" in out
    assert "status: 2 error(s)" in out


def test_truncated_file_is_out_of_bounds(tmp_path, capsys):
    path = write_model(tmp_path, {"a": ("w.data", 0), "b": ("w.data", 64)}, {"w.data": 100})

    status, out = inspect(path, capsys)

    assert status == 1
    assert row(out, "a")[-1] == "ok"
    assert row(out, "b") == ["b", "w.data", "64", "64", "64", "out", "of", "bounds"]
    assert "exceeds the size of 'w.data' (100 bytes)" in out


def test_missing_file_and_unsafe_location_are_errors(tmp_path, capsys):
    sub = tmp_path / "model"
    sub.mkdir()
    (tmp_path / "outside.data").write_bytes(b"\0" * 64)
    path = write_model(
        sub, {"a": ("w.data", 0), "gone": ("gone.data", 0), "escape": ("../outside.data", 0)}, {"w.data": 64}
    )

    status, out = inspect(path, capsys)

    assert status == 1
    assert row(out, "gone")[-2:] == ["missing", "file"]
    assert row(out, "escape")[-2:] == ["unsafe", "location"]
    assert "gone.data: MISSING (1 tensors refer to it)" in out
    assert "contains a '..' component" in out
    assert "status: 2 error(s)" in out


def test_model_without_external_tensors(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "inline",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, dtype=np.float32), "w")],
    )
    path = tmp_path / "inline.onnx"
    onnx.save_model(helper.make_model(graph), str(path))

    status, out = inspect(path, capsys)

    assert status == 0
    assert "no external tensors and no DelayedInitializer node (1 inline)." in out


def test_missing_model_file(tmp_path, capsys):
    status = main(["inspect", str(tmp_path / "nope.onnx")])

    assert status == 1
    assert "not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("offset", "alignment", "shown"),
    [(0, 0, "any"), (48, 16, "16"), (4096, 4096, "4K"), (3 * 65536, 65536, "64K"), (2**31, 2**31, ">=1M")],
)
def test_offset_alignment_display(offset, alignment, shown):
    assert offset_alignment(offset) == alignment
    assert format_alignment(alignment) == shown


def test_a_safetensors_file_s_header_is_not_a_gap(tmp_path, capsys):
    """A safetensors file starts with its header (padded to the alignment): bytes of the file, not a gap between
    tensors; a file whose tensors cover its data section has no gap at all."""
    from onnx_light_ref import align_external_data_streaming
    from tests.models import make_external_model

    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", {"a": np.ones(1024, np.float32), "b": np.zeros(16, np.float32)})
    align_external_data_streaming(src, tmp_path / "model.onnx", weights_format="safetensors")

    status, out = inspect(tmp_path / "model.onnx", capsys)

    assert status == 0
    assert "  model.safetensors: 2 tensors, 4160 bytes used of 8256, 0 gap bytes in 0 gaps" in out
