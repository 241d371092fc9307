"""Copy byte ranges from source files into one destination file, in the kernel whenever it can.

Method chain, chosen at run time and remembered per (source device, destination device) pair:

1. ``os.copy_file_range``: in-kernel, positional on both sides (reflinks on filesystems that support them);
2. ``os.sendfile``: in-kernel too and works across filesystems (``copy_file_range`` fails with EXDEV between ext4
   and tmpfs, for instance);
3. ``os.preadv`` into one ``chunk_size`` buffer + ``os.pwrite``: the portable last resort.

A method is dropped for a device pair when it fails with EINVAL, ENOSYS, EXDEV, EOPNOTSUPP/ENOTSUP or EPERM, or
moves nothing where the validated range says bytes exist; any other error (EIO, ENOSPC, and EBADF, which means a
descriptor bug, not an unsupported pair) propagates, and a source that really ended early is reported by the last
method. Ranges contiguous in both source and destination are merged into one. Every source file is opened once,
checked to be the very file that was validated (device and inode), and closed at the end.

Reflinks: on XFS, btrfs and other cloning filesystems, ``copy_file_range`` between offsets that are both multiples
of the block size shares extents instead of copying. The engine never breaks that: a range whose source and
destination offsets have the same remainder modulo the destination's ``st_blksize`` is cut at block boundaries
(a short head up to the first boundary, then whole blocks), and chunks are whole blocks; with a ``chunk_size``
below the block size, an aligned ``copy_file_range`` call moves one block (no user-space buffer is involved). Each
other system call moves at most ``chunk_size`` bytes. :class:`CopyStats` reports the clone-eligible bytes, and
:meth:`RangeCopier.cloned_bytes` what the filesystem actually shares.

Durability: with ``durable=True`` the copier starts writeback of each finished stretch of the destination while the
next is copied (:mod:`onnx_light_ref.io._write.writeback`), so the caller's final ``fsync`` has little left. The copier
never fsyncs: that stays with publication. Free space is the caller's too (:mod:`onnx_light_ref.io._write.space`).

This module never reads weight bytes into Python objects except through the one bounded buffer of the last
fallback, and it never writes padding: gaps are left as holes, which read as zeros (the caller sets the final size).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._plan.ranges import CopyRange, RangeColumns, open_source
from onnx_light_ref.io._posix import pread_exact, pwrite_all
from onnx_light_ref.io._write.space import shared_extent_bytes
from onnx_light_ref.io._write.writeback import DEFAULT_STRETCH, WritebackPacer

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``, called as bytes move."""

CopyMethod = Literal["copy_file_range", "sendfile", "pread_pwrite"]

# errno values meaning "this method cannot copy between these two files", as opposed to a real I/O failure.
_UNSUPPORTED_ERRNOS = frozenset(
    code
    for code in (
        errno.EINVAL,
        errno.ENOSYS,
        errno.EXDEV,
        errno.EOPNOTSUPP,
        getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
        errno.EPERM,
    )
)

_ALL_METHODS: tuple[CopyMethod, ...] = get_args(CopyMethod)

_FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)
_CLONE_RANGE = struct.Struct("=qQQQ")  # src_fd, src_offset, src_length, dest_offset


def _merged_with_total(ranges: Sequence[CopyRange]) -> tuple[Iterator[CopyRange], int]:
    """``ranges`` merged in destination order (:func:`_merged`), and their total length."""
    if isinstance(ranges, RangeColumns):
        return ranges.merged(), ranges.total
    ordered, total = _in_destination_order(ranges)
    return _merged(ordered), total


def merge_ranges(ranges: Iterable[CopyRange]) -> list[CopyRange]:
    """Merge ranges that continue each other in both source and destination (kept in destination order)."""
    ordered, _ = _in_destination_order(ranges)
    return list(_merged(ordered))


def _in_destination_order(ranges: Iterable[CopyRange]) -> tuple[Iterable[CopyRange], int]:
    """``ranges`` in destination order, and their total length.

    One pass checks the order: ranges already in destination order (every plan's are) are returned as given, a
    sequence never copied; only out-of-order ones are sorted into a list. A plan's shard builds its
    :class:`CopyRange` objects on demand, so a sort would hold one object per range of the shard at once.
    """
    if not isinstance(ranges, Sequence):
        ranges = list(ranges)  # a one-shot iterable is read twice below
    total = 0
    last = -1
    ordered = True
    for item in ranges:
        if item.length > 0:
            total += item.length
            ordered = ordered and item.dst_offset >= last
            last = item.dst_offset
    if not ordered:
        ranges = sorted(ranges, key=lambda r: r.dst_offset)
    return ranges, total


