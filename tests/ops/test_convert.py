"""delay_initializers: a model with external weights becomes one whose weights are DelayedInitializer nodes.

The story: a user has ``model.onnx`` + ``weights.data``; after conversion the reference evaluator (file and cpu
modes) computes exactly what plain ``ReferenceEvaluator(path)`` and onnxruntime compute, and the converter never
read a weight byte nor touched the model it was given.
"""

from __future__ import annotations

import builtins
import io
import logging
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._read.onnx_compat import evaluator_shape_checks
from onnx_light_ref.io._read.walker import iter_graphs
from onnx_light_ref.ops import (
    DelayedInitializer,
    delay_initializers,
    reference_evaluator,
    register_schemas,
)
from onnx_light_ref.ops._convert import plan_delayed_initializers
from onnx_light_ref.ops._dtypes import PORTABLE_DTYPES, np_dtype_for
from onnx_light_ref.ops._schema import make_delayed_initializer_node
from tests.checks import run_onnxruntime, sha256_of_tree
from tests.models import (
    IR_VERSION,
    OPSET,
    build_control_flow_model,
    build_shadowing_model,
    build_training_model,
    control_flow_feeds,
    save_external,
    shadowing_feeds,
    training_feeds,
    value_info,
)

pytest.importorskip("onnxruntime")

# onnxruntime has no complex tensor type at all ("MLDataType for: tensor(complex64) is not currently registered").
ORT_UNSUPPORTED = {TensorProto.COMPLEX64, TensorProto.COMPLEX128}
_vi = value_info


def run_converted(model: onnx.ModelProto, base_dir: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(base_dir)], **evaluator_shape_checks())
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


@pytest.mark.parametrize("dtype", PORTABLE_DTYPES, ids=lambda t: TensorProto.DataType.Name(t).lower())
def test_every_portable_dtype_round_trips(tmp_path, dtype):
    """The seed's 14 types; the extended ones are tests/ops/test_element_types.py's."""
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


def _exotic_dtype_model(tmp_path: Path) -> Path:
    """bfloat16, float8 and int4 external initializers (outside the portable set) and a float one."""
    exotic = [
        helper.make_tensor(
            "H", TensorProto.BFLOAT16, [4], np.array([0x3F80, 0xC000, 0x4049, 0], np.uint16).tobytes(), raw=True
        ),
        helper.make_tensor("E", TensorProto.FLOAT8E4M3FN, [4], bytes([0x38, 0x40, 0xB8, 0x00]), raw=True),
        helper.make_tensor("Q", TensorProto.INT4, [4], bytes([0x21, 0xF7]), raw=True),
    ]
    f32 = numpy_helper.from_array(np.arange(64, dtype=np.float32), "F")
    graph = helper.make_graph(
        [
            *(helper.make_node("Cast", [t.name], [f"{t.name.lower()}32"], to=TensorProto.FLOAT) for t in exotic),
            helper.make_node("Identity", ["F"], ["f"]),
        ],
        "exotic",
        [],
        [*(_vi(f"{t.name.lower()}32", TensorProto.FLOAT, [4]) for t in exotic), _vi("f", TensorProto.FLOAT, [64])],
        [*exotic, f32],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)
    return save_external(model, tmp_path / "model.onnx")


def test_portable_keeps_initializers_of_types_outside_the_seed_set(tmp_path, caplog):
    path = _exotic_dtype_model(tmp_path)

    with caplog.at_level(logging.INFO, logger="onnx_light_ref.ops._convert"):
        plan = plan_delayed_initializers(path, portable=True)
        converted = delay_initializers(path, portable=True)

    assert plan.kept_dtype == ["H", "E", "Q"]
    assert [item.tensor.name for item in plan.delayed] == ["F"]
    assert [t.name for t in converted.graph.initializer] == ["H", "E", "Q"]
    assert all(t.data_location == TensorProto.EXTERNAL for t in converted.graph.initializer)
    assert [n.output[0] for n in delayed_nodes(converted.graph)] == ["F"]
    assert "'H'" in caplog.text and "bfloat16" in caplog.text and "float8e4m3fn" in caplog.text
    assert "outside the portable set (portable=True" in caplog.text


def test_by_default_the_extended_types_become_nodes_too(tmp_path):
    path = _exotic_dtype_model(tmp_path)

    plan = plan_delayed_initializers(path)
    converted = delay_initializers(path)

    assert plan.kept_dtype == []
    assert [n.output[0] for n in delayed_nodes(converted.graph)] == ["H", "E", "Q", "F"]
    dtypes = {n.output[0]: next(a.i for a in n.attribute if a.name == "dtype") for n in delayed_nodes(converted.graph)}
    assert dtypes == {"H": TensorProto.BFLOAT16, "E": TensorProto.FLOAT8E4M3FN, "Q": TensorProto.INT4, "F": 1}
    assert list(converted.graph.initializer) == []


