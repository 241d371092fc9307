"""The copy engine: byte ranges between real files, through each method of the chain and each fallback."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

import pytest

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._read.locations import file_identity
from onnx_light_ref.io._write import copy_engine
from onnx_light_ref.io._write.copy_engine import CopyMethod, RangeCopier, merge_ranges
from tests.zoo import build_zoo_model

SOURCE_BYTES = bytes(range(256)) * 40  # 10240 bytes, every offset distinguishable modulo 256


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src.bin"
    path.write_bytes(SOURCE_BYTES)
    return path


def ranges_from(path: Path) -> list[CopyRange]:
    """Three slices of the source, reordered and spaced out in the destination."""
    return [
        CopyRange(str(path), 5000, 0, 1000),
        CopyRange(str(path), 17, 4096, 3000),
        CopyRange(str(path), 9000, 8192, 1240),
    ]


def expected_output(ranges: list[CopyRange]) -> bytes:
    size = max(r.dst_offset + r.length for r in ranges)
    out = bytearray(size)
    for r in ranges:
        out[r.dst_offset : r.dst_offset + r.length] = SOURCE_BYTES[r.src_offset : r.src_offset + r.length]
    return bytes(out)


def copy_to(dst: Path, ranges: list[CopyRange], **options) -> RangeCopier:
    """Run a copier into a new ``dst``; return it (closed) for its ``used_methods``."""
    chunk_size, progress = options.pop("chunk_size", 1024), options.pop("progress", None)
    fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with RangeCopier(fd, chunk_size, **options) as copier:
            copier.copy(ranges, progress)
    finally:
        os.close(fd)
    return copier


def raising(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


# ------------------------------------------------------------------------------------------------------ merge_ranges


def test_ranges_contiguous_in_source_and_destination_become_one_copy():
    ranges = [CopyRange("a", 100, 0, 10), CopyRange("a", 110, 10, 5), CopyRange("a", 115, 15, 1)]
    assert merge_ranges(ranges) == [CopyRange("a", 100, 0, 16)]


def test_ranges_are_not_merged_across_gaps_or_files():
    gap_in_destination = [CopyRange("a", 0, 0, 10), CopyRange("a", 10, 64, 10)]
    gap_in_source = [CopyRange("a", 0, 0, 10), CopyRange("a", 11, 10, 10)]
    other_file = [CopyRange("a", 0, 0, 10), CopyRange("b", 10, 10, 10)]
    for ranges in (gap_in_destination, gap_in_source, other_file):
        assert merge_ranges(ranges) == ranges


def test_merge_orders_by_destination_and_drops_empty_ranges():
    ranges = [CopyRange("a", 10, 10, 10), CopyRange("a", 50, 20, 0), CopyRange("a", 0, 0, 10)]
    assert merge_ranges(ranges) == [CopyRange("a", 0, 0, 20)]


class _LazyRanges(Sequence[CopyRange]):
    """Ranges built on demand, as a plan's shard gives them; counts how many were built."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.built = 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            raise AssertionError("a slice copies the ranges")
        if not 0 <= index < self.count:
            raise IndexError(index)
        self.built += 1
        gap = 16 if index % 2 else 0  # pairs of ranges contiguous in both source and destination
        return CopyRange("a", 32 * (index // 2) + 16 * (index % 2), 64 * (index // 2) + gap, 16)


def test_ranges_in_destination_order_are_merged_in_one_pass_without_sorting(monkeypatch):
    def no_sort(*args, **kwargs):
        raise AssertionError("ranges already in destination order were sorted")

    monkeypatch.setattr(copy_engine, "sorted", no_sort, raising=False)
    ranges = _LazyRanges(1000)

    merged = merge_ranges(ranges)

    assert merged == [CopyRange("a", 32 * i, 64 * i, 32) for i in range(500)]
    assert ranges.built == 2000  # one pass to check the order, one to merge: never a list of every range


def test_out_of_order_ranges_and_one_shot_iterables_are_sorted_first():
    ordered = [CopyRange("a", 32 * i, 64 * i, 32) for i in range(50)]
    shuffled = ordered[1::2] + ordered[::2]
    assert merge_ranges(iter(shuffled)) == ordered
    assert merge_ranges(iter(ordered)) == ordered


# ---------------------------------------------------------------------------------------------- methods and fallbacks


@pytest.mark.parametrize("method", ["copy_file_range", "sendfile", "pread_pwrite"])
@pytest.mark.parametrize("chunk_size", [7, 4096, 4 * 1024 * 1024])
def test_each_method_copies_the_exact_ranges(tmp_path, source, method, chunk_size):
    ranges = ranges_from(source)
    copier = copy_to(tmp_path / "dst.bin", ranges, chunk_size=chunk_size, methods=[method])

    assert copier.used_methods == {method}
    # The copier leaves gaps as holes and does not set the final size: the file ends with the last range.
    assert (tmp_path / "dst.bin").read_bytes() == expected_output(ranges)


# EXDEV is produced for real in tests/fs (tmpfs -> ext4). These errnos come from kernels or filesystems not at hand
# here (ENOSYS: kernels before 4.5; EINVAL/EOPNOTSUPP: some FUSE and network filesystems), so they stay mocked.
@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP])
def test_copy_file_range_unsupported_falls_back_to_sendfile(tmp_path, source, monkeypatch, code):
    monkeypatch.setattr(os, "copy_file_range", raising(code))
    ranges = ranges_from(source)

    copier = copy_to(tmp_path / "dst.bin", ranges)

    assert copier.used_methods == {"sendfile"}
    assert (tmp_path / "dst.bin").read_bytes() == expected_output(ranges)


