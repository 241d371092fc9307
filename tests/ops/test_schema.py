"""ai.rt::DelayedInitializer schema: registration, checker (check_custom_domain) and shape inference."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import onnx.defs
import pytest
from onnx import TensorProto
from onnx import helper as oh

import onnx_light_ref
from onnx_light_ref.io._read.onnx_compat import HAS_PYTHON_SHAPE_INFERENCE, ONNX_VERSION
from onnx_light_ref.ops import ALLOWED_DTYPES, register_schemas
from onnx_light_ref.ops._attributes import ATTRIBUTE_TYPES
from onnx_light_ref.ops._dtypes import (
    ALLOWED_TYPE_STRINGS,
    EXTENDED_DTYPES,
    PORTABLE_DTYPES,
    PORTABLE_TYPE_STRINGS,
    dtype_name,
)
from onnx_light_ref.ops._schema import DOMAIN, OP_TYPE, check_delayed_initializer_node, make_delayed_initializer_node

OPSETS = [oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)]
# onnx < 1.19 cannot attach a Python inference function (onnx_light_ref.io._read.onnx_compat): what it does instead is
# checked by tests/test_onnx_compat.py and by test_node_check_without_onnx_validates_like_the_kernel below.
needs_inference = pytest.mark.skipif(
    not HAS_PYTHON_SHAPE_INFERENCE, reason=f"onnx {ONNX_VERSION} has no Python shape inference (onnx >= 1.19)"
)


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register_schemas()


def make_node(drop: tuple[str, ...] = (), **overrides: object) -> onnx.NodeProto:
    values: dict[str, object] = {
        "shape": [2, 3],
        "dtype": TensorProto.FLOAT,
        "load_device": "file",
        "runtime_device": "cpu",
        "filename": "weights.bin",
        "offset": 16,
    }
    values.update(overrides)
    node = oh.make_node("DelayedInitializer", [], ["y"], domain="ai.rt", name="w")
    for key, attr_type in ATTRIBUTE_TYPES.items():
        if key in drop:
            continue
        value = values[key]
        node.attribute.append(
            value if isinstance(value, onnx.AttributeProto) else oh.make_attribute(key, value, attr_type=attr_type)
        )
    return node


def model_with_identity(node: onnx.NodeProto) -> onnx.ModelProto:
    """y -> Identity -> z, with z declared untyped-shape so inference must come from the op."""
    identity = oh.make_node("Identity", ["y"], ["z"])
    z = oh.make_tensor_value_info("z", TensorProto.UNDEFINED, None)
    return oh.make_model(oh.make_graph([node, identity], "g", [], [z]), opset_imports=OPSETS)


def model_declaring(node: onnx.NodeProto, elem_type: int, shape: list[int]) -> onnx.ModelProto:
    y = oh.make_tensor_value_info("y", elem_type, shape)
    return oh.make_model(oh.make_graph([node], "g", [], [y]), opset_imports=OPSETS)


def test_register_schemas_is_idempotent() -> None:
    register_schemas()
    register_schemas()
    schema = onnx.defs.get_schema("DelayedInitializer", 1, "ai.rt")
    assert schema.domain == "ai.rt" and schema.since_version == 1
    assert list(schema.inputs) == []
    assert [o.name for o in schema.outputs] == ["output"]
    assert sorted(schema.type_constraints[0].allowed_type_strs) == sorted(ALLOWED_TYPE_STRINGS)
    assert set(schema.attributes) == set(ATTRIBUTE_TYPES)
    assert all(attr.required for attr in schema.attributes.values())
    assert schema.has_type_and_shape_inference_function is HAS_PYTHON_SHAPE_INFERENCE


def test_allowed_types_are_spelled_as_onnx_spells_them() -> None:
    known = {t for schema in onnx.defs.get_all_schemas() for c in schema.type_constraints for t in c.allowed_type_strs}
    assert set(ALLOWED_TYPE_STRINGS) <= known
    assert len(PORTABLE_DTYPES) == 14 and len(PORTABLE_TYPE_STRINGS) == 14
    assert tuple(sorted(PORTABLE_DTYPES + EXTENDED_DTYPES)) == ALLOWED_DTYPES
    assert "tensor(string)" not in ALLOWED_TYPE_STRINGS
    # bfloat16, float8 and int4 are represented by every supported onnx (1.17 with its own structured dtypes).
    for extended in ("tensor(bfloat16)", "tensor(float8e4m3fn)", "tensor(float8e5m2fnuz)", "tensor(int4)"):
        assert extended in ALLOWED_TYPE_STRINGS
        assert extended not in PORTABLE_TYPE_STRINGS


def test_the_schema_accepts_the_extended_types_and_the_seed_ones() -> None:
    schema = onnx.defs.get_schema("DelayedInitializer", 1, "ai.rt")
    allowed = set(schema.type_constraints[0].allowed_type_strs)
    assert set(PORTABLE_TYPE_STRINGS) <= allowed
    assert allowed == set(ALLOWED_TYPE_STRINGS)


def test_registration_before_and_after_importing_onnx_reference() -> None:
    code = textwrap.dedent(
        """
        import sys
        import onnx, numpy as np
        from onnx import helper as oh
        order = sys.argv[1]
        if order == "schema-first":
            from onnx_light_ref.ops._schema import register_schemas
            register_schemas()
            from onnx_light_ref.ops import DelayedInitializer
        else:
            from onnx_light_ref.ops import DelayedInitializer, register_schemas
            register_schemas()
        from onnx.reference import ReferenceEvaluator
        node = oh.make_node("DelayedInitializer", [], ["y"], domain="ai.rt", shape=[0], dtype=1,
                            load_device="file", runtime_device="cpu", filename="never.bin", offset=0)
        model = oh.make_model(oh.make_graph([node], "g", [], [oh.make_tensor_value_info("y", 1, [0])]),
                              opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)])
        onnx.checker.check_model(model, check_custom_domain=True)
        assert ReferenceEvaluator(model, new_ops=[DelayedInitializer]).run(None, {})[0].shape == (0,)
        """
    )
    for order in ("schema-first", "kernel-first"):
        subprocess.run([sys.executable, "-c", code, order], check=True, timeout=120)


@pytest.mark.parametrize("dtype", ALLOWED_DTYPES)
@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_checker_accepts_valid_nodes(dtype: int, load_device: str) -> None:
    model = model_declaring(make_node(dtype=dtype, load_device=load_device), dtype, [2, 3])
    onnx.checker.check_model(model, check_custom_domain=True)
    onnx.checker.check_model(model, full_check=True, check_custom_domain=True)


@pytest.mark.parametrize("missing", list(ATTRIBUTE_TYPES))
def test_checker_rejects_missing_attribute(missing: str) -> None:
    model = model_declaring(make_node(drop=(missing,)), TensorProto.FLOAT, [2, 3])
    with pytest.raises(onnx.checker.ValidationError, match=f"Required attribute '{missing}' is missing"):
        onnx.checker.check_model(model, check_custom_domain=True)


@pytest.mark.parametrize(
    "attribute",
    [
        oh.make_attribute("shape", 3),
        oh.make_attribute("dtype", "float"),
        oh.make_attribute("load_device", 1),
        oh.make_attribute("runtime_device", ["cpu"]),
        oh.make_attribute("filename", 1.5),
        oh.make_attribute("offset", [0]),
    ],
    ids=lambda a: a.name,
)
def test_checker_rejects_mistyped_attribute(attribute: onnx.AttributeProto) -> None:
    model = model_declaring(make_node(**{attribute.name: attribute}), TensorProto.FLOAT, [2, 3])
    with pytest.raises(onnx.checker.ValidationError, match=f"Mismatched attribute type in '.*{attribute.name}'"):
        onnx.checker.check_model(model, check_custom_domain=True)


def test_checker_rejects_unknown_attribute_and_inputs() -> None:
    node = make_node()
    node.attribute.append(oh.make_attribute("bogus", 1))
    with pytest.raises(onnx.checker.ValidationError, match="Unrecognized attribute: bogus"):
        onnx.checker.check_model(model_declaring(node, TensorProto.FLOAT, [2, 3]), check_custom_domain=True)
    node = make_node()
    node.input.append("x")
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = oh.make_model(oh.make_graph([node], "g", [x], [y]), opset_imports=OPSETS)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model, check_custom_domain=True)


@needs_inference
@pytest.mark.parametrize("dtype", ALLOWED_DTYPES)
@pytest.mark.parametrize("shape", [[2, 3], [], [0, 5]])
def test_infer_shapes_types_the_output(dtype: int, shape: list[int]) -> None:
    model = model_with_identity(make_node(dtype=dtype, shape=shape))
    # Identity takes float8 from opset 19, int4 from 21, float4 from 23...: the newest opset types most of them;
    # for a type no Identity takes (float6 on onnx 1.23), the op's own output is checked alone.
    newest = onnx.defs.onnx_opset_version()
    model.opset_import[0].version = newest
    identity_types = onnx.defs.get_schema("Identity", newest).type_constraints[0].allowed_type_strs
    names = ("y", "z") if f"tensor({dtype_name(dtype)})" in identity_types else ("y",)
    if names == ("y",):
        del model.graph.node[1:]
        model.graph.output[0].name = "y"
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    by_name = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    for name in names:
        tensor_type = by_name[name].type.tensor_type
        assert tensor_type.elem_type == dtype
        assert [d.dim_value for d in tensor_type.shape.dim] == shape


INVALID_NODES = pytest.mark.parametrize(
    ("overrides", "drop", "fragment"),
    [
        ({"load_device": "gpu"}, (), "load_device must be 'cpu' or 'file', got 'gpu'"),
        ({"runtime_device": "cuda"}, (), "runtime_device must be 'cpu', got 'cuda'"),
        ({"filename": ""}, (), "filename must not be empty"),
        ({"offset": -8}, (), "offset must be non-negative, got -8"),
        ({"shape": [2, -3]}, (), r"shape must not contain negative dimensions, got \[2, -3\]"),
        ({"dtype": TensorProto.STRING}, (), r"dtype 8 \(string\) is not supported"),
        ({"dtype": 29}, (), r"dtype 29 \(<unknown 29>\) is not supported: element type 29 is not an ONNX element"),
        ({"dtype": 0}, (), r"dtype 0 \(undefined\) is not supported"),
        ({}, ("filename",), r"missing required attribute\(s\) 'filename'"),
        ({"offset": oh.make_attribute("offset", "0")}, (), "attribute 'offset' must be INT, got STRING"),
    ],
)


@needs_inference
@INVALID_NODES
@pytest.mark.parametrize("strict", [False, True])
def test_infer_shapes_validates_like_the_kernel(overrides: dict, drop: tuple, fragment: str, strict: bool) -> None:
    """An invalid node is an InferenceError naming the node in both modes: non-strict cannot swallow it."""
    model = model_with_identity(make_node(drop=drop, **overrides))
    with pytest.raises(onnx.shape_inference.InferenceError) as info:
        onnx.shape_inference.infer_shapes(model, strict_mode=strict)
    assert re.search(rf"^\[ShapeInferenceError\] node DelayedInitializer\[ai\.rt\] \(w\): {fragment}", str(info.value))
    assert not isinstance(info.value, ValueError)


@INVALID_NODES
def test_node_check_without_onnx_validates_like_the_kernel(overrides: dict, drop: tuple, fragment: str) -> None:
    """What generate-tests applies on onnx < 1.19: the inference function's checks, same error and message."""
    with pytest.raises(onnx.shape_inference.InferenceError) as info:
        check_delayed_initializer_node(make_node(drop=drop, **overrides))
    assert re.search(rf"^\[ShapeInferenceError\] node DelayedInitializer\[ai\.rt\] \(w\): {fragment}", str(info.value))
    check_delayed_initializer_node(make_node())  # a valid node passes


