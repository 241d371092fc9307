"""A copy from a source range to a destination offset (the plan's unit of work), and how its source is read.

:func:`open_source` opens a range's source the way every reader must: through the folder held since validation when
the range is model-relative, and only if it is still the very file (device and inode) that was validated. Planning
(dedup, inline payloads), ``verify`` and the copy engine all read sources through it.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

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
