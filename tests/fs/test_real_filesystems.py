"""The copy engine and the space reservation on real filesystems: full, read-only, cross-filesystem, reflink."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._write.copy_engine import RangeCopier, can_clone
from onnx_light_ref.io._write.space import (
    SpaceRequest,
    filesystem_of,
    reserve_space,
    reserve_space_for_all,
    shared_extent_bytes,
)
from tests.checks import assert_no_temp_files, sha256_of_tree
from tests.models import make_external_model

MIB = 1024 * 1024
BLOCK = 4096


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def write_random(path: Path, size: int, seed: int = 0) -> bytes:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


def new_file(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)


def copy_into(dst: Path, ranges: list[CopyRange], chunk_size: int = 4 * MIB, **options) -> RangeCopier:
    fd = new_file(dst)
    try:
        with RangeCopier(fd, chunk_size, **options) as copier:
            copier.copy(ranges)
            copier.cloned = copier.cloned_bytes()  # type: ignore[attr-defined]  # measured while fd is open
    finally:
        os.close(fd)
    return copier


def expected(source: bytes, ranges: list[CopyRange]) -> bytes:
    out = bytearray(max(r.dst_offset + r.length for r in ranges))
    for r in ranges:
        out[r.dst_offset : r.dst_offset + r.length] = source[r.src_offset : r.src_offset + r.length]
    return bytes(out)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------ across filesystems


def test_tmpfs_to_ext4_falls_back_to_sendfile_after_a_real_exdev(tmpfs_mount, ext4_mount):
    data = write_random(tmpfs_mount / "src.bin", 3 * MIB + 17)
    ranges = [
        CopyRange(str(tmpfs_mount / "src.bin"), 5, 0, 2 * MIB),
        CopyRange(str(tmpfs_mount / "src.bin"), 2 * MIB + 9, 2 * MIB + BLOCK, MIB),
    ]

    copier = copy_into(ext4_mount / "dst.bin", ranges, chunk_size=MIB)

    assert copier.used_methods == {"sendfile"}
    assert copier.stats.bytes_by_method == {"sendfile": 3 * MIB}
    assert copier.stats.clone_eligible_bytes == 0
    assert (ext4_mount / "dst.bin").read_bytes() == expected(data, ranges)


def test_tmpfs_to_ext4_without_sendfile_uses_the_bounded_buffer(tmpfs_mount, ext4_mount):
    data = write_random(tmpfs_mount / "src.bin", MIB)
    ranges = [CopyRange(str(tmpfs_mount / "src.bin"), 3, 100, MIB - 3)]

    copier = copy_into(
        ext4_mount / "dst.bin", ranges, chunk_size=64 * 1024, methods=["copy_file_range", "pread_pwrite"]
    )

    assert copier.used_methods == {"pread_pwrite"}
    assert copier._buffer is not None and len(copier._buffer) == 64 * 1024
    assert (ext4_mount / "dst.bin").read_bytes() == expected(data, ranges)


def test_a_model_on_tmpfs_aligns_onto_ext4_byte_for_byte(tmpfs_mount, ext4_mount):
    tensors = {f"w{i}": np.arange(1000 + i, dtype=np.float32) for i in range(5)}
    src = make_external_model(tmpfs_mount, tensors)
    oracle_dir = tmpfs_mount / "oracle"
    oracle_dir.mkdir()
    align_external_data_streaming(src, oracle_dir / "m.onnx", alignment=4096)
    before = sha256_of_tree(tmpfs_mount)

    align_external_data_streaming(src, ext4_mount / "m.onnx", alignment=4096, chunk_size=1000)

    assert (ext4_mount / "m.onnx.data").read_bytes() == (oracle_dir / "m.onnx.data").read_bytes()
    assert sha256_of_tree(tmpfs_mount) == before


# ------------------------------------------------------------------------------------------------- full disk


def test_reserve_space_refuses_a_file_larger_than_the_free_space(small_tmpfs):
    path = small_tmpfs / "out.data"
    fd = new_file(path)
    try:
        free = free_bytes(small_tmpfs)
        with pytest.raises(OSError) as raised:
            reserve_space(fd, 16 * MIB, path=str(path))
        size_after = os.fstat(fd).st_size
    finally:
        os.close(fd)

    assert raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert f"{16 * MIB} bytes needed" in message
    assert f"{free} bytes free" in message
    assert f"{str(small_tmpfs)!r} (tmpfs" in message
    assert size_after == 0
    assert free_bytes(small_tmpfs) == free


def test_reserve_space_preallocates_what_fits(small_tmpfs):
    path = small_tmpfs / "out.data"
    fd = new_file(path)
    try:
        reservation = reserve_space(fd, 6 * MIB, path=str(path))
        st = os.fstat(fd)
    finally:
        os.close(fd)

    assert reservation.preallocated
    assert reservation.needed_bytes == 6 * MIB
    assert reservation.filesystem.fs_type == "tmpfs"
    assert reservation.filesystem.mount_point == str(small_tmpfs)
    assert st.st_size == 6 * MIB and st.st_blocks * 512 >= 6 * MIB
    assert free_bytes(small_tmpfs) <= 2 * MIB


def test_reserving_several_files_checks_their_total_before_preallocating_any(small_tmpfs):
    paths = [small_tmpfs / f"shard{i}" for i in range(6)]
    fds = [new_file(path) for path in paths]
    try:
        free = free_bytes(small_tmpfs)
        with pytest.raises(OSError) as raised:
            reserve_space_for_all([SpaceRequest(fd, 2 * MIB, str(path)) for fd, path in zip(fds, paths, strict=True)])
        sizes = [os.fstat(fd).st_size for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)

    assert raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    # The whole job, not the first shard that no longer fits.
    assert f"{12 * MIB} bytes needed" in message and f"{free} bytes free" in message
    assert f"for {str(paths[0])!r} and 5 more files" in message
    assert f"{str(small_tmpfs)!r} (tmpfs" in message
    assert sizes == [0] * 6
    assert free_bytes(small_tmpfs) == free


def test_reserving_several_files_that_fit_preallocates_each(small_tmpfs, tmp_path):
    paths = [small_tmpfs / "a", small_tmpfs / "b", tmp_path / "elsewhere"]
    fds = [new_file(path) for path in paths]
    try:
        reservations = reserve_space_for_all(
            [
                SpaceRequest(fds[0], 3 * MIB, str(paths[0])),
                SpaceRequest(fds[1], 4 * MIB, str(paths[1]), MIB),
                SpaceRequest(fds[2], MIB, str(paths[2])),
            ]
        )
        sizes = [os.fstat(fd).st_size for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)

    assert [r.needed_bytes for r in reservations] == [3 * MIB, 3 * MIB, MIB]
    assert [r.preallocated for r in reservations] == [True, False, True]  # expected clones: no preallocation
    assert sizes == [3 * MIB, 0, MIB]


def test_a_copy_that_fills_the_disk_reports_enospc_not_an_unsupported_method(tmp_path, small_tmpfs):
    write_random(tmp_path / "src.bin", 12 * MIB)

    with pytest.raises(OSError) as raised:
        copy_into(small_tmpfs / "dst.bin", [CopyRange(str(tmp_path / "src.bin"), 0, 0, 12 * MIB)], chunk_size=MIB)

    assert raised.value.errno == errno.ENOSPC


def test_aligning_onto_a_full_disk_leaves_nothing_and_keeps_the_previous_output(tmp_path, small_tmpfs):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = make_external_model(src_dir, {f"w{i}": np.full(MIB // 4, i, dtype=np.float32) for i in range(12)})
    (small_tmpfs / "m.onnx").write_bytes(b"previous model")
    (small_tmpfs / "m.onnx.data").write_bytes(b"previous weights")
    before, source_before = sha256_of_tree(small_tmpfs), sha256_of_tree(src_dir)

    with pytest.raises(OSError) as raised:
        align_external_data_streaming(src, small_tmpfs / "m.onnx", alignment=4096)

    assert raised.value.errno == errno.ENOSPC
    assert sha256_of_tree(small_tmpfs) == before
    assert sha256_of_tree(src_dir) == source_before
    assert_no_temp_files(small_tmpfs)


# ------------------------------------------------------------------------------------------------- read-only


def test_a_read_only_destination_is_refused_with_erofs_before_anything_is_written(tmp_path, make_readonly):
    src = make_external_model(tmp_path, {"w": np.arange(4096, dtype=np.float32)})
    readonly = make_readonly(lambda folder: (folder / "m.onnx").write_bytes(b"previous"))
    before = sha256_of_tree(readonly)

    with pytest.raises(OSError) as raised:
        align_external_data_streaming(src, readonly / "m.onnx")

    assert raised.value.errno == errno.EROFS
    assert sha256_of_tree(readonly) == before


def test_sources_on_a_read_only_mount_are_copied(tmp_path, make_readonly):
    data = os.urandom(MIB)
    readonly = make_readonly(lambda folder: (folder / "src.bin").write_bytes(data))
    ranges = [CopyRange(str(readonly / "src.bin"), 0, 0, MIB)]

    copier = copy_into(tmp_path / "dst.bin", ranges)

    assert (tmp_path / "dst.bin").read_bytes() == data
    assert sum(copier.stats.bytes_by_method.values()) == MIB


# ---------------------------------------------------------------------------------------------------- reflink


def test_an_aligned_64_mib_range_is_cloned_on_xfs(xfs_mount):
    data = write_random(xfs_mount / "src.bin", 80 * MIB)
    os.sync()
    ranges = [CopyRange(str(xfs_mount / "src.bin"), 8 * MIB, BLOCK, 64 * MIB)]
    free_before = free_bytes(xfs_mount)

    copier = copy_into(xfs_mount / "dst.bin", ranges, chunk_size=1_000_000)  # not a block multiple on purpose
    os.sync()

    assert copier.used_methods == {"copy_file_range"}
    assert copier.stats.clone_eligible_bytes == 64 * MIB
    assert copier.stats.copied_bytes == 0
    assert copier.cloned == 64 * MIB  # type: ignore[attr-defined]
    # A clone counts its blocks in both files' st_blocks (du shows them twice); only free space tells the truth.
    assert free_before - free_bytes(xfs_mount) < MIB
    assert (xfs_mount / "dst.bin").read_bytes() == expected(data, ranges)


def test_same_misalignment_on_both_sides_copies_only_the_head_and_clones_the_rest_on_xfs(xfs_mount):
    data = write_random(xfs_mount / "src.bin", 10 * MIB)
    ranges = [CopyRange(str(xfs_mount / "src.bin"), MIB + 100, 100, 8 * MIB)]

    copier = copy_into(xfs_mount / "dst.bin", ranges, chunk_size=MIB)

    clonable = (8 * MIB - (BLOCK - 100)) // BLOCK * BLOCK
    assert copier.stats.clone_eligible_bytes == clonable
    assert copier.cloned == clonable  # type: ignore[attr-defined]
    assert (xfs_mount / "dst.bin").read_bytes() == expected(data, ranges)


def test_unaligned_ranges_on_xfs_are_copied_and_said_so(xfs_mount):
    data = write_random(xfs_mount / "src.bin", 9 * MIB)
    ranges = [CopyRange(str(xfs_mount / "src.bin"), 64, 0, 8 * MIB)]
    os.sync()  # settle the source's delayed allocation before measuring
    free_before = free_bytes(xfs_mount)

    copier = copy_into(xfs_mount / "dst.bin", ranges)
    os.sync()

    assert copier.stats.clone_eligible_bytes == 0
    assert copier.stats.copied_bytes == 8 * MIB
    assert copier.cloned == 0  # type: ignore[attr-defined]
    assert free_before - free_bytes(xfs_mount) >= 8 * MIB
    assert (xfs_mount / "dst.bin").read_bytes() == expected(data, ranges)


def test_clone_probe_and_plan_need_no_write(xfs_mount, tmp_path):
    write_random(xfs_mount / "src.bin", 4 * MIB)
    write_random(tmp_path / "other.bin", 4 * MIB)
    fd = new_file(xfs_mount / "dst.bin")
    src_fd = os.open(xfs_mount / "src.bin", os.O_RDONLY)
    other_fd = os.open(tmp_path / "other.bin", os.O_RDONLY)
    try:
        assert can_clone(src_fd, fd)
        assert not can_clone(other_fd, fd)  # another filesystem
        with RangeCopier(fd, MIB) as copier:
            planned = copier.plan_clone_bytes(
                [
                    CopyRange(str(xfs_mount / "src.bin"), 0, 0, MIB + 10),  # one block-multiple body + 10 bytes
                    CopyRange(str(xfs_mount / "src.bin"), 2 * MIB + 1, 2 * MIB, 10_000),  # offsets disagree
                    CopyRange(str(tmp_path / "other.bin"), 0, 3 * MIB, MIB),  # across filesystems
                ]
            )
        assert planned == MIB
        assert os.fstat(fd).st_size == 0
    finally:
        for descriptor in (fd, src_fd, other_fd):
            os.close(descriptor)


def test_reserve_space_does_not_preallocate_or_demand_space_for_clones(xfs_mount):
    write_random(xfs_mount / "src.bin", 32 * MIB)
    ranges = [CopyRange(str(xfs_mount / "src.bin"), 0, 0, 32 * MIB)]
    fd = new_file(xfs_mount / "dst.bin")
    try:
        with RangeCopier(fd, 4 * MIB) as copier:
            clone_bytes = copier.plan_clone_bytes(ranges)
            reservation = reserve_space(fd, 32 * MIB + 100, path=str(xfs_mount / "dst.bin"), clone_bytes=clone_bytes)
            copier.copy(ranges)
            cloned = copier.cloned_bytes()
    finally:
        os.close(fd)

    assert clone_bytes == 32 * MIB
    assert reservation.needed_bytes == 100 and not reservation.preallocated
    assert reservation.filesystem.fs_type == "xfs"
    assert cloned == 32 * MIB


def test_preallocated_blocks_are_still_replaced_by_clones_on_xfs(xfs_mount):
    # What docs/durability.md claims: on XFS, cloning over preallocated blocks still shares and frees them again.
    write_random(xfs_mount / "src.bin", 32 * MIB)
    os.sync()
    free_before = free_bytes(xfs_mount)
    fd = new_file(xfs_mount / "dst.bin")
    try:
        assert reserve_space(fd, 32 * MIB, path=str(xfs_mount / "dst.bin")).preallocated
        with RangeCopier(fd, 4 * MIB) as copier:
            copier.copy([CopyRange(str(xfs_mount / "src.bin"), 0, 0, 32 * MIB)])
        assert shared_extent_bytes(fd) == 32 * MIB
    finally:
        os.close(fd)
    os.sync()
    assert free_before - free_bytes(xfs_mount) < MIB


def test_shared_extents_are_unknown_where_the_filesystem_cannot_tell(tmpfs_mount):
    (tmpfs_mount / "f.bin").write_bytes(b"x" * 10000)
    fd = os.open(tmpfs_mount / "f.bin", os.O_RDONLY)
    try:
        assert shared_extent_bytes(fd) in (None, 0)
    finally:
        os.close(fd)


def test_the_filesystem_is_named_from_the_mount_table(xfs_mount, tmpfs_mount):
    for folder, fs_type in ((xfs_mount, "xfs"), (tmpfs_mount, "tmpfs")):
        info = filesystem_of(os.stat(folder).st_dev, str(folder / "x"))
        assert (info.mount_point, info.fs_type) == (str(folder), fs_type)
