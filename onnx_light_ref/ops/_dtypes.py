"""The element types ``ai.rt::DelayedInitializer`` may produce: the single source of truth.

The schema's type constraint, the kernel's ``dtype`` check, the shape-inference check, the converter and the
conformance cases all read this module, so the allowed types cannot drift apart (onnx-light's schema allowed
complex types its kernel then refused, and its kernel accepted bfloat16/float8/int4 that the schema refused).

Two sets:

* :data:`PORTABLE_DTYPES`, the seed spec's 14 types (onnx-light's C++ runtime): types whose ``raw_data`` layout is
  numpy's own little-endian layout. A model meant for onnx-light uses only these
  (``delay_initializers(..., portable=True)``).
* :data:`EXTENDED_DTYPES`, the types large models are stored in, where the installed onnx's evaluator represents
  them: bfloat16, the float8 types (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0), int4/uint4 and float4 E2M1 (two per
  byte), int2/uint2 (four per byte) and float6 (four in three bytes). The op produces them exactly as onnx's own
  evaluator holds them (:func:`~onnx_light_ref.io._read.onnx_compat.evaluator_dtype`: ml_dtypes on current onnx, onnx's
  structured dtypes on onnx 1.17); a type this onnx does not define or cannot represent is refused with
  :class:`~onnx_light_ref.errors.UnsupportedElementTypeError` naming it (:func:`refuse_dtype`).

STRING is never allowed (its values are not raw bytes). This module must never hand-write what onnx already knows:
numpy dtypes come from ``numpy_helper.to_array``, sizes from :mod:`onnx_light_ref.io._read.dtype_sizes`, names from
the ``TensorProto.DataType`` enum.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnx_light_ref.errors import UnsupportedElementTypeError
from onnx_light_ref.io._read.dtype_sizes import element_bits
from onnx_light_ref.io._read.onnx_compat import ONNX_VERSION, element_type_name, evaluator_dtype, raw_type_refusal

PORTABLE_DTYPES: tuple[int, ...] = tuple(
    sorted(
        (
            TensorProto.BOOL,
            TensorProto.COMPLEX128,
            TensorProto.COMPLEX64,
            TensorProto.DOUBLE,
            TensorProto.FLOAT,
            TensorProto.FLOAT16,
            TensorProto.INT16,
            TensorProto.INT32,
            TensorProto.INT64,
            TensorProto.INT8,
            TensorProto.UINT16,
            TensorProto.UINT32,
            TensorProto.UINT64,
            TensorProto.UINT8,
        )
    )
)
"""The seed spec's 14 types (onnx-light's C++ runtime): the portable set, ascending."""

EXTENDED_TYPE_NAMES: tuple[str, ...] = (
    "BFLOAT16",
    "FLOAT8E4M3FN",
    "FLOAT8E4M3FNUZ",
    "FLOAT8E5M2",
    "FLOAT8E5M2FNUZ",
    "FLOAT8E8M0",
    "UINT4",
    "INT4",
    "FLOAT4E2M1",
    "UINT2",
    "INT2",
    "FLOAT6E2M3",
    "FLOAT6E3M2",
)
"""onnx.proto names of the types beyond the portable set the op produces wherever the installed onnx can."""

EXTENDED_DTYPES: tuple[int, ...] = tuple(
    sorted(
        getattr(TensorProto, name)
        for name in EXTENDED_TYPE_NAMES
        if hasattr(TensorProto, name) and raw_type_refusal(getattr(TensorProto, name)) is None
    )
)
"""The extended types the installed onnx defines and its evaluator represents from raw bytes, ascending."""

ALLOWED_DTYPES: tuple[int, ...] = tuple(sorted(PORTABLE_DTYPES + EXTENDED_DTYPES))
"""TensorProto.DataType values accepted by the op's ``dtype`` attribute with the installed onnx, ascending."""


def dtype_name(dtype: int) -> str:
    """Lower-case ONNX name of a TensorProto.DataType value (``1`` -> ``"float"``), or ``"<unknown N>"``.

    Types newer than the installed onnx are named too (``23`` -> ``"float4e2m1"`` on onnx 1.17).
    """
    name = element_type_name(dtype)
    return name.lower() if name is not None else f"<unknown {dtype}>"


def _type_strings(dtypes: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(sorted(f"tensor({dtype_name(t)})" for t in dtypes))


ALLOWED_TYPE_STRINGS: tuple[str, ...] = _type_strings(ALLOWED_DTYPES)
"""The schema's type-constraint strings, e.g. ``"tensor(float)"``, sorted as onnx prints them."""

PORTABLE_TYPE_STRINGS: tuple[str, ...] = _type_strings(PORTABLE_DTYPES)
"""The type-constraint strings of the seed spec (the portable set)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_allowed_dtype(dtype: object) -> bool:
    """True when ``dtype`` is an int (not a bool) naming one of :data:`ALLOWED_DTYPES`."""
    return _is_int(dtype) and dtype in ALLOWED_DTYPES


def is_portable_dtype(dtype: object) -> bool:
    """True when ``dtype`` is an int (not a bool) naming one of :data:`PORTABLE_DTYPES` (onnx-light's runtime)."""
    return _is_int(dtype) and dtype in PORTABLE_DTYPES


def is_packed_dtype(dtype: int) -> bool:
    """True for an allowed type stored below a byte per element (int4, uint4, float4, int2, uint2, float6)."""
    bits = element_bits(dtype) if is_allowed_dtype(dtype) else None
    return bits is not None and bits % 8 != 0


def describe_allowed() -> str:
    """Human-readable list of the allowed dtypes for error messages: ``1 (float), 2 (uint8), ...``."""
    return ", ".join(f"{t} ({dtype_name(t)})" for t in ALLOWED_DTYPES)


def refusal_reason(dtype: object) -> str | None:
    """Why the op cannot produce ``dtype`` here (a sentence naming it), or None when it can."""
    if not _is_int(dtype):
        return f"dtype {dtype!r} ({type(dtype).__name__}) is not an integer TensorProto.DataType value"
    assert isinstance(dtype, int)
    if dtype in ALLOWED_DTYPES:
        return None
    why = raw_type_refusal(dtype)
    if why is None:  # an ONNX type onnx represents that the op does not list (none today)
        why = f"element type {dtype} ({dtype_name(dtype)}) is not one the op produces"
    return f"dtype {dtype} ({dtype_name(dtype)}) is not supported: {why} (onnx {ONNX_VERSION})"


def refuse_dtype(dtype: object, *, where: str | None = None) -> None:
    """Raise :class:`UnsupportedElementTypeError` for a dtype the op cannot produce; return for an allowed one.

    Args:
        dtype: the ``dtype`` attribute's value.
        where: who asks (a node, a tensor), put first in the message; None: no prefix.

    Raises:
        UnsupportedElementTypeError: naming the type, why it is refused and the accepted types.
    """
    reason = refusal_reason(dtype)
    if reason is not None:
        prefix = f"{where}: " if where else ""
        raise UnsupportedElementTypeError(f"{prefix}{reason}; expected one of {describe_allowed()}.", dtype)


def np_dtype_for(dtype: int) -> np.dtype:
    """The numpy dtype onnx's evaluator holds an allowed type in (ml_dtypes' ``bfloat16``, ``float32``...).

    Raises:
        UnsupportedElementTypeError: (a ``ValueError``) for a type that is not allowed.
    """
    refuse_dtype(dtype)
    np_dtype = evaluator_dtype(dtype)
    assert np_dtype is not None  # every allowed type has one (raw_type_refusal checked it)
    return np_dtype
