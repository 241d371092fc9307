"""Tensors of element types ``.npy`` cannot carry, across the ``run`` command's ``.npy`` boundary.

``np.save`` writes an ml_dtypes array (bfloat16, float8, int4...) with a descr ``np.load`` refuses (``'<f1'``) or
reads back as raw void (``'|V2'``): the type is lost. So ``run``:

* writes such an output **widened exactly** (:func:`output_for_npy`): bfloat16, float8, float4, float6 to float32;
  int4, int2 to int8; uint4, uint2 to uint8, every value unchanged, with a note naming the widening. Where the
  widening merges bit patterns (float8 E5M2's NaN payloads become one NaN), the note says so;
* or, with ``raw_bits=True``, writes each element's **bits** as an unsigned integer of the element's width (uint16
  for bfloat16, uint8 for the others; a sub-byte element's code in the low bits of its byte), same shape;
* reads an input of such a type from a ``.npy`` of the widened type and **narrows it exactly**
  (:func:`input_from_npy`): a value the type cannot hold (0.1 for bfloat16, 8 for int4, inf for float8 E4M3FN, a
  NaN payload bfloat16 cannot keep) is refused, naming the input, the first such value and its index; with
  ``raw_bits=True`` it reads the bits form instead.
* a type with **one NaN** (float8 E4M3FNUZ and E5M2FNUZ, float8 E8M0: their NaN has no sign) writes it as
  ``np.nan`` and reads any float32 NaN (either sign, any payload) as it, on every onnx (onnx's ``Cast`` gives it a
  sign that differs between onnx versions): a ``.npy`` ``run`` wrote on one onnx feeds the model on another.

Every conversion is onnx's own: widening is the ``Cast`` operator of onnx's reference evaluator (exact: every
value of these types is a float32, an int8 or a uint8), narrowing is its inverse, looked up in the widening of
every bit pattern (``Cast`` the other way would round, saturate infinities or quiet NaNs), packing and unpacking
are ``numpy_helper``'s. This module never writes
a file and never imports ``onnx.reference`` before a conversion is needed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnx_light_ref.io._read.dtype_sizes import element_bits
from onnx_light_ref.io._read.onnx_compat import array_raw_bytes, evaluator_dtype
from onnx_light_ref.ops._codes import every_code
from onnx_light_ref.ops._dtypes import EXTENDED_DTYPES, dtype_name, is_packed_dtype
from onnx_light_ref.ops._raw_arrays import array_from_bytes

# The integer types widen to the 8-bit integer of their signedness; every other extended type is a float.
_WIDENED_INTEGERS = {"INT4": np.int8, "INT2": np.int8, "UINT4": np.uint8, "UINT2": np.uint8}

# Sub-byte types whose codes are read back as the unsigned type of the same width (onnx 1.17 stores an int4's
# value, not its code, in its byte); float6 has no unsigned twin, and its representation holds the code.
_UNSIGNED_TWINS = {"INT4": "UINT4", "UINT4": "UINT4", "FLOAT4E2M1": "UINT4", "INT2": "UINT2", "UINT2": "UINT2"}


@dataclass(frozen=True)
class NpyForm:
    """An array as it goes into a ``.npy`` file, and what was done to it (None: written as it is)."""

    array: np.ndarray
    note: str | None = None


def _name(data_type: int) -> str:
    return str(TensorProto.DataType.Name(data_type))


def extended_type_of(dtype: np.dtype) -> int | None:
    """The extended element type whose representation (:func:`~onnx_light_ref.io._read.onnx_compat.evaluator_dtype`) is
    ``dtype``, or None for numpy's own types (which ``.npy`` carries)."""
    return _types_by_dtype().get(np.dtype(dtype))


@functools.cache
def _types_by_dtype() -> dict[np.dtype, int]:
    found: dict[np.dtype, int] = {}
    for data_type in EXTENDED_DTYPES:
        dtype = evaluator_dtype(data_type)
        if dtype is not None:
            found[dtype] = data_type
    return found


def _widened_dtype(data_type: int) -> np.dtype:
    return np.dtype(_WIDENED_INTEGERS.get(_name(data_type), np.float32))


def _bits_dtype(data_type: int) -> np.dtype:
    bits = element_bits(data_type)
    assert bits is not None
    return np.dtype(np.uint16 if bits == 16 else np.uint8)


def evaluator_array_dtype(data_type: int) -> np.dtype:
    """The dtype onnx's evaluator holds a tensor of ``data_type`` in (onnx 1.17: its structured bfloat16, not the
    float32 ``helper.tensor_dtype_to_np_dtype`` names); ``object`` for STRING."""
    dtype = evaluator_dtype(data_type)
    return dtype if dtype is not None else np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))


