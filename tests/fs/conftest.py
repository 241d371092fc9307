"""Real filesystems for fault and reflink tests: each fixture mounts under ``tmp_path`` and always unmounts.

A mock of ``os.copy_file_range`` cannot show what a full disk, a read-only mount, a cross-filesystem copy or a
reflink-capable filesystem really do; these fixtures give the tests the real thing:

* ``small_tmpfs``: an 8 MiB tmpfs (ENOSPC for real);
* ``make_readonly(fill)``: a tmpfs that ``fill`` populates, then remounted read-only (EROFS);
* ``tmpfs_mount`` and ``ext4_mount``: two different filesystems (``copy_file_range`` fails with EXDEV between them);
* ``inode_tmpfs``: a tmpfs with 64 inodes (ENOSPC when creating a file, with bytes to spare);
* ``ext3_mount``: a loop-mounted ext3 (no extents, so no ``fallocate``: space is checked, never reserved);
* ``xfs_mount``: a loop-mounted XFS made with ``mkfs.xfs -m reflink=1`` on a sparse file (cloning).

Mounting needs root (CI runs as root). Where the kernel or the system refuses (not root, no loop devices, no
``mkfs.xfs``), the test is skipped with that reason; any other failure is a failure. Every mount is undone when the
test ends, passed or failed, with a lazy unmount as the last resort; loop images live under ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.memory_folder import unmount

MIB = 1024 * 1024


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _require_tools(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root (CI runs as root)")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/run installs xfsprogs with apt-get when it can)")


@contextmanager
def mounted(target: Path, *mount_args: str) -> Iterator[Path]:
    """Mount (``mount *mount_args target``) for the duration of the block; skip the test if mounting is refused."""
    target.mkdir(parents=True, exist_ok=True)
    result = _run("mount", *mount_args, str(target))
    if result.returncode != 0:
        pytest.skip(f"mount {' '.join(mount_args)} refused here: {result.stderr.strip()}")
    try:
        yield target
    finally:
        unmount(target)


def _loop_filesystem(tmp_path: Path, name: str, size: int, mkfs: list[str]) -> Iterator[Path]:
    image = tmp_path / f"{name}.img"
    with open(image, "wb") as sparse:
        sparse.truncate(size)
    made = _run(*mkfs, str(image))
    if made.returncode != 0:
        raise RuntimeError(f"{' '.join(mkfs)} failed: {made.stderr.strip()}")
    with mounted(tmp_path / name, "-o", "loop", str(image)) as target:
        yield target


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: writing more than that fails with ENOSPC."""
    _require_tools("mount", "umount")
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=8m", "tmpfs") as target:
        yield target


@pytest.fixture
def tmpfs_mount(tmp_path: Path) -> Iterator[Path]:
    """A 256 MiB tmpfs (another filesystem than ``ext4_mount``)."""
    _require_tools("mount", "umount")
    with mounted(tmp_path / "tmpfs", "-t", "tmpfs", "-o", "size=256m", "tmpfs") as target:
        yield target


@pytest.fixture
def ext4_mount(tmp_path: Path) -> Iterator[Path]:
    """A loop-mounted 128 MiB ext4 (no reflinks; ``copy_file_range`` copies in the kernel)."""
    _require_tools("mount", "umount", "mkfs.ext4")
    yield from _loop_filesystem(tmp_path, "ext4", 128 * MIB, ["mkfs.ext4", "-q", "-F"])


@pytest.fixture
def ext3_mount(tmp_path: Path) -> Iterator[Path]:
    """A loop-mounted 64 MiB ext3: ``fallocate`` fails with EOPNOTSUPP, like ZFS and some NFS servers.

    No blocks reserved for root (``-m 0``): the tests run as root, which could otherwise write past ``f_bavail``.
    """
    _require_tools("mount", "umount", "mkfs.ext3")
    yield from _loop_filesystem(tmp_path, "ext3", 64 * MIB, ["mkfs.ext3", "-q", "-F", "-m", "0"])


@pytest.fixture
def xfs_mount(tmp_path: Path) -> Iterator[Path]:
    """A loop-mounted 512 MiB XFS with reflinks: aligned ``copy_file_range`` clones extents."""
    _require_tools("mount", "umount", "mkfs.xfs")
    yield from _loop_filesystem(tmp_path, "xfs", 512 * MIB, ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"])


@pytest.fixture
def make_readonly(tmp_path: Path) -> Iterator[Callable[[Callable[[Path], None]], Path]]:
    """``make_readonly(fill)``: a tmpfs that ``fill(folder)`` populates, then remounted read-only; returns it."""
    _require_tools("mount", "umount")
    mounts: list[Path] = []

    def make(fill: Callable[[Path], None]) -> Path:
        target = tmp_path / f"ro{len(mounts)}"
        target.mkdir()
        result = _run("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target))
        if result.returncode != 0:
            pytest.skip(f"mount -t tmpfs refused here: {result.stderr.strip()}")
        mounts.append(target)
        fill(target)
        remount = _run("mount", "-o", "remount,ro", str(target))
        if remount.returncode != 0:
            pytest.skip(f"remounting read-only refused here: {remount.stderr.strip()}")
        return target

    try:
        yield make
    finally:
        for target in reversed(mounts):
            unmount(target)


@pytest.fixture
def inode_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs with 64 inodes: creating a file fails with ENOSPC once they are used, whatever the free space."""
    _require_tools("mount", "umount")
    with mounted(tmp_path / "inodes", "-t", "tmpfs", "-o", "size=64m,nr_inodes=64", "tmpfs") as target:
        yield target
