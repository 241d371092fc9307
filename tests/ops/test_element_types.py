"""The element types beyond numpy's: bfloat16, float8, int4/uint4, float4, int2/uint2, float6.

The story: a user has a model whose external weights are bfloat16 (an LLM checkpoint) or int4/float8 (a quantized
one). ``reference_evaluator(path)`` (file and cpu modes) must return, bit for bit and in the same dtype, what onnx's
own ``ReferenceEvaluator(onnx.load(path))`` returns, NaN payloads and ``-0.0`` included; ``delay_initializers``,
``undelay_initializers`` and the schema handle every such type; ``portable=True`` keeps them as initializers for
onnx-light's C++ runtime; a type the installed onnx cannot represent is refused with a typed error naming it.

onnx 1.17 (the floor) represents bfloat16, the float8 types and int4/uint4 with its own structured dtypes and does
not define the newer types: there the refusals are what is tested. Its ``numpy_helper.to_array`` ignores the raw
bytes of a bfloat16 tensor (uninitialized memory comes back), so the oracle for bfloat16 on the floor is onnx's
evaluator on the same values in ``int32_data``, the field that onnx reads (:func:`onnx_oracle`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref import verify_models
from onnx_light_ref.errors import UnsupportedElementTypeError
from onnx_light_ref.io._read.dtype_sizes import packed_nbytes
from onnx_light_ref.io._read.onnx_compat import (
    ONNX_VERSION,
    array_raw_bytes,
    evaluator_dtype,
    evaluator_shape_checks,
    onnx_readable_tensor,
    raw_type_refusal,
    to_array_reads_raw_data,
)
from onnx_light_ref.ops import (
    DelayedInitializer,
    delay_initializers,
    reference_evaluator,
    undelay_initializers,
)
from onnx_light_ref.ops import _raw_arrays as raw_arrays
from onnx_light_ref.ops._codes import every_code, pack_codes
from onnx_light_ref.ops._convert import plan_delayed_initializers
from onnx_light_ref.ops._dtypes import (
    ALLOWED_DTYPES,
    EXTENDED_DTYPES,
    EXTENDED_TYPE_NAMES,
    PORTABLE_DTYPES,
    dtype_name,
    is_packed_dtype,
    np_dtype_for,
)
from onnx_light_ref.ops._schema import check_delayed_initializer_node, make_delayed_initializer_node
from tests.checks import sha256_of_tree

IR_VERSION = 10
NEWEST_OPSET = onnx.defs.onnx_opset_version()
EXTENDED_IDS = [dtype_name(t) for t in EXTENDED_DTYPES]
# The candidate types this onnx does not represent (onnx 1.17: float4, float8e8m0, int2/uint2, float6; none on 1.23).
MISSING_NAMES = [name for name in EXTENDED_TYPE_NAMES if getattr(TensorProto, name, None) not in EXTENDED_DTYPES]
MISSING_NUMBERS = {"FLOAT4E2M1": 23, "FLOAT8E8M0": 24, "UINT2": 25, "INT2": 26, "FLOAT6E2M3": 27, "FLOAT6E3M2": 28}


def outputs_model(tensors: list[onnx.TensorProto]) -> onnx.ModelProto:
    """A graph whose outputs are its initializers, as they are (no operator's type constraint is involved)."""
    outputs = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in tensors]
    graph = helper.make_graph([], "types", [], outputs, tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", NEWEST_OPSET)], ir_version=IR_VERSION)


def save_external(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.data", size_threshold=0)
    return path


def every_code_tensor(dtype: int, name: str = "W") -> onnx.TensorProto:
    shape, raw = every_code(dtype)
    return onnx.TensorProto(name=name, data_type=dtype, dims=list(shape), raw_data=raw)


def onnx_oracle(path: Path, new_ops: list[type] | None = None) -> list[np.ndarray]:
    """``ReferenceEvaluator(onnx.load(path))``; a tensor whose raw bytes this onnx's ``to_array`` ignores (bfloat16 on
    onnx 1.17) is handed to it in the typed field it reads, the same values."""
    model = onnx.load(str(path))
    for tensor in model.graph.initializer:
        if not to_array_reads_raw_data(tensor.data_type):
            tensor.CopyFrom(onnx_readable_tensor(tensor.data_type, list(tensor.dims), tensor.raw_data, tensor.name))
    return list(ReferenceEvaluator(model, new_ops=new_ops).run(None, {}))


def assert_bit_equal(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()


# ------------------------------------------------------------------------------------------------ the type table


def test_the_portable_set_is_the_seed_spec() -> None:
    names = sorted(dtype_name(t) for t in PORTABLE_DTYPES)
    seed = "bool complex128 complex64 double float float16 int16 int32 int64 int8 uint16 uint32 uint64 uint8"
    assert names == sorted(seed.split())
    assert set(PORTABLE_DTYPES) <= set(ALLOWED_DTYPES)
    assert not set(PORTABLE_DTYPES) & set(EXTENDED_DTYPES)


def test_every_onnx_release_supported_represents_bfloat16_float8_and_int4() -> None:
    names = {dtype_name(t) for t in EXTENDED_DTYPES}
    assert {"bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "int4", "uint4"} <= names


@pytest.mark.parametrize("dtype", EXTENDED_DTYPES, ids=EXTENDED_IDS)
def test_the_representation_is_what_onnx_to_array_returns(dtype: int) -> None:
    shape, raw = every_code(dtype)
    onnx_array = numpy_helper.to_array(onnx_readable_tensor(dtype, list(shape), raw))
    assert np_dtype_for(dtype) == onnx_array.dtype == evaluator_dtype(dtype)
    # ml_dtypes on current onnx; onnx's own structured dtypes on onnx 1.17 (not the float32 its helper names).
    assert np_dtype_for(dtype).itemsize == (2 if dtype == TensorProto.BFLOAT16 else 1)


def test_only_onnx_117_bfloat16_ignores_raw_data() -> None:
    """The defect the oracle works around: onnx 1.17's to_array reads bfloat16 from int32_data only."""
    broken = [t for t in ALLOWED_DTYPES if not to_array_reads_raw_data(t)]
    assert broken in ([], [TensorProto.BFLOAT16])
    if evaluator_dtype(TensorProto.BFLOAT16).names is None:  # ml_dtypes' bfloat16: onnx's rewrite reads raw_data
        assert broken == []


@pytest.mark.parametrize("dtype", [t for t in EXTENDED_DTYPES if is_packed_dtype(t)])
def test_the_packing_of_the_cases_is_onnxs(dtype: int) -> None:
    """pack_codes (the cases' layout) against numpy_helper's own packing, odd counts included."""
    shape, raw = every_code(dtype)
    array = numpy_helper.to_array(onnx.TensorProto(data_type=dtype, dims=list(shape), raw_data=raw))
    assert array_raw_bytes(array, dtype) == raw
    assert len(raw) == packed_nbytes(dtype, int(np.prod(shape)))
    assert pack_codes([1, 2, 3], 4) == bytes([0x21, 0x03])  # low nibble first, padding nibble zero


# ------------------------------------------------------------------------------------- evaluation, the oracle


@pytest.mark.parametrize("load_device", ["file", "cpu"])
@pytest.mark.parametrize("dtype", EXTENDED_DTYPES, ids=EXTENDED_IDS)
def test_every_bit_pattern_evaluates_as_onnxs_own_evaluator(tmp_path: Path, dtype: int, load_device: str) -> None:
    path = save_external(outputs_model([every_code_tensor(dtype)]), tmp_path / "model.onnx")
    before = sha256_of_tree(tmp_path)

    sess = reference_evaluator(path, load_device, **evaluator_shape_checks())
    assert [n.op_type for n in sess.proto_.graph.node] == ["DelayedInitializer"]
    got = sess.run(None, {})
    again = sess.run(None, {})

    (expected,) = onnx_oracle(path)
    assert_bit_equal(got[0], expected)
    assert_bit_equal(again[0], expected)
    assert got[0].flags.writeable and not np.shares_memory(got[0], again[0])
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 8, 9])
@pytest.mark.parametrize("dtype", [t for t in EXTENDED_DTYPES if is_packed_dtype(t)], ids=dtype_name)
def test_packed_types_at_odd_counts_and_unaligned_offsets(tmp_path: Path, dtype: int, count: int) -> None:
    """The kernel straight from a node: bytes before and after the tensor, an odd offset, every count's padding."""
    rng = np.random.default_rng(count * 31 + dtype)
    nbytes = packed_nbytes(dtype, count)
    assert nbytes is not None
    payload = rng.integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()  # padding bits too: onnx ignores them
    (tmp_path / "w.bin").write_bytes(b"\xa5" * 7 + payload + b"\x5a" * 5)
    expected = numpy_helper.to_array(onnx.TensorProto(data_type=dtype, dims=[count], raw_data=payload))
    for load_device in ("file", "cpu"):
        node = make_delayed_initializer_node(
            "y", shape=[count], dtype=dtype, load_device=load_device, filename="w.bin", offset=7
        )
        graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", dtype, [count])])
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", NEWEST_OPSET), helper.make_opsetid("ai.rt", 1)]
        )
        (got,) = ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(tmp_path)]).run(None, {})
        assert_bit_equal(got, expected)


