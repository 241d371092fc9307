"""Find blobs whose bytes are identical, so that the destination stores each distinct content once.

Equality is decided on the bytes themselves, in three narrowing steps: blobs are grouped by length (a blob of unique
length is never read); then by a digest of three samples (its first, middle and last 4 KiB), so a model without
duplicates reads only those samples; blobs whose samples match are then read whole once for a SHA-256 digest (when
more than two are left and they are longer than the samples), and blobs whose digests match are finally compared
byte by byte, chunk by chunk, against the first of their group before they are merged. A hash collision therefore
never merges two different blobs. Memory stays bounded by two chunk buffers (plus 32 bytes per candidate) whatever
the number of candidates. SHA-256 rather than BLAKE2b: it runs at memory speed on CPUs with SHA extensions, about
faster than BLAKE2b here (docs/align.md, design notes).

Blobs are described by :class:`BlobSource`: a byte range of an open file (external data, or an inline payload
inside the ``.onnx`` itself) or bytes already in memory (typed-field tensors converted to raw bytes). This module
reads through the descriptors it is given and never opens, writes or closes a file.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._posix import pread_exact

_SAMPLE_BYTES = 4096  # read from the head, middle and tail of each candidate before any whole read


@dataclass(frozen=True, slots=True)
class BlobSource:
    """Where a blob's bytes are: ``data`` in memory, or ``length`` bytes of descriptor ``fd`` at ``offset``."""

    length: int
    fd: int | None = None
    offset: int = 0
    data: bytes | None = None
    label: str = ""  # names the tensor and file in errors
    key: object = None  # equal keys mean the same bytes by construction (same file, offset and length)


def find_duplicates(blobs: Sequence[BlobSource], chunk_size: int) -> array[int]:
    """For each blob, the index of the first blob with identical bytes (itself when it is the first).

    ``blobs`` may build each descriptor on demand (the aligner keeps its payloads as columns): each is asked for
    about twice, and none is kept beyond the comparison that needs it.

    Args:
        blobs: the blobs, in the order that decides which of identical blobs is "first".
        chunk_size: size of each of the two read buffers (at most: no longer than the longest blob compared).

    Returns:
        One int64 per blob: its own index, or that of an earlier blob with the same bytes.

    Raises:
        ExternalDataError: a file ended before a blob's range (it changed since it was validated).
    """
    first: array[int] = array("q", range(len(blobs)))
    by_key: dict[object, int] = {}
    by_length: dict[int, list[int]] = {}
    for index in range(len(blobs)):
        blob = blobs[index]
        if blob.key is not None:
            earlier = by_key.setdefault(blob.key, index)
            if earlier != index:
                first[index] = earlier
                continue
        by_length.setdefault(blob.length, []).append(index)
    # The buffers need not be longer than the longest blob compared: a small model's dedup allocated two zeroed
    # buffers of the whole chunk size on every run.
    longest = max((length for length, members in by_length.items() if len(members) > 1), default=0)
    reader = _ChunkReader(max(1, min(chunk_size, longest)))
    for length, members in by_length.items():
        if len(members) < 2:
            continue
        if length == 0:
            for index in members[1:]:
                first[index] = members[0]
            continue
        by_sample: dict[bytes, list[int]] = {}
        for index in members:
            by_sample.setdefault(reader.sample_digest(blobs[index]), []).append(index)
        for group in by_sample.values():
            if len(group) > 2 and length > 3 * _SAMPLE_BYTES:
                _merge_by_digest(group, blobs, reader, first)
            elif len(group) > 1:
                _merge_equal(group, blobs, reader, first)
    # Blobs merged by key point at a representative that may itself have been merged by content.
    for index in range(len(first)):
        first[index] = first[first[index]]
    return first


def _merge_by_digest(group: list[int], blobs: Sequence[BlobSource], reader: _ChunkReader, first: array[int]) -> None:
    """Read each blob of ``group`` once for its digest, then compare only blobs with equal digests."""
    by_digest: dict[bytes, list[int]] = {}
    for index in group:
        by_digest.setdefault(reader.digest(blobs[index]), []).append(index)
    for same_digest in by_digest.values():
        if len(same_digest) > 1:
            _merge_equal(same_digest, blobs, reader, first)


def _merge_equal(group: list[int], blobs: Sequence[BlobSource], reader: _ChunkReader, first: array[int]) -> None:
    """Merge each blob of ``group`` into the first earlier one it is byte-identical to."""
    representatives: list[int] = []
    for index in group:
        match = next((rep for rep in representatives if reader.equal(blobs[rep], blobs[index])), None)
        if match is None:
            representatives.append(index)
        else:
            first[index] = match


class _ChunkReader:
    """Reads blobs through two reusable buffers of ``chunk_size`` bytes."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self._a = bytearray(chunk_size)
        self._b = bytearray(chunk_size)

    def digest(self, blob: BlobSource) -> bytes:
        hasher = hashlib.sha256()
        self._each_chunk(blob, self._a, hasher.update)
        return hasher.digest()

    def sample_digest(self, blob: BlobSource) -> bytes:
        """Digest of the first, middle and last :data:`_SAMPLE_BYTES` of ``blob`` (all of it when it is short)."""
        hasher = hashlib.sha256()
        size = min(_SAMPLE_BYTES, self.chunk_size, blob.length)
        for start in dict.fromkeys((0, (blob.length - size) // 2, blob.length - size)):
            hasher.update(self._read(blob, start, size, self._a))
        return hasher.digest()

    def equal(self, left: BlobSource, right: BlobSource) -> bool:
        for start in range(0, left.length, self.chunk_size):
            count = min(self.chunk_size, left.length - start)
            # Compare the buffers, not memoryviews: memoryview equality goes element by element (~80x slower).
            a = self._fill(left, start, count, self._a)
            b = self._fill(right, start, count, self._b)
            if a != b:
                return False
        return True

    def _fill(self, blob: BlobSource, start: int, count: int, buffer: bytearray) -> bytearray:
        """``count`` bytes of ``blob`` at ``start`` as a bytearray: ``buffer`` itself when full, else a slice copy."""
        view = self._read(blob, start, count, buffer)
        if blob.data is not None:
            buffer[:count] = view
        return buffer if count == len(buffer) else buffer[:count]

    def _each_chunk(self, blob: BlobSource, buffer: bytearray, sink: Callable[[memoryview], object]) -> None:
        for start in range(0, blob.length, self.chunk_size):
            sink(self._read(blob, start, min(self.chunk_size, blob.length - start), buffer))

    def _read(self, blob: BlobSource, start: int, count: int, buffer: bytearray) -> memoryview:
        if blob.data is not None:
            return memoryview(blob.data)[start : start + count]
        assert blob.fd is not None
        view = memoryview(buffer)[:count]
        got = pread_exact(blob.fd, view, blob.offset + start)
        if got != count:
            raise ExternalDataError(
                f"{blob.label}: the file ended at offset {blob.offset + start + got} while {count - got} more bytes "
                "were expected; was it truncated while being read?"
            )
        return view
