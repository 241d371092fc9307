"""Rule 2's one decision (``io/_plan/sites.py``): which tensors may become external, and where their bytes may sit.

The table of inputs whose data shape inference reads is checked against the installed onnx (every input its
inference functions read, probed with an external tensor, is listed) and against the real consumers: for each op,
``check_model(full_check=True)`` and an onnxruntime session refuse the model with the tensor external and accept it
inline.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, defs, helper, numpy_helper, shape_inference

from onnx_light_ref.io._plan.sites import (
    DATA_INPUTS,
    SHAPE_TENSOR,
    SiteColumns,
    SitePolicy,
    _table_inputs,
    all_may_sit,
    may_sit,
    placement_problem,
)
from onnx_light_ref.io._read.walker import iter_tensors
from tests.models import IR_VERSION, OPSET, externalize

_EXTERNAL = "Cannot parse data from external tensors"
_ELEMENTS = {
    "tensor(float)": TensorProto.FLOAT,
    "tensor(int64)": TensorProto.INT64,
    "tensor(int32)": TensorProto.INT32,
    "tensor(double)": TensorProto.DOUBLE,
    "tensor(bool)": TensorProto.BOOL,
    "tensor(uint8)": TensorProto.UINT8,
}


def _external_copy(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.ClearField("raw_data")
    copy.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "x.bin"), ("offset", "0"), ("length", "8")):
        copy.external_data.add(key=key, value=value)
    return copy


def _element(schema: defs.OpSchema, formal: defs.OpSchema.FormalParameter, prefer: int) -> int | None:
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}.get(
        formal.type_str, [formal.type_str]
    )
    elements = [_ELEMENTS[s] for s in allowed if s in _ELEMENTS]
    if not elements:
        return None
    return prefer if prefer in elements else elements[0]


def _reads_external(schema: defs.OpSchema, index: int) -> bool:
    """Whether the schema's inference parses input ``index``'s data when it is an external tensor, for some shapes."""
    inputs = list(schema.inputs)
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(schema.name, names, [f"o{k}" for k in range(max(1, len(schema.outputs)))])
    shapes = ((), (1,), (2,), (4,))
    for prefer, with_data, (mine, others) in itertools.product(
        (TensorProto.INT64, TensorProto.FLOAT), (False, True), itertools.product(shapes, (*shapes, (1, 1, 2, 2)))
    ):
        elements = [_element(schema, formal, prefer) for formal in inputs]
        if None in elements:
            return False
        types, data = {}, {}
        for k, (name, element) in enumerate(zip(names, elements, strict=True)):
            shape = mine if k == index else others
            types[name] = helper.make_tensor_type_proto(element, list(shape))
            value = numpy_helper.from_array(np.ones(shape, helper.tensor_dtype_to_np_dtype(element)), name)
            if k == index:
                data[name] = _external_copy(value)
            elif with_data:
                data[name] = value
        try:
            shape_inference.infer_node_outputs(
                schema, node, types, data, opset_imports=[helper.make_opsetid("", schema.since_version)]
            )
        except Exception as exc:
            if _EXTERNAL in str(exc):
                return True
    return False


def _latest_schemas() -> list[defs.OpSchema]:
    latest: dict[str, defs.OpSchema] = {}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain in ("", "ai.onnx.ml") and not schema.deprecated and schema.since_version <= 25:
            known = latest.get((schema.domain, schema.name))  # type: ignore[call-overload]
            if known is None or schema.since_version > known.since_version:
                latest[(schema.domain, schema.name)] = schema  # type: ignore[index]
    return sorted(latest.values(), key=lambda s: (s.domain, s.name))


@pytest.mark.skipif(
    tuple(int(part) for part in onnx.__version__.split(".")[:2]) < (1, 23),
    reason=f"the table was derived with onnx 1.23; onnx {onnx.__version__}'s infer_node_outputs crashes (segfault) on "
    "some of the probe's inputs (seen with 1.17)",
)
def test_every_input_the_installed_onnx_reads_as_data_is_in_the_table() -> None:
    """A probe of every op's latest schema: an input its inference parses from an external tensor is listed (the
    table may list more: the probe cannot reach every input, and older onnx versions)."""
    missing = []
    for schema in _latest_schemas():
        for index in range(len(schema.inputs)):
            if _reads_external(schema, index) and (
                schema.domain != "" or index not in _table_inputs(schema.name, schema.since_version)
            ):
                missing.append(f"{schema.domain or 'ai.onnx'}::{schema.name}-{schema.since_version} input {index}")
    assert missing == []


def _int64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# op, inputs (name -> value, None: the graph input x of shape [1, 1, 4, 4]), the probed input, attributes
CONSUMERS = {
    "Reshape": ({"shape": _int64([2, 8])}, "shape", {}),
    "Expand": ({"shape": _int64([2, 1, 4, 4])}, "shape", {}),
    "Tile": ({"repeats": _int64([1, 1, 2, 2])}, "repeats", {}),
    "Slice": ({"starts": _int64([0]), "ends": _int64([2]), "axes": _int64([2])}, "starts", {}),
    "Unsqueeze": ({"axes": _int64([0])}, "axes", {}),
    "Squeeze": ({"axes": _int64([0])}, "axes", {}),
    "ReduceSum": ({"axes": _int64([1])}, "axes", {}),
    "ReduceMean": ({"axes": _int64([1])}, "axes", {}),
    "Pad": ({"pads": _int64([0, 0, 1, 1, 0, 0, 1, 1])}, "pads", {}),
    "TopK": ({"k": _int64([2])}, "k", {}),
    "Resize": ({"roi": np.zeros(0, np.float32), "scales": np.ones(4, np.float32)}, "scales", {}),
    "Split": ({"split": _int64([2, 2])}, "split", {"axis": 2}),
}


def _consumer_model(op: str, folder: Path, external: bool) -> Path:
    constants, probed, attributes = CONSUMERS[op]
    initializers = [numpy_helper.from_array(value, name) for name, value in constants.items()]
    if external:
        externalize([t for t in initializers if t.name == probed], folder, "w.bin")
    outputs = ["y", "z"] if op in ("TopK", "Split") else ["y"]
    # The graph returns Shape(y): its type is known whatever the op infers (the full checker wants typed outputs).
    nodes = [helper.make_node(op, ["x", *constants], outputs, **attributes), helper.make_node("Shape", ["y"], ["ys"])]
    graph = helper.make_graph(
        nodes,
        op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("ys", TensorProto.INT64, [None])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = folder / f"{op}-{'external' if external else 'inline'}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("op", sorted(CONSUMERS))
def test_onnx_checker_and_onnxruntime_refuse_the_listed_input_external_and_accept_it_inline(
    tmp_path: Path, op: str
) -> None:
    inline = _consumer_model(op, tmp_path, external=False)
    onnx.checker.check_model(str(inline), full_check=True)
    ort.InferenceSession(str(inline), providers=["CPUExecutionProvider"])
    external = _consumer_model(op, tmp_path, external=True)
    with pytest.raises(Exception, match=_EXTERNAL):
        onnx.checker.check_model(str(external), full_check=True)
    with pytest.raises(Exception, match=_EXTERNAL):
        ort.InferenceSession(str(external), providers=["CPUExecutionProvider"])
    model = onnx.load(str(inline), load_external_data=False)
    policy = SitePolicy(model, 0)
    for site in iter_tensors(model):  # every constant input of these ops is read, but Resize's roi
        assert policy.is_shape_tensor(site) == (site.tensor.name != "roi")


# ---------------------------------------------------------------------------------------------- the decision itself


def _graph_model(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], **extra: object) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])], [], initializers
    )
    opsets = extra.pop("opsets", [helper.make_opsetid("", OPSET)])
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, **extra)  # type: ignore[arg-type]


def _decisions(model: onnx.ModelProto, threshold: int | None = 0) -> dict[str, tuple[bool, str | None]]:
    policy = SitePolicy(model, threshold)
    decided = {}
    for site in iter_tensors(model):
        decision = policy.decide(site, len(site.tensor.raw_data) if site.tensor.HasField("raw_data") else None)
        decided[site.tensor.name] = (decision.external, decision.reason)
    return decided


def test_a_shape_consumed_in_a_subgraph_stays_inline_unless_the_subgraph_defines_the_name_again() -> None:
    shape = numpy_helper.from_array(_int64([4, 4]), "shape")
    other = numpy_helper.from_array(_int64([2, 8]), "other")
    inner_shape = numpy_helper.from_array(_int64([8, 2]), "other")  # the subgraph's own "other" hides the outer one
    branch = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["a"]), helper.make_node("Reshape", ["x", "other"], ["b"])],
        "then",
        [],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [inner_shape],
    )
    node = helper.make_node("If", ["c"], ["a"], then_branch=branch, else_branch=branch)
    model = _graph_model([node], [shape, other])
    decided = _decisions(model)
    assert decided["shape"] == (False, SHAPE_TENSOR)
    names = [(site.tensor.name, site.kind, SitePolicy(model, 0).is_shape_tensor(site)) for site in iter_tensors(model)]
    # outer "other": only the subgraph reads an "other", its own: not a shape tensor; the inner ones are
    assert names[1] == ("other", "initializer", False)
    assert [entry[2] for entry in names if entry[0] == "other"][1:] == [True, True]


def test_a_constant_node_feeding_a_shape_input_stays_inline() -> None:
    value = numpy_helper.from_array(_int64([4, 4]), "value")
    nodes = [helper.make_node("Constant", [], ["s"], value=value), helper.make_node("Reshape", ["x", "s"], ["y"])]
    assert _decisions(_graph_model(nodes, [])) == {"value": (False, SHAPE_TENSOR)}


def test_a_shape_passed_to_a_local_function_that_reshapes_with_it_stays_inline() -> None:
    function = helper.make_function(
        "local",
        "f",
        ["a", "s"],
        ["b"],
        [helper.make_node("Reshape", ["a", "s"], ["b"])],
        [helper.make_opsetid("", OPSET)],
    )
    caller = helper.make_function(
        "local", "g", ["a", "s", "w"], ["b"], [helper.make_node("f", ["a", "s"], ["b"], domain="local")], []
    )
    shape = numpy_helper.from_array(_int64([4, 4]), "shape")
    weight = numpy_helper.from_array(np.ones(16, np.float32), "w")
    model = _graph_model(
        [helper.make_node("g", ["x", "shape", "w"], ["y"], domain="local")],
        [shape, weight],
        opsets=[helper.make_opsetid("", OPSET), helper.make_opsetid("local", 1)],
        functions=[function, caller],
    )
    assert _decisions(model) == {"shape": (False, SHAPE_TENSOR), "w": (True, None)}


def test_input_positions_follow_the_models_opset() -> None:
    """Resize-10's input 1 is ``scales`` (read); from Resize-11 on it is ``roi`` (not read)."""
    roi = numpy_helper.from_array(np.ones(4, np.float32), "second")
    node = helper.make_node("Resize", ["x", "second"], ["y"])
    assert _decisions(_graph_model([node], [roi], opsets=[helper.make_opsetid("", 10)])) == {
        "second": (False, SHAPE_TENSOR)
    }
    assert _decisions(_graph_model([node], [roi], opsets=[helper.make_opsetid("", 11)])) == {"second": (True, None)}
    assert _table_inputs("Reshape", 4) == frozenset()  # Reshape-1 took its shape as an attribute
    assert set(DATA_INPUTS) >= {"Reshape", "Expand", "Tile", "Slice", "Squeeze", "Unsqueeze", "Range"}