@pytest.mark.parametrize("chunk", [3, 6, 24])
@pytest.mark.parametrize("dtype", [t for t in EXTENDED_DTYPES if is_packed_dtype(t)], ids=dtype_name)
def test_packed_tensors_unpacked_chunk_by_chunk_are_unpacked_as_a_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: int, chunk: int
) -> None:
    """The kernel unpacks PACKED_CHUNK_BYTES at a time (memory: the output and one chunk); tiny chunks here."""
    monkeypatch.setattr(raw_arrays, "PACKED_CHUNK_BYTES", chunk)
    path = save_external(outputs_model([every_code_tensor(dtype)]), tmp_path / "model.onnx")
    for load_device in ("file", "cpu"):
        (got,) = reference_evaluator(path, load_device).run(None, {})
        (expected,) = onnx_oracle(path)
        assert_bit_equal(got, expected)


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_a_model_computing_with_every_extended_type(tmp_path: Path, load_device: str) -> None:
    """Cast to float32 and a sum per type: what a quantized model does with its weights, vs onnx's evaluator."""
    tensors = [every_code_tensor(dtype, f"W{dtype}") for dtype in EXTENDED_DTYPES]
    nodes = [helper.make_node("Cast", [t.name], [f"f{t.name}"], to=TensorProto.FLOAT) for t in tensors]
    outputs = [helper.make_tensor_value_info(f"f{t.name}", TensorProto.FLOAT, list(t.dims)) for t in tensors]
    graph = helper.make_graph(nodes, "cast", [], outputs, tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", NEWEST_OPSET)], ir_version=IR_VERSION)
    path = save_external(model, tmp_path / "model.onnx")

    with np.errstate(all="ignore"):
        got = reference_evaluator(path, load_device).run(None, {})
        expected = onnx_oracle(path)
    assert len(got) == len(EXTENDED_DTYPES)
    for g, e in zip(got, expected, strict=True):
        assert_bit_equal(g, e)


# ------------------------------------------------------------------------------------- convert, undelay, schema


def test_delay_then_undelay_is_verify_equal_for_every_extended_type(tmp_path: Path) -> None:
    tensors = [every_code_tensor(dtype, f"W{dtype}") for dtype in EXTENDED_DTYPES]
    source = save_external(outputs_model(tensors), tmp_path / "model.onnx")
    delayed = tmp_path / "delayed.onnx"
    converted = delay_initializers(source)
    assert len(converted.graph.node) == len(EXTENDED_DTYPES) and not converted.graph.initializer
    onnx.save(converted, str(delayed))
    (tmp_path / "out").mkdir()

    undelay_initializers(delayed, tmp_path / "out" / "model.onnx", alignment=64)

    result = verify_models(source, tmp_path / "out" / "model.onnx", by_name=True)
    assert result.equal, result
    restored = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert {t.name: t.data_type for t in restored.graph.initializer} == {t.name: t.data_type for t in tensors}


def test_portable_keeps_every_extended_type_as_an_initializer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tensors = [every_code_tensor(dtype, f"W{dtype}") for dtype in EXTENDED_DTYPES]
    tensors.append(numpy_helper.from_array(np.arange(4, dtype=np.float32), "F"))
    path = save_external(outputs_model(tensors), tmp_path / "model.onnx")

    with caplog.at_level(logging.INFO, logger="onnx_light_ref.ops._convert"):
        portable = delay_initializers(path, portable=True)
    extended = delay_initializers(path)

    assert [n.output[0] for n in portable.graph.node] == ["F"]
    assert [t.name for t in portable.graph.initializer] == [f"W{dtype}" for dtype in EXTENDED_DTYPES]
    assert {a.i for n in portable.graph.node for a in n.attribute if a.name == "dtype"} <= set(PORTABLE_DTYPES)
    assert len(extended.graph.node) == len(tensors) and not extended.graph.initializer
    assert "outside the portable set" in caplog.text
    # The portable model evaluates like onnx's evaluator: its kept tensors are ordinary external initializers.
    onnx.save(portable, str(tmp_path / "portable.onnx"))
    got = onnx_oracle(tmp_path / "portable.onnx", new_ops=[DelayedInitializer.bind(tmp_path)])
    for g, e in zip(got, onnx_oracle(path), strict=True):
        assert_bit_equal(g, e)


@pytest.mark.parametrize("dtype", EXTENDED_DTYPES, ids=EXTENDED_IDS)
def test_checker_and_node_check_accept_the_extended_types(dtype: int) -> None:
    from onnx_light_ref.ops import register_schemas

    register_schemas()
    node = make_delayed_initializer_node("y", shape=[3], dtype=dtype, load_device="file", filename="w", offset=0)
    check_delayed_initializer_node(node)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", dtype, [3])])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", NEWEST_OPSET), helper.make_opsetid("ai.rt", 1)]
    )
    onnx.checker.check_model(model, full_check=True, check_custom_domain=True)