@pytest.mark.parametrize("full_check", [False, True])
def test_check_model_reports_an_invalid_node_by_name(full_check: bool) -> None:
    """check_model's own attribute check (ValidationError), then full_check's inference (InferenceError)."""
    model = model_declaring(make_node(shape=[2, -3]), TensorProto.FLOAT, [2, 3])
    if full_check and not HAS_PYTHON_SHAPE_INFERENCE:
        onnx.checker.check_model(model, full_check=True)  # nothing runs the op's inference before onnx 1.19
    elif full_check:
        with pytest.raises(
            onnx.shape_inference.InferenceError, match=r"node DelayedInitializer\[ai\.rt\] \(w\): shape"
        ):
            onnx.checker.check_model(model, full_check=True)
    else:
        onnx.checker.check_model(model)  # the checker validates attribute presence and types, not values
    model = model_declaring(make_node(drop=("offset",)), TensorProto.FLOAT, [2, 3])
    with pytest.raises(onnx.checker.ValidationError, match="Required attribute 'offset' is missing"):
        onnx.checker.check_model(model, full_check=full_check)


@needs_inference
@pytest.mark.parametrize(
    ("elem_type", "shape", "message"),
    [
        (TensorProto.INT64, [2, 3], "Inferred elem type differs from existing elem type"),
        (TensorProto.FLOAT, [4, 3], "Inferred shape and existing shape differ in dimension 0"),
    ],
)
def test_non_strict_inference_swallows_declared_conflicts_strict_reports_them(
    elem_type: int, shape: list[int], message: str
) -> None:
    """What non-strict mode can swallow: a valid node whose output is declared with another type or shape."""
    node = make_node(dtype=TensorProto.FLOAT, shape=[2, 3])
    identity = oh.make_node("Identity", ["y"], ["z"])
    model = oh.make_model(
        oh.make_graph([node, identity], "g", [], [oh.make_tensor_value_info("z", elem_type, shape)]),
        opset_imports=OPSETS,
    )
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    y = next(vi for vi in inferred.graph.value_info if vi.name == "y")
    assert y.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in y.type.tensor_type.shape.dim] == [2, 3]
    onnx.checker.check_model(model)
    with pytest.raises(onnx.shape_inference.InferenceError, match=message):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    with pytest.raises(onnx.shape_inference.InferenceError, match=message):
        onnx.checker.check_model(model, full_check=True)


