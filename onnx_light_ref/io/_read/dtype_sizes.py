"""How many bytes ``raw_data`` of each ONNX element type takes: the one place the package computes a byte size.

ONNX packs some types below a byte: INT4/UINT4/FLOAT4E2M1 two per byte, INT2/UINT2 four per byte, FLOAT6E2M3/
FLOAT6E3M2 four values in three bytes (``ceil(n * 6 / 8)`` bytes, as ``onnx.helper.make_tensor`` checks). Sizing the
last two as one byte per element made align and verify refuse valid models that ``onnx.save_model`` wrote.

The sizes are a table (:data:`SPEC_BITS`: the layouts onnx.proto documents for every type with a fixed size), so that
reading a model's metadata needs neither numpy nor the ``onnx`` package (``inspect`` starts without them). A type the
table does not list (one a newer onnx adds) is sized by onnx itself: :func:`element_bits` asks
``onnx.numpy_helper.from_array`` to write 8 zeros of the numpy type ``onnx.helper.tensor_dtype_to_np_dtype`` maps
the element type to; the length of that ``raw_data`` is the number of bits per element, packing included. The
tests check the table against onnx's writers for every type the installed onnx writes as itself (onnx 1.17/1.18 map
BFLOAT16 and the FLOAT8 types to float32 and INT4 to int8, whose ``itemsize`` would say 4 bytes per bfloat16).

This module must never read a file, and never guess a size: a type without a fixed element size (STRING,
UNDEFINED, a value no onnx defines) has none (``None``).
"""

from __future__ import annotations

import functools

from onnx_light_ref.io._read.proto import TensorProto, data_type_name

_SPEC_BITS_BY_NAME: dict[str, int] = {
    "FLOAT": 32,
    "UINT8": 8,
    "INT8": 8,
    "UINT16": 16,
    "INT16": 16,
    "INT32": 32,
    "INT64": 64,
    "BOOL": 8,
    "FLOAT16": 16,
    "DOUBLE": 64,
    "UINT32": 32,
    "UINT64": 64,
    "COMPLEX64": 64,
    "COMPLEX128": 128,
    "BFLOAT16": 16,
    "FLOAT8E4M3FN": 8,
    "FLOAT8E4M3FNUZ": 8,
    "FLOAT8E5M2": 8,
    "FLOAT8E5M2FNUZ": 8,
    "FLOAT8E8M0": 8,
    "UINT4": 4,
    "INT4": 4,
    "FLOAT4E2M1": 4,
    "UINT2": 2,
    "INT2": 2,
    "FLOAT6E2M3": 6,
    "FLOAT6E3M2": 6,
}

SPEC_BITS: dict[int, int] = {
    getattr(TensorProto, name): bits
    for name, bits in _SPEC_BITS_BY_NAME.items()
    if hasattr(TensorProto, name)  # each onnx release defines the types it knows
}
"""Bits per element of every fixed-size type the installed onnx defines, as onnx.proto documents them."""

# Elements written by the probe: 8, so that no packing leaves a partial byte (8 six-bit values are 6 bytes) and the
# raw_data length in bytes is the number of bits per element.
_PROBE_ELEMENTS = 8


@functools.cache
def element_bits(data_type: int) -> int | None:
    """Bits one element of ``data_type`` takes in ``raw_data``, packing included; None without a fixed size.

    Args:
        data_type: a ``TensorProto.DataType`` value (any int: unknown values have no size).

    Returns:
        2, 4, 6, 8, 16, 32, 64 or 128; None for STRING, UNDEFINED and values this onnx does not define.
    """
    if data_type in (TensorProto.UNDEFINED, TensorProto.STRING):
        return None
    known = SPEC_BITS.get(data_type)
    if known is not None or data_type_name(data_type) is None:  # a number no onnx defines: nothing to ask onnx
        return known
    return _probe_bits(data_type)


def packed_nbytes(data_type: int, n_elements: int) -> int | None:
    """Bytes ``n_elements`` elements of ``data_type`` take in ``raw_data``: ``ceil(n_elements * bits / 8)``.

    Args:
        data_type: a ``TensorProto.DataType`` value.
        n_elements: the element count (the product of the dims), >= 0.

    Returns:
        The byte count (FLOAT6: 4 elements in 3 bytes, a partial group rounded up to whole bytes), or None when the
        type has no fixed element size (see :func:`element_bits`).

    Raises:
        ValueError: ``n_elements`` is negative.
    """
    if n_elements < 0:
        raise ValueError(f"n_elements must be >= 0, got {n_elements}.")
    bits = element_bits(data_type)
    return None if bits is None else -(-n_elements * bits // 8)


def _probe_bits(data_type: int) -> int | None:
    """onnx's own answer: the raw_data length of ``_PROBE_ELEMENTS`` zeros written by ``from_array``, when this onnx
    writes the type as itself (older ones write bfloat16/float8 as float32 and int4 unpacked: not an answer)."""
    import numpy as np  # only for a type the table does not list: reading metadata imports neither otherwise
    import onnx
    from onnx import numpy_helper

    try:
        np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))
        probe = numpy_helper.from_array(np.zeros(_PROBE_ELEMENTS, dtype=np_dtype))
    except (KeyError, TypeError, ValueError, NotImplementedError):
        return None
    if probe.data_type != data_type or not probe.HasField("raw_data"):
        return None
    return len(probe.raw_data) * 8 // _PROBE_ELEMENTS
