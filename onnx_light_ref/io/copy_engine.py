"""Copy byte ranges from source files into one destination file, in the kernel whenever it can.

Method chain, chosen at run time and remembered per (source device, destination device) pair:

1. ``os.copy_file_range``: in-kernel, positional on both sides (reflinks on filesystems that support them);
2. ``os.sendfile``: in-kernel too and works across filesystems (``copy_file_range`` fails with EXDEV between ext4
   and tmpfs, for instance);
3. ``os.preadv`` into one ``chunk_size`` buffer + ``os.pwrite``: the portable last resort.

A method is dropped for a device pair when it fails with EINVAL, ENOSYS, EXDEV, EOPNOTSUPP/ENOTSUP or EPERM, or
moves nothing where the validated range says bytes exist; any other error (EIO, ENOSPC...) propagates, and a source
that really ended early is reported by the last method. Each system call moves at most
``chunk_size`` bytes. Ranges contiguous in both source and destination are merged into one. Every source file is
opened once, checked to be the very file that was validated (device and inode), and closed at the end.

This module never reads weight bytes into Python objects except through the one bounded buffer of the last
fallback, and it never writes padding: gaps are left as holes, which read as zeros (the caller sets the final size).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io.locations import FileIdentity

__all__ = ["CopyMethod", "CopyRange", "ProgressCallback", "RangeCopier", "merge_ranges", "open_source"]

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``, called as bytes move."""

CopyMethod = str  # "copy_file_range" | "sendfile" | "pread_pwrite"

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
        errno.EBADF,
    )
)

_ALL_METHODS: tuple[CopyMethod, ...] = ("copy_file_range", "sendfile", "pread_pwrite")


@dataclass(frozen=True, slots=True)
class CopyRange:
    """Copy ``length`` bytes from ``src_path`` at ``src_offset`` to the destination at ``dst_offset``."""

    src_path: str
    src_offset: int
    dst_offset: int
    length: int
    src_identity: FileIdentity | None = None  # when set, the opened file must be this one


def merge_ranges(ranges: Iterable[CopyRange]) -> list[CopyRange]:
    """Merge ranges that continue each other in both source and destination (kept in destination order)."""
    merged: list[CopyRange] = []
    for item in sorted((r for r in ranges if r.length > 0), key=lambda r: r.dst_offset):
        last = merged[-1] if merged else None
        if (
            last is not None
            and last.src_path == item.src_path
            and last.src_offset + last.length == item.src_offset
            and last.dst_offset + last.length == item.dst_offset
        ):
            merged[-1] = CopyRange(
                last.src_path, last.src_offset, last.dst_offset, last.length + item.length, last.src_identity
            )
        else:
            merged.append(item)
    return merged


def open_source(item: CopyRange) -> int:
    """Open ``item``'s source read-only, refusing a file that is no longer the one that was validated.

    The path was resolved and checked before (no symlink, inside the model folder); between that check and this
    open, someone with write access to the folder could have swapped the file, for a symlink pointing anywhere or
    for another file. ``O_NOFOLLOW`` refuses the first, the device/inode comparison the second: both raise
    :class:`ExternalDataError`, and nothing is read from the swapped file.
    """
    try:
        fd = os.open(item.src_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW on a symlink (EMLINK on FreeBSD)
            raise ExternalDataError(
                f"source file {item.src_path!r} was replaced after it was validated (it is now a symbolic link); "
                "nothing was published."
            ) from exc
        raise
    st = os.fstat(fd)
    if item.src_identity is not None and FileIdentity(st.st_dev, st.st_ino) != item.src_identity:
        os.close(fd)
        raise ExternalDataError(
            f"source file {item.src_path!r} was replaced after it was validated; nothing was published."
        )
    return fd


@dataclass
class RangeCopier:
    """Copies :class:`CopyRange` items into an open destination descriptor; use as a context manager.

    ``methods`` restricts the chain (tests force each fallback this way). ``used_methods`` records what actually
    moved bytes, for reports and tests.
    """

    dst_fd: int
    chunk_size: int
    methods: Sequence[CopyMethod] = _ALL_METHODS
    used_methods: set[CopyMethod] = field(default_factory=set)
    _src_fds: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (fd, st_dev)
    _disabled: dict[tuple[int, int], set[CopyMethod]] = field(default_factory=dict)
    _buffer: bytearray | None = None

    def __post_init__(self) -> None:
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0, got {self.chunk_size}.")
        unknown = set(self.methods) - set(_ALL_METHODS)
        if unknown or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {_ALL_METHODS}, got {tuple(self.methods)}.")
        # Platforms without a syscall (macOS has no copy_file_range) simply skip it.
        self.methods = tuple(m for m in self.methods if m == "pread_pwrite" or hasattr(os, m))
        self._dst_dev = os.fstat(self.dst_fd).st_dev

    def __enter__(self) -> RangeCopier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every source descriptor this copier opened."""
        fds, self._src_fds = self._src_fds, {}
        for fd, _ in fds.values():
            os.close(fd)

    def copy(self, ranges: Sequence[CopyRange], progress: ProgressCallback | None = None) -> int:
        """Copy every range (merged first); return the number of payload bytes moved."""
        merged = merge_ranges(ranges)
        total = sum(r.length for r in merged)
        done = 0
        for item in merged:
            src_fd, src_dev = self._open_source(item)
            disabled = self._disabled.setdefault((src_dev, self._dst_dev), set())
            position = 0
            while position < item.length:
                count = min(self.chunk_size, item.length - position)
                moved = self._copy_once(
                    src_fd, disabled, item, item.src_offset + position, item.dst_offset + position, count
                )
                position += moved
                done += moved
                if progress is not None:
                    progress(done, total)
        return done

    def _open_source(self, item: CopyRange) -> tuple[int, int]:
        opened = self._src_fds.get(item.src_path)
        if opened is not None:
            return opened
        fd = open_source(item)
        src_dev = os.fstat(fd).st_dev
        self._src_fds[item.src_path] = (fd, src_dev)
        return fd, src_dev

    def _copy_once(
        self, src_fd: int, disabled: set[CopyMethod], item: CopyRange, src_offset: int, dst_offset: int, count: int
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
            self.used_methods.add(method)
            return moved
        if moved_nothing:
            raise ExternalDataError(
                f"source file {item.src_path!r} ended at offset {src_offset} while {count} more bytes were "
                f"expected (range at offset {item.src_offset}, {item.length} bytes); was it truncated during "
                "the copy?"
            )
        raise OSError(errno.ENOTSUP, f"no copy method works from {item.src_path!r} to the destination")

    def _call(self, method: CopyMethod, src_fd: int, src_offset: int, dst_offset: int, count: int) -> int:
        if method == "copy_file_range":
            return os.copy_file_range(src_fd, self.dst_fd, count, src_offset, dst_offset)
        if method == "sendfile":
            # sendfile writes at the destination's file position: set it first (the descriptor is ours alone).
            os.lseek(self.dst_fd, dst_offset, os.SEEK_SET)
            return os.sendfile(self.dst_fd, src_fd, src_offset, count)
        return self._pread_pwrite(src_fd, src_offset, dst_offset, count)

    def _pread_pwrite(self, src_fd: int, src_offset: int, dst_offset: int, count: int) -> int:
        if self._buffer is None:
            self._buffer = bytearray(self.chunk_size)
        view = memoryview(self._buffer)[:count]
        got = os.preadv(src_fd, [view], src_offset)
        written = 0
        while written < got:
            written += os.pwrite(self.dst_fd, view[written:got], dst_offset + written)
        return got
