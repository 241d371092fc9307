"""What differs between the supported onnx releases, checked on whichever onnx runs the tests.

``.ci/run`` runs this file on the floor (onnx 1.17, Python 3.10) and on the newest onnx (Python 3.13), so each
branch below is exercised by some CI pass: the assertions say what the package does on an onnx with and without
each feature. The exit tests run real child processes: onnx 1.19 to 1.22 hung or crashed at interpreter exit once
a Python inference function was registered.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from onnx.defs import OpSchema
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.backend._backend import DelayedInitializerBackend
from onnx_light_ref.errors import UnsupportedOnnxFeatureError
from onnx_light_ref.io._read.locations import expected_nbytes
from onnx_light_ref.io._read.onnx_compat import (
    HAS_PYTHON_SHAPE_INFERENCE,
    ONNX_VERSION,
    array_raw_bytes,
    element_type_name,
    evaluator_checks_shapes,
    evaluator_dtype,
    evaluator_shape_checks,
    onnx_readable_tensor,
    raw_element_size,
    raw_type_refusal,
    readable_tensor_from_array,
    to_array_reads_raw_data,
    typed_raw_bytes,
)
from onnx_light_ref.ops import reference_evaluator
from onnx_light_ref.ops._schema import make_delayed_initializer_node, register_schemas

REPO = Path(__file__).resolve().parents[1]
# Generous: a clean child finishes in a few seconds; the old failure was a hang (or a signal) at exit.
CHILD_TIMEOUT = 180


def run_child(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False
    )


def delayed_model(shape: list[int], filename: str = "w.bin") -> onnx.ModelProto:
    """DelayedInitializer -> y -> Identity -> z (declared): shape inference alone can type y."""
    node = make_delayed_initializer_node(
        "y", shape=shape, dtype=TensorProto.FLOAT, load_device="cpu", filename=filename, offset=0
    )
    declared = oh.make_tensor_value_info("z", TensorProto.FLOAT, shape)
    graph = oh.make_graph([node, oh.make_node("Identity", ["y"], ["z"])], "g", [], [declared])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)])


def test_register_schemas_child_exits_cleanly(tmp_path: Path) -> None:
    done = run_child("-c", "from onnx_light_ref import register_schemas; register_schemas()", cwd=tmp_path)
    assert (done.returncode, done.stderr.count("Traceback")) == (0, 0), done.stderr


def test_schema_used_by_inference_then_exit_is_clean(tmp_path: Path) -> None:
    # The inference function has run (so onnx holds it) before the interpreter exits.
    code = textwrap.dedent(
        """
        import sys
        import onnx
        from onnx import helper as oh
        from onnx_light_ref import register_schemas
        from onnx_light_ref.ops._schema import make_delayed_initializer_node
        register_schemas()
        node = make_delayed_initializer_node("y", shape=[2], dtype=1, load_device="cpu", filename="w", offset=0)
        graph = oh.make_graph([node, oh.make_node("Identity", ["y"], ["z"])], "g", [],
                              [oh.make_tensor_value_info("z", 1, [2])])
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)])
        strict = sys.argv[1] == "strict"  # onnx < 1.19: y stays untyped, and strict Identity inference refuses it
        onnx.checker.check_model(model, full_check=strict, check_custom_domain=True)
        print([v.name for v in onnx.shape_inference.infer_shapes(model, strict_mode=strict).graph.value_info])
        """
    )
    done = run_child("-c", code, "strict" if HAS_PYTHON_SHAPE_INFERENCE else "lenient", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # y is typed when onnx runs the Python inference function; left out where onnx cannot attach one.
    assert done.stdout.split() == (["['y']"] if HAS_PYTHON_SHAPE_INFERENCE else ["[]"])


def test_generate_tests_child_writes_the_cases_and_exits_cleanly(tmp_path: Path) -> None:
    done = run_child("-m", "onnx_light_ref", "generate-tests", str(tmp_path / "cases"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    models = sorted((tmp_path / "cases").rglob("model.onnx"))
    assert len(models) >= 30
    for model in models:
        onnx.checker.check_model(str(model))


def test_the_schema_leaves_the_registry_at_exit(tmp_path: Path) -> None:
    # atexit runs hooks last-in first-out: this hook, registered before register_schemas(), runs after ours.
    code = textwrap.dedent(
        """
        import atexit, onnx.defs
        def report():
            print("registered at exit:", onnx.defs.has("DelayedInitializer", "ai.rt"))
        atexit.register(report)
        from onnx_light_ref import register_schemas
        register_schemas()
        print("registered:", onnx.defs.has("DelayedInitializer", "ai.rt"))
        """
    )
    done = run_child("-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["registered: True", "registered at exit: False"]


def test_inference_function_is_attached_exactly_where_onnx_allows_it() -> None:
    assert hasattr(OpSchema, "set_type_and_shape_inference_function") is HAS_PYTHON_SHAPE_INFERENCE
    register_schemas()
    model = delayed_model([2, 3])
    if HAS_PYTHON_SHAPE_INFERENCE:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        (y,) = inferred.graph.value_info
        assert (y.name, y.type.tensor_type.elem_type) == ("y", TensorProto.FLOAT)
        assert [d.dim_value for d in y.type.tensor_type.shape.dim] == [2, 3]
    else:
        assert list(onnx.shape_inference.infer_shapes(model).graph.value_info) == []
        # The cost: strict inference (and check_model(full_check=True)) refuses the untyped input of Identity.
        with pytest.raises(onnx.shape_inference.InferenceError, match="Input 0 expected to have type"):
            onnx.shape_inference.infer_shapes(model, strict_mode=True)
    # The checker validates the node on every onnx: the schema is registered either way.
    with pytest.raises(onnx.checker.ValidationError, match="Required attribute 'offset' is missing"):
        model = delayed_model([2])
        del model.graph.node[0].attribute[-1]
        onnx.checker.check_model(model, check_custom_domain=True)


def test_no_inference_warning_names_the_onnx_version_needed(tmp_path: Path) -> None:
    code = "import logging; logging.basicConfig(); from onnx_light_ref import register_schemas; register_schemas()"
    done = run_child("-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    if HAS_PYTHON_SHAPE_INFERENCE:
        assert "shape-inference" not in done.stderr
    else:
        assert f"onnx {ONNX_VERSION} cannot attach a Python shape-inference function" in done.stderr
        assert "onnx >= 1.19" in done.stderr


def test_evaluator_shape_checks_follow_the_evaluator_signature() -> None:
    has = "check_shape_annotations" in inspect.signature(ReferenceEvaluator.__init__).parameters
    assert evaluator_checks_shapes() is has
    assert evaluator_shape_checks() == ({"check_shape_annotations": True} if has else {})


def write_weights(folder: Path) -> Path:
    data = np.arange(6, dtype=np.float32)
    (folder / "w.bin").write_bytes(data.tobytes())
    path = folder / "m.onnx"
    onnx.save(delayed_model([2, 3]), path)
    return path


def test_check_shape_annotations_works_or_names_the_onnx_it_needs(tmp_path: Path) -> None:
    path = write_weights(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    if evaluator_checks_shapes():
        sess = reference_evaluator(path, "file", check_shape_annotations=True)
        np.testing.assert_array_equal(sess.run(None, {})[0], np.arange(6, dtype=np.float32).reshape(2, 3))
        rep = DelayedInitializerBackend.prepare(str(path), check_shape_annotations=True)
        np.testing.assert_array_equal(rep.run([])[0], np.arange(6, dtype=np.float32).reshape(2, 3))
    else:
        message = f"'check_shape_annotations' needs onnx >= 1.23; the installed onnx {ONNX_VERSION}"
        with pytest.raises(UnsupportedOnnxFeatureError, match=message):
            reference_evaluator(path, "file", check_shape_annotations=True)
        with pytest.raises(UnsupportedOnnxFeatureError, match=message):
            DelayedInitializerBackend.prepare(str(path), check_shape_annotations=True)
        with pytest.raises(UnsupportedOnnxFeatureError, match=message):
            DelayedInitializerBackend.run_node(delayed_model([2]).graph.node[0], [], check_shape_annotations=True)
    # Both ways: no file written, none changed.
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize(
    ("name", "size"),
    [("BFLOAT16", 2), ("FLOAT8E4M3FN", 1), ("FLOAT8E4M3FNUZ", 1), ("FLOAT8E5M2", 1), ("FLOAT8E5M2FNUZ", 1)],
)
def test_raw_sizes_of_the_types_old_onnx_maps_to_float32(name: str, size: int) -> None:
    data_type = getattr(TensorProto, name)
    assert raw_element_size(data_type) == size
    tensor = TensorProto(name="t", data_type=data_type, dims=[3, 5])
    assert expected_nbytes(tensor) == 15 * size


def test_raw_sizes_of_other_types_come_from_onnx() -> None:
    assert raw_element_size(TensorProto.FLOAT) is None
    assert raw_element_size(TensorProto.INT4) is None
    assert expected_nbytes(TensorProto(name="t", data_type=TensorProto.DOUBLE, dims=[3])) == 24


@pytest.mark.parametrize(
    ("data_type", "values", "packed"),
    [
        (TensorProto.INT4, [1, -2, 3, -4, 5], "e1c305"),  # odd count: onnx 1.17's from_array refuses it
        (TensorProto.UINT4, [1, 2, 15], "210f"),
        (TensorProto.INT4, [7, -8], "87"),  # even count: onnx packs it on every release
        (TensorProto.UINT4, [], ""),
    ],
)
def test_typed_sub_byte_values_convert_to_the_bytes_make_tensor_packs(
    data_type: int, values: list[int], packed: str
) -> None:
    tensor = oh.make_tensor("t", data_type, [len(values)], values)  # int32_data: one packed byte per entry
    assert bytes(v & 0xFF for v in tensor.int32_data).hex() == packed
    raw = typed_raw_bytes(tensor)
    assert raw.hex() == packed
    assert len(raw) == expected_nbytes(tensor)


def test_typed_bytes_still_refuse_values_that_do_not_fit_the_dims() -> None:
    short = TensorProto(name="t", data_type=TensorProto.INT4, dims=[5], int32_data=[0x21, 0x43])  # 4 values of 5
    with pytest.raises(ValueError):
        typed_raw_bytes(short)
    floats = TensorProto(name="f", data_type=TensorProto.FLOAT, dims=[3], float_data=[1.0, 2.0])
    with pytest.raises(ValueError):
        typed_raw_bytes(floats)


# ----------------------------------------------------------------------------------- element types beyond numpy's


def test_the_representation_of_the_extended_types_is_what_this_onnx_evaluates_with() -> None:
    """ml_dtypes on current onnx, onnx's own structured dtypes on onnx 1.17: whatever to_array returns."""
    bfloat16 = evaluator_dtype(TensorProto.BFLOAT16)
    assert bfloat16 is not None and bfloat16.itemsize == 2
    if bfloat16.names is not None:  # onnx 1.17: np.dtype((np.uint16, [("bfloat16", "<u2")]))
        assert bfloat16.names == ("bfloat16",)
        assert np.dtype(oh.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)) == np.float32  # the helper's other answer
    else:
        assert bfloat16.name == "bfloat16"
    assert evaluator_dtype(TensorProto.FLOAT) == np.float32
    assert evaluator_dtype(TensorProto.STRING) is None and evaluator_dtype(TensorProto.UNDEFINED) is None
    assert evaluator_dtype(999) is None


