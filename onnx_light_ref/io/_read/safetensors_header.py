"""The safetensors header: write one (padded so the data section starts aligned) and parse one as hostile input.

A safetensors file is an 8-byte little-endian header size ``N``, ``N`` bytes of UTF-8 JSON mapping each tensor name
to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the data section, which starts at
``8 + N``) plus an optional ``"__metadata__"`` object of string values, then the data section, which the tensors must
cover exactly: no hole, no overlap, nothing after the last tensor.

:func:`encode_header` pads the JSON with trailing spaces (valid JSON whitespace, what the ``safetensors`` library
does for its 8-byte alignment) so that the data section starts at a multiple of the requested alignment, and refuses
a header the library would refuse to open: ``N`` (the JSON *and* its padding) above :data:`MAX_HEADER_SIZE`, an
alignment above :data:`MAX_DATA_ALIGNMENT` (the padding alone would break the limit), a key that is not valid
Unicode. :func:`parse_header` treats the bytes as an attacker's and refuses everything ``safetensors`` 0.8 refuses
(``SafeTensors::read_metadata`` and ``Metadata::validate``): ``N`` above the limit or past the end of the file, text
that is not UTF-8 JSON (a lone surrogate escape, ``-0`` where an integer is due), unknown dtypes, shapes and offsets
that are not integers in ``[0, 2**64)``, a shape whose element count overflows u64 *in the library's checked
left-to-right product* (``[2**32, 2**32, 0]`` is refused although its product is 0) or whose bit count does, offsets
that disagree with ``dtype`` x ``shape``, overlaps; holes and bytes after the last tensor are returned for
:func:`require_covered`. It also refuses a few headers the library accepts (never the other way round): repeated
keys (the library keeps the last one), an entry with other keys than the three or written as a JSON array, a dtype
written as an object, an empty name. This module never writes a file and never reads tensor bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from onnx_light_ref.errors import SafetensorsError
from onnx_light_ref.io._read.alignment import align_up
from onnx_light_ref.io._read.proto import TensorProto
from onnx_light_ref.io._read.strict_json import RepeatedKeyError, loads_strict

_T = TensorProto

# ONNX data type -> safetensors dtype code, for every type both have (safetensors 0.8's Dtype enum).
_DTYPES: dict[int, str] = {
    _T.BOOL: "BOOL",
    _T.UINT8: "U8",
    _T.INT8: "I8",
    _T.UINT16: "U16",
    _T.INT16: "I16",
    _T.UINT32: "U32",
    _T.INT32: "I32",
    _T.UINT64: "U64",
    _T.INT64: "I64",
    _T.FLOAT16: "F16",
    _T.BFLOAT16: "BF16",
    _T.FLOAT: "F32",
    _T.DOUBLE: "F64",
    _T.COMPLEX64: "C64",
    _T.FLOAT8E4M3FN: "F8_E4M3",
    _T.FLOAT8E5M2: "F8_E5M2",
    _T.FLOAT8E4M3FNUZ: "F8_E4M3FNUZ",
    _T.FLOAT8E5M2FNUZ: "F8_E5M2FNUZ",
}
# Packed sub-byte types: safetensors' F4/F6 codes count elements, and ONNX pads an odd count to a whole byte, so
# the packed bytes are stored as U8 [nbytes] (onnx-ir's choice); the ONNX tensor keeps the real type and dims.
_PACKED: set[int] = {_T.INT4, _T.UINT4}
for _name, _code in (("FLOAT8E8M0", "F8_E8M0"),):
    if hasattr(_T, _name):  # newer onnx releases only
        _DTYPES[getattr(_T, _name)] = _code
for _name in ("FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2"):
    if hasattr(_T, _name):
        _PACKED.add(getattr(_T, _name))


def is_packed(data_type: int) -> bool:
    """Whether an ONNX data type packs several elements per byte (stored as ``U8`` of its bytes)."""
    return data_type in _PACKED


def safetensors_dtype(data_type: int) -> str | None:
    """The safetensors code storing an ONNX data type (``U8`` for packed sub-byte types); None when there is none."""
    if data_type in _PACKED:
        return "U8"
    return _DTYPES.get(data_type)


def storage_shape(data_type: int, dims: tuple[int, ...], nbytes: int) -> tuple[int, ...]:
    """The shape safetensors stores: the dims, or ``(nbytes,)`` for a packed sub-byte type (stored as U8)."""
    return (nbytes,) if data_type in _PACKED else dims


SIZE_PREFIX = 8  # the little-endian u64 header size every safetensors file starts with

MAX_HEADER_SIZE = 100_000_000
"""Largest header size ``N`` (the JSON and its padding, not the 8-byte prefix) the ``safetensors`` library opens.

