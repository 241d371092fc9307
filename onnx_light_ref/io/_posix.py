"""Exact positional reads and writes on file descriptors, and the checks made on a file once it is open.

Platform story: the package is POSIX-only (Linux first, macOS and the BSDs best effort), declared in
``pyproject.toml``'s classifiers and the README. Positional I/O (``os.preadv``, ``os.pwrite``) is what makes a
descriptor shareable by threads and every read independent of a file position; Windows lacks ``os.preadv`` and is
not supported. The kernel-copy calls (``copy_file_range``, ``sendfile``) are optional: the copy engine skips those a
platform lacks and falls back to :func:`pread_exact` + :func:`pwrite_all`.

This module never opens, names or closes files: callers own their descriptors. It never reads more than asked.
"""

from __future__ import annotations

import os

from onnx_light_ref.errors import UnsafeLocationError


def pread_exact(fd: int, buffer: memoryview, offset: int) -> int:
    """Fill ``buffer`` (a writable byte view) from ``fd`` at ``offset``; return the bytes read.

    Loops on short reads. Returns fewer than ``len(buffer)`` bytes only when the file ends first: the caller, who
    knows what was expected, turns that into its own error.
    """
    done = 0
    size = len(buffer)
    while done < size:
        got = os.preadv(fd, [buffer[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` to ``fd`` at ``offset`` (positional; loops on short writes)."""
    view = memoryview(data).cast("B")
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], offset + written)


def check_single_link(st: os.stat_result, *, what: str) -> None:
    """Refuse a data file with several hard links, as onnx >= 1.21 does (CVE-2026-34446).

    A hard link inside a model's folder can name any file the user can read; reading it through a model would leak
    it. ``what`` names the tensor/node and the file for the message. Check it on the ``fstat`` of the open
    descriptor where there is one, so that the file cannot be swapped between the check and the read.
    """
    if st.st_nlink > 1:
        raise UnsafeLocationError(
            f"{what} has {st.st_nlink} hard links; refused as onnx does (a hard link can expose a file from outside "
            "the model's folder). Copy the file instead of hard-linking it."
        )
