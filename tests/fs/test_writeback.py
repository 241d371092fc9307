"""Writeback overlap: same bytes with and without it, requests made only when durable, clean fallbacks."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._write import writeback
from onnx_light_ref.io._write.copy_engine import RangeCopier
from onnx_light_ref.io._write.writeback import WritebackPacer, sync_file_range_available

MIB = 1024 * 1024


def unaligned_ranges(source: Path) -> list[CopyRange]:
    """16 ranges of ~1 MiB from odd source offsets to 4096-aligned destination offsets (no merge, no clone)."""
    return [CopyRange(str(source), i * (MIB + 13) + 7, i * (MIB + 4096), MIB + i) for i in range(16)]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src.bin"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 17 * MIB + 1000, dtype=np.uint8).tobytes())
    return path


def copy_with(dst: Path, ranges: list[CopyRange], **options) -> RangeCopier:
    fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with RangeCopier(fd, 256 * 1024, writeback_stretch=2 * MIB, **options) as copier:
            copier.copy(ranges)
        os.fsync(fd)
    finally:
        os.close(fd)
    return copier


@pytest.mark.skipif(not sync_file_range_available(), reason="sync_file_range is Linux-only")
@pytest.mark.parametrize("methods", [("copy_file_range",), ("sendfile",), ("pread_pwrite",)])
def test_durable_and_not_durable_copies_are_byte_identical(tmp_path, source, methods):
    ranges = unaligned_ranges(source)

    durable = copy_with(tmp_path / "durable.bin", ranges, durable=True, methods=methods)
    fast = copy_with(tmp_path / "fast.bin", ranges, durable=False, methods=methods)

    assert (tmp_path / "durable.bin").read_bytes() == (tmp_path / "fast.bin").read_bytes()
    payload = sum(r.length for r in ranges)
    assert durable.stats.bytes_by_method == fast.stats.bytes_by_method == {methods[0]: payload}
    # ~17 MiB of destination in 2 MiB stretches: 8 WRITE requests, 6 waits on the stretch two back, 1 for the tail.
    assert durable.stats.writeback_requests >= 8
    assert fast.stats.writeback_requests == 0


def test_where_sync_file_range_is_missing_the_copy_goes_on_without_it(tmp_path, source, monkeypatch):
    # Needs a mock: non-Linux platforms and C libraries without the symbol cannot be produced on this host.
    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", None)
    ranges = unaligned_ranges(source)

    copier = copy_with(tmp_path / "dst.bin", ranges, durable=True)
    copy_with(tmp_path / "ref.bin", ranges, durable=False)

    assert copier.stats.writeback_requests == 0
    assert (tmp_path / "dst.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()


@pytest.mark.skipif(not sync_file_range_available(), reason="sync_file_range is Linux-only")
def test_a_descriptor_that_refuses_writeback_turns_the_pacer_off(tmp_path):
    read_end, write_end = os.pipe()  # sync_file_range on a pipe fails with ESPIPE, for real
    try:
        pacer = WritebackPacer(write_end, stretch=10)
        pacer.written(0, 100)
        pacer.written(100, 100)
        pacer.finish()
    finally:
        os.close(read_end)
        os.close(write_end)

    assert not pacer.active
    assert pacer.requests == 0


def test_a_real_io_error_from_writeback_propagates(tmp_path, monkeypatch):
    # Needs a mock: EIO from sync_file_range means a failing disk. It must not be swallowed, because after waiting on
    # the failed pages the kernel may not report the error again to the final fsync.
    def failing(fd: int, offset: int, length: int, flags: int) -> None:
        raise OSError(errno.EIO, "sync_file_range: Input/output error")

    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", failing)
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        pacer = WritebackPacer(fd, stretch=10)
        with pytest.raises(OSError) as raised:
            pacer.written(0, 100)
    finally:
        os.close(fd)
    assert raised.value.errno == errno.EIO


def test_the_pacer_waits_on_the_stretch_two_back_and_never_on_the_latest(tmp_path, monkeypatch):
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        writeback, "_SYNC_FILE_RANGE", lambda fd, offset, length, flags: calls.append((offset, length, flags))
    )
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        pacer = WritebackPacer(fd, stretch=100)
        for offset in range(0, 400, 50):
            pacer.written(offset, 50)
        pacer.written(450, 10)  # a gap: holes need no writeback, the stretch just spans it
        pacer.finish()
    finally:
        os.close(fd)

    write, wait = writeback.SYNC_FILE_RANGE_WRITE, 7
    assert calls == [
        (0, 100, write),
        (100, 100, write),
        (200, 100, write),
        (0, 100, wait),
        (300, 100, write),
        (100, 100, wait),
        (400, 60, write),
        (200, 100, wait),
    ]