def test_without_both_kernel_copies_the_bounded_buffer_loop_is_used(tmp_path, source, monkeypatch):
    # Mocked: no filesystem at hand refuses sendfile (tests/fs covers the real copy_file_range -> buffer path).
    monkeypatch.setattr(os, "copy_file_range", raising(errno.EXDEV))
    monkeypatch.setattr(os, "sendfile", raising(errno.ENOSYS))
    ranges = ranges_from(source)

    copier = copy_to(tmp_path / "dst.bin", ranges, chunk_size=333)

    assert copier.used_methods == {"pread_pwrite"}
    assert len(copier._buffer) == 333  # the one bounded user-space buffer
    assert (tmp_path / "dst.bin").read_bytes() == expected_output(ranges)


def test_a_real_io_error_is_not_mistaken_for_an_unsupported_method(tmp_path, source, monkeypatch):
    # Mocked: EIO needs a failing disk; a real ENOSPC is tested in tests/fs.
    sendfile_calls = []
    monkeypatch.setattr(os, "copy_file_range", raising(errno.EIO))
    monkeypatch.setattr(os, "sendfile", lambda *a: sendfile_calls.append(a))

    with pytest.raises(OSError) as raised:
        copy_to(tmp_path / "dst.bin", ranges_from(source))

    assert raised.value.errno == errno.EIO
    assert sendfile_calls == []


