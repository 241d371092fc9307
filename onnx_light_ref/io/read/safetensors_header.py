"""The safetensors header: write one (padded so the data section starts aligned) and parse one as hostile input.

A safetensors file is an 8-byte little-endian header size ``N``, ``N`` bytes of UTF-8 JSON mapping each tensor name
to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the data section, which starts at
``8 + N``) plus an optional ``"__metadata__"`` object of string values, then the data section, which the tensors must
cover exactly: no hole, no overlap, nothing after the last tensor.

:func:`encode_header` pads the JSON with trailing spaces (valid JSON whitespace, what the ``safetensors`` library
does for its 8-byte alignment) so that the data section starts at a multiple of the requested alignment.
:func:`parse_header` treats the bytes as an attacker's: the header size is capped (the ``safetensors`` library's own
100 MB limit) and checked against the file size before it is read, duplicate keys, unknown dtypes, negative or
non-integer shapes and offsets, offsets that disagree with ``dtype`` x ``shape``, overlaps, holes and bytes after
the last tensor are typed errors naming the file, the tensor and the offsets. This module never writes a file and
never reads tensor bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from onnx_light_ref.errors import SafetensorsError
from onnx_light_ref.io.plan.alignment import align_up

__all__ = [
    "DTYPE_BITS",
    "MAX_HEADER_SIZE",
    "SafetensorsEntry",
    "SafetensorsHeader",
    "encode_header",
    "parse_header",
    "read_header",
    "require_covered",
]

SIZE_PREFIX = 8  # the little-endian u64 header size every safetensors file starts with

# The safetensors library refuses headers above 100 MB (``HeaderTooLarge``); a bigger one is an attack, not a model.
MAX_HEADER_SIZE = 100_000_000

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
    entries: Iterable[SafetensorsEntry], alignment: int = 1, metadata: Mapping[str, str] | None = None
) -> bytes:
    """The size prefix and JSON header of a safetensors file, padded with spaces to a multiple of ``alignment``.

    The data section of a file starting with these bytes starts at ``len(result)``, a multiple of
    ``max(alignment, 8)``.

    Args:
        entries: every tensor of the file (their ``begin``/``end`` relative to the data section).
        alignment: a power of two (1 for the safetensors minimum of 8).
        metadata: the optional ``__metadata__`` object (string values only).

    Returns:
        The bytes to write at offset 0.

    Raises:
        SafetensorsError: a duplicate or empty name, or a non-string metadata value.
    """
    document: dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("safetensors __metadata__ must map strings to strings.")
        document[_METADATA] = dict(metadata)
    for entry in entries:
        if not entry.name or entry.name == _METADATA or entry.name in document:
            raise SafetensorsError(f"safetensors key {entry.name!r} is empty, reserved or repeated.")
        document[entry.name] = {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [entry.begin, entry.end],
        }
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    total = align_up(SIZE_PREFIX + len(text), max(alignment, _MIN_PADDING_STEP))
    padded = text + b" " * (total - SIZE_PREFIX - len(text))
    return struct.pack("<Q", len(padded)) + padded


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
            f"{path!r}: safetensors header size {size} at offset 0 exceeds the {MAX_HEADER_SIZE}-byte limit."
        )
    if size > file_size - SIZE_PREFIX:
        raise SafetensorsError(
            f"{path!r}: safetensors header size {size} at offset 0 runs past the end of the {file_size}-byte file."
        )


def parse_header(path: str, text: bytes, file_size: int) -> SafetensorsHeader:
    """Parse a header's JSON bytes (without the size prefix) as hostile input.

    Holes in the data section (including bytes after the last tensor) are returned in ``holes`` rather than raised:
    ``inspect`` reports them, readers that need an exact cover call :func:`require_covered`.

    Args:
        path: the file's name, for messages.
        text: the ``N`` header bytes.
        file_size: the file's size.

    Returns:
        The :class:`SafetensorsHeader`.

    Raises:
        SafetensorsError: not UTF-8 JSON, not an object, a duplicate key, an unknown dtype, a bad shape or
            ``data_offsets``, a tensor whose byte size disagrees with its dtype and shape, a tensor past the end of
            the file, overlapping tensors, a malformed ``__metadata__``.
    """
    _check_header_size(path, len(text), file_size)
    data_start = SIZE_PREFIX + len(text)
    data_size = file_size - data_start
    try:
        document = json.loads(text.decode("utf-8"), object_pairs_hook=_refuse_duplicates)
    except _DuplicateKeyError as exc:
        raise SafetensorsError(f"{path!r}: safetensors header repeats the key {exc.key!r}.") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SafetensorsError(f"{path!r}: safetensors header is not UTF-8 JSON: {exc}") from None
    if not isinstance(document, dict):
        raise SafetensorsError(f"{path!r}: safetensors header is a JSON {type(document).__name__}, not an object.")
    metadata = document.pop(_METADATA, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path!r}: safetensors __metadata__ must be an object of string values.")
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


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: Sequence[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)  # built in C; a repeated key makes it shorter than the pairs (checked once per object)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return result


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
            f"{_where(path, name)}: shape must be a list of non-negative integers, got {shape!r:.200}."
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
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - begin:
        raise SafetensorsError(
            f"{_where(path, name)}: dtype {dtype} and shape {shape} need {bits / 8:g} bytes but data_offsets "
            f"[{begin}, {end}] hold {end - begin}."
        )
    return SafetensorsEntry(name, dtype, tuple(shape), begin, end)


def _where(path: str, name: str) -> str:
    return f"{path!r}: safetensors tensor {name!r}"