``read_metadata`` refuses ``n > MAX_HEADER_SIZE`` with ``HeaderTooLarge`` and ``serialize`` refuses to write one; a
bigger header is an attack or a bug, not a model."""

MAX_DATA_ALIGNMENT = 1 << 26
"""Largest alignment a safetensors file can give its data section (64 MiB).

The data section starts at ``8 + N`` and the format allows no hole between tensors, so the header's padding is the
only way to align the first tensor: ``8 + N`` must be a multiple of the alignment with ``N <= MAX_HEADER_SIZE``,
and the largest power of two that allows is ``2**26`` (``2**27 - 8`` is above the limit). A larger alignment could
only come from a padding tensor, a key every safetensors loader would then see as a weight: refused instead."""

_U64_MAX = 2**64 - 1  # the library's shapes, offsets and products are u64 (usize on 64-bit hosts), checked

# Bits per element of every dtype safetensors 0.8 knows (its ``Dtype`` enum). Offsets are checked against them.
DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

_MIN_PADDING_STEP = 8  # the safetensors library itself pads its header to 8 bytes; never less
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_METADATA = "__metadata__"


@dataclass(frozen=True, slots=True)
class SafetensorsEntry:
    """One tensor of a safetensors header: name, dtype code, shape and its ``[begin, end)`` in the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed header: ``data_start`` is where the data section starts in the file (``8 + N``)."""

    path: str
    data_start: int
    data_size: int  # bytes of the file after data_start
    entries: dict[str, SafetensorsEntry]  # in data order
    metadata: dict[str, str] = field(default_factory=dict)
    holes: tuple[tuple[int, int], ...] = ()  # uncovered [begin, end) ranges of the data section, data-relative

    @property
    def covered(self) -> bool:
        """True when the tensors cover the data section exactly (what safetensors requires)."""
        return not self.holes


def encode_header(
    entries: Iterable[SafetensorsEntry],
    alignment: int = 1,
    metadata: Mapping[str, str] | None = None,
    *,
    what: str = "safetensors file",
) -> bytes:
    """The size prefix and JSON header of a safetensors file, padded with spaces to a multiple of ``alignment``.

    The data section of a file starting with these bytes starts at ``len(result)``, a multiple of
    ``max(alignment, 8)``. The header is checked against the ``safetensors`` library's limits before the padding is
    built: a file it would refuse to open is never described.

    Args:
        entries: every tensor of the file (their ``begin``/``end`` relative to the data section).
        alignment: a power of two (1 for the safetensors minimum of 8), at most :data:`MAX_DATA_ALIGNMENT`.
        metadata: the optional ``__metadata__`` object (string values only).
        what: the file, for messages (e.g. ``"safetensors file 2 of 3"``).

    Returns:
        The bytes to write at offset 0.

    Raises:
        SafetensorsError: a duplicate or empty name, a name or metadata that is not valid Unicode, a non-string
            metadata value, an alignment above :data:`MAX_DATA_ALIGNMENT`, or a header (JSON and padding) above
            :data:`MAX_HEADER_SIZE` bytes.
    """
    check_data_alignment(alignment)
    document: dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("safetensors __metadata__ must map strings to strings.")
        document[_METADATA] = dict(metadata)
    longest = ""
    for entry in entries:
        if not entry.name or entry.name == _METADATA or entry.name in document:
            raise SafetensorsError(f"safetensors key {entry.name!r} is empty, reserved or repeated.")
        document[entry.name] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [entry.begin, entry.end],
        }
        if len(entry.name) > len(longest):
            longest = entry.name
    try:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        bad = next(key for key in document if not _is_unicode(key))
        raise SafetensorsError(
            f"{what}: safetensors key {_shown(bad)} is not valid Unicode (a lone surrogate); the safetensors library "
            "refuses such a header."
        ) from None
    step = max(alignment, _MIN_PADDING_STEP)
    size = align_up(SIZE_PREFIX + len(text), step) - SIZE_PREFIX
    if size > MAX_HEADER_SIZE:
        raise SafetensorsError(_too_large(what, len(text), size, step, len(document), longest))
    return struct.pack("<Q", size) + text + b" " * (size - len(text))


def check_data_alignment(alignment: int) -> None:
    """Refuse an alignment a safetensors file cannot give its data section (see :data:`MAX_DATA_ALIGNMENT`).

    Raises:
        SafetensorsError: ``alignment`` is above :data:`MAX_DATA_ALIGNMENT`.
    """
    if alignment > MAX_DATA_ALIGNMENT:
        raise SafetensorsError(
            f"alignment {alignment} cannot be given to a safetensors file: its data section starts right after the "
            f"header (8 + N bytes, N at most {MAX_HEADER_SIZE:,}, the safetensors library's limit) and the format "
            "allows no padding between tensors, so the largest alignment of its first tensor is "
            f"{MAX_DATA_ALIGNMENT} (64 MiB). Use alignment <= {MAX_DATA_ALIGNMENT}, or weights_format='onnx'."
        )


def _too_large(what: str, json_size: int, size: int, step: int, keys: int, longest: str) -> str:
    """Why a header is above the limit: its JSON alone, or the padding that aligns the data section."""
    if json_size > MAX_HEADER_SIZE:
        return (
            f"{what}: the safetensors header of {keys} key(s) is {json_size:,} bytes of JSON, above the "
            f"{MAX_HEADER_SIZE:,}-byte limit of the safetensors library (it refuses to open such a file); the "
            f"longest key is {_shown(longest)} ({len(longest):,} characters). Shorten the names, or spread the "
            "tensors over more files (max_shard_size)."
        )
    return (
        f"{what}: padding the {json_size:,}-byte safetensors header so that the data section starts at a multiple "
        f"of {step} makes it {size:,} bytes, above the {MAX_HEADER_SIZE:,}-byte limit of the safetensors library "
        "(it refuses to open such a file). Use a smaller alignment, or spread the tensors over more files "
        "(max_shard_size)."
    )


def _shown(name: str) -> str:
    """A key for a message: quoted, at most 60 characters of it."""
    return repr(name) if len(name) <= 60 else f"{name[:57]!r}..."


def _is_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a lone surrogate, which JSON escapes can produce, does not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_header(fd: int, path: str, file_size: int) -> SafetensorsHeader:
    """Read and parse the header of the open safetensors file ``fd`` (``file_size`` bytes long, from ``fstat``).

    Args:
        fd: an open descriptor of the file (read with ``pread``; its offset is not used).
        path: the file's name, for messages.
        file_size: the file's size; the header must fit in it.

    Returns:
        The :class:`SafetensorsHeader` (holes listed, not refused: see :func:`parse_header`).

    Raises:
        SafetensorsError: the header is malformed or does not fit (see :func:`parse_header`).
        OSError: reading failed.
    """
    prefix = os.pread(fd, SIZE_PREFIX, 0)
    if len(prefix) < SIZE_PREFIX:
        raise SafetensorsError(
            f"{path!r} is not a safetensors file: it holds {file_size} bytes, fewer than the {SIZE_PREFIX}-byte "
            "header size."
        )
    (size,) = struct.unpack("<Q", prefix)
    _check_header_size(path, size, file_size)
    text = os.pread(fd, size, SIZE_PREFIX)
    if len(text) != size:
        raise SafetensorsError(f"{path!r} ended while reading its {size}-byte safetensors header (truncated?).")
    return parse_header(path, text, file_size)


def _check_header_size(path: str, size: int, file_size: int) -> None:
    if size > MAX_HEADER_SIZE:
        raise SafetensorsError(
            f"{path!r}: safetensors header size {size} at offset 0 exceeds the {MAX_HEADER_SIZE}-byte limit of the "
            "safetensors library (HeaderTooLarge: it refuses to open the file)."
        )
    if size > file_size - SIZE_PREFIX:
        raise SafetensorsError(
            f"{path!r}: safetensors header size {size} at offset 0 runs past the end of the {file_size}-byte file."
        )


def parse_header(path: str, text: bytes, file_size: int) -> SafetensorsHeader:
    """Parse a header's JSON bytes (without the size prefix) as hostile input.

    Refuses every header the ``safetensors`` library refuses (see the module docstring), and a few more. Holes in the
    data section (including bytes after the last tensor) are returned in ``holes`` rather than raised: ``inspect``
    reports them, readers that need an exact cover (as the library does) call :func:`require_covered`.

    Args:
        path: the file's name, for messages.
        text: the ``N`` header bytes.
        file_size: the file's size.

    Returns:
        The :class:`SafetensorsHeader`.

    Raises:
        SafetensorsError: above the size limit, not UTF-8 JSON (or JSON the library's parser refuses), not an
            object, a duplicate key, an unknown dtype, a bad shape or ``data_offsets``, a shape whose element or bit
            count overflows u64, a tensor whose byte size disagrees with its dtype and shape, a tensor past the end
            of the file, overlapping tensors, a malformed ``__metadata__``, an empty name.
    """
    _check_header_size(path, len(text), file_size)
    data_start = SIZE_PREFIX + len(text)
    data_size = file_size - data_start
    document = _load_json(path, text)
    if not isinstance(document, dict):
        raise SafetensorsError(f"{path!r}: safetensors header is a JSON {type(document).__name__}, not an object.")
    metadata = document.pop(_METADATA, None)
    if metadata is None:  # ``"__metadata__": null`` is no metadata to the library (an Option)
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path!r}: safetensors __metadata__ must be an object of string values.")
    if (b"\\ud" in text or b"\\uD" in text) and not all(map(_is_unicode, _strings(document, metadata))):
        bad = next(t for t in _strings(document, metadata) if not _is_unicode(t))
        raise SafetensorsError(
            f"{path!r}: safetensors header holds the string {bad!r:.80}, a lone surrogate escape the safetensors "
            "library's JSON parser refuses."
        )
    entries = sorted(
        (_parse_entry(path, name, value, data_size) for name, value in document.items()),
        key=lambda e: (e.begin, e.end),
    )
    holes: list[tuple[int, int]] = []
    cursor = 0
    previous: SafetensorsEntry | None = None
    for entry in entries:
        if entry.begin < cursor:
            assert previous is not None
            raise SafetensorsError(
                f"{path!r}: safetensors tensors {previous.name!r} [{previous.begin}, {previous.end}) and "
                f"{entry.name!r} [{entry.begin}, {entry.end}) overlap (data offsets, data section at {data_start})."
            )
        if entry.begin > cursor:
            holes.append((cursor, entry.begin))
        cursor = max(cursor, entry.end)
        if entry.nbytes:
            previous = entry
    if cursor < data_size:
        holes.append((cursor, data_size))
    return SafetensorsHeader(path, data_start, data_size, {e.name: e for e in entries}, dict(metadata), tuple(holes))


def _load_json(path: str, text: bytes) -> object:
    """The header's JSON, refusing what Python's parser takes and the library's (serde_json) does not.

    ``-0`` is an integer to Python and a float to serde_json (so not a ``usize``): when the text holds ``-0`` at
    all, integers go through :func:`_parse_int`, which turns exactly that token into a float the type checks refuse.
    The other differences (NaN, Infinity, integers above u64, lone surrogates) are refused by the type checks of
    :func:`_parse_entry` or the surrogate check of :func:`parse_header`.
    """
    try:
        return loads_strict(text, parse_int=_parse_int if b"-0" in text else None)
    except RepeatedKeyError as exc:
        raise SafetensorsError(f"{path!r}: safetensors header repeats the key {exc.key!r}.") from None
    except ValueError as exc:  # UnicodeDecodeError is one
        raise SafetensorsError(f"{path!r}: safetensors header is not UTF-8 JSON: {exc}") from None


def _parse_int(token: str) -> int | float:
    return -0.0 if token == "-0" else int(token)


def _strings(document: dict[str, object], metadata: dict[str, str]) -> Iterable[str]:
    """Every string of a header that the type checks do not pin down: names, metadata keys and values."""
    yield from document
    yield from metadata
    yield from metadata.values()


def require_covered(header: SafetensorsHeader) -> None:
    """Raise unless the tensors cover the data section exactly (no hole, nothing after the last tensor).

    Raises:
        SafetensorsError: naming the first uncovered range (file offsets).
    """
    if header.holes:
        begin, end = header.holes[0]
        start = header.data_start
        raise SafetensorsError(
            f"{header.path!r}: safetensors data section has {len(header.holes)} uncovered range(s), the first at "
            f"file offsets [{start + begin}, {start + end}); safetensors requires the tensors to cover it exactly."
        )


def _parse_entry(path: str, name: str, value: object, data_size: int) -> SafetensorsEntry:
    # ``type(x) is int`` (not isinstance): JSON true/false parse as bool, a subclass of int, and are refused.
    # The common case is checked with few calls (thousands of entries per header); messages are built on failure.
    if not name:
        raise SafetensorsError(f"{path!r}: safetensors header has a tensor with an empty name.")
    if type(value) is not dict or value.keys() != _ENTRY_KEYS:
        raise SafetensorsError(
            f"{_where(path, name)}: expected an object with exactly {sorted(_ENTRY_KEYS)}, got {value!r:.200}."
        )
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if type(dtype) is not str or dtype not in DTYPE_BITS:
        raise SafetensorsError(f"{_where(path, name)}: unknown dtype {dtype!r:.40} (known: {', '.join(DTYPE_BITS)}).")
    if type(shape) is not list or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise SafetensorsError(
            f"{_where(path, name)}: shape must be a list of integers in [0, 2**64), got {shape!r:.200}."
        )
    if type(offsets) is not list or len(offsets) != 2:
        raise SafetensorsError(
            f"{_where(path, name)}: data_offsets must be two non-negative integers, got {offsets!r:.200}."
        )
    begin, end = offsets
    if type(begin) is not int or type(end) is not int or begin < 0 or end < 0:
        raise SafetensorsError(
            f"{_where(path, name)}: data_offsets must be two non-negative integers, got {offsets!r:.200}."
        )
    if end < begin:
        raise SafetensorsError(f"{_where(path, name)}: data_offsets [{begin}, {end}] end before they begin.")
    if end > data_size:
        raise SafetensorsError(
            f"{_where(path, name)}: data_offsets [{begin}, {end}] run past the end of the {data_size}-byte data "
            "section."
        )
    count = math.prod(shape)
    bits = count * DTYPE_BITS[dtype]
    if bits > _U64_MAX or (not count and shape and _overflows_before_zero(shape)):
        _refuse_overflow(path, name, dtype, shape)
    if bits % 8 or bits // 8 != end - begin:
        raise SafetensorsError(
            f"{_where(path, name)}: dtype {dtype} and shape {shape} need {bits / 8:g} bytes but data_offsets "
            f"[{begin}, {end}] hold {end - begin}."
        )
    return SafetensorsEntry(name, dtype, tuple(shape), begin, end)


def _overflows_before_zero(shape: list[int]) -> bool:
    """For a shape holding a 0: whether a dim is above u64, or the product of the dims before the first 0 is.

    The library folds the shape left to right with ``checked_mul``: a prefix that overflows is refused even when a
    later dimension is 0 (``[2**32, 2**32, 0]``). Dimensions are >= 1 before the first 0, so the prefix products only
    grow: checking the product before the first 0 checks every prefix. Without a 0, a dim above u64 or an overflowing
    prefix makes the whole product, so the bit count, overflow: the caller's one comparison catches it.
    """
    return max(shape) > _U64_MAX or math.prod(shape[: shape.index(0)]) > _U64_MAX


def _refuse_overflow(path: str, name: str, dtype: str, shape: list[int]) -> None:
    """Refuse a shape the library's checked u64 arithmetic refuses, saying which check."""
    if max(shape) > _U64_MAX:
        raise SafetensorsError(
            f"{_where(path, name)}: shape must be a list of integers in [0, 2**64) (the library's dims are u64), got "
            f"{shape!r:.200}."
        )
    raise SafetensorsError(
        f"{_where(path, name)}: dtype {dtype} and shape {shape!r:.200} overflow the safetensors library's u64 "
        "element or bit count (its checked product, left to right, refuses it)."
    )


def _where(path: str, name: str) -> str:
    return f"{path!r}: safetensors tensor {name!r}"
