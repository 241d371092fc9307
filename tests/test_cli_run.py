"""``onnx-light-ref run``: evaluate a model with external weights lazily and find its outputs as .npy files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.cli import main
from onnx_light_ref.commands.run import output_file_name


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
    assert "evaluation failed" in capsys.readouterr().err
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
