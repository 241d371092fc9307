"""The element types ``ai.rt::DelayedInitializer`` may produce: the single source of truth.

The schema's type constraint, the kernel's ``dtype`` check, the shape-inference check and the conformance cases all
read this module, so the 14 allowed types cannot drift apart (onnx-light's schema allowed complex types its kernel
then refused, and its kernel accepted bfloat16/float8/int4 that the schema refused). Only types whose ONNX
``raw_data`` layout is exactly numpy's little-endian layout are allowed: no STRING (not raw bytes), no
bfloat16/float8/int4/int2 (no numpy dtype without ml_dtypes, packed sub-byte layouts).

This module must never hand-write what onnx already knows: numpy dtypes come from
``onnx.helper.tensor_dtype_to_np_dtype`` and type names from the ``TensorProto.DataType`` enum.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

__all__ = [
    "ALLOWED_DTYPES",
    "ALLOWED_TYPE_STRINGS",
    "describe_allowed",
    "dtype_name",
    "is_allowed_dtype",
    "little_endian_dtype",
    "np_dtype_for",
]

ALLOWED_DTYPES: tuple[int, ...] = tuple(
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
"""TensorProto.DataType values accepted by the op's ``dtype`` attribute, ascending."""


def dtype_name(dtype: int) -> str:
    """Lower-case ONNX name of a TensorProto.DataType value (``1`` -> ``"float"``), or ``"<unknown N>"``."""
    try:
        return TensorProto.DataType.Name(dtype).lower()
    except ValueError:
        return f"<unknown {dtype}>"


ALLOWED_TYPE_STRINGS: tuple[str, ...] = tuple(sorted(f"tensor({dtype_name(t)})" for t in ALLOWED_DTYPES))
"""The schema's type-constraint strings, e.g. ``"tensor(float)"``, sorted as onnx prints them."""


def is_allowed_dtype(dtype: object) -> bool:
    """True when ``dtype`` is an int (not a bool) naming one of :data:`ALLOWED_DTYPES`."""
    return isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in ALLOWED_DTYPES


def np_dtype_for(dtype: int) -> np.dtype:
    """Native numpy dtype of an allowed TensorProto.DataType value; ``ValueError`` for any other value."""
    if not is_allowed_dtype(dtype):
        raise ValueError(
            f"dtype {dtype} ({dtype_name(dtype) if isinstance(dtype, int) else type(dtype).__name__}) is not "
            f"supported; expected one of {describe_allowed()}."
        )
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))


def little_endian_dtype(dtype: int) -> np.dtype:
    """The numpy dtype matching ONNX ``raw_data`` bytes (always little-endian) for an allowed dtype."""
    return np_dtype_for(dtype).newbyteorder("<")


def describe_allowed() -> str:
    """Human-readable list of the allowed dtypes for error messages: ``1 (float), 2 (uint8), ...``."""
    return ", ".join(f"{t} ({dtype_name(t)})" for t in ALLOWED_DTYPES)