def _merged(ordered: Iterable[CopyRange]) -> Iterator[CopyRange]:
    """One pass over ranges in destination order: empty ones dropped, continuing ones joined."""
    pending: CopyRange | None = None
    for item in ordered:
        if item.length <= 0:
            continue
        if (
            pending is not None
            and pending.src_path == item.src_path
            and pending.src_offset + pending.length == item.src_offset
            and pending.dst_offset + pending.length == item.dst_offset
        ):
            pending = CopyRange(
                pending.src_path,
                pending.src_offset,
                pending.dst_offset,
                pending.length + item.length,
                pending.src_identity,
                pending.src_folder,
                pending.src_location,
            )
            continue
        if pending is not None:
            yield pending
        pending = item
    if pending is not None:
        yield pending


def can_clone(src_fd: int, dst_fd: int) -> bool:
    """Whether the filesystem can share extents from ``src_fd`` into ``dst_fd`` (reflink), probed without effect.

    Asks ``FICLONERANGE`` for zero bytes starting at the source's end: the kernel checks the pair (same
    filesystem, reflink support, descriptor modes) and returns without touching either file. EXDEV, EOPNOTSUPP,
    EINVAL and the like mean "no"; so does any platform without the ioctl.

    Args:
        src_fd: The source, open for reading.
        dst_fd: The destination, open for writing.

    Returns:
        True when cloning between the two files is supported.
    """
    try:
        end = os.fstat(src_fd).st_size
        fcntl.ioctl(dst_fd, _FICLONERANGE, _CLONE_RANGE.pack(src_fd, end, 0, 0))
    except (OSError, OverflowError) as exc:
        logger.debug("no reflink between fd %d and fd %d: %s", src_fd, dst_fd, exc)
        return False
    return True


def _clonable_part(src_offset: int, dst_offset: int, length: int, block: int) -> tuple[int, int]:
    """(head, body): bytes before the first common block boundary, then whole blocks after it; (0, 0) if none."""
    if src_offset % block != dst_offset % block:
        return 0, 0
    head = min(length, -src_offset % block)
    body = (length - head) // block * block
    return head, body


@dataclass(slots=True)
class CopyStats:
    """What a :class:`RangeCopier` moved, and how.

    Attributes:
        bytes_by_method: Payload bytes moved by each method.
        clone_eligible_bytes: Bytes moved by ``copy_file_range`` in whole blocks between block-aligned source and
            destination offsets, on a device pair that supports cloning (:func:`can_clone`): what the filesystem
            clones rather than copies. 0 on filesystems without reflinks (ext4, tmpfs) and across filesystems.
        writeback_requests: ``sync_file_range`` calls made to overlap writeback with the copy (0 when not durable
            or not supported).
    """

    bytes_by_method: dict[CopyMethod, int] = field(default_factory=dict)
    clone_eligible_bytes: int = 0
    writeback_requests: int = 0

    @property
    def copied_bytes(self) -> int:
        """Bytes the kernel or the buffer loop really copied (all moved bytes minus the clone-eligible ones)."""
        return sum(self.bytes_by_method.values()) - self.clone_eligible_bytes


