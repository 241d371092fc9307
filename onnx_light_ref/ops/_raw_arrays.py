"""A tensor's raw bytes -> the numpy array onnx's own evaluator holds for it: the kernel's one decoding step.

``ReferenceEvaluator(onnx.load(path))`` converts each initializer with ``numpy_helper.to_array``; the kernel must
return, bit for bit and in the same dtype (:func:`~onnx_light_ref.ops._dtypes.np_dtype_for`), the array that
function returns for the same bytes, NaN payloads and ``-0.0`` included. :func:`read_array` does it in two ways:

* **byte-sized types** (the 14 portable ones, bfloat16, the float8 types): ``to_array`` is
  ``np.frombuffer(raw, dtype)``; the bytes are read straight into the output array, byte-swapped in place on a
  big-endian host as onnx does. A file-mode run holds the tensor once. (onnx 1.17's ``to_array`` ignores the raw
  bytes of a bfloat16 tensor, see :mod:`onnx_light_ref.io._read.onnx_compat`; reading them into its bfloat16 dtype
  is what it does with ``int32_data``.)
* **packed types** (int4, uint4, float4: two per byte; int2, uint2: four; float6: four in three bytes; odd counts
  padded): the packed bytes are read :data:`PACKED_CHUNK_BYTES` at a time and unpacked into the output, so the
  memory is the output plus one chunk (unpacking the whole tensor at once took about 3.5x the output: the bytes
  copied into the proto, again out of it, and onnx's temporaries). Where whole elements fit in a byte (4 and 2
  bits), each byte is looked up in :func:`_unpack_table`, onnx's own ``to_array`` of every byte value computed once
  per type, and written straight into the output (``np.take``): the bit order and the sign handling are onnx's,
  bit for bit, on every onnx. (onnx 1.17 unpacks 4-bit types in Python: ``to_array`` on each chunk took ~850 MiB
  of temporaries and minutes per 16 MiB.) float6, whose elements cross bytes, is unpacked by ``to_array`` on a
  ``TensorProto`` holding each chunk.

This module must never open a file (the caller reads, through its held folder) and never decode bits itself: onnx
decodes them (each byte value once, or each chunk).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable

import numpy as np
from onnx import TensorProto, numpy_helper

from onnx_light_ref.errors import TensorAllocationError
from onnx_light_ref.io._read.dtype_sizes import element_bits, packed_nbytes
from onnx_light_ref.ops._allocation import allocate_tensor
from onnx_light_ref.ops._dtypes import dtype_name, is_packed_dtype, np_dtype_for

PACKED_CHUNK_BYTES = 3 * 1024 * 1024
"""Packed bytes read and unpacked per step: a multiple of 3, so that every chunk but the last holds whole
elements of every packing (four float6 take three bytes), and small next to any tensor worth reading lazily."""

_TAKE_BLOCK = 64 * 1024
"""Packed bytes looked up per ``np.take`` call (its index copy: 512 KiB)."""

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


@functools.cache
def _unpack_table(dtype: int) -> np.ndarray | None:
    """onnx's unpacking of every byte value, for a type whose elements fit whole in a byte (4 or 2 bits).

    Row ``b`` holds the bytes of the elements ``numpy_helper.to_array`` returns for the raw byte ``b``, first element
    first (onnx 1.17's int4 is sign-extended to the byte, newer onnx keeps the code: whatever it does is the table).
    None for float6, whose elements cross byte boundaries.
    """
    bits = element_bits(dtype)
    if bits is None or 8 % bits:
        return None
    per_byte = 8 // bits
    values = numpy_helper.to_array(TensorProto(data_type=dtype, dims=[256 * per_byte], raw_data=bytes(range(256))))
    return np.ascontiguousarray(values).view(np.uint8).reshape(256, per_byte)


def _unpack_chunk(dtype: int, chunk: memoryview, out: np.ndarray) -> None:
    """Unpack the packed bytes ``chunk`` into ``out`` (the next ``out.size`` elements), as onnx unpacks them."""
    table = _unpack_table(dtype)
    if table is None:
        tensor = TensorProto(data_type=dtype, dims=[out.size], raw_data=bytes(chunk))
        out[:] = numpy_helper.to_array(tensor)
        return
    per_byte = table.shape[1]
    codes = np.frombuffer(chunk, dtype=np.uint8)
    whole, rest = divmod(out.size, per_byte)
    target = out.view(np.uint8)[: whole * per_byte].reshape(whole, per_byte)
    # np.take converts its indices to intp (8 bytes per packed byte): a block at a time keeps that small. mode="clip"
    # (a byte always indexes the table) writes into ``out`` directly; "raise" would buffer it in a copy.
    for start in range(0, whole, _TAKE_BLOCK):
        stop = min(start + _TAKE_BLOCK, whole)
        np.take(table, codes[start:stop], axis=0, out=target[start:stop], mode="clip")
    if rest:  # an odd count's last byte: its first elements only
        out.view(np.uint8)[whole * per_byte :] = table[codes[whole], :rest]


def _read_packed(dtype: int, flat: np.ndarray, read: RawReader, where: str) -> int:
    """Fill ``flat`` chunk by chunk, each chunk unpacked as onnx unpacks it (:func:`_unpack_chunk`); the bytes read."""
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
        try:
            _unpack_chunk(dtype, view, flat[first : first + count])
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