def test_each_call_moves_at_most_chunk_size_bytes(tmp_path, source, monkeypatch):
    counts = []
    real = os.copy_file_range

    def recording(src, dst, count, offset_src=None, offset_dst=None):
        counts.append(count)
        return real(src, dst, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", recording)
    copy_to(tmp_path / "dst.bin", ranges_from(source), chunk_size=100)

    assert max(counts) == 100
    assert sum(counts) == 1000 + 3000 + 1240


def test_a_source_file_is_opened_once_for_all_its_ranges(tmp_path, source, monkeypatch):
    opened = []
    real_open = os.open

    def recording_open(path, flags, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    fd = os.open(tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT, 0o644)
    monkeypatch.setattr(os, "open", recording_open)
    try:
        with RangeCopier(fd, 64) as copier:
            copier.copy(ranges_from(source))
    finally:
        os.close(fd)

    assert opened == [str(source)]


def test_a_source_replaced_after_validation_is_refused(tmp_path, source):
    identity = file_identity(str(source))
    os.rename(source, tmp_path / "old.bin")
    source.write_bytes(SOURCE_BYTES)  # same name and content, another file

    with pytest.raises(ExternalDataError, match="replaced after it was validated"):
        copy_to(tmp_path / "dst.bin", [CopyRange(str(source), 0, 0, 10, identity)])


def test_a_source_truncated_during_the_copy_is_reported(tmp_path, source):
    with pytest.raises(ExternalDataError, match="ended at offset 10240"):
        copy_to(tmp_path / "dst.bin", [CopyRange(str(source), 10000, 0, 500)], methods=["copy_file_range"])


def test_progress_is_monotonic_and_ends_at_the_payload_total(tmp_path, source):
    calls = []
    copy_to(tmp_path / "dst.bin", ranges_from(source), chunk_size=500, progress=lambda d, t: calls.append((d, t)))

    done = [d for d, _ in calls]
    assert len(calls) > 3
    assert done == sorted(done)
    assert calls[-1] == (5240, 5240)
    assert {t for _, t in calls} == {5240}


@pytest.mark.parametrize("bad", [{"chunk_size": 0}, {"chunk_size": -5}, {"methods": []}, {"methods": ["splice"]}])
def test_invalid_options_are_refused(tmp_path, bad):
    fd = os.open(tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(ValueError):
            RangeCopier(fd, **{"chunk_size": 64, **bad})
    finally:
        os.close(fd)


# -------------------------------------------------------------------------------------------------- end to end


def test_aligned_output_is_identical_through_the_bounded_buffer(tmp_path, monkeypatch):
    # Mocked: both kernel copies refused at once does not happen on a filesystem at hand (sendfile: tests/fs).
    src = build_zoo_model("several_files", tmp_path).path
    align_external_data_in_memory(src, tmp_path / "oracle.onnx", alignment=64)
    monkeypatch.setattr(os, "copy_file_range", raising(errno.ENOSYS))
    monkeypatch.setattr(os, "sendfile", raising(errno.EINVAL))

    align_external_data_streaming(src, tmp_path / "out.onnx", alignment=64, chunk_size=7)

    assert (tmp_path / "out.onnx.data").read_bytes() == (tmp_path / "oracle.onnx.data").read_bytes()


def test_a_kernel_method_that_moves_nothing_falls_back_instead_of_failing(tmp_path, source, monkeypatch):
    # Mocked: some filesystems (FUSE, network) answer copy_file_range with 0 although the range exists.
    monkeypatch.setattr(os, "copy_file_range", lambda *args, **kwargs: 0)
    ranges = ranges_from(source)

    copier = copy_to(tmp_path / "dst.bin", ranges)

    assert copier.used_methods == {"sendfile"}
    assert (tmp_path / "dst.bin").read_bytes() == expected_output(ranges)


def test_a_truncated_source_fails_after_every_method_moved_nothing(tmp_path, source):
    with pytest.raises(ExternalDataError, match="ended at offset 10240"):
        copy_to(tmp_path / "dst.bin", [CopyRange(str(source), 10000, 0, 500)])


# ------------------------------------------------------------------------------------------ stats and reflink care


def test_stats_count_the_bytes_each_method_moved(tmp_path, source):
    ranges = ranges_from(source)

    copier = copy_to(tmp_path / "dst.bin", ranges, methods=["sendfile"])

    assert copier.stats.bytes_by_method == {"sendfile": 5240}
    assert copier.stats.clone_eligible_bytes == 0
    assert copier.stats.copied_bytes == 5240


def test_copy_methods_are_a_closed_set():
    assert get_args(CopyMethod) == ("copy_file_range", "sendfile", "pread_pwrite")


def test_aligned_ranges_are_cut_at_block_boundaries_whatever_the_chunk_size(tmp_path, monkeypatch):
    data = os.urandom(64 * 1024)
    (tmp_path / "src.bin").write_bytes(data)
    block = os.statvfs(tmp_path).f_bsize  # st_blksize of a new file on this filesystem
    calls = []
    real = os.copy_file_range

    def recording(src, dst, count, offset_src=None, offset_dst=None):
        calls.append((offset_src, offset_dst, count))
        return real(src, dst, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", recording)
    ranges = [CopyRange(str(tmp_path / "src.bin"), 100, block + 100, 8 * block)]

    copy_to(tmp_path / "dst.bin", ranges, chunk_size=block + 1000)

    # A short head up to the common boundary, then whole blocks: every later call starts aligned on both sides.
    assert calls[0] == (100, block + 100, block - 100)
    assert all(s % block == 0 and d % block == 0 and c % block in (0, 100) for s, d, c in calls[1:])
    assert (tmp_path / "dst.bin").read_bytes()[block + 100 :] == data[100 : 100 + 8 * block]


def test_a_chunk_smaller_than_a_block_keeps_the_buffered_methods_bounded(tmp_path):
    data = os.urandom(3 * 4096)
    (tmp_path / "src.bin").write_bytes(data)
    ranges = [CopyRange(str(tmp_path / "src.bin"), 0, 0, len(data))]

    copier = copy_to(tmp_path / "dst.bin", ranges, chunk_size=100, methods=["pread_pwrite"])

    assert copier._buffer is not None and len(copier._buffer) == 100
    assert (tmp_path / "dst.bin").read_bytes() == data


def test_a_destination_not_open_for_writing_is_a_bug_not_an_unsupported_method(tmp_path, source):
    # EBADF used to send the copy down the chain; it now propagates from the first call.
    (tmp_path / "dst.bin").write_bytes(b"")
    fd = os.open(tmp_path / "dst.bin", os.O_RDONLY)
    try:
        with RangeCopier(fd, 1024) as copier, pytest.raises(OSError) as raised:
            copier.copy(ranges_from(source))
    finally:
        os.close(fd)

    assert raised.value.errno == errno.EBADF
    assert copier.used_methods == set()
    assert (tmp_path / "dst.bin").read_bytes() == b""


def test_durable_is_keyword_only(tmp_path):
    fd = os.open(tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(TypeError):
            RangeCopier(fd, 64, False)  # type: ignore[misc]
    finally:
        os.close(fd)
