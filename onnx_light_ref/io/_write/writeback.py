"""Start the kernel's writeback of a destination file while the copy goes on, so the final fsync has little left.

Without it, a copy dirties the whole destination in the page cache and the caller's final ``fsync`` then waits for
all of it: writing and copying never overlap. Linux's ``sync_file_range(2)`` (reached through ``ctypes``, Python has
no binding) starts writeback of a finished stretch (``SYNC_FILE_RANGE_WRITE``, asynchronous) and can wait for an
older one (``WAIT_BEFORE | WRITE | WAIT_AFTER``), which keeps the dirty pages of one copy bounded to a few stretches.
Measurements are in ``docs/durability.md``.

Writeback is an optimisation, never a durability guarantee: ``sync_file_range`` flushes neither metadata nor the
disk's cache. The caller's ``fsync`` of every output file and folder stays what makes an output durable. Where the
call is missing (not Linux, no libc symbol) or refused for a descriptor (EINVAL, ENOSYS, ESPIPE, EOPNOTSUPP), the
pacer turns itself off for that descriptor and the copy goes on. Real I/O errors (EIO, ENOSPC...) propagate: once
``sync_file_range`` has waited on a failed page, the kernel may not report that error to the later ``fsync`` of the
same file, so swallowing it could let a broken output be published.

This module never writes, reads or closes the descriptors it is given.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys
from collections import deque
from collections.abc import Callable

logger = logging.getLogger(__name__)

SYNC_FILE_RANGE_WAIT_BEFORE = 1
SYNC_FILE_RANGE_WRITE = 2
SYNC_FILE_RANGE_WAIT_AFTER = 4

DEFAULT_STRETCH = 8 * 1024 * 1024
"""Bytes of destination per writeback request: large enough that the system calls cost nothing next to the I/O
(8192 tensors of 64 KiB make 64 requests, not 8192), small enough that writeback starts early in the copy."""

_WAIT_LAG = 2
"""Wait on the stretch this many requests back: one stretch is being written while the next is copied, and dirty
pages stay bounded to about ``_WAIT_LAG + 1`` stretches (measured best on ext4; one back stalls the copy)."""

# errno values meaning "this descriptor or platform cannot do it", as opposed to a real I/O failure.
_UNSUPPORTED_ERRNOS = frozenset(
    (errno.EINVAL, errno.ENOSYS, errno.ESPIPE, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP))
)

SyncFileRange = Callable[[int, int, int, int], None]


def _load_sync_file_range() -> SyncFileRange | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int

    def call(fd: int, offset: int, length: int, flags: int) -> None:
        if function(fd, offset, length, flags) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"sync_file_range: {os.strerror(code)}")

    return call


_SYNC_FILE_RANGE = _load_sync_file_range()


def sync_file_range_available() -> bool:
    """Return whether this platform's C library offers ``sync_file_range`` (Linux only)."""
    return _SYNC_FILE_RANGE is not None


def sync_file_range(fd: int, offset: int, length: int, flags: int) -> None:
    """Call Linux ``sync_file_range(2)`` on ``fd``.

    Args:
        fd: An open descriptor of a regular file.
        offset: First byte of the stretch.
        length: Bytes in the stretch (0 means up to the end of the file).
        flags: A combination of ``SYNC_FILE_RANGE_WAIT_BEFORE``, ``SYNC_FILE_RANGE_WRITE`` and
            ``SYNC_FILE_RANGE_WAIT_AFTER``.

    Raises:
        OSError: With ``errno.ENOSYS`` when the platform has no such call; with the kernel's errno otherwise.
    """
    if _SYNC_FILE_RANGE is None:
        raise OSError(errno.ENOSYS, "sync_file_range is not available on this platform")
    _SYNC_FILE_RANGE(fd, offset, length, flags)


class WritebackPacer:
    """Starts writeback of a destination as it fills, one stretch at a time, and bounds its dirty pages.

    The copier reports each stretch of destination it finished with :meth:`written` (in increasing offsets, gaps
    allowed: holes cost no writeback). Every ``stretch`` bytes, the pacer starts writeback of what was finished and
    waits for the request ``_WAIT_LAG`` back. :meth:`finish` starts writeback of the tail; the caller's ``fsync``
    does the rest. ``enabled=False`` (``durable=False`` writers) makes every method a no-op.

    Attributes:
        active: Whether writeback requests are still being made for this descriptor.
        requests: Number of ``sync_file_range`` calls that succeeded.
    """

    def __init__(self, fd: int, *, enabled: bool = True, stretch: int = DEFAULT_STRETCH) -> None:
        if stretch <= 0:
            raise ValueError(f"stretch must be > 0, got {stretch}.")
        self.fd = fd
        self.stretch = stretch
        self.active = enabled and _SYNC_FILE_RANGE is not None
        self.requests = 0
        self._start: int | None = None  # first byte not yet handed to writeback
        self._end = 0
        self._in_flight: deque[tuple[int, int]] = deque()

    def written(self, offset: int, length: int) -> None:
        """Record that ``length`` bytes at ``offset`` are in the destination; start writeback every ``stretch``."""
        if not self.active or length <= 0:
            return
        if self._start is None:
            self._start = offset
        self._end = max(self._end, offset + length)
        if self._end - self._start >= self.stretch:
            self._flush_pending()

    def finish(self) -> None:
        """Start writeback of what is left; wait for nothing (the caller's ``fsync`` does)."""
        if self.active and self._start is not None and self._end > self._start:
            self._flush_pending()
        self._in_flight.clear()

    def _flush_pending(self) -> None:
        assert self._start is not None
        stretch = (self._start, self._end - self._start)
        self._start = self._end
        if not self._request(*stretch, SYNC_FILE_RANGE_WRITE):
            return
        self._in_flight.append(stretch)
        if len(self._in_flight) > _WAIT_LAG:
            old = self._in_flight.popleft()
            self._request(*old, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER)

    def _request(self, offset: int, length: int, flags: int) -> bool:
        try:
            sync_file_range(self.fd, offset, length, flags)
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED_ERRNOS:
                raise
            logger.debug("writeback overlap disabled for fd %d: %s", self.fd, exc)
            self.active = False
            self._in_flight.clear()
            return False
        self.requests += 1
        return True
