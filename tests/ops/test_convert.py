"""delay_initializers: a model with external weights becomes one whose weights are DelayedInitializer nodes.

The story: a user has ``model.onnx`` + ``weights.data``; after conversion the reference evaluator (file and cpu
modes) computes exactly what plain ``ReferenceEvaluator(path)`` and onnxruntime compute, and the converter never
read a weight byte nor touched the model it was given.
"""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from lazy_models import (
    IR_VERSION,
    OPSET,
    build_control_flow_model,
    control_flow_feeds,
    run_onnxruntime,
    save_external,
    value_info,
)
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.ops import ALLOWED_DTYPES, DelayedInitializer, delay_initializers
from onnx_light_ref.ops.dtypes import np_dtype_for

pytest.importorskip("onnxruntime")

# onnxruntime has no complex tensor type at all ("MLDataType for: tensor(complex64) is not currently registered").
ORT_UNSUPPORTED = {TensorProto.COMPLEX64, TensorProto.COMPLEX128}
_vi = value_info


def run_converted(model: onnx.ModelProto, base_dir: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(base_dir)], check_shape_annotations=True)
    return sess.run(None, feeds)


def delayed_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    return [n for n in graph.node if n.op_type == "DelayedInitializer" and n.domain == "ai.rt"]


@pytest.mark.parametrize("load_device", ["file", "cpu"])
@pytest.mark.parametrize("cond", [True, False])
def test_control_flow_model_matches_reference_evaluator_and_onnxruntime(tmp_path, load_device, cond):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    feeds = control_flow_feeds(cond)

    converted = delay_initializers(path, load_device)

    got = run_converted(converted, tmp_path, feeds)
    expected = ReferenceEvaluator(str(path)).run(None, feeds)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)
    for g, o in zip(got, run_onnxruntime(path, feeds), strict=True):
        np.testing.assert_allclose(g, o, rtol=1e-6, atol=1e-6)


def test_each_initializer_becomes_a_node_at_the_front_of_its_own_graph(tmp_path):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")

    converted = delay_initializers(path, "cpu")

    graph = converted.graph
    assert len(graph.initializer) == 0
    assert [n.output[0] for n in graph.node[:2]] == ["W", "B"]
    if_node = next(n for n in graph.node if n.op_type == "If")
    then_branch = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert [n.output[0] for n in delayed_nodes(then_branch)] == ["T"]
    assert then_branch.node[0].op_type == "DelayedInitializer"
    loop_body = next(a.g for a in next(n for n in graph.node if n.op_type == "Loop").attribute)
    assert loop_body.node[0].output[0] == "L" and len(loop_body.initializer) == 0
    attributes = {a.name: helper.get_attribute_value(a) for a in graph.node[0].attribute}
    assert attributes == {
        "shape": [3, 4],
        "dtype": TensorProto.FLOAT,
        "load_device": b"cpu",
        "runtime_device": b"cpu",
        "filename": b"weights.data",
        "offset": 0,
    }
    assert [(o.domain, o.version) for o in converted.opset_import if o.domain == "ai.rt"] == [("ai.rt", 1)]
    onnx.checker.check_model(converted)


