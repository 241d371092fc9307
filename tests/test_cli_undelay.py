"""``onnx-light-ref undelay``: a DelayedInitializer model becomes one onnxruntime runs; refusals are one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref._cli import main
from onnx_light_ref.ops import delay_initializers
from tests.checks import snapshot_tree


def delayed_model(folder: Path) -> tuple[Path, np.ndarray]:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    source = folder / "m.onnx"
    onnx.save(model, source, save_as_external_data=True, location="m.data", size_threshold=0)
    delayed = folder / "delayed.onnx"
    onnx.save(delay_initializers(source), delayed)
    return delayed, w


def test_undelay_writes_a_model_onnxruntime_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    delayed, w = delayed_model(tmp_path)
    dst = tmp_path / "out.onnx"
    assert main(["undelay", str(delayed), str(dst), "--alignment", "64", "--no-fsync"]) == 0
    assert f"wrote {dst} and {dst}.data" in capsys.readouterr().out
    x = np.ones((2, 3), dtype=np.float32)
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x @ w)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--weights", "../w.data"], "outside the destination model's folder"),
    ],
)
def test_refusals_are_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args, fragment) -> None:
    delayed, _ = delayed_model(tmp_path)
    (tmp_path / "out").mkdir()
    dst = tmp_path / "out" / "m.onnx"
    argv = ["undelay", str(delayed), str(dst), *[a if a != "../w.data" else str(tmp_path / "w.data") for a in args]]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0]
    assert list((tmp_path / "out").iterdir()) == []


def test_outside_file_needs_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "w.bin"
    data.write_bytes(np.array([1.5, -2], dtype="<f4").tobytes())
    node = helper.make_node(
        "DelayedInitializer",
        [],
        ["y"],
        domain="ai.rt",
        dtype=1,
        load_device="cpu",
        runtime_device="cpu",
        filename=str(data),
        offset=0,
    )
    node.attribute.insert(0, helper.make_attribute("shape", [2]))
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("ai.rt", 1)]
    (tmp_path / "model").mkdir()
    src = tmp_path / "model" / "spec.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), src)
    dst = tmp_path / "model" / "out.onnx"
    assert main(["undelay", str(src), str(dst)]) == 1
    assert "--allow-outside-folder" in capsys.readouterr().err
    assert not dst.exists()
    assert main(["undelay", str(src), str(dst), "--allow-outside-folder"]) == 0
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {})[0]
    np.testing.assert_array_equal(got, [1.5, -2])


def test_missing_destination_folders_are_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    delayed, w = delayed_model(tmp_path)
    dst = tmp_path / "new" / "deeper" / "out.onnx"
    weights = tmp_path / "new" / "deeper" / "weights" / "w.data"

    assert main(["undelay", str(delayed), str(dst), "--weights", str(weights), "--no-fsync"]) == 0, capsys.readouterr()

    assert f"wrote {dst} and {weights}" in capsys.readouterr().out
    x = np.ones((2, 3), dtype=np.float32)
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x @ w)


@pytest.mark.parametrize("weights", [None, "new/a/w/w.data"])
def test_folders_created_for_a_refused_run_are_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], weights: str | None
) -> None:
    delayed, _ = delayed_model(tmp_path)
    (tmp_path / "m.data").unlink()  # refused by undelay_initializers, once the command has created the folders
    before = snapshot_tree(tmp_path)
    extra = ["--weights", str(tmp_path / weights)] if weights else []

    assert main(["undelay", str(delayed), str(tmp_path / "new" / "a" / "out.onnx"), *extra]) == 1

    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "m.data" in err[0]
    assert snapshot_tree(tmp_path) == before


def test_a_destination_under_a_file_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    delayed, _ = delayed_model(tmp_path)
    (tmp_path / "blocker").write_bytes(b"not a folder")
    before = snapshot_tree(tmp_path)

    assert main(["undelay", str(delayed), str(tmp_path / "blocker" / "sub" / "out.onnx")]) == 1

    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: cannot create the folder {str(tmp_path / 'blocker' / 'sub')!r}: Not a directory"]
    assert snapshot_tree(tmp_path) == before


OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # a terminal that honours it copies "pwned" to the clipboard
BIDI = "\u202e"  # right-to-left override: reorders what the reader sees


def test_a_hostile_name_in_an_error_reaches_the_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model function's domain and name, and the node's output tensor name, carry OSC 52 and a bidi override;
    undelay refuses the model with an error quoting the function as ``domain::name`` (not through repr)."""
    from onnx_light_ref.ops._schema import make_delayed_initializer_node

    tensor = f"w{OSC52}{BIDI}"
    node = make_delayed_initializer_node(
        tensor, shape=[2], dtype=TensorProto.FLOAT, load_device="file", filename="w.bin", offset=0
    )
    domain, name = f"local{OSC52}", f"f{BIDI}gnp.exe"
    function = helper.make_function(domain, name, [], [tensor], [node], [helper.make_opsetid("ai.rt", 1)])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("ai.rt", 1), helper.make_opsetid(domain, 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10, functions=[function])
    onnx.save(model, tmp_path / "m.onnx")
    before = snapshot_tree(tmp_path)
    assert main(["undelay", str(tmp_path / "m.onnx"), str(tmp_path / "out.onnx"), "--no-fsync"]) == 1
    captured = capsys.readouterr()
    err = captured.err.rstrip("\n")
    assert "\n" not in err and err.isprintable(), repr(err)
    assert err.startswith("error: ") and "a function has no initializers" in err
    assert "model function local\\x1b]52;c;cHduZWQ=\\x07::f\\u202egnp.exe" in err
    assert captured.out == ""
    assert snapshot_tree(tmp_path) == before


@pytest.mark.parametrize("message", [f"tensor w{OSC52}", f"op type Add{BIDI}", ValueError(f"domain d{OSC52}{BIDI}")])
def test_error_exit_escapes_every_message(capsys: pytest.CaptureFixture[str], message: object) -> None:
    from onnx_light_ref._commands.errors import error_exit

    assert error_exit(message) == 1
    err = capsys.readouterr().err
    assert err.endswith("\n") and err[:-1].isprintable() and err.startswith("error: ")
    assert "\\x1b]52;c;" in err or "\\u202e" in err