# --------------------------------------------------------------------------------------------------- refusals


def refused_model(tmp_path: Path, dtype: int, load_device: str = "file") -> onnx.ModelProto:
    (tmp_path / "w.bin").write_bytes(bytes(16))
    node = make_delayed_initializer_node(
        "y", shape=[4], dtype=dtype, load_device=load_device, filename="w.bin", offset=0
    )
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.rt", 1)])


@pytest.mark.parametrize(
    ("dtype", "why"),
    [
        (TensorProto.STRING, r"element type 8 \(STRING\) is not stored as raw bytes"),
        (TensorProto.UNDEFINED, r"has no numpy representation for element type 0 \(UNDEFINED\)"),
        (29, r"element type 29 is not an ONNX element type"),
        (-3, r"element type -3 is not an ONNX element type"),
    ],
)
@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_types_no_onnx_can_produce_are_refused_by_name(tmp_path: Path, dtype: int, why: str, load_device: str) -> None:
    model = refused_model(tmp_path, dtype, load_device)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsupportedElementTypeError, match=why) as info:
        ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(tmp_path)])
    assert info.value.data_type == dtype
    assert f"dtype {dtype} ({dtype_name(dtype)}) is not supported" in str(info.value)
    assert "expected one of 1 (float)" in str(info.value)
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.skipif(not MISSING_NAMES, reason=f"onnx {ONNX_VERSION} represents every candidate type")
@pytest.mark.parametrize("name", MISSING_NAMES)
def test_types_this_onnx_lacks_are_refused_naming_the_type_and_the_onnx(tmp_path: Path, name: str) -> None:
    """The floor (onnx 1.17): float4, float8e8m0, int2/uint2 and float6 are refused, by kernel, inference, converter."""
    dtype = MISSING_NUMBERS[name]
    message = rf"dtype {dtype} \({name.lower()}\) is not supported: the installed onnx {ONNX_VERSION} does not define"
    assert raw_type_refusal(dtype) is not None and dtype not in ALLOWED_DTYPES
    refused_model(tmp_path, dtype)
    before = sha256_of_tree(tmp_path)
    for load_device in ("file", "cpu"):
        with pytest.raises(UnsupportedElementTypeError, match=message):
            ReferenceEvaluator(refused_model(tmp_path, dtype, load_device), new_ops=[DelayedInitializer.bind(tmp_path)])
    node = refused_model(tmp_path, dtype).graph.node[0]
    with pytest.raises(onnx.shape_inference.InferenceError, match=message):
        check_delayed_initializer_node(node)
    with pytest.raises(UnsupportedElementTypeError, match=message):
        np_dtype_for(dtype)
    assert sha256_of_tree(tmp_path) == before

    # The converter keeps such an initializer (onnx's own loader decides what to do with it) and says why.
    tensor = onnx.TensorProto(name="W", data_type=dtype, dims=[4], raw_data=bytes(packed_nbytes(dtype, 4) or 4))
    path = save_external(outputs_model([tensor]), tmp_path / "model.onnx")
    assert plan_delayed_initializers(path).kept_dtype == ["W"]


def test_undelay_refuses_a_node_of_a_type_this_onnx_cannot_produce(tmp_path: Path) -> None:
    model = refused_model(tmp_path, 29)
    onnx.save(model, str(tmp_path / "delayed.onnx"))
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsupportedElementTypeError, match=r"dtype 29 \(<unknown 29>\) is not supported"):
        undelay_initializers(tmp_path / "delayed.onnx", tmp_path / "standard.onnx")
    assert sha256_of_tree(tmp_path) == before
