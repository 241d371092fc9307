"""Every bit pattern of an element type, as the raw bytes of one tensor: test vectors and conversion tables.

:func:`every_code` is what the conformance cases store (every bfloat16, every float8 byte, every 4-bit code at an
odd count...) and what the ``run`` command widens once to learn whether a type's widening keeps every bit.
:func:`pack_codes` writes sub-byte codes in onnx.proto's documented layout; it is a *spec* of the layout, checked
against onnx's own ``numpy_helper.from_array`` by the tests, never used to decode a tensor (onnx does that).

This module must never read or write a file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from onnx_light_ref.io._read.dtype_sizes import element_bits
from onnx_light_ref.ops._dtypes import is_packed_dtype

# Shapes of the packed tensors: odd element counts (the last byte, or three-byte group, is partly padding), every
# code present (the code of element i is i * step modulo 2**bits, the step coprime with it).
_PACKED_SHAPES = {4: (3, 11), 2: (2, 7), 6: (5, 13)}
_PACKED_STEPS = {4: 7, 2: 3, 6: 5}


def pack_codes(codes: Sequence[int], bits: int) -> bytes:
    """Sub-byte codes packed as onnx.proto documents them.

    Element ``i`` takes bits ``[i*bits, (i+1)*bits)`` of the little-endian byte stream and the unused bits of the
    last byte are zero: two int4 per byte, low nibble first; four float6 in three bytes.

    Args:
        codes: the codes, each below ``2**bits`` (higher bits are dropped).
        bits: bits per element (2, 4 or 6; 8 and 16 give plain little-endian bytes).

    Returns:
        ``ceil(len(codes) * bits / 8)`` bytes.
    """
    value = 0
    for index, code in enumerate(codes):
        value |= (code & ((1 << bits) - 1)) << (index * bits)
    return value.to_bytes(-(-len(codes) * bits // 8), "little")


def every_code(dtype: int) -> tuple[tuple[int, ...], bytes]:
    """The shape and raw bytes of a tensor holding every bit pattern of ``dtype`` at least once.

    Args:
        dtype: an allowed type of at most 16 bits per element.

    Returns:
        ``(16, 16)`` and the 256 bytes for 8-bit types, ``(256, 256)`` and all 65,536 little-endian codes for
        16-bit ones; for packed types an odd count (33 four-bit, 14 two-bit, 65 six-bit values) holding every code.

    Raises:
        ValueError: a type wider than 16 bits (too many patterns) or without a fixed size.
    """
    bits = element_bits(dtype)
    if bits is None or bits > 16:
        raise ValueError(f"every_code needs a type of at most 16 bits per element, got dtype {dtype} ({bits} bits).")
    if is_packed_dtype(dtype):
        shape = _PACKED_SHAPES[bits]
        codes = [index * _PACKED_STEPS[bits] % (1 << bits) for index in range(math.prod(shape))]
        return shape, pack_codes(codes, bits)
    side = 1 << (bits // 2)
    return (side, side), np.arange(1 << bits, dtype=f"<u{bits // 8}").tobytes()