def test_the_order_of_the_decision() -> None:
    tensors = [
        numpy_helper.from_array(np.zeros(0, np.float32), "empty"),
        numpy_helper.from_array(np.ones(2, np.float32), "small"),
        numpy_helper.from_array(np.ones(64, np.float32), "large"),
        helper.make_tensor("text", TensorProto.STRING, [1], [b"abc" * 100]),
    ]
    tensors[3].raw_data = b"x" * 300  # no byte size a string tensor could be checked against
    model = _graph_model([], tensors)
    assert _decisions(model, 16) == {
        "empty": (False, None),
        "small": (False, None),
        "large": (True, None),
        "text": (False, None),
    }
    assert all(not external for external, _ in _decisions(model, None).values())  # no threshold: nothing moves


def test_where_bytes_may_sit() -> None:
    assert may_sit(0, 16, 16) and may_sit(100, 0, 100)
    assert not may_sit(0, 0, 100)  # the start of a file, or of a safetensors data section, is not its end
    assert not may_sit(8, 16, 100, data_start=64)  # inside a header
    assert not may_sit(90, 16, 100)
    assert "rest of the file" in (placement_problem(64, 0, 100, data_start=64) or "")
    assert "header" in (placement_problem(8, 16, 100, data_start=64) or "")
    assert "past the end" in (placement_problem(90, 16, 100) or "")
    assert placement_problem(0, 16, 16) is None


