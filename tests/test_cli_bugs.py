"""Ours are one line, bugs are bugs (issue 39): the model's or the input's problem is one ``error:`` line and exit
status 1; an exception the command does not expect (a bug of the package) is one line asking to report it, exit
status 70, the traceback behind the global ``--debug``, and nothing written."""

from __future__ import annotations

import builtins
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref._commands.errors import INTERNAL_ERROR, ISSUES_URL
from tests.checks import snapshot_tree
from tests.models import make_external_model
from tests.test_cli_run import save_linear_model
from tests.zoo import reference_tensors


def _model(folder: Path, node: onnx.NodeProto, *initializers: np.ndarray, domain: str | None = None) -> Path:
    """``y = node(x, c0, c1...)`` with ``x`` a float vector of 3 and the constants as initializers."""
    names = [f"c{index}" for index in range(len(initializers))]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(value, name) for value, name in zip(initializers, names, strict=True)],
    )
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    path = folder / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))
    np.save(folder / "x.npy", np.ones(3, np.float32))
    return path


# What onnx's reference evaluator and numpy raise for a model they cannot run: the user's input, one line each.
EVALUATOR_REFUSALS = {
    "NotImplementedError": (lambda: helper.make_node("Foo", ["x"], ["y"], domain="my.ops"), (), "my.ops", "unknown"),
    "RuntimeError": (lambda: helper.make_node("Relu", ["nope"], ["y"]), (), None, "Unable to find input 'nope'"),
    "TypeError": (lambda: helper.make_node("Add", ["x", "c0"], ["y"]), (np.ones(4, np.float32),), None, "Add"),
    "IndexError": (lambda: helper.make_node("Gather", ["x", "c0"], ["y"]), (np.array([7]),), None, "out of bounds"),
    "KeyError": (lambda: helper.make_node("Cast", ["x"], ["y"], to=999), (), None, "999"),
    "ValueError": (lambda: helper.make_node("Reshape", ["x", "c0"], ["y"]), (np.array([5]),), None, "reshape"),
    "MemoryError": (
        lambda: helper.make_node("ConstantOfShape", ["c0"], ["y"]),
        (np.array([10**7, 10**7]),),
        None,
        "allocate",
    ),
}


@pytest.mark.parametrize("kind", list(EVALUATOR_REFUSALS))
def test_a_model_the_evaluator_cannot_run_is_one_error_line(kind, tmp_path, capsys):
    node, constants, domain, fragment = EVALUATOR_REFUSALS[kind]
    model = _model(tmp_path, node(), *constants, domain=domain)
    before = snapshot_tree(tmp_path)

    status = main(["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")])

    err = capsys.readouterr().err
    assert status == 1, err
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err
    assert "this is a bug" not in err and "Traceback" not in err
    assert snapshot_tree(tmp_path) == before  # --output-dir created, then removed: nothing written
    with pytest.raises(getattr(builtins, kind)):  # the oracle: onnx's own evaluator raises that type for the model
        ReferenceEvaluator(str(model)).run(None, {"x": np.ones(3, np.float32)})


def _raising_in(module: types.ModuleType, error: BaseException) -> types.FunctionType:
    """A function raising ``error`` whose frame belongs to ``module``: a bug in that module, as the traceback shows
    it (a plain function of this test would be a frame of the tests)."""

    def boom(*args: object, **kwargs: object) -> None:
        raise error

    return types.FunctionType(boom.__code__, vars(module), "boom", None, boom.__closure__)


def _align_argv(tmp_path: Path) -> list[str]:
    src = make_external_model(tmp_path, reference_tensors())
    return ["align", str(src), str(tmp_path / "out" / "m.onnx"), "--no-progress"]


def _run_argv(tmp_path: Path) -> list[str]:
    model = save_linear_model(tmp_path)
    np.save(tmp_path / "x.npy", np.ones((2, 8), np.float32))
    return ["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]


PLANTED = {
    # After the weights are copied, before the publication: the transaction's temp files exist.
    "align": (_align_argv, "onnx_light_ref.io._align", "aligned_result"),
    # In the kernel, while onnx's evaluator runs it: a KeyError of ours, not the model's.
    "run (kernel)": (_run_argv, "onnx_light_ref.ops._delayed_initializer", "_read_tensor"),
    # After the evaluation, once --output-dir was created.
    "run (outputs)": (_run_argv, "onnx_light_ref._commands.run", "_plan_outputs"),
}


@pytest.mark.parametrize("where", list(PLANTED))
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_bug_is_one_line_asking_to_report_it_with_status_70_and_nothing_written(
    where, debug, tmp_path, capsys, monkeypatch
):
    build, module_name, function = PLANTED[where]
    argv = build(tmp_path)
    module = __import__(module_name, fromlist=["_"])
    monkeypatch.setattr(module, function, _raising_in(module, KeyError("planted")))
    before = snapshot_tree(tmp_path)

    status = main(["--debug", *argv] if debug else argv)

    err = capsys.readouterr().err
    assert status == INTERNAL_ERROR == 70
    last = err.splitlines()[-1]
    assert last.startswith("error: KeyError: 'planted' (this is a bug in onnx-light-ref, please report it at ")
    assert ISSUES_URL in last
    if debug:
        assert err.startswith("Traceback (most recent call last):") and "in boom\n    raise error\nKeyError: " in err
    else:
        assert err.count("\n") == 1 and "Traceback" not in err and "--debug" in last
    assert snapshot_tree(tmp_path) == before  # no temp file, no folder the command created, no output


def test_debug_goes_before_the_command(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["inspect", str(tmp_path / "m.onnx"), "--debug"])
    assert done.value.code == 2
    assert "--debug goes before the command: onnx-light-ref --debug inspect ..." in capsys.readouterr().err