def test_raw_type_refusals_name_the_type_and_the_onnx() -> None:
    assert raw_type_refusal(TensorProto.FLOAT) is None
    assert raw_type_refusal(TensorProto.BFLOAT16) is None and raw_type_refusal(TensorProto.INT4) is None
    assert raw_type_refusal(TensorProto.STRING) == "element type 8 (STRING) is not stored as raw bytes"
    assert raw_type_refusal(999) == "element type 999 is not an ONNX element type"
    defined = hasattr(TensorProto, "FLOAT4E2M1")
    assert element_type_name(23) == "FLOAT4E2M1"  # named even where onnx does not define it
    if not defined:
        assert raw_type_refusal(23) == (
            f"the installed onnx {ONNX_VERSION} does not define element type 23 (FLOAT4E2M1); a newer onnx does"
        )


def test_to_array_reads_raw_data_detects_onnx_117s_bfloat16() -> None:
    reads = to_array_reads_raw_data(TensorProto.BFLOAT16)
    assert reads == (evaluator_dtype(TensorProto.BFLOAT16).names is None)  # only onnx 1.17's structured dtype fails
    assert to_array_reads_raw_data(TensorProto.FLOAT8E4M3FN) and to_array_reads_raw_data(TensorProto.INT4)
    assert not to_array_reads_raw_data(TensorProto.STRING)


