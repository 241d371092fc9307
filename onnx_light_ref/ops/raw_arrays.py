"""A tensor's raw bytes -> the numpy array onnx's own evaluator holds for it: the kernel's one decoding step.

``ReferenceEvaluator(onnx.load(path))`` converts each initializer with ``numpy_helper.to_array``; the kernel must
return, bit for bit, the array that function returns for the same bytes (NaN payloads and ``-0.0`` included), in
the same dtype (:func:`~onnx_light_ref.ops.dtypes.np_dtype_for`). Two layouts:

* **byte-sized types** (the 14 portable ones, bfloat16, the float8 types): ``to_array`` is
  ``np.frombuffer(raw, dtype)``; the file's bytes are read straight into the output array (:func:`raw_buffer` *is*
  the output), byte-swapped in place on a big-endian host as onnx does. No copy: a file-mode run holds the tensor
  once. onnx 1.17's ``to_array`` ignores the raw bytes of a bfloat16 tensor (see
  :mod:`onnx_light_ref.onnx_compat`); reading them into its bfloat16 dtype is what it does with ``int32_data``.
* **packed types** (int4, uint4, float4: two per byte; int2, uint2: four; float6: four in three bytes, odd counts
  padded): the packed bytes are read into a ``uint8`` buffer and unpacked by onnx itself, ``numpy_helper.to_array``
  on a ``TensorProto`` holding them, so the bit order, the padding nibble and the sign handling are onnx's.

This module must never open a file (the kernel reads, through its held folder) and never decode bits itself.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from onnx import TensorProto, numpy_helper

from onnx_light_ref.errors import TensorAllocationError
from onnx_light_ref.io.read.dtype_sizes import packed_nbytes
from onnx_light_ref.ops.allocation import allocate_tensor
from onnx_light_ref.ops.dtypes import dtype_name, is_packed_dtype, np_dtype_for

__all__ = ["array_from_bytes", "array_from_raw", "raw_buffer", "writable_bytes"]


def raw_buffer(dtype: int, shape: tuple[int, ...], *, where: str) -> np.ndarray:
    """An uninitialized array to read the tensor's raw bytes into (see :func:`writable_bytes`).

    Args:
        dtype: an allowed ``TensorProto.DataType`` value.
        shape: the tensor's dimensions.
        where: who needs the tensor, for messages.

    Returns:
        The output array itself (its dtype and shape) for byte-sized types; for packed types a ``uint8`` array of
        the packed byte count.

    Raises:
        TensorAllocationError: the array cannot be held in memory.
    """
    if is_packed_dtype(dtype):
        nbytes = packed_nbytes(dtype, math.prod(shape))
        assert nbytes is not None
        return allocate_tensor((nbytes,), np.dtype(np.uint8), where=where)
    return allocate_tensor(shape, np_dtype_for(dtype), where=where)


def writable_bytes(buffer: np.ndarray) -> memoryview:
    """The buffer's bytes as a flat writable memoryview (``ndarray.data`` refuses ml_dtypes' formats)."""
    flat: memoryview = buffer.reshape(-1).view(np.uint8).data
    return flat


def array_from_raw(dtype: int, buffer: np.ndarray, shape: tuple[int, ...], *, where: str) -> np.ndarray:
    """The array onnx's evaluator would hold for the raw bytes now in ``buffer`` (from :func:`raw_buffer`).

    Args:
        dtype: the type ``buffer`` was made for.
        buffer: filled with the tensor's little-endian raw bytes.
        shape: the tensor's dimensions.
        where: who needs the tensor, for messages.

    Returns:
        A writable array of ``np_dtype_for(dtype)`` and ``shape``: ``buffer`` itself for byte-sized types.

    Raises:
        TensorAllocationError: onnx's unpacking cannot allocate its result.
    """
    if not is_packed_dtype(dtype):
        if sys.byteorder == "big" and buffer.dtype.itemsize > 1:
            buffer.byteswap(inplace=True)  # what numpy_helper.to_array does on a big-endian host
        return buffer
    tensor = TensorProto(data_type=dtype, dims=shape, raw_data=buffer.tobytes())
    try:
        array = numpy_helper.to_array(tensor)
    except MemoryError as exc:
        raise TensorAllocationError(
            f"{where}: unpacking {math.prod(shape)} {dtype_name(dtype)} values of shape {list(shape)} failed to "
            f"allocate ({exc})."
        ) from exc
    # onnx 1.17 returns a read-only view for some paths; every kernel output is a writable array of its own.
    return array if array.flags.writeable else array.copy()


def array_from_bytes(dtype: int, raw: bytes, shape: tuple[int, ...], *, where: str) -> np.ndarray:
    """:func:`raw_buffer`, filled with ``raw``, through :func:`array_from_raw`: raw bytes held in memory -> array.

    Raises:
        ValueError: ``raw`` is not the tensor's byte count.
        TensorAllocationError: the array cannot be held in memory.
    """
    buffer = raw_buffer(dtype, shape, where=where)
    view = writable_bytes(buffer)
    if len(raw) != len(view):
        raise ValueError(f"{where}: {len(raw)} bytes given for {len(view)} bytes of {dtype_name(dtype)} {list(shape)}.")
    view[:] = raw
    return array_from_raw(dtype, buffer, shape, where=where)
