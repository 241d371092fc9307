"""A copy from a source range to a destination offset (the plan's unit of work), how its source is read, and a
shard's ranges kept as columns (:class:`RangeColumns`: a few bytes per range, not an object).

:func:`open_source` opens a range's source the way every reader must: through the folder held since validation when
the range is model-relative, and only if it is still the very file (device and inode) that was validated. Planning
(dedup, inline payloads), ``verify`` and the copy engine all read sources through it.
"""

from __future__ import annotations

import errno
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._read.folder import FileIdentity, ModelFolder


@dataclass(frozen=True, slots=True)
class CopyRange:
    """Copy ``length`` bytes from ``src_path`` at ``src_offset`` to the destination at ``dst_offset``."""

    src_path: str
    src_offset: int
    dst_offset: int
    length: int
    src_identity: FileIdentity | None = None  # when set, the opened file must be this one
    # When set, the source is opened as src_location relative to this held folder (src_path is for messages only).
    src_folder: ModelFolder | None = None
    src_location: str | None = None


class RangeSource(Protocol):
    """A source file of :class:`RangeColumns`: what a :class:`CopyRange` says of its source."""

    @property
    def path(self) -> str: ...

    @property
    def identity(self) -> FileIdentity | None: ...

    @property
    def folder(self) -> ModelFolder | None: ...

    @property
    def location(self) -> str | None: ...


class RangeColumns(Sequence[CopyRange]):
    """The ranges of one destination file kept as four columns (source index into ``sources``, source offset,
    destination offset, length): a plan of 100,000 tensors holds a few bytes per range, not an object. It is a
    sequence of :class:`CopyRange` built on demand; the copy engine reads it merged (:meth:`merged`), the writer
    contract its total and its sources, without building one object per range."""

    __slots__ = ("dst_offsets", "files", "lengths", "sources", "src_offsets")

    def __init__(self, sources: Sequence[RangeSource]) -> None:
        self.sources = sources
        self.files: array[int] = array("i")
        self.src_offsets: array[int] = array("q")
        self.dst_offsets: array[int] = array("q")
        self.lengths: array[int] = array("q")

    def add(self, source: int, src_offset: int, dst_offset: int, length: int) -> None:
        """Append ``length`` bytes of ``sources[source]`` at ``src_offset``, copied to ``dst_offset``."""
        self.files.append(source)
        self.src_offsets.append(src_offset)
        self.dst_offsets.append(dst_offset)
        self.lengths.append(length)

    def __len__(self) -> int:
        return len(self.lengths)

    @overload
    def __getitem__(self, index: int) -> CopyRange: ...

    @overload
    def __getitem__(self, index: slice) -> list[CopyRange]: ...

    def __getitem__(self, index: int | slice) -> CopyRange | list[CopyRange]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._range(self.files[index], self.src_offsets[index], self.dst_offsets[index], self.lengths[index])

    def __iter__(self) -> Iterator[CopyRange]:
        for row in zip(self.files, self.src_offsets, self.dst_offsets, self.lengths, strict=True):
            yield self._range(*row)

    @property
    def total(self) -> int:
        """Bytes of every range together."""
        return sum(self.lengths)

    def used_sources(self) -> list[RangeSource]:
        """The sources some range reads, each once."""
        return [self.sources[index] for index in sorted(set(self.files))]

    def merged(self) -> Iterator[CopyRange]:
        """The ranges in destination order, empty ones dropped, those continuing each other (same source, adjacent
        in both files) joined: what :meth:`RangeCopier.copy` moves, one object per merged range."""
        files, src, dst, lengths = self.files, self.src_offsets, self.dst_offsets, self.lengths
        order: Iterable[int] = range(len(lengths))
        if any(dst[i] > dst[i + 1] for i in range(len(dst) - 1)):
            order = sorted(order, key=dst.__getitem__)
        pending: list[int] | None = None  # source, source offset, destination offset, length
        for index in order:
            length = lengths[index]
            if length <= 0:
                continue
            if (
                pending is not None
                and pending[0] == files[index]
                and pending[1] + pending[3] == src[index]
                and pending[2] + pending[3] == dst[index]
            ):
                pending[3] += length
                continue
            if pending is not None:
                yield self._range(*pending)
            pending = [files[index], src[index], dst[index], length]
        if pending is not None:
            yield self._range(*pending)

    def _range(self, source: int, src_offset: int, dst_offset: int, length: int) -> CopyRange:
        file = self.sources[source]
        return CopyRange(file.path, src_offset, dst_offset, length, file.identity, file.folder, file.location)