class RangeCopier:
    """Copies :class:`CopyRange` items into an open destination descriptor; use as a context manager.

    ``methods`` restricts the chain (tests force each fallback this way). ``used_methods`` records what actually
    moved bytes and ``stats`` how many, for reports and tests.
    """

    def __init__(
        self,
        dst_fd: int,
        chunk_size: int,
        *,
        durable: bool = True,
        methods: Sequence[CopyMethod] = _ALL_METHODS,
        writeback_stretch: int = DEFAULT_STRETCH,
    ) -> None:
        """Prepare a copier into ``dst_fd``.

        Args:
            dst_fd: The destination, open for writing (not ``O_APPEND``); the caller closes it.
            chunk_size: Most bytes one system call moves, and the size of the one buffer of the last fallback.
                Aligned ``copy_file_range`` calls move whole blocks (see the module docstring).
            durable: Start writeback of each finished stretch of the destination while the next is copied, so
                the caller's final ``fsync`` is short. False leaves writeback to the kernel (for writers that will
                not fsync). Either way the bytes written are the same and the copier never fsyncs.
            methods: The allowed methods, in order; methods this platform lacks are skipped.
            writeback_stretch: Destination bytes per writeback request when ``durable``.

        Raises:
            ValueError: On a non-positive ``chunk_size`` or ``writeback_stretch``, or unknown or no methods.
        """
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {chunk_size}.")
        unknown = set(methods) - set(_ALL_METHODS)
        if unknown or not methods:
            raise ValueError(f"methods must be a non-empty subset of {_ALL_METHODS}, got {tuple(methods)}.")
        self.dst_fd = dst_fd
        self.chunk_size = chunk_size
        self.durable = durable
        # Platforms without a syscall (macOS has no copy_file_range) simply skip it.
        self.methods: tuple[CopyMethod, ...] = tuple(m for m in methods if m == "pread_pwrite" or hasattr(os, m))
        self.used_methods: set[CopyMethod] = set()
        self.stats = CopyStats()
        dst_stat = os.fstat(dst_fd)
        self._dst_dev = dst_stat.st_dev
        self._block = max(1, dst_stat.st_blksize)
        self._writeback = WritebackPacer(dst_fd, enabled=durable, stretch=writeback_stretch)
        self._src_fds: dict[str, tuple[int, int]] = {}  # path -> (fd, st_dev)
        self._disabled: dict[tuple[int, int], set[CopyMethod]] = {}
        self._clones: dict[int, bool] = {}  # source device -> can_clone into the destination
        self._clones_here: bool | None = None  # the destination's filesystem clones (a file into itself)
        self._clone_intervals: list[tuple[int, int]] = []  # destination (offset, length) of clone-eligible calls
        self._buffer: bytearray | None = None

    def __enter__(self) -> RangeCopier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every source descriptor this copier opened."""
        fds, self._src_fds = self._src_fds, {}
        for fd, _ in fds.values():
            os.close(fd)

    def plan_clone_bytes(self, ranges: Sequence[CopyRange]) -> int:
        """Bytes of ``ranges`` this copier expects to clone rather than copy (for :func:`~.space.reserve_space`).

        Probes the destination's filesystem first (none clones on ext4, tmpfs: 0 without a look at the ranges), then
        opens the sources (kept open for :meth:`copy`) and probes each device pair once with :func:`can_clone`;
        nothing is written.

        Args:
            ranges: The ranges :meth:`copy` will be given.

        Returns:
            The whole blocks between block-aligned offsets on cloning device pairs; 0 without reflinks.
        """
        if "copy_file_range" not in self.methods or not self._destination_clones():
            return 0
        total = 0
        for item in _merged_with_total(ranges)[0]:
            src_fd, src_dev = self._open_source(item)
            if self._can_clone(src_fd, src_dev):
                total += _clonable_part(item.src_offset, item.dst_offset, item.length, self._block)[1]
        return total

    def cloned_bytes(self) -> int | None:
        """Bytes of the clone-eligible stretches that the filesystem reports as shared extents (``FIEMAP``).

        Meaningful on a destination this copier filled from empty. None when the filesystem cannot tell.
        """
        return shared_extent_bytes(self.dst_fd, self._clone_intervals)

    def copy(self, ranges: Sequence[CopyRange], progress: ProgressCallback | None = None) -> int:
        """Copy every range (merged first); return the number of payload bytes moved.

        Args:
            ranges: What to copy; ranges contiguous in source and destination are merged.
            progress: Called as ``progress(done_bytes, total_bytes)`` after each system call.

        Returns:
            The payload bytes moved (the sum of the range lengths).

        Raises:
            ExternalDataError: A source was replaced after validation, or ended before its range.
            OSError: A real I/O error (EIO, ENOSPC, ...), from the copy or from starting writeback.
        """
        merged, total = _merged_with_total(ranges)
        done = 0
        for item in merged:
            src_fd, src_dev = self._open_source(item)
            disabled = self._disabled.setdefault((src_dev, self._dst_dev), set())
            position = 0
            while position < item.length:
                src_offset, dst_offset = item.src_offset + position, item.dst_offset + position
                count = self._call_size(src_offset, dst_offset, item.length - position, disabled)
                moved = self._copy_once(src_fd, src_dev, disabled, item, src_offset, dst_offset, count)
                self._writeback.written(dst_offset, moved)
                position += moved
                done += moved
                if progress is not None:
                    progress(done, total)
        self._writeback.finish()
        self.stats.writeback_requests = self._writeback.requests
        return done

    def _call_size(self, src_offset: int, dst_offset: int, remaining: int, disabled: set[CopyMethod]) -> int:
        """Bytes for the next call: ``chunk_size``, cut so that copy_file_range calls start on block boundaries."""
        if "copy_file_range" not in self.methods or "copy_file_range" in disabled:
            return min(self.chunk_size, remaining)
        head, body = _clonable_part(src_offset, dst_offset, remaining, self._block)
        if head:
            return min(self.chunk_size, head)
        if body:
            return min(body, max(self._block, self.chunk_size // self._block * self._block))
        return min(self.chunk_size, remaining)

    def _destination_clones(self) -> bool:
        """Whether the destination's filesystem clones at all: probed on the destination itself (one ioctl), so that
        on ext4 or tmpfs planning never walks the ranges (8192 ranges: tens of milliseconds) to find nothing."""
        if self._clones_here is None:
            self._clones_here = can_clone(self.dst_fd, self.dst_fd)
        return self._clones_here

    def _can_clone(self, src_fd: int, src_dev: int) -> bool:
        known = self._clones.get(src_dev)
        if known is None:
            known = self._clones[src_dev] = src_dev == self._dst_dev and can_clone(src_fd, self.dst_fd)
        return known

    def _open_source(self, item: CopyRange) -> tuple[int, int]:
        opened = self._src_fds.get(item.src_path)
        if opened is not None:
            return opened
        fd = open_source(item)
        src_dev = os.fstat(fd).st_dev
        self._src_fds[item.src_path] = (fd, src_dev)
        return fd, src_dev

    def _copy_once(
        self,
        src_fd: int,
        src_dev: int,
        disabled: set[CopyMethod],
        item: CopyRange,
        src_offset: int,
        dst_offset: int,
        count: int,
    ) -> int:
        """Move up to ``count`` bytes with the first method not ``disabled`` for this device pair."""
        moved_nothing = False
        for method in self.methods:
            if method in disabled:
                continue
            try:
                moved = self._call(method, src_fd, src_offset, dst_offset, count)
            except OSError as exc:
                if exc.errno in _UNSUPPORTED_ERRNOS and method != "pread_pwrite":
                    logger.debug("%s unsupported from %r (%s); falling back", method, item.src_path, exc)
                    disabled.add(method)
                    continue
                raise
            if moved == 0:
                # Some filesystems (FUSE, network, pseudo files) make the in-kernel calls return 0 although the
                # planned range is in the file: let the next method decide; a truly short source fails in all.
                logger.debug("%s moved nothing from %r at %d; falling back", method, item.src_path, src_offset)
                disabled.add(method)
                moved_nothing = True
                continue
            self._record(method, src_fd, src_dev, src_offset, dst_offset, moved)
            return moved
        if moved_nothing:
            raise ExternalDataError(
                f"source file {item.src_path!r} ended at offset {src_offset} while {count} more bytes were "
                f"expected (range at offset {item.src_offset}, {item.length} bytes); was it truncated during "
                "the copy?"
            )
        raise OSError(errno.ENOTSUP, f"no copy method works from {item.src_path!r} to the destination")

    def _record(
        self, method: CopyMethod, src_fd: int, src_dev: int, src_offset: int, dst_offset: int, moved: int
    ) -> None:
        self.used_methods.add(method)
        self.stats.bytes_by_method[method] = self.stats.bytes_by_method.get(method, 0) + moved
        if method != "copy_file_range" or src_offset % self._block or dst_offset % self._block:
            return
        blocks = moved // self._block * self._block
        if blocks and self._can_clone(src_fd, src_dev):
            self.stats.clone_eligible_bytes += blocks
            last = self._clone_intervals[-1] if self._clone_intervals else None
            if last is not None and last[0] + last[1] == dst_offset:
                self._clone_intervals[-1] = (last[0], last[1] + blocks)
            else:
                self._clone_intervals.append((dst_offset, blocks))

    def _call(self, method: CopyMethod, src_fd: int, src_offset: int, dst_offset: int, count: int) -> int:
        if method == "copy_file_range":
            return os.copy_file_range(src_fd, self.dst_fd, count, src_offset, dst_offset)
        count = min(count, self.chunk_size)  # an aligned call may exceed chunk_size; the buffered ones never do
        if method == "sendfile":
            # sendfile writes at the destination's file position: set it first (the descriptor is ours alone).
            os.lseek(self.dst_fd, dst_offset, os.SEEK_SET)
            return os.sendfile(self.dst_fd, src_fd, src_offset, count)
        return self._pread_pwrite(src_fd, src_offset, dst_offset, count)

    def _pread_pwrite(self, src_fd: int, src_offset: int, dst_offset: int, count: int) -> int:
        if self._buffer is None:
            self._buffer = bytearray(self.chunk_size)
        view = memoryview(self._buffer)[:count]
        got = pread_exact(src_fd, view, src_offset)
        pwrite_all(self.dst_fd, view[:got], dst_offset)
        return got