@pytest.mark.parametrize("dtype", ALLOWED_DTYPES, ids=lambda t: TensorProto.DataType.Name(t).lower())
def test_every_allowed_dtype_round_trips(tmp_path, dtype):
    np_dtype = np_dtype_for(dtype)
    rng = np.random.default_rng(dtype)
    raw = rng.integers(0, 100, size=(2, 3))
    if np_dtype.kind == "c":
        array = (raw + 1j * raw[::-1]).astype(np_dtype)
    elif np_dtype.kind == "b":
        array = raw % 2 == 0
    else:
        array = raw.astype(np_dtype)
    scalar = np.array(array.flat[1], dtype=np_dtype)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["A"], ["out_a"]), helper.make_node("Identity", ["S"], ["out_s"])],
        "dtypes",
        [],
        [_vi("out_a", dtype, [2, 3]), _vi("out_s", dtype, [])],
        [numpy_helper.from_array(array, "A"), numpy_helper.from_array(scalar, "S")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = save_external(model, tmp_path / "model.onnx")

    expected = ReferenceEvaluator(str(path)).run(None, {})
    for load_device in ("file", "cpu"):
        got = run_converted(delay_initializers(path, load_device), tmp_path, {})
        for g, e in zip(got, expected, strict=True):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_array_equal(g, e)
    np.testing.assert_array_equal(expected[0], array)
    if dtype not in ORT_UNSUPPORTED:
        for g, o in zip(expected, run_onnxruntime(path, {}), strict=True):
            np.testing.assert_array_equal(g, o)


def test_converter_never_reads_the_weights(tmp_path, monkeypatch):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    data = os.path.realpath(tmp_path / "weights.data")

    def guard(opener):
        def guarded(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(file)) == data:
                raise AssertionError(f"the converter opened the weights file {file!r}")
            return opener(file, *args, **kwargs)

        return guarded

    monkeypatch.setattr(builtins, "open", guard(builtins.open))
    monkeypatch.setattr(io, "open", guard(io.open))
    monkeypatch.setattr(os, "open", guard(os.open))
    monkeypatch.setattr(np, "fromfile", guard(np.fromfile))
    monkeypatch.setattr(np, "memmap", guard(np.memmap))

    converted = delay_initializers(path, "file")
    delay_initializers(onnx.load_model(str(path), load_external_data=False), "cpu", base_dir=tmp_path)

    monkeypatch.undo()
    assert not any(t.HasField("raw_data") for t in converted.graph.initializer)
    got = run_converted(converted, tmp_path, control_flow_feeds(True))
    np.testing.assert_array_equal(got[0], ReferenceEvaluator(str(path)).run(None, control_flow_feeds(True))[0])


def test_input_proto_is_not_mutated(tmp_path):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    model = onnx.load_model(str(path), load_external_data=False)
    before = model.SerializeToString()

    converted = delay_initializers(model, base_dir=tmp_path)

    assert model.SerializeToString() == before
    assert converted is not model and len(delayed_nodes(converted.graph)) == 2


def test_proto_with_external_initializers_needs_base_dir(tmp_path):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    model = onnx.load_model(str(path), load_external_data=False)

    with pytest.raises(ValueError, match="base_dir is required"):
        delay_initializers(model)


def test_model_without_external_data_is_returned_unchanged_in_content():
    model = build_control_flow_model()

    converted = delay_initializers(model)

    assert converted.SerializeToString() == model.SerializeToString()


def _single_tensor_model(tmp_path: Path, location: str, offset: int = 0, length: int | None = None) -> onnx.ModelProto:
    """A model whose one initializer points at ``location``; writes ``weights.data`` (48 bytes) in ``tmp_path``."""
    array = np.arange(12, dtype=np.float32)
    (tmp_path / "weights.data").write_bytes(array.tobytes())
    tensor = numpy_helper.from_array(array, "W")
    set_external_data(tensor, location, offset=offset, length=length if length is not None else array.nbytes)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["out"])], "one", [], [_vi("out", TensorProto.FLOAT, [12])], [tensor]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


@pytest.mark.parametrize(
    ("location", "offset", "error", "match"),
    [
        ("/etc/passwd", 0, UnsafeLocationError, "absolute"),
        ("../weights.data", 0, UnsafeLocationError, r"'\.\.'"),
        ("sub/../../weights.data", 0, UnsafeLocationError, r"'\.\.'"),
        ("missing.data", 0, FileNotFoundError, "does not exist"),
        ("weights.data", 8, ExternalDataError, "exceeds the size"),
    ],
)
def test_invalid_locations_are_refused_with_io_errors(tmp_path, location, offset, error, match):
    model = _single_tensor_model(tmp_path, location, offset)
    onnx.save_model(model, str(tmp_path / "model.onnx"))

    with pytest.raises(error, match=match):
        delay_initializers(tmp_path / "model.onnx")
    with pytest.raises(error, match=match):
        delay_initializers(model, base_dir=tmp_path)