@pytest.mark.parametrize("data_type", [TensorProto.BFLOAT16, TensorProto.FLOAT8E5M2, TensorProto.UINT4])
def test_onnx_readable_tensors_come_back_as_their_bytes(data_type: int) -> None:
    raw = bytes([0x01, 0x80, 0xFF, 0x7F, 0xC1, 0x00])
    count = len(raw) * 8 // (16 if data_type == TensorProto.BFLOAT16 else 8 if data_type != TensorProto.UINT4 else 4)
    tensor = onnx_readable_tensor(data_type, [count], raw, "t")
    assert tensor.HasField("raw_data") == to_array_reads_raw_data(data_type)
    array = numpy_helper.to_array(tensor)
    assert array.dtype == evaluator_dtype(data_type)
    assert array_raw_bytes(array, data_type) == raw
    again = readable_tensor_from_array(array, "u")
    assert numpy_helper.to_array(again).tobytes() == array.tobytes()


def test_odd_int4_arrays_are_packed_where_from_array_refuses() -> None:
    array = numpy_helper.to_array(TensorProto(data_type=TensorProto.INT4, dims=[3], raw_data=bytes([0x21, 0x0F])))
    assert array_raw_bytes(array, TensorProto.INT4) == bytes([0x21, 0x0F])
    assert numpy_helper.to_array(readable_tensor_from_array(array)).tobytes() == array.tobytes()
