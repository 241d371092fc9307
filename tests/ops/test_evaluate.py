"""reference_evaluator(path): the one-call lazy evaluator gives what ReferenceEvaluator(path) and onnxruntime give."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from onnx_light_ref.io._read import folder as folder_module
from onnx_light_ref.io._read.onnx_compat import evaluator_shape_checks
from onnx_light_ref.ops import _evaluate as evaluate_module
from onnx_light_ref.ops import reference_evaluator
from tests.checks import run_onnxruntime
from tests.models import (
    IR_VERSION,
    OPSET,
    build_control_flow_model,
    build_training_model,
    control_flow_feeds,
    save_external,
    training_feeds,
    value_info,
)


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_matches_plain_evaluator_and_onnxruntime(tmp_path, load_device):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")

    sess = reference_evaluator(path, load_device, **evaluator_shape_checks())

    for cond in (True, False):
        feeds = control_flow_feeds(cond)
        got = sess.run(None, feeds)
        for g, e in zip(got, ReferenceEvaluator(str(path)).run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, e)
        for g, o in zip(got, run_onnxruntime(path, feeds), strict=True):
            np.testing.assert_allclose(g, o, rtol=1e-6, atol=1e-6)


def test_file_mode_reads_nothing_at_construction_and_rereads_at_each_run(tmp_path, monkeypatch):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    data = os.path.realpath(tmp_path / "weights.data")
    real_open = os.open
    opened: list[str] = []

    def counting_open(file, *args, **kwargs):
        if os.fsdecode(file) == "weights.data":  # the walk opens the last component relative to its folder
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(folder_module.PROBE, "force_walk", True)  # every open through os.open, counted
    monkeypatch.setattr(os, "open", counting_open)

    sess = reference_evaluator(str(path), "file")
    at_construction = len(opened)  # opened to record which file it is (fstat), never read
    sess.run(None, control_flow_feeds(True))
    first_run = len(opened) - at_construction
    assert first_run > 0
    # New bytes in the file are seen by the next run: nothing was cached.
    (tmp_path / "weights.data").write_bytes(b"\0" * os.path.getsize(data))
    zero = sess.run(None, control_flow_feeds(True))
    assert len(opened) == at_construction + 2 * first_run
    np.testing.assert_array_equal(zero[0], np.zeros((2, 4), dtype=np.float32))


def test_cpu_mode_reads_at_construction_only(tmp_path):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    feeds = control_flow_feeds(False)
    expected = ReferenceEvaluator(str(path)).run(None, feeds)

    sess = reference_evaluator(path, "cpu")
    os.remove(tmp_path / "weights.data")

    for g, e in zip(sess.run(None, feeds), expected, strict=True):
        np.testing.assert_array_equal(g, e)


def test_works_from_another_working_directory(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    path = save_external(build_control_flow_model(), folder / "model.onnx")
    monkeypatch.chdir(tmp_path)

    got = reference_evaluator(os.path.relpath(path), "file").run(None, control_flow_feeds(True))

    np.testing.assert_array_equal(got[0], ReferenceEvaluator(str(path)).run(None, control_flow_feeds(True))[0])


def test_missing_weights_file_is_reported_at_construction(tmp_path):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    os.remove(tmp_path / "weights.data")

    with pytest.raises(FileNotFoundError, match=r"weights\.data"):
        reference_evaluator(path)


def test_overridable_initializer_is_loaded_eagerly_and_can_be_overridden(tmp_path):
    default = np.arange(4, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "overridable",
        [value_info("x", TensorProto.FLOAT, [4]), value_info("bias", TensorProto.FLOAT, [4])],
        [value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(default, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = save_external(model, tmp_path / "model.onnx")
    x = np.ones(4, dtype=np.float32)

    sess = reference_evaluator(path)

    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + default)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "bias": x})[0], x + x)


def test_external_constant_attribute_is_loaded_eagerly(tmp_path):
    value = numpy_helper.from_array(np.arange(6, dtype=np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=value)], "const", [], [value_info("y", TensorProto.FLOAT, [6])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.save_model(
        model,
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        size_threshold=0,
        location="w.data",
        convert_attribute=True,
    )
    assert (
        onnx.load_model(str(tmp_path / "model.onnx"), load_external_data=False)
        .graph.node[0]
        .attribute[0]
        .t.data_location
        == TensorProto.EXTERNAL
    )

    got = reference_evaluator(tmp_path / "model.onnx").run(None, {})

    np.testing.assert_array_equal(got[0], np.arange(6, dtype=np.float32))


def test_user_new_ops_are_kept(tmp_path):
    class Twice(OpRun):
        op_domain = "custom"

        def _run(self, x):
            return (x * 2,)

    graph = helper.make_graph(
        [helper.make_node("Twice", ["W"], ["y"], domain="custom")],
        "custom_op",
        [],
        [value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.arange(3, dtype=np.float32), "W")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("custom", 1)],
        ir_version=IR_VERSION,
    )
    path = save_external(model, tmp_path / "model.onnx")

    got = reference_evaluator(path, new_ops=[Twice]).run(None, {})

    np.testing.assert_array_equal(got[0], np.arange(3, dtype=np.float32) * 2)


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_training_tensors_are_never_loaded(tmp_path, load_device):
    """Inference never runs training_info graphs, so their external tensors stay unread (here: their file is gone)."""
    path, training_entries = build_training_model(tmp_path)
    expected = run_onnxruntime(path, training_feeds())
    os.unlink(tmp_path / "train.bin")

    sess = reference_evaluator(path, load_device, **evaluator_shape_checks())

    np.testing.assert_allclose(sess.run(None, training_feeds())[0], expected[0], rtol=1e-6, atol=1e-6)
    (info,) = sess.proto_.training_info
    kept = {t.name: t.SerializeToString() for t in (*info.initialization.initializer, *info.algorithm.initializer)}
    assert kept == training_entries


def external_constant_model(folder, location: str) -> str:
    """A Constant whose value is 16 uint8 bytes at ``location`` (never converted: loaded eagerly)."""
    tensor = TensorProto(name="c", data_type=TensorProto.UINT8, dims=[16], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        tensor.external_data.add(key=key, value=value)
    node = helper.make_node("Constant", [], ["y"], value=tensor, name="const")
    graph = helper.make_graph([node], "g", [], [value_info("y", TensorProto.UINT8, [16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


@pytest.mark.parametrize(
    ("setup", "error", "words"),
    [
        ("hard-link", "UnsafeLocationError", r"tensor 'c': external data file 'w.bin' .* has 2 hard links"),
        ("escape", "UnsafeLocationError", r"tensor 'c': external data file 'w.bin' .*symbolic link.*outside"),
        ("dotdot", "UnsafeLocationError", r"tensor 'c': external data location '\.\./w.bin' contains a '\.\.'"),
        ("missing", "FileNotFoundError", r"tensor 'c': external data file 'w.bin' does not exist"),
        ("short", "ExternalDataError", r"tensor 'c': external data range \[offset 0, \+16 bytes\) exceeds"),
        ("inner-symlink", "UnsafeLocationError", r"tensor 'c': external data file 'w.bin' .*symbolic link"),
    ],
)
def test_eagerly_loaded_tensors_get_typed_errors_before_any_read(tmp_path, monkeypatch, setup, error, words):
    # These tensors are read eagerly (through the held folder); every refusal is typed and comes before any read.
    from onnx_light_ref import errors

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"S" * 16)
    location = "w.bin"
    if setup == "hard-link":
        os.link(outside, model_dir / "w.bin")
    elif setup == "escape":
        (model_dir / "w.bin").symlink_to(outside)
    elif setup == "dotdot":
        location = "../w.bin"
    elif setup == "short":
        (model_dir / "w.bin").write_bytes(b"x" * 4)
    elif setup == "inner-symlink":
        (model_dir / "real.bin").write_bytes(b"r" * 16)
        (model_dir / "w.bin").symlink_to("real.bin")  # inside the folder: onnx's loader refuses it, so do we
    path = external_constant_model(model_dir, location)
    expected = getattr(errors, error, None) or FileNotFoundError
    loads: list[str] = []
    real_load = evaluate_module._load_through_folder
    monkeypatch.setattr(
        evaluate_module,
        "_load_through_folder",
        lambda tensor, ref, label: loads.append(label) or real_load(tensor, ref, label),
    )

    with pytest.raises(expected, match=words):
        reference_evaluator(path)
    assert loads == []  # refused before any tensor was read