def test_symlink_escaping_the_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    model = _single_tensor_model(outside, "link.data")
    (model_dir / "link.data").symlink_to(outside / "weights.data")

    with pytest.raises(UnsafeLocationError, match="outside"):
        delay_initializers(model, base_dir=model_dir)


def test_hard_linked_data_file_is_refused_as_onnx_does(tmp_path):
    model = _single_tensor_model(tmp_path, "weights.data")
    os.link(tmp_path / "weights.data", tmp_path / "elsewhere.data")

    with pytest.raises(UnsafeLocationError, match="hard links"):
        delay_initializers(model, base_dir=tmp_path)


def test_length_disagreeing_with_shape_is_refused(tmp_path):
    model = _single_tensor_model(tmp_path, "weights.data", length=40)

    with pytest.raises(ExternalDataError, match="does not match dims"):
        delay_initializers(model, base_dir=tmp_path)


def test_unsupported_dtype_is_refused_unless_min_size_keeps_it(tmp_path):
    bf16 = helper.make_tensor("H", TensorProto.BFLOAT16, [4], np.zeros(4, np.uint16).tobytes(), raw=True)
    f32 = numpy_helper.from_array(np.arange(64, dtype=np.float32), "F")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["H"], ["h32"], to=TensorProto.FLOAT), helper.make_node("Identity", ["F"], ["f"])],
        "bf16",
        [],
        [_vi("h32", TensorProto.FLOAT, [4]), _vi("f", TensorProto.FLOAT, [64])],
        [bf16, f32],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = save_external(model, tmp_path / "model.onnx")

    with pytest.raises(ValueError, match=r"'H'.*bfloat16"):
        delay_initializers(path)
    converted = delay_initializers(path, min_size=9)

    assert [t.name for t in converted.graph.initializer] == ["H"]
    assert [n.output[0] for n in delayed_nodes(converted.graph)] == ["F"]


def test_min_size_keeps_small_initializers(tmp_path):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")

    converted = delay_initializers(path, min_size=17)  # W is 48 bytes; B, T, L are 16

    assert [n.output[0] for n in delayed_nodes(converted.graph)] == ["W"]
    assert sorted(t.name for t in converted.graph.initializer) == ["B"]


def test_initializer_overridable_by_a_graph_input_stays_an_initializer(tmp_path):
    model = _single_tensor_model(tmp_path, "weights.data")
    model.graph.input.append(_vi("W", TensorProto.FLOAT, [12]))

    converted = delay_initializers(model, base_dir=tmp_path)

    assert [t.name for t in converted.graph.initializer] == ["W"]
    assert delayed_nodes(converted.graph) == []
    assert not any(o.domain == "ai.rt" for o in converted.opset_import)


def test_model_local_functions_are_inlined(tmp_path):
    function = helper.make_function(
        "local",
        "AddTwice",
        ["a", "b"],
        ["c"],
        [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Add", ["t", "b"], ["c"])],
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    W = numpy_helper.from_array(np.arange(4, dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("AddTwice", ["x", "W"], ["y"], domain="local")],
        "with_function",
        [_vi("x", TensorProto.FLOAT, [4])],
        [_vi("y", TensorProto.FLOAT, [4])],
        [W],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("local", 1)],
        ir_version=IR_VERSION,
        functions=[function],
    )
    path = save_external(model, tmp_path / "model.onnx")
    feeds = {"x": np.ones(4, dtype=np.float32)}

    converted = delay_initializers(path)

    assert len(converted.functions) == 0
    got = run_converted(converted, tmp_path, feeds)
    np.testing.assert_array_equal(got[0], ReferenceEvaluator(str(path)).run(None, feeds)[0])


def test_argument_errors(tmp_path):
    path = save_external(build_control_flow_model(), tmp_path / "model.onnx")

    with pytest.raises(ValueError, match="load_device"):
        delay_initializers(path, "gpu")
    with pytest.raises(ValueError, match="min_size"):
        delay_initializers(path, min_size=-1)
    with pytest.raises(TypeError, match="model_or_path"):
        delay_initializers(42)  # type: ignore[arg-type]