def ranges_total(ranges: Sequence[CopyRange]) -> int:
    """Bytes of every range of ``ranges`` together."""
    return ranges.total if isinstance(ranges, RangeColumns) else sum(item.length for item in ranges)


def range_sources(ranges: Sequence[CopyRange]) -> Iterator[tuple[str, FileIdentity | None]]:
    """The path and identity of the source of every range (of each source once for :class:`RangeColumns`)."""
    if isinstance(ranges, RangeColumns):
        return ((source.path, source.identity) for source in ranges.used_sources())
    return ((item.src_path, item.src_identity) for item in ranges)


def read_range(item: CopyRange) -> bytes:
    """The ``item.length`` bytes at ``item.src_offset`` of its (validated) source, into memory: for the few small
    payloads a writer keeps inline; fewer bytes when the file ended (the caller says what that means).

    Raises:
        ExternalDataError, FileNotFoundError: as :func:`open_source`.
    """
    fd = open_source(item)
    try:
        data = bytearray(item.length)
        got = pread_exact(fd, memoryview(data), item.src_offset)
    finally:
        os.close(fd)
    return bytes(data[:got]) if got != item.length else bytes(data)


def open_source(item: CopyRange) -> int:
    """Open ``item``'s source read-only, refusing a file that is no longer the one that was validated.

    A model-relative source (``src_folder`` set) is opened through the folder descriptor held since validation
    (:meth:`~onnx_light_ref.io._read.folder.ModelFolder.open_file`: no symbolic link, no escape, one hard link), so a
    folder or subfolder swapped meanwhile cannot redirect the read. Any other source (the ``.onnx`` the user named, for
    its inline payloads) is opened by its path with ``O_NOFOLLOW``. Either way the device and inode must be the
    validated ones: a file replaced since then raises :class:`ExternalDataError` and nothing is read from it.

    Raises:
        ExternalDataError: the file was replaced (or became a symbolic link, or cannot be opened).
        FileNotFoundError: the file is gone.
    """
    if item.src_folder is not None and item.src_location is not None:
        # Hard links were checked at validation; a link added since to the same inode exposes nothing new, and a
        # replaced file fails the identity check below.
        try:
            opened = item.src_folder.open_file(
                item.src_location, subject=f"source file {item.src_path!r}", check_links=False
            )
        except UnsafeLocationError as exc:
            raise UnsafeLocationError(
                f"source file {item.src_path!r} was replaced after it was validated: {exc} Nothing was published."
            ) from exc
        fd, st = opened.fd, opened.stat
    else:
        try:
            fd = os.open(item.src_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW on a symlink (EMLINK on FreeBSD)
                raise ExternalDataError(
                    f"source file {item.src_path!r} was replaced after it was validated (it is now a symbolic "
                    "link); nothing was published."
                ) from exc
            raise ExternalDataError(
                f"source file {item.src_path!r} cannot be opened: {exc.strerror or exc}; nothing was published."
            ) from exc
        st = os.fstat(fd)
    if item.src_identity is not None and FileIdentity(st.st_dev, st.st_ino) != item.src_identity:
        os.close(fd)
        raise ExternalDataError(
            f"source file {item.src_path!r} was replaced after it was validated; nothing was published."
        )
    return fd
