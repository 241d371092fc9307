"""A tensor's raw bytes -> the numpy array onnx's own evaluator holds for it: the kernel's one decoding step.

``ReferenceEvaluator(onnx.load(path))`` converts each initializer with ``numpy_helper.to_array``; the kernel must
return, bit for bit and in the same dtype (:func:`~onnx_light_ref.ops.dtypes.np_dtype_for`), the array that
function returns for the same bytes, NaN payloads and ``-0.0`` included. :func:`read_array` does it in two ways:

* **byte-sized types** (the 14 portable ones, bfloat16, the float8 types): ``to_array`` is
  ``np.frombuffer(raw, dtype)``; the bytes are read straight into the output array, byte-swapped in place on a
  big-endian host as onnx does. A file-mode run holds the tensor once. (onnx 1.17's ``to_array`` ignores the raw
  bytes of a bfloat16 tensor, see :mod:`onnx_light_ref.onnx_compat`; reading them into its bfloat16 dtype is what
  it does with ``int32_data``.)
* **packed types** (int4, uint4, float4: two per byte; int2, uint2: four; float6: four in three bytes; odd counts
  padded): the packed bytes are read :data:`PACKED_CHUNK_BYTES` at a time and each chunk is unpacked by onnx
  itself, ``numpy_helper.to_array`` on a ``TensorProto`` holding it, into the output: the bit order, the padding
  and the sign handling are onnx's, and the memory is the output plus one chunk (unpacking the whole tensor at once
  took about 3.5x the output: the bytes copied into the proto, again out of it, and onnx's temporaries).

This module must never open a file (the caller reads, through its held folder) and never decode bits itself.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import numpy as np
from onnx import TensorProto, numpy_helper

from onnx_light_ref.errors import TensorAllocationError
from onnx_light_ref.io.read.dtype_sizes import element_bits, packed_nbytes
from onnx_light_ref.ops.allocation import allocate_tensor
from onnx_light_ref.ops.dtypes import dtype_name, is_packed_dtype, np_dtype_for

__all__ = ["PACKED_CHUNK_BYTES", "RawReader", "array_from_bytes", "read_array"]

PACKED_CHUNK_BYTES = 3 * 1024 * 1024
"""Packed bytes unpacked per ``to_array`` call: a multiple of 3, so that every chunk but the last holds whole
elements of every packing (four float6 take three bytes), and small next to any tensor worth reading lazily."""

RawReader = Callable[[memoryview, int], int]
"""``read(view, position)``: fill ``view`` with the tensor's raw bytes from ``position`` (0: its first byte) on;
returns how many bytes it read (fewer only at the end of the data)."""


def read_array(dtype: int, shape: tuple[int, ...], read: RawReader, *, where: str) -> tuple[np.ndarray, int]:
    """The array onnx's evaluator holds for the tensor whose raw bytes ``read`` provides.

    Args:
        dtype: an allowed ``TensorProto.DataType`` value.
        shape: the tensor's dimensions.
        read: where the raw bytes come from (see :data:`RawReader`); errors it raises propagate.
        where: who needs the tensor, for messages.

    Returns:
        A new writable array of ``np_dtype_for(dtype)`` and ``shape``, and the number of raw bytes read: when that
        is below the tensor's byte count the data ended early and the array is incomplete (the caller refuses it).

    Raises:
        TensorAllocationError: the array cannot be held in memory.
    """
    out = allocate_tensor(shape, np_dtype_for(dtype), where=where)
    if not is_packed_dtype(dtype):
        done = read(out.reshape(-1).view(np.uint8).data, 0)
        if sys.byteorder == "big" and out.dtype.itemsize > 1:
            out.byteswap(inplace=True)  # what numpy_helper.to_array does on a big-endian host
        return out, done
    return out, _read_packed(dtype, out.reshape(-1), read, where)


def _read_packed(dtype: int, flat: np.ndarray, read: RawReader, where: str) -> int:
    """Fill ``flat`` chunk by chunk, each chunk unpacked by ``numpy_helper.to_array``; the bytes read."""
    bits = element_bits(dtype)
    nbytes = packed_nbytes(dtype, flat.size)
    assert bits is not None and nbytes is not None
    chunk = bytearray(min(PACKED_CHUNK_BYTES, nbytes))
    position = first = 0
    while position < nbytes:
        size = min(len(chunk), nbytes - position)
        view = memoryview(chunk)[:size]
        got = read(view, position)
        if got < size:
            return position + got
        count = min(size * 8 // bits, flat.size - first)
        tensor = TensorProto(data_type=dtype, dims=[count], raw_data=bytes(view))
        try:
            flat[first : first + count] = numpy_helper.to_array(tensor)
        except MemoryError as exc:
            raise TensorAllocationError(
                f"{where}: unpacking {count} {dtype_name(dtype)} values failed to allocate ({exc})."
            ) from exc
        position, first = position + size, first + count
    return position


def array_from_bytes(dtype: int, raw: bytes, shape: tuple[int, ...], *, where: str) -> np.ndarray:
    """:func:`read_array` of raw bytes held in memory.

    Raises:
        ValueError: ``raw`` is not the tensor's byte count.
        TensorAllocationError: the array cannot be held in memory.
    """
    expected = packed_nbytes(dtype, math.prod(shape))
    if len(raw) != expected:
        raise ValueError(f"{where}: {len(raw)} bytes given for {expected} bytes of {dtype_name(dtype)} {list(shape)}.")
    source = memoryview(raw)

    def read(view: memoryview, position: int) -> int:
        piece = source[position : position + len(view)]
        view[: len(piece)] = piece
        return len(piece)

    array, _ = read_array(dtype, shape, read, where=where)
    return array
