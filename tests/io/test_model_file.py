"""io/model_file: always binary protobuf whatever the name, UTF-8 strings only, typed errors (also on the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_light_ref.errors import ExternalDataError, InvalidModelError
from onnx_light_ref.io._read.locations import check_external_structure, expected_nbytes
from onnx_light_ref.io._read.model_file import check_model_strings, load_model_metadata


def small_model(name: str = "w") -> onnx.ModelProto:
    tensor = numpy_helper.from_array(np.arange(4, dtype=np.float32), name)
    node = helper.make_node("Identity", [name], ["y"])
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])
    graph = helper.make_graph([node], "g", [], [out], initializer=[tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def with_bytes(model: onnx.ModelProto, placeholder: bytes) -> bytes:
    return model.SerializeToString().replace(placeholder, b"\xff\xfe" + placeholder[2:])


@pytest.mark.parametrize("suffix", [".json", ".textproto", ".onnxtxt", ".txt", ".onnx", ""])
def test_a_binary_model_loads_whatever_its_name(tmp_path: Path, suffix: str):
    path = tmp_path / f"model{suffix}"
    path.write_bytes(small_model().SerializeToString())
    assert load_model_metadata(str(path)).graph.initializer[0].name == "w"


@pytest.mark.parametrize("suffix", [".json", ".textproto", ".onnxtxt", ".txt"])
def test_a_text_model_is_an_invalid_model_not_a_parse_error(tmp_path: Path, suffix: str):
    path = tmp_path / f"model{suffix}"
    path.write_text(onnx.printer.to_text(small_model()) if suffix == ".onnxtxt" else "ir_version: 10\ngraph {}\n")
    with pytest.raises(InvalidModelError, match="is not a valid ONNX model"):
        load_model_metadata(str(path))


@pytest.mark.parametrize(
    ("placeholder", "field"),
    [
        (b"NAMEXX", "model.graph.node[0].input[0]"),  # the tensor name, first met as the node's input
        (b"GRAPHX", "model.graph.name"),
    ],
)
def test_non_utf8_strings_are_an_invalid_model_naming_the_field(tmp_path: Path, placeholder: bytes, field: str):
    model = small_model("NAMEXX")
    model.graph.name = "GRAPHX"
    path = tmp_path / "m.onnx"
    path.write_bytes(with_bytes(model, placeholder))
    with pytest.raises(InvalidModelError) as raised:
        load_model_metadata(str(path))
    assert f"{field} is not valid UTF-8" in str(raised.value)
    parsed = onnx.ModelProto()
    parsed.ParseFromString(path.read_bytes())
    with pytest.raises(InvalidModelError, match="is not valid UTF-8"):
        check_model_strings(parsed)


def test_the_cli_prints_one_error_line_for_a_non_utf8_model(tmp_path: Path):
    src = tmp_path / "m.onnx"
    src.write_bytes(with_bytes(small_model("NAMEXX"), b"NAMEXX"))
    # inspect is the exception on purpose: it reports such names per tensor (tests/test_inspect_hostile.py).
    for command in (
        ["align", str(src), str(tmp_path / "out.onnx")],
        ["verify", str(src), str(src)],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "onnx_light_ref", *command], check=False, capture_output=True, text=True
        )
        assert done.returncode == 1, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and "not valid UTF-8" in lines[0], done.stderr
        assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("dims", [[-1], [4, -4], [-2, -2]])
def test_expected_nbytes_is_never_negative(dims: list[int]):
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=dims)
    with pytest.raises(ExternalDataError, match=r"'w' has negative dims"):
        expected_nbytes(tensor)


@pytest.mark.parametrize("field", ["float_data", "int32_data", "int64_data", "double_data", "uint64_data"])
def test_an_external_tensor_with_typed_values_is_refused(field: str):
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[1])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "w.bin"
    getattr(tensor, field).append(1)
    with pytest.raises(ExternalDataError, match=f"also holds inline values in {field}"):
        check_external_structure(tensor)


def test_a_file_over_protobufs_limit_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A sparse 3 GiB file: reading it whole first (as onnx.load does) took 3 GiB of RSS only to fail in protobuf.
    path = tmp_path / "weights.onnx"
    with open(path, "wb") as f:
        f.truncate(3 * 2**30)
    reads: list[int] = []
    real_preadv = os.preadv
    monkeypatch.setattr(
        os, "preadv", lambda fd, buffers, offset: reads.append(offset) or real_preadv(fd, buffers, offset)
    )

    with pytest.raises(InvalidModelError, match=r"is 3221225472 bytes, more than protobuf's 2 GiB limit"):
        load_model_metadata(str(path))
    assert reads == []
    assert path.stat().st_size == 3 * 2**30


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero-symlink", "symlink-loop"])
def test_a_model_path_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str):
    path = tmp_path / "model.onnx"
    if kind == "fifo":
        os.mkfifo(path)  # opened for reading without O_NONBLOCK, this would wait forever for a writer
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-zero-symlink":
        path.symlink_to("/dev/zero")  # endless data: must never be read
    else:
        path.symlink_to(tmp_path / "loop")
        (tmp_path / "loop").symlink_to(path)

    expected = {  # what the path is, never "not found" for something that exists (issue 26)
        "fifo": r"ONNX model path '.*model\.onnx' is a FIFO \(named pipe\), not a regular file",
        "directory": r"ONNX model path '.*model\.onnx' is a directory",
        "dev-zero-symlink": r"ONNX model path '.*model\.onnx' is a character device, not a regular file",
        "symlink-loop": r"not found: '.*model\.onnx'",
    }[kind]
    with pytest.raises(FileNotFoundError, match=expected):
        load_model_metadata(str(path))


@pytest.mark.parametrize("count", [3, 1500])  # the Python walk alone; the strict parse first (>= 1024 items)
@pytest.mark.parametrize("at", ["first", "last"])
def test_a_model_in_memory_is_refused_by_either_check_naming_the_same_field(count: int, at: str):
    """A model in memory is serialized for the strict parse only when it has many initializers and nodes (a small
    one with large inline payloads: the walk costs well under a millisecond, the serialization its bytes)."""
    tensors = [numpy_helper.from_array(np.zeros(1, np.float32), f"w{index}") for index in range(count)]
    graph = helper.make_graph([], "g", [], [helper.make_tensor_value_info("w0", onnx.TensorProto.FLOAT, [1])], tensors)
    model = helper.make_model(graph)
    check_model_strings(model)  # every string UTF-8: accepted by both
    index = 0 if at == "first" else count - 1
    model.graph.initializer[index].name = "BADNAM"
    parsed = onnx.ModelProto()
    parsed.ParseFromString(with_bytes(model, b"BADNAM"))  # onnx's proto2 schema keeps a non-UTF-8 string as bytes
    with pytest.raises(InvalidModelError, match=rf"graph\.initializer\[{index}\]\.name is not valid UTF-8"):
        check_model_strings(parsed)