def test_node_builder_writes_the_reference_attribute_order() -> None:
    node = make_delayed_initializer_node(
        "y", shape=[], dtype=TensorProto.DOUBLE, load_device="cpu", filename="/abs/w.bin", offset=8, name="n"
    )
    assert (node.op_type, node.domain, node.name, list(node.input), list(node.output)) == (
        OP_TYPE,
        DOMAIN,
        "n",
        [],
        ["y"],
    )
    assert (OP_TYPE, DOMAIN) == ("DelayedInitializer", "ai.rt")
    assert [(a.name, a.type) for a in node.attribute] == list(ATTRIBUTE_TYPES.items())
    assert [oh.get_attribute_value(a) for a in node.attribute] == [[], 11, b"cpu", b"cpu", b"/abs/w.bin", 8]
    model = model_declaring(node, TensorProto.DOUBLE, [])
    onnx.checker.check_model(model, full_check=True, check_custom_domain=True)
    assert make_node() == make_delayed_initializer_node(
        "y", shape=[2, 3], dtype=TensorProto.FLOAT, load_device="file", filename="weights.bin", offset=16, name="w"
    )


def test_the_package_spells_the_domain_and_op_type_in_one_place() -> None:
    """No string "ai.rt" / "DelayedInitializer" in code outside io/_read/delayed_names.py (``ops._schema`` and the
    sharing scan of ``io``, which never imports ``ops``, both take them from there).

    Docstrings, ``__all__`` lists and the packages' export tables name the Python class, not the op: they do not count.
    """
    package = Path(onnx_light_ref.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative == "io/_read/delayed_names.py" or path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        ignored = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    ignored.add(id(first.value))
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                ignored.update(id(n) for n in ast.walk(node.value))
        found += [
            f"{relative}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and node.value in ("ai.rt", "DelayedInitializer")
            and id(node) not in ignored
        ]
    assert found == []