@pytest.mark.parametrize(
    ("offset", "length", "size", "start"),
    [
        (0, 16, 16, 0),
        (100, 0, 100, 0),
        (0, 0, 100, 0),
        (8, 16, 100, 64),
        (64, 16, 100, 64),
        (90, 16, 100, 0),
        (-8, 16, 100, 0),
        (8, -4, 100, 0),
        (2**62, 2**62, 100, 0),
        (0, 2**63 - 1, 2**63 - 1, 0),
    ],
)
def test_all_placed_sites_checked_at_once_agree_with_each_site_checked(
    offset: int, length: int, size: int, start: int
) -> None:
    """The columns' one-pass check accepts exactly what :func:`may_sit` accepts (a negative offset or length is
    left to the site-by-site check, which names it); a file of unknown size is not checked."""
    columns = SiteColumns()
    columns.place("w.bin", 0, 16)  # a good site in another file: the bad one is found among others
    columns.place("x.bin", offset, length)
    expected = may_sit(offset, length, size, data_start=start) and offset >= 0 and length >= 0
    assert all_may_sit(columns, [16, size], [0, start]) is expected
    assert all_may_sit(columns, [16, None], [0, 0]) is (offset >= 0 and length >= 0)
    assert all_may_sit(SiteColumns(), [], [])
