"""``onnx-light-ref run``: evaluate a model with external weights lazily and find its outputs as .npy files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref._commands.run import output_file_name
from tests.checks import snapshot_tree


def save_linear_model(folder: Path) -> Path:
    """y = x @ W + b and a second output ``w/sum`` (a name that is not a file name), weights in ``w.data``."""
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["y"]),
            helper.make_node("ReduceSum", ["W"], ["w/sum"], keepdims=0),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("w/sum", TensorProto.FLOAT, []),
        ],
        [
            numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = folder / "linear.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="w.data", size_threshold=0)
    return path


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_run_saves_every_output(tmp_path, capsys, load_device):
    path = save_linear_model(tmp_path)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"

    status = main(
        [
            "run",
            str(path),
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--load-device",
            load_device,
            "--output-dir",
            str(out_dir),
        ]
    )

    assert status == 0
    expected = ReferenceEvaluator(str(path)).run(None, {"x": x})
    np.testing.assert_array_equal(np.load(out_dir / "y.npy"), expected[0])
    np.testing.assert_array_equal(np.load(out_dir / "w_sum.npy"), expected[1])
    out = capsys.readouterr().out
    assert "y: shape [2, 4] dtype float32" in out
    assert "w/sum: shape [] dtype float32" in out


def test_run_reports_bad_inputs(tmp_path, capsys):
    path = save_linear_model(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((2, 8), dtype=np.float32))

    assert main(["run", str(path), "--input", f"nope={tmp_path / 'x.npy'}"]) == 1
    assert "no input(s) ['nope']" in capsys.readouterr().err
    assert main(["run", str(path), "--input", f"x={tmp_path / 'missing.npy'}"]) == 1
    assert "cannot load input 'x'" in capsys.readouterr().err
    assert main(["run", str(path), "--output-dir", str(tmp_path / "o")]) == 1
    assert "missing --input for ['x']" in capsys.readouterr().err
    (tmp_path / "w.data").unlink()
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    assert "w.data" in capsys.readouterr().err


def test_input_spec_must_have_a_name_and_a_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", str(tmp_path / "m.onnx"), "--input", "x.npy"])
    assert "NAME=FILE.npy" in capsys.readouterr().err


def test_output_file_names_are_safe():
    assert output_file_name("logits") == "logits.npy"
    assert output_file_name("../../etc/passwd") == "_.._etc_passwd.npy"
    assert output_file_name("") == "output.npy"


# ----------------------------------------------------------------------------------- ordinary mistakes: one line


def one_error_line(capsys, fragment: str) -> None:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in captured.err


def run_cli(path: Path, out_dir: Path, *feeds: str, extra: tuple[str, ...] = ()) -> int:
    argv = ["run", str(path), "--output-dir", str(out_dir), *extra]
    for feed in feeds:
        argv += ["--input", feed]
    return main(argv)


@pytest.mark.parametrize(
    ("array", "fragment"),
    [
        (np.zeros((3, 8), dtype=np.float32), "input 'x' has shape [3, 8], the model expects [2, 8]"),
        (np.zeros((2, 8, 1), dtype=np.float32), "input 'x' has shape [2, 8, 1], the model expects [2, 8]"),
        (np.zeros((2, 8), dtype=np.float64), "input 'x' has dtype float64, the model expects float32"),
    ],
)
def test_wrong_feed_is_one_error_line(tmp_path, capsys, array, fragment):
    path = save_linear_model(tmp_path)
    np.save(tmp_path / "x.npy", array)
    assert run_cli(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(capsys, fragment)
    assert not (tmp_path / "out").exists()


def test_output_dir_that_is_a_file(tmp_path, capsys):
    path = save_linear_model(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((2, 8), dtype=np.float32))
    (tmp_path / "out").write_bytes(b"keep me")
    assert run_cli(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(capsys, "exists and is not a folder")
    assert (tmp_path / "out").read_bytes() == b"keep me"
    assert run_cli(path, tmp_path / "out" / "sub", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(capsys, f"--output-dir: cannot create the folder {str(tmp_path / 'out' / 'sub')!r}: Not a directory")
    assert (tmp_path / "out").read_bytes() == b"keep me"


def test_model_the_converter_refuses(tmp_path, capsys):
    path = save_linear_model(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../w.data"
    onnx.save(model, str(path))
    np.save(tmp_path / "x.npy", np.zeros((2, 8), dtype=np.float32))
    assert run_cli(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(capsys, "'..'")
    assert not (tmp_path / "out").exists()


def delayed_model(folder: Path, filename: str, *, runtime_device: str = "cpu") -> Path:
    node = helper.make_node(
        "DelayedInitializer",
        [],
        ["y"],
        domain="ai.rt",
        name="w",
        dtype=TensorProto.FLOAT,
        load_device="file",
        runtime_device=runtime_device,
        filename=filename,
        offset=0,
    )
    node.attribute.insert(0, helper.make_attribute("shape", [2]))
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("ai.rt", 1)]
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))
    return path


def test_bad_kernel_attribute(tmp_path, capsys):
    (tmp_path / "w.bin").write_bytes(np.array([1, 2], dtype="<f4").tobytes())
    path = delayed_model(tmp_path, "w.bin", runtime_device="gpu")
    assert run_cli(path, tmp_path / "out") == 1
    one_error_line(capsys, "runtime_device must be 'cpu', got 'gpu'")
    assert not (tmp_path / "out").exists()


def test_file_outside_the_model_folder_needs_the_flag(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(np.array([1.5, -2], dtype="<f4").tobytes())
    path = delayed_model(tmp_path / "model", str(outside))
    assert run_cli(path, tmp_path / "out") == 1
    one_error_line(capsys, "outside the model's folder")
    assert not (tmp_path / "out").exists()
    assert run_cli(path, tmp_path / "out", extra=("--allow-outside-folder",)) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), [1.5, -2])


def test_sequence_output_is_refused_before_writing_anything(tmp_path, capsys):
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["t"]),
            helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor_value_info("t", TensorProto.FLOAT, [2]),
            helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2]),
        ],
    )
    path = tmp_path / "seq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
    np.save(tmp_path / "x.npy", np.ones(2, dtype=np.float32))
    assert run_cli(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(capsys, "output 'seq' is a sequence of 2 values")
    assert not (tmp_path / "out").exists()


def test_a_missing_nested_output_dir_is_created(tmp_path, capsys):
    path = save_linear_model(tmp_path)
    x = np.ones((2, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "new" / "deeper" / "out"

    assert run_cli(path, out, f"x={tmp_path / 'x.npy'}") == 0, capsys.readouterr().err

    expected = ReferenceEvaluator(str(path)).run(None, {"x": x})
    np.testing.assert_array_equal(np.load(out / "y.npy"), expected[0])
    assert sorted(p.name for p in out.iterdir()) == [".onnx-light-ref-run.json", "w_sum.npy", "y.npy"]


@pytest.mark.parametrize("failure", ["wrong feed", "model the converter refuses"])
def test_output_folders_created_for_a_refused_run_are_removed(tmp_path, capsys, failure):
    path = save_linear_model(tmp_path)
    np.save(tmp_path / "x.npy", np.ones((2, 8) if failure != "wrong feed" else (3, 8), dtype=np.float32))
    if failure != "wrong feed":
        (tmp_path / "w.data").write_bytes(b"short")  # the weights file no longer holds W and b
    before = snapshot_tree(tmp_path)

    assert run_cli(path, tmp_path / "new" / "a" / "out", f"x={tmp_path / 'x.npy'}") == 1

    one_error_line(capsys, "has shape [3, 8]" if failure == "wrong feed" else f"cannot evaluate {str(path)!r}")
    assert snapshot_tree(tmp_path) == before


class _Evil:
    """Unpickling this would create ``marker`` (it must never happen: run loads .npy without pickle)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def huge_header_npy(path: Path) -> None:
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    header["shape"] = (2**40,)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 16)


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("pickle", "Object arrays cannot be loaded when allow_pickle=False"),
        ("raw-pickle", "contains pickled (object) data"),
        (
            "huge-header",
            "its header announces shape [1099511627776] of float32 (4398046511104 bytes), but the file "
            "holds 16 bytes of data",
        ),
        ("fifo", "not a regular file"),
    ],
)
def test_hostile_input_files_are_one_error_line_and_never_unpickled(tmp_path, capsys, kind, fragment):
    import pickle

    path = save_linear_model(tmp_path)
    feed = tmp_path / "x.npy"
    marker = tmp_path / "PWNED"
    if kind == "pickle":
        np.save(feed, np.array([_Evil(marker)], dtype=object), allow_pickle=True)
    elif kind == "raw-pickle":
        feed.write_bytes(pickle.dumps(_Evil(marker)))
    elif kind == "huge-header":
        huge_header_npy(feed)  # numpy allocated the 4 TiB announced before reading: MemoryError traceback
    else:
        os.mkfifo(feed)  # np.load would wait for a writer forever
    before = snapshot_tree(tmp_path)

    assert run_cli(path, tmp_path / "out", f"x={feed}") == 1
    one_error_line(capsys, fragment)
    assert not marker.exists()
    assert not (tmp_path / "out").exists()
    assert snapshot_tree(tmp_path) == before


def test_an_eagerly_loaded_constant_with_a_hard_linked_file_is_one_error_line(tmp_path, capsys):
    # onnx's loader raised its own ValidationError (no ValueError) for such a tensor: run printed a traceback.
    (tmp_path / "secret.bin").write_bytes(b"S" * 16)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    os.link(tmp_path / "secret.bin", model_dir / "w.bin")
    tensor = TensorProto(name="c", data_type=TensorProto.UINT8, dims=[16], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "16")):
        tensor.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=tensor)],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [16])],
    )
    path = model_dir / "model.onnx"
    path.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10).SerializeToString()
    )

    assert run_cli(path, tmp_path / "out") == 1
    one_error_line(capsys, "tensor 'c': external data file 'w.bin'")
    assert not (tmp_path / "out").exists()
