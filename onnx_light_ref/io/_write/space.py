"""Disk space of a destination: check and preallocate before the first byte is copied, and count cloned bytes.

A 100 GB job on a 50 GB disk must fail at once, with a message that says how many bytes are needed, how many are
free and on which filesystem, not after an hour with half a file behind. :func:`reserve_space` checks
``statvfs`` and preallocates with Linux ``fallocate(2)`` (mode 0, through ``ctypes``) where the filesystem supports
it. It deliberately avoids glibc's ``posix_fallocate`` on Linux: where the filesystem lacks ``fallocate``, glibc
emulates it by writing one byte per block, which on 100 GB means millions of writes; other POSIX systems use
``os.posix_fallocate``, whose EINVAL/EOPNOTSUPP (ZFS, some NFS) means "not supported" and is skipped.

Reflinks: bytes that the copy will clone (``copy_file_range`` between block-aligned offsets on XFS, btrfs...) need
no new blocks, so they are not counted as needed, and when any are expected the file is not preallocated at all:
on XFS, cloning over preallocated blocks still clones (the preallocated blocks are freed again), but the
preallocation would first demand the full size free, refusing a re-alignment that needs almost no space.

:func:`shared_extent_bytes` asks the filesystem (``FS_IOC_FIEMAP``) how many bytes of a file are shared extents:
in a freshly created destination those are exactly the cloned bytes. ``st_blocks`` cannot tell (a clone counts
its blocks in both files); the filesystem's free space can, but only where nothing else writes.

This module never writes file contents; the only change it makes is preallocation, undone if it fails.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import struct
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# fallocate/posix_fallocate answers meaning "this filesystem does not preallocate", not "no space".
_NO_PREALLOCATION_ERRNOS = frozenset(
    (errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP), errno.EINVAL, errno.ENOSYS, errno.ENODEV)
)


@dataclass(frozen=True, slots=True)
class FilesystemInfo:
    """Where a file lives: ``mount_point`` and ``fs_type`` from ``/proc/self/mountinfo`` (empty when unknown)."""

    mount_point: str
    fs_type: str
    source: str = ""

    def describe(self, fallback_folder: str) -> str:
        """Human-readable filesystem name for messages, e.g. ``'/mnt/data' (xfs on /dev/loop0)``."""
        if not self.mount_point:
            return f"the filesystem of {fallback_folder!r}"
        detail = self.fs_type + (f" on {self.source}" if self.source and self.source != self.fs_type else "")
        return f"{self.mount_point!r} ({detail})"


@dataclass(frozen=True, slots=True)
class SpaceReservation:
    """What :func:`reserve_space` found and did.

    Attributes:
        needed_bytes: New bytes the destination needs (``size`` minus expected clones).
        free_bytes: Bytes available to this user on the destination filesystem before the reservation.
        preallocated: Whether ``size`` bytes were preallocated.
        filesystem: Where the destination lives.
    """

    needed_bytes: int
    free_bytes: int
    preallocated: bool
    filesystem: FilesystemInfo


def _unescape_mountinfo(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as 3-digit octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_of(st_dev: int, path: str, *, mountinfo: str = "/proc/self/mountinfo") -> FilesystemInfo:
    """Find the mount of device ``st_dev`` that holds ``path`` (longest matching mount point).

    Args:
        st_dev: ``st_dev`` of the file (from ``os.fstat``).
        path: A path of (or inside the folder of) the file, used to choose among several mounts of one device.
        mountinfo: The mount table to read (Linux); an unreadable table gives an empty :class:`FilesystemInfo`.

    Returns:
        The mount point, filesystem type and source, or empty strings when unknown (not Linux, no procfs).
    """
    wanted = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    real = os.path.realpath(path)
    best: FilesystemInfo | None = None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return FilesystemInfo("", "")
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[2] != wanted or "-" not in fields[6:]:
            continue
        mount_point = _unescape_mountinfo(fields[4])
        separator = fields.index("-", 6)
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if best is None or (inside and len(mount_point) > len(best.mount_point)):
            best = FilesystemInfo(mount_point, fields[separator + 1], _unescape_mountinfo(fields[separator + 2]))
    return best or FilesystemInfo("", "")


def _load_fallocate() -> Callable[[int, int], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int

    def call(fd: int, size: int) -> None:
        if function(fd, 0, 0, size) != 0:  # mode 0: allocate and extend, no zero-writing emulation
            code = ctypes.get_errno()
            raise OSError(code, f"fallocate: {os.strerror(code)}")

    return call


_FALLOCATE = _load_fallocate()


def _preallocate(fd: int, size: int) -> bool:
    """Allocate ``size`` bytes from offset 0; False when the filesystem does not support it. ENOSPC propagates."""
    try:
        if _FALLOCATE is not None:
            _FALLOCATE(fd, size)
        elif hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:
            return False
    except OSError as exc:
        if exc.errno in _NO_PREALLOCATION_ERRNOS:
            logger.debug("preallocation not supported on fd %d: %s", fd, exc)
            return False
        raise
    return True


def _free_bytes(fd: int) -> int:
    st = os.fstatvfs(fd)
    return st.f_bavail * st.f_frsize


def _no_space(needed: int, free: int, where: str, what: str) -> OSError:
    """``what``: the destination(s), already quoted."""
    return OSError(
        errno.ENOSPC,
        f"not enough free space on {where} for {what}: {needed} bytes needed ({needed / 2**30:.2f} GiB), "
        f"{free} bytes free ({free / 2**30:.2f} GiB); nothing was written",
    )


def reserve_space(fd: int, size: int, *, path: str, clone_bytes: int = 0, preallocate: bool = True) -> SpaceReservation:
    """Make sure the destination behind ``fd`` can hold ``size`` bytes before anything is copied into it.

    Checks the free space of the destination's filesystem, then preallocates ``size`` bytes from offset 0 where the
    filesystem supports it (the file's size becomes at least ``size``; the caller sets the final size anyway).
    Filesystems without preallocation (some tmpfs, overlayfs, NFS, ZFS) are only checked. When ``clone_bytes`` > 0
    the file is never preallocated (see the module docstring) and only ``size - clone_bytes`` must be free.

    Args:
        fd: The destination, open for writing, normally a new empty temporary file.
        size: Bytes the destination will hold (padding included).
        path: The destination's path (or its final path), for the message and to find its mount.
        clone_bytes: Bytes the copy is expected to clone rather than write (0 when unknown).
        preallocate: False only checks free space.

    Returns:
        A :class:`SpaceReservation` with the numbers used.

    Raises:
        OSError: ``errno.ENOSPC`` when the filesystem has fewer free bytes than needed, or when preallocation
            runs out of space; the message gives the bytes needed and free and the filesystem. The file is
            truncated back to its previous size first. Other ``OSError`` from ``fstat``/``fallocate`` propagate.
        ValueError: When ``size`` or ``clone_bytes`` is negative.
    """
    if size < 0 or clone_bytes < 0:
        raise ValueError(f"size and clone_bytes must be >= 0, got {size} and {clone_bytes}.")
    st = os.fstat(fd)
    needed = max(0, size - clone_bytes)
    free = _free_bytes(fd)
    filesystem = filesystem_of(st.st_dev, path)
    where = filesystem.describe(os.path.dirname(os.path.abspath(path)))
    if needed > free:
        raise _no_space(needed, free, where, repr(path))
    preallocated = False
    if preallocate and clone_bytes == 0 and size > st.st_size:
        try:
            preallocated = _preallocate(fd, size)
        except OSError as exc:
            os.ftruncate(fd, st.st_size)
            if exc.errno == errno.ENOSPC:
                raise _no_space(needed, free, where, repr(path)) from exc
            raise
    logger.debug("reserved %d bytes for %r on %s (%d free, preallocated=%s)", needed, path, where, free, preallocated)
    return SpaceReservation(needed, free, preallocated, filesystem)


@dataclass(frozen=True, slots=True)
class SpaceRequest:
    """One destination of a multi-file job, for :func:`reserve_space_for_all` (same fields as :func:`reserve_space`)."""

    fd: int
    size: int
    path: str
    clone_bytes: int = 0


def reserve_space_for_all(requests: Sequence[SpaceRequest], *, preallocate: bool = True) -> list[SpaceReservation]:
    """Reserve the space of every file of one job (e.g. the shards of a sharded write), checking the total first.

    Reserving shard after shard would refuse the job only at the first shard that no longer fits, with a message
    about that shard ("2 MiB needed, 1.6 MiB free") when the job needs 12 MiB of 8: the user would free too little
    and fail again. Here the files on each filesystem are summed and checked against its free space before any is
    preallocated, so the message gives the whole job's bytes; then each file is reserved with :func:`reserve_space`.

    Args:
        requests: The destinations, each open for writing (normally new, empty temporary files).
        preallocate: False only checks free space.

    Returns:
        One :class:`SpaceReservation` per request, in order.

    Raises:
        OSError: ``errno.ENOSPC`` when the files on one filesystem need more than it has free (the message gives the
            total needed and free, the filesystem and the files), or when a preallocation runs out of space; the
            files already preallocated keep their blocks until the caller discards them (temporary files).
        ValueError: When a ``size`` or ``clone_bytes`` is negative.
    """
    by_device: dict[int, list[SpaceRequest]] = {}
    for request in requests:
        if request.size < 0 or request.clone_bytes < 0:
            raise ValueError(f"size and clone_bytes must be >= 0, got {request.size} and {request.clone_bytes}.")
        by_device.setdefault(os.fstat(request.fd).st_dev, []).append(request)
    for device, group in by_device.items():
        needed = sum(max(0, r.size - r.clone_bytes) for r in group)
        free = _free_bytes(group[0].fd)
        if needed > free:
            where = filesystem_of(device, group[0].path).describe(os.path.dirname(os.path.abspath(group[0].path)))
            files = repr(group[0].path) + (f" and {len(group) - 1} more files" if len(group) > 1 else "")
            raise _no_space(needed, free, where, files)
    return [
        reserve_space(r.fd, r.size, path=r.path, clone_bytes=r.clone_bytes, preallocate=preallocate) for r in requests
    ]


_FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap), the same on every Linux architecture
_FIEMAP_HEADER = struct.Struct("=QQIIII")  # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, pad
_FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, reserved64[2], flags, reserved[3]
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_EXTENT_SHARED = 0x2000
_FIEMAP_BATCH = 256


def _shared_extents(fd: int) -> list[tuple[int, int]]:
    """Every shared extent of ``fd`` as (logical offset, length), in file order."""
    shared: list[tuple[int, int]] = []
    start = 0
    while True:
        buffer = bytearray(_FIEMAP_HEADER.size + _FIEMAP_EXTENT.size * _FIEMAP_BATCH)
        _FIEMAP_HEADER.pack_into(buffer, 0, start, 2**64 - 1 - start, 0, 0, _FIEMAP_BATCH, 0)
        fcntl.ioctl(fd, _FS_IOC_FIEMAP, buffer)
        mapped = _FIEMAP_HEADER.unpack_from(buffer, 0)[3]
        if mapped == 0:
            return shared
        for index in range(mapped):
            logical, _, length, _, _, flags, *_ = _FIEMAP_EXTENT.unpack_from(
                buffer, _FIEMAP_HEADER.size + index * _FIEMAP_EXTENT.size
            )
            if flags & _FIEMAP_EXTENT_SHARED:
                shared.append((logical, length))
            if flags & _FIEMAP_EXTENT_LAST:
                return shared
            start = logical + length


def shared_extent_bytes(fd: int, intervals: Iterable[tuple[int, int]] | None = None) -> int | None:
    """Count the bytes of ``fd`` stored in extents shared with another file (reflinks), without syncing.

    Args:
        fd: An open file.
        intervals: (offset, length) pairs to count within, sorted and not overlapping; None counts the whole file.

    Returns:
        The shared bytes, or None when the filesystem cannot say (no ``FIEMAP``: tmpfs, NFS, not Linux).

    Raises:
        OSError: For failures other than "not supported".
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        extents = _shared_extents(fd)
    except OSError as exc:
        if exc.errno in _NO_PREALLOCATION_ERRNOS or exc.errno == errno.ENOTTY:
            return None
        raise
    if intervals is None:
        return sum(length for _, length in extents)
    total, first = 0, 0
    for offset, length in intervals:  # both sorted: one sweep
        end = offset + length
        while first < len(extents) and extents[first][0] + extents[first][1] <= offset:
            first += 1
        index = first
        while index < len(extents) and extents[index][0] < end:
            start, size = extents[index]
            total += min(end, start + size) - max(offset, start)
            index += 1
    return total