def test_portable_must_be_a_bool(tmp_path):
    path = _exotic_dtype_model(tmp_path)
    with pytest.raises(TypeError, match="portable must be a bool, got int 1"):
        delay_initializers(path, portable=1)


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_reference_evaluator_runs_exotic_dtypes_like_plain_reference_evaluator(tmp_path, load_device):
    path = _exotic_dtype_model(tmp_path)
    before = sha256_of_tree(tmp_path)

    got = reference_evaluator(path, load_device, **evaluator_shape_checks()).run(None, {})

    expected = ReferenceEvaluator(str(path)).run(None, {})
    assert len(got) == len(expected) == 4
    # onnx 1.17's own evaluator reads external bfloat16/float8 as float32 (garbage); the values below are the oracle
    plain_reads_exotic = np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)).itemsize == 2
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if plain_reads_exotic or i not in (0, 2):
            np.testing.assert_array_equal(g, e)
    np.testing.assert_array_equal(got[0], np.array([1.0, -2.0, 3.140625, 0.0], np.float32))
    np.testing.assert_array_equal(got[2], np.array([1, 2, 7, -1], np.float32))
    assert sha256_of_tree(tmp_path) == before


def test_subgraph_initializers_shadowing_outer_names_keep_ssa_form(tmp_path):
    """An inner initializer named like an outer value stays an initializer; the result passes the checker."""
    path = save_external(build_shadowing_model(), tmp_path / "model.onnx")
    register_schemas()

    plan = plan_delayed_initializers(path)
    converted = delay_initializers(path)
    converted_path = tmp_path / "converted.onnx"
    onnx.save_model(converted, str(converted_path))

    # By path, so that the kept external initializers resolve in the model's folder.
    onnx.checker.check_model(str(converted_path), full_check=True, check_custom_domain=True)
    assert [item.tensor.name for item in plan.delayed] == ["W", "B"]
    assert plan.kept_shadowing == ["W", "W", "B", "B"]
    assert [n.output[0] for n in delayed_nodes(converted.graph)] == ["W", "B"]
    for graph in iter_graphs(converted.graph):
        if graph is not converted.graph:
            assert delayed_nodes(graph) == [], graph.name
    # The source shows the checker would have rejected delaying the inner ones: a node output "W" in a branch.
    for cond in (True, False):
        for flip in (True, False):
            feeds = shadowing_feeds(cond, flip)
            expected = ReferenceEvaluator(str(path)).run(None, feeds)
            for sess in (
                ReferenceEvaluator(str(converted_path), new_ops=[DelayedInitializer.bind(tmp_path)]),
                reference_evaluator(path),
            ):
                for g, e in zip(sess.run(None, feeds), expected, strict=True):
                    np.testing.assert_array_equal(g, e)


def test_delaying_a_shadowing_initializer_would_break_ssa(tmp_path):
    """Why the converter keeps them: the same model with the inner W as a node output is rejected by the checker."""
    model = build_shadowing_model()
    register_schemas()
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    then_branch = next(a.g for a in if_node.attribute if a.name == "then_branch")
    inner = then_branch.initializer[0]
    then_branch.node.insert(
        0,
        make_delayed_initializer_node(
            inner.name, shape=list(inner.dims), dtype=inner.data_type, load_device="file", filename="w.bin", offset=0
        ),
    )
    del then_branch.initializer[:]
    model.opset_import.append(helper.make_opsetid("ai.rt", 1))
    with pytest.raises(onnx.checker.ValidationError, match="single static assignment"):
        onnx.checker.check_model(model, check_custom_domain=True)


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


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_training_graphs_keep_their_initializers(tmp_path, load_device):
    """Only inference's initializers become nodes: training_info graphs keep theirs, external and byte-identical.

    The training weights file is deleted first: the converter must not even validate references it leaves alone
    (an ``initialization_binding``/``update_binding`` names an initializer, never a node output).
    """
    path, training_entries = build_training_model(tmp_path)
    expected = run_onnxruntime(path, training_feeds())
    os.unlink(tmp_path / "train.bin")

    converted = delay_initializers(path, load_device)

    assert sorted(node.output[0] for node in delayed_nodes(converted.graph)) == ["B", "W"]
    assert len(converted.graph.initializer) == 0
    (info,) = converted.training_info
    kept = {t.name: t.SerializeToString() for t in (*info.initialization.initializer, *info.algorithm.initializer)}
    assert kept == training_entries
    for graph in (info.initialization, info.algorithm):
        assert not delayed_nodes(graph)
    assert [(b.key, b.value) for b in info.update_binding] == [("W", "W_new")]
    np.testing.assert_allclose(run_converted(converted, tmp_path, training_feeds())[0], expected[0], rtol=1e-6)