def feed_dtype(data_type: int, *, raw_bits: bool = False) -> np.dtype | None:
    """The dtype a ``.npy`` must have to feed an input of ``data_type``; None for numpy's own types.

    Args:
        data_type: the graph input's element type.
        raw_bits: the bits form (uint16/uint8) instead of the widened one.

    Returns:
        float32, int8, uint8 (widened) or uint16/uint8 (bits) for an extended type, else None.
    """
    if data_type not in EXTENDED_DTYPES:
        return None
    return _bits_dtype(data_type) if raw_bits else _widened_dtype(data_type)


@functools.cache
def _cast_session(source: int, target: int) -> Any:
    """onnx's reference evaluator running ``Cast(to=target)`` on a ``source`` input, at the newest opset."""
    from onnx.reference import ReferenceEvaluator

    node = onnx.helper.make_node("Cast", ["x"], ["y"], to=target)
    graph = onnx.helper.make_graph(
        [node],
        "cast",
        [onnx.helper.make_tensor_value_info("x", source, None)],
        [onnx.helper.make_tensor_value_info("y", target, None)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    return ReferenceEvaluator(model)


def _cast(array: np.ndarray, source: int, target: int) -> np.ndarray:
    with np.errstate(all="ignore"):  # out-of-range values are found by the round trip, not by warnings
        (result,) = _cast_session(source, target).run(None, {"x": array})
    return np.asarray(result)


def _widened_type(data_type: int) -> int:
    return int(onnx.helper.np_dtype_to_tensor_dtype(_widened_dtype(data_type)))


def _widen(array: np.ndarray, data_type: int) -> np.ndarray:
    widened = _cast(array, data_type, _widened_type(data_type)).astype(_widened_dtype(data_type), copy=False)
    if _has_one_nan(data_type):
        widened[np.isnan(widened)] = np.nan  # onnx's Cast gives it a sign, not the same on every onnx
    return widened


@functools.cache
def _has_one_nan(data_type: int) -> bool:
    """Whether the type has exactly one NaN code (the float8 fnuz types, float8e8m0), which has no sign.

    onnx's ``Cast`` widens it to a float32 NaN of a sign that depends on the onnx version (fnuz: ``-nan`` on 1.23,
    ``nan`` on 1.17), so ``run`` writes it as ``np.nan`` (``0x7FC00000``) and reads any NaN as it, on every onnx: a
    ``.npy`` written on one onnx feeds the same model on another.
    """
    if _widened_dtype(data_type).kind != "f":
        return False
    shape, raw = every_code(data_type)
    codes = array_from_bytes(data_type, raw, shape, where=dtype_name(data_type)).reshape(-1)
    return int(np.count_nonzero(np.isnan(_cast(codes, data_type, _widened_type(data_type))))) == 1


@functools.cache
def _merged_patterns(data_type: int) -> int:
    """How many of the type's bit patterns the widening merges into another's value (0: it keeps every bit)."""
    shape, raw = every_code(data_type)
    codes = array_from_bytes(data_type, raw, shape, where=dtype_name(data_type))
    widened = _widen(codes.reshape(-1), data_type)
    distinct_codes = np.unique(_bits(codes.reshape(-1), data_type)).size
    distinct_widened = np.unique(widened.view(f"u{widened.dtype.itemsize}")).size
    return int(distinct_codes - distinct_widened)


def _bits(array: np.ndarray, data_type: int) -> np.ndarray:
    """Each element's bit pattern as an unsigned integer (sub-byte types: the code, via onnx's pack and unpack)."""
    if not is_packed_dtype(data_type):
        return array.view(_bits_dtype(data_type)).copy()
    name = _name(data_type)
    twin = getattr(TensorProto, _UNSIGNED_TWINS.get(name, name))
    packed = array_raw_bytes(np.ascontiguousarray(array), data_type)
    codes = numpy_helper.to_array(TensorProto(data_type=twin, dims=array.shape, raw_data=packed))
    return codes.view(np.uint8).copy()


def output_for_npy(array: np.ndarray, *, raw_bits: bool = False) -> NpyForm:
    """What to save for an output: itself, or (extended types) its exact widening or its bits.

    Args:
        array: an output of the evaluator.
        raw_bits: write the bits form instead of the widened values.

    Returns:
        The array to save and a note for the user (None when the array is saved as it is).
    """
    data_type = extended_type_of(array.dtype)
    if data_type is None:
        return NpyForm(array)
    name = dtype_name(data_type)
    if raw_bits:
        bits = _bits(array, data_type)
        return NpyForm(bits, f"raw bits of {name} as {bits.dtype} (--raw-bits)")
    widened = _widen(array, data_type)
    merged = _merged_patterns(data_type)
    note = f"{name} widened exactly to {widened.dtype}"
    if merged:
        note += f" (NaN payloads are not kept: {merged} of its bit patterns widen to another's value; --raw-bits)"
    return NpyForm(widened, note)


def input_from_npy(name: str, array: np.ndarray, data_type: int, *, raw_bits: bool = False) -> np.ndarray:
    """The evaluator's array for a ``.npy`` feeding an input of an extended ``data_type``, narrowed exactly.

    Args:
        name: the input's name, for messages.
        array: the loaded ``.npy`` (:func:`feed_dtype` gives the dtype it must have).
        data_type: the graph input's element type (an extended one).
        raw_bits: the ``.npy`` holds bits (uint16/uint8), not widened values.

    Returns:
        An array of onnx's representation of ``data_type``, the same shape.

    Raises:
        ValueError: the ``.npy`` has another dtype, or a value (a code, with ``raw_bits``) the type cannot hold,
            named with its index; nothing was converted.
    """
    type_name = dtype_name(data_type)
    expected = feed_dtype(data_type, raw_bits=raw_bits)
    assert expected is not None
    if array.dtype != expected:
        form = "its raw bits" if raw_bits else "its values widened exactly"
        raise ValueError(
            f"input {name!r} is {type_name} in the model: give a .npy of {expected} ({form}), got {array.dtype}."
        )
    if raw_bits:
        return _from_bits(name, array, data_type)
    codes, keys, order = _inverse_widening(data_type)
    values = array.reshape(-1)
    if _has_one_nan(data_type):  # any NaN, of any sign or payload, is the type's one NaN
        values = np.where(np.isnan(values), np.float32(np.nan), values)
    wanted = values.view(keys.dtype)
    position = np.minimum(np.searchsorted(keys, wanted), keys.size - 1)
    wrong = np.flatnonzero(keys[position] != wanted)
    if wrong.size:
        first = int(wrong[0])
        index = [int(i) for i in np.unravel_index(first, array.shape)]
        raise ValueError(
            f"input {name!r} is {type_name} in the model: {wrong.size} of its {array.size} values cannot be held "
            f"exactly by {type_name}; the first, at index {index}, is {array.reshape(-1)[first]!s} ({array.dtype}). "
            f"Give values {type_name} holds (or its raw bits with --raw-bits)."
        )
    return codes[order[position]].reshape(array.shape)


@functools.cache
def _inverse_widening(data_type: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every code of the type (onnx's representation), the bits of their widenings sorted, and the sort order.

    Narrowing is the inverse of onnx's widening, looked up: a value is narrowed to the code whose widening has
    exactly its bits, and a value no code widens to is refused. No rounding, saturation or NaN quieting can happen
    (``Cast`` to float8 saturates infinities, to bfloat16 quiets signalling NaNs).
    """
    shape, raw = every_code(data_type)
    codes = array_from_bytes(data_type, raw, shape, where=dtype_name(data_type)).reshape(-1)
    widened = _widen(codes, data_type)
    keys = widened.view(f"u{widened.dtype.itemsize}")
    order = np.argsort(keys, kind="stable")
    return codes, keys[order], order


def _from_bits(name: str, array: np.ndarray, data_type: int) -> np.ndarray:
    """Bits (uint16/uint8 codes) -> onnx's representation, through onnx's own packing and unpacking."""
    bits = element_bits(data_type)
    assert bits is not None
    too_wide = np.flatnonzero(array.reshape(-1) >= (1 << bits))
    if too_wide.size:
        first = int(too_wide[0])
        index = [int(i) for i in np.unravel_index(first, array.shape)]
        raise ValueError(
            f"input {name!r} is {dtype_name(data_type)} in the model: code {int(array.reshape(-1)[first])} at index "
            f"{index} does not fit in {bits} bits (--raw-bits feeds each element's bit pattern)."
        )
    if not is_packed_dtype(data_type):
        raw = np.ascontiguousarray(array, dtype=_bits_dtype(data_type).newbyteorder("<")).tobytes()
    else:
        type_name = _name(data_type)
        twin = getattr(TensorProto, _UNSIGNED_TWINS.get(type_name, type_name))
        twin_dtype = evaluator_dtype(twin)
        assert twin_dtype is not None
        raw = array_raw_bytes(np.ascontiguousarray(array).view(twin_dtype), twin)
    return array_from_bytes(data_type, raw, array.shape, where=f"input {name!r}")
