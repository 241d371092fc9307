"""A folder in memory (a tmpfs) for tests whose cost is the disk's, not the code's.

Reading 2 GiB of holes from a file on ext4 makes the kernel allocate and zero 2 GiB of page cache (15-20 s of system
time for the verify tests over 2 GiB, most of that file's time); on a tmpfs holes read as the shared zero page, and
fsync is free. The code under test makes the same system calls on either, and the assertions are the same: the real
disk filesystems are tested as such in ``tests/fs`` (loop-mounted ext4, ext3, XFS) and by every other test.

Mounting needs root (CI runs as root); where it is refused, the folder is a plain one under the test's temp folder:
the same test, only slower.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["in_memory_folder", "unmount"]


@contextmanager
def in_memory_folder(target: Path, size: str = "64m") -> Iterator[Path]:
    """``target`` (created) as a tmpfs of ``size`` (``mount -o size=``) for the block, unmounted at its end whatever
    happens (lazily if something still holds it); ``target`` as a plain folder where mounting is refused."""
    target.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield target
        return
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)]
    if subprocess.run(mount, capture_output=True, check=False).returncode != 0:
        yield target
        return
    try:
        yield target
    finally:
        unmount(target)


def unmount(target: Path) -> None:
    """Unmount ``target``; if something still holds it (a descriptor leaked by a failing test), detach it now, freed
    when released. Raises ``RuntimeError`` when even that is refused."""
    if subprocess.run(["umount", str(target)], capture_output=True, check=False).returncode == 0:
        return
    lazy = subprocess.run(["umount", "-l", str(target)], capture_output=True, text=True, check=False)
    if lazy.returncode != 0:
        raise RuntimeError(f"could not unmount {target}: {lazy.stderr.strip()}")
