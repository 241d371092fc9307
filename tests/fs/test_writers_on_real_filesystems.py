"""Every writer of the package, at its public API, on real filesystems: full, read-only, out of inodes, across
filesystems, and reflink-capable.

Writers: both aligners (one file and a sharded write), ``save_model_with_shared_external_data`` and
``undelay_initializers``. Each fault test asserts the error (type, errno, message), that nothing was left behind
(no temp file, the previous destination byte-for-byte intact) and that no source byte changed. They replace the
monkeypatched read-only, full-tmpfs and "fails after the weights were staged" rows that
``tests/hardening/test_bad_inputs.py`` had. A disk that fills *during* the copy, after the space check passed, is
real here too: at the copy's first write the test fills the filesystem from another file (real writes, real
ENOSPC); on ext3 (no ``fallocate``, like ZFS and some NFS) the copy then fails, on tmpfs the preallocation holds.

The system-call spies here only *record* (which descriptor was written, on which device) or, for that one test,
fill the disk with real writes; they never fake a fault.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    save_model_with_shared_external_data,
)
from onnx_light_ref.io._verify import verify_models
from onnx_light_ref.io._write.space import shared_extent_bytes
from onnx_light_ref.ops import delay_initializers, undelay_initializers
from tests.checks import assert_no_temp_files, sha256_of_tree
from tests.models import externalize, identity_model, make_external_model

MIB = 1024 * 1024
BLOCK = 4096
WRITERS = ["streaming", "in_memory", "sharded", "shared", "undelay"]
# Sharded jobs cap each file at two tensors (tensors are block multiples, so no padding).
TENSORS_PER_SHARD = 2


def tensors_of(count: int, nbytes: int, seed: int = 0, *, lead: int = 0) -> dict[str, np.ndarray]:
    """``count`` random float32 tensors of ``nbytes`` each; ``lead`` > 0 adds a first tensor of ``lead`` bytes."""
    rng = np.random.default_rng(seed)
    tensors = {"lead": rng.integers(0, 255, lead, dtype=np.uint8)} if lead else {}
    tensors.update({f"w{i}": rng.standard_normal(nbytes // 4).astype(np.float32) for i in range(count)})
    return tensors


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


@dataclass
class Job:
    """One writer, ready to write ``dst`` from sources prepared on disk (or in memory, for the shared saver)."""

    writer: str
    dst: Path
    run: Callable[..., Any]
    outputs: list[Path]  # every file the writer publishes
    payload: int  # weights bytes the job writes (block multiples here, so no padding)
    reference: Path  # a model holding the same tensors as the output, for verify_models
    source_dirs: list[Path] = field(default_factory=list)
    proto: onnx.ModelProto | None = None  # the shared saver's in-memory model, which must not change on failure


def make_job(
    writer: str,
    src_dir: Path,
    dst_dir: Path,
    tensors: dict[str, np.ndarray],
) -> Job:
    """Write the sources of ``writer`` under ``src_dir`` (the shared saver's reused file goes to ``dst_dir``)."""
    dst = dst_dir / "m.onnx"
    payload = sum(a.nbytes for a in tensors.values())
    if writer == "shared":
        reused = numpy_helper.from_array(np.arange(BLOCK // 4, dtype=np.float32), "reused")
        externalize([reused], dst_dir, "reused.data")
        every = {"reused": np.arange(BLOCK // 4, dtype=np.float32), **tensors}
        reference = src_dir / "reference.onnx"  # the same tensors, all inline: what the saved model must hold
        onnx.save(identity_model(every), reference)
        model = identity_model(every)
        model.graph.initializer[0].CopyFrom(reused)
        return Job(
            writer,
            dst,
            lambda **options: save_model_with_shared_external_data(model, dst, **options),
            [dst, Path(f"{dst}.data")],
            payload,
            reference,
            [src_dir],
            proto=model,
        )
    src = make_external_model(src_dir, tensors)
    outputs = [dst, Path(f"{dst}.data")]
    if writer == "streaming":
        run: Callable[..., Any] = lambda **options: align_external_data_streaming(src, dst, **options)  # noqa: E731
    elif writer == "in_memory":
        run = lambda **options: align_external_data_in_memory(src, dst, **options)  # noqa: E731
    elif writer == "sharded":
        cap = TENSORS_PER_SHARD * max(a.nbytes for a in tensors.values())
        shards = -(-len(tensors) // TENSORS_PER_SHARD)
        outputs += [Path(f"{dst}.data.{i}") for i in range(1, shards)]
        run = lambda **options: align_external_data_streaming(src, dst, max_shard_size=cap, **options)  # noqa: E731
    elif writer == "undelay":
        delayed = src_dir / "delayed.onnx"
        onnx.save(delay_initializers(src), delayed)
        run = lambda **options: undelay_initializers(delayed, dst, **options)  # noqa: E731
    else:
        raise AssertionError(writer)
    return Job(writer, dst, run, outputs, payload, src, [src_dir])


def place_previous_outputs(job: Job) -> None:
    """A previous version of every output, which a failed run must leave exactly as it was."""
    for index, path in enumerate(job.outputs):
        path.write_bytes(np.random.default_rng(100 + index).bytes(64 * 1024))


@dataclass
class Snapshot:
    """What must not change when a job fails: the destination tree, every source tree, the in-memory model."""

    trees: dict[Path, dict[str, str]]
    proto: bytes | None

    @classmethod
    def take(cls, job: Job, folders: list[Path]) -> Snapshot:
        trees = {folder: sha256_of_tree(folder) for folder in [*folders, *job.source_dirs]}
        return cls(trees, job.proto.SerializeToString() if job.proto is not None else None)

    def assert_unchanged(self, job: Job) -> None:
        for folder, before in self.trees.items():
            assert sha256_of_tree(folder) == before, f"{folder} changed"
        if self.proto is not None:
            assert job.proto is not None and job.proto.SerializeToString() == self.proto


# The write system calls, with the position of their destination descriptor.
_WRITE_CALLS = (("copy_file_range", 1), ("sendfile", 0), ("pwrite", 0), ("pwritev", 0), ("write", 0), ("writev", 0))


def watch_writes(monkeypatch: pytest.MonkeyPatch, folder: Path, on_write: Callable[[str], None]) -> None:
    """Call ``on_write(name)`` before every write system call to a file on ``folder``'s filesystem (spies only:
    every call still goes to the real system call)."""
    device = os.stat(folder).st_dev
    for name, fd_position in _WRITE_CALLS:
        real = getattr(os, name, None)
        if real is None:
            continue

        def spy(*args: Any, _real: Any = real, _name: str = name, _at: int = fd_position, **kw: Any) -> Any:
            if os.fstat(args[_at]).st_dev == device:
                on_write(_name)
            return _real(*args, **kw)

        monkeypatch.setattr(os, name, spy)


@pytest.fixture
def writes_on(monkeypatch) -> Callable[[Path], list[str]]:
    """``writes_on(folder)``: a live list of the write system calls made to files on ``folder``'s filesystem."""

    def watch(folder: Path) -> list[str]:
        calls: list[str] = []
        watch_writes(monkeypatch, folder, calls.append)
        return calls

    return watch


def tensors_for(writer: str, count: int, nbytes: int) -> dict[str, np.ndarray]:
    return tensors_of(count, nbytes, seed=WRITERS.index(writer))


# ------------------------------------------------------------------------------------------ full disk (ENOSPC)


@pytest.mark.parametrize("writer", WRITERS)
def test_a_job_larger_than_the_free_space_fails_before_copying_and_leaves_everything_as_it_was(
    writer, tmp_path, small_tmpfs, writes_on
):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    job = make_job(writer, src_dir, small_tmpfs, tensors_for(writer, 12, MIB))  # 12 MiB into 8 MiB
    place_previous_outputs(job)
    snapshot = Snapshot.take(job, [small_tmpfs])
    free = free_bytes(small_tmpfs)
    writes = writes_on(small_tmpfs)

    with pytest.raises(OSError) as raised:
        job.run()

    assert raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert message.startswith(f"[Errno {errno.ENOSPC}] not enough free space on "), message
    needed = re.search(r"(\d+) bytes needed", message)
    available = re.search(r"(\d+) bytes free", message)
    assert needed is not None and available is not None, message
    # The whole job is known before the first byte moves: all shards together, not the first one.
    assert job.payload <= int(needed.group(1)) <= job.payload + 64 * 1024, message
    assert int(available.group(1)) == free, message
    assert f"{str(small_tmpfs)!r} (tmpfs" in message, message
    assert writes == [], f"bytes were written before the space check: {writes}"
    snapshot.assert_unchanged(job)
    assert_no_temp_files(small_tmpfs)
    assert free_bytes(small_tmpfs) == free


@pytest.mark.parametrize("writer", WRITERS)
def test_a_job_that_fits_the_small_disk_is_written(writer, tmp_path, small_tmpfs):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    job = make_job(writer, src_dir, small_tmpfs, tensors_for(writer, 6, MIB))  # 6 MiB into 8 MiB
    place_previous_outputs(job)

    result = job.run()

    assert int(result) == job.payload
    assert all(path.is_file() for path in job.outputs)
    assert verify_models(job.reference, job.dst).equal
    assert_no_temp_files(small_tmpfs)


# ------------------------------------------------------------------- the disk fills during the copy (ENOSPC)


@dataclass
class Filler:
    """Another writer, armed to take the free space at the job's first write to the destination's filesystem."""

    folder: Path
    leave: int  # free bytes left to the job once filled
    path: Path | None = None  # the filler file, once written
    writes_after: list[str] = field(default_factory=list)  # the job's write calls from then on

    def fill(self, write: Callable[[int, bytes], int]) -> None:
        self.path = self.folder / "filler.bin"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        chunk = b"\xff" * (64 * 1024)
        try:
            while free_bytes(self.folder) > self.leave:
                try:
                    write(fd, chunk)
                except OSError as exc:  # the metadata took the rest: the disk is as full as it gets
                    assert exc.errno == errno.ENOSPC, exc
                    break
            os.fsync(fd)
        finally:
            os.close(fd)
        assert free_bytes(self.folder) <= self.leave


@pytest.fixture
def fill_at_first_write(monkeypatch) -> Callable[[Path, int], Filler]:
    """``fill_at_first_write(folder, leave)``: when the job first writes to ``folder``'s filesystem (its space
    already checked and, where supported, preallocated), a filler file takes all but ``leave`` free bytes."""

    def arm(folder: Path, leave: int) -> Filler:
        filler = Filler(folder, leave)
        real_write = os.write

        def fill_first(name: str) -> None:
            if filler.path is None:
                filler.fill(real_write)
            filler.writes_after.append(name)

        watch_writes(monkeypatch, folder, fill_first)
        return filler

    return arm


@pytest.mark.parametrize("writer", WRITERS)
def test_a_disk_filled_during_the_copy_without_preallocation_fails_and_leaves_everything_as_it_was(
    writer, tmp_path, ext3_mount, fill_at_first_write
):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    job = make_job(writer, src_dir, ext3_mount, tensors_for(writer, 3, MIB))  # 3 MiB fit the 60 MiB free
    place_previous_outputs(job)
    snapshot = Snapshot.take(job, [ext3_mount])
    filler = fill_at_first_write(ext3_mount, 256 * 1024)

    with pytest.raises(OSError) as raised:
        job.run()

    assert filler.path is not None, "the job wrote nothing to the destination"
    assert raised.value.errno == errno.ENOSPC, raised.value
    assert "not enough free space" not in str(raised.value), "the space check, not the copy, failed"
    filler.path.unlink()  # the other writer's file; everything else must be as it was
    snapshot.assert_unchanged(job)
    assert_no_temp_files(ext3_mount)


@pytest.mark.parametrize("writer", WRITERS)
def test_a_disk_filled_during_the_copy_does_not_fail_a_preallocated_job(
    writer, tmp_path, small_tmpfs, fill_at_first_write
):
    # The same filler on tmpfs: the weights' blocks were preallocated, so the copy needs none of the space it takes;
    # the .onnx (never preallocated, a few KiB here) fits in what the filler leaves.
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    job = make_job(writer, src_dir, small_tmpfs, tensors_for(writer, 3, MIB))
    place_previous_outputs(job)
    filler = fill_at_first_write(small_tmpfs, 256 * 1024)

    result = job.run()

    assert filler.path is not None and filler.writes_after, "the filler never ran"
    assert free_bytes(small_tmpfs) < job.payload
    assert int(result) == job.payload
    assert verify_models(job.reference, job.dst).equal
    assert_no_temp_files(small_tmpfs)


# ------------------------------------------------------------------------------------------- out of inodes


def use_up_inodes(folder: Path) -> list[Path]:
    """Create empty files until the filesystem has no inode left; return them (delete one to free one inode)."""
    filler = folder / "filler"
    filler.mkdir()
    made = []
    while True:
        path = filler / f"f{len(made)}"
        try:
            path.touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return made
        made.append(path)


@pytest.mark.parametrize("writer", WRITERS)
def test_running_out_of_inodes_at_every_file_creation_leaves_everything_as_it_was(writer, tmp_path, inode_tmpfs):
    # The n-th file the job creates fails (a weights file staged, then the next one or the .onnx refused).
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    job = make_job(writer, src_dir, inode_tmpfs, tensors_for(writer, 5, 64 * 1024))
    place_previous_outputs(job)
    fillers = use_up_inodes(inode_tmpfs)
    failures = 0
    while True:
        snapshot = Snapshot.take(job, [inode_tmpfs])
        try:
            result = job.run()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            snapshot.assert_unchanged(job)
            assert_no_temp_files(inode_tmpfs)
            failures += 1
            assert failures <= 20, "the job never got enough inodes"
            fillers.pop().unlink()  # one more inode for the next attempt
            continue
        break

    # Each published file (weights files, then the .onnx) was one point of failure.
    assert failures >= len(job.outputs)
    assert int(result) == job.payload
    assert verify_models(job.reference, job.dst).equal
    assert_no_temp_files(inode_tmpfs)


# ---------------------------------------------------------------------------------------- read-only (EROFS)


@pytest.mark.parametrize("writer", WRITERS)
def test_a_read_only_destination_fails_with_erofs_and_changes_nothing(writer, tmp_path, make_readonly):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    jobs: list[Job] = []

    def fill(folder: Path) -> None:
        jobs.append(make_job(writer, src_dir, folder, tensors_for(writer, 3, 64 * 1024)))
        place_previous_outputs(jobs[0])

    readonly = make_readonly(fill)
    job = jobs[0]
    snapshot = Snapshot.take(job, [readonly])

    with pytest.raises(OSError) as raised:
        job.run()

    assert raised.value.errno == errno.EROFS
    assert "Read-only file system" in str(raised.value)
    snapshot.assert_unchanged(job)


# ------------------------------------------------------------------------------------------ across filesystems


@pytest.mark.parametrize("writer", ["streaming", "in_memory", "sharded", "undelay"])
def test_tmpfs_sources_are_written_onto_ext4(writer, tmpfs_mount, ext4_mount):
    # The shared saver is left out: it copies no file, it writes inline bytes from memory.
    job = make_job(writer, tmpfs_mount, ext4_mount, tensors_for(writer, 6, MIB + BLOCK))
    source_before = sha256_of_tree(tmpfs_mount)

    result = job.run(chunk_size=MIB) if writer != "in_memory" else job.run()

    assert int(result) == job.payload
    assert verify_models(job.reference, job.dst).equal
    assert sha256_of_tree(tmpfs_mount) == source_before
    assert sorted(Path(p) for p in getattr(result, "weights_files", job.outputs[1:])) == sorted(job.outputs[1:])
    if writer in ("streaming", "sharded"):
        # copy_file_range refuses to cross filesystems (EXDEV); the engine falls back to sendfile, in the kernel.
        assert result.copy_methods == {"sendfile"}
        assert result.bytes_by_method == {"sendfile": job.payload}
        assert result.clone_eligible_bytes == 0


def test_a_model_aligned_across_filesystems_runs_in_onnxruntime_like_its_source(tmpfs_mount, ext4_mount):
    import onnxruntime as ort

    job = make_job("streaming", tmpfs_mount, ext4_mount, tensors_for("streaming", 4, MIB))
    job.run()

    expected = ort.InferenceSession(str(job.reference), providers=["CPUExecutionProvider"]).run(None, {})
    got = ort.InferenceSession(str(job.dst), providers=["CPUExecutionProvider"]).run(None, {})
    assert len(got) == len(expected) == 4
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------------- reflink


def weights_files(dst: Path) -> list[Path]:
    return sorted(p for p in dst.parent.iterdir() if p.name.startswith(f"{dst.name}.data"))


def shared_bytes(files: list[Path]) -> int:
    total = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            shared = shared_extent_bytes(fd)
        finally:
            os.close(fd)
        assert shared is not None, f"FIEMAP unavailable on {path}"
        total += shared
    return total


def realign_on_xfs(xfs: Path, tmp_path: Path, *, aligned: bool, **options: Any) -> Any:
    """Write a source onto ``xfs`` (block-aligned or not), then re-align it there twice: durable and not."""
    tensors = tensors_of(16, 4 * MIB, seed=5, lead=0 if aligned else 100)
    original = make_external_model(tmp_path, tensors)
    (xfs / "src").mkdir()
    source = xfs / "src" / "m.onnx"
    align_external_data_streaming(original, source, alignment=BLOCK if aligned else 0)
    os.sync()  # settle the source's delayed allocation before measuring free space
    results = {}
    for durable in (True, False):
        (xfs / f"durable_{durable}").mkdir()
        free_before = free_bytes(xfs)
        result = align_external_data_streaming(
            source, xfs / f"durable_{durable}" / "m.onnx", durable=durable, **options
        )
        os.sync()
        results[durable] = (result, free_before - free_bytes(xfs))
    return source, results


@pytest.mark.parametrize("options", [{}, {"max_shard_size": 16 * MIB}], ids=["one file", "shards"])
def test_re_aligning_an_aligned_model_on_xfs_clones_and_needs_no_new_blocks(xfs_mount, tmp_path, options):
    payload = 16 * 4 * MIB
    source, results = realign_on_xfs(xfs_mount, tmp_path, aligned=True, **options)

    for durable, (result, new_bytes) in results.items():
        out = xfs_mount / f"durable_{durable}" / "m.onnx"
        files = weights_files(out)
        assert len(files) == (4 if options else 1)
        assert sorted(Path(p) for p in result.weights_files) == files
        assert int(result) == result.payload_bytes == payload
        assert result.clone_eligible_bytes == payload
        assert result.bytes_by_method == {"copy_file_range": payload}
        assert shared_bytes(files) == payload
        assert new_bytes < payload // 100, f"durable={durable}: {new_bytes} new bytes for a cloned {payload}"
        assert verify_models(source, out).equal
    # Durable or not, the same bytes.
    for one, other in zip(
        weights_files(xfs_mount / "durable_True" / "m.onnx"),
        weights_files(xfs_mount / "durable_False" / "m.onnx"),
        strict=True,
    ):
        assert one.name == other.name and one.read_bytes() == other.read_bytes()
    assert (xfs_mount / "durable_True" / "m.onnx").read_bytes() == (xfs_mount / "durable_False" / "m.onnx").read_bytes()


def test_re_aligning_an_unaligned_model_on_xfs_copies_every_byte(xfs_mount, tmp_path):
    payload = 100 + 16 * 4 * MIB
    source, results = realign_on_xfs(xfs_mount, tmp_path, aligned=False)

    for durable, (result, new_bytes) in results.items():
        out = xfs_mount / f"durable_{durable}" / "m.onnx"
        assert result.payload_bytes == payload
        assert result.clone_eligible_bytes == 0
        assert result.bytes_by_method == {"copy_file_range": payload}
        assert shared_bytes(weights_files(out)) == 0
        assert new_bytes >= 16 * 4 * MIB
        assert verify_models(source, out).equal
    assert (xfs_mount / "durable_True" / "m.onnx.data").read_bytes() == (
        xfs_mount / "durable_False" / "m.onnx.data"
    ).read_bytes()


@pytest.mark.parametrize(("filesystem", "clones"), [("xfs_mount", True), ("ext4_mount", False)])
def test_re_aligning_over_the_previous_output_copies_its_bridge_by_clone_where_the_filesystem_can(
    filesystem, clones, tmp_path, monkeypatch, request
):
    """A re-align over its own previous output publishes through a bridge ``.onnx`` and copies each bridge file to
    its final name (docs/safety.md) with the copy engine: a reflink clone on XFS (no new blocks), an in-kernel copy on
    ext4. Either way the output verifies equal to the source, and nothing is left behind."""
    from onnx_light_ref.io._write import publish

    mount: Path = request.getfixturevalue(filesystem)
    original = make_external_model(tmp_path, tensors_of(4, 4 * MIB, seed=7))
    (mount / "src").mkdir()
    source = mount / "src" / "m.onnx"
    align_external_data_streaming(original, source, alignment=BLOCK)
    (mount / "out").mkdir()
    out = mount / "out" / "m.onnx"
    align_external_data_streaming(source, out, max_shard_size=8 * MIB)
    os.sync()
    copies: list[int] = []

    class Recording(publish.RangeCopier):
        def copy(self, ranges, progress=None):  # type: ignore[no-untyped-def]
            moved = super().copy(ranges, progress)
            copies.append(self.stats.clone_eligible_bytes)
            return moved

    monkeypatch.setattr(publish, "RangeCopier", Recording)
    free_before = free_bytes(mount)

    result = align_external_data_streaming(source, out, max_shard_size=8 * MIB)

    os.sync()
    assert len(result.weights_files) == 2
    assert len(copies) == 2, copies  # one copy per weights file the previous .onnx referenced
    if clones:
        assert all(copies) and free_before - free_bytes(mount) < 16 * MIB // 100  # clones all the way: no new blocks
    else:
        assert copies == [0, 0]
    assert verify_models(source, out).equal
    assert_no_temp_files(mount / "out")
    assert sorted(p.name for p in (mount / "out").iterdir()) == ["m.onnx", "m.onnx.data", "m.onnx.data.1"]


# ------------------------------------------------------------------------------- durable: fsync and writeback
# Not a filesystem fault: recording spies on os.fsync and the writeback call, extending tests/io/test_durable.py
# (streaming, in-memory, shared) to the sharded write and undelay, and checking the writeback overlap per file.


@pytest.mark.parametrize("writer", WRITERS)
def test_durable_fsyncs_every_output_and_the_folder_and_paces_writeback_while_durable_false_does_neither(
    writer, tmp_path, monkeypatch
):
    from onnx_light_ref.io._write import writeback

    real_fsync, real_sync_file_range = os.fsync, writeback.sync_file_range
    outputs: dict[bool, dict[str, bytes]] = {}
    for durable in (True, False):
        src_dir, dst_dir = tmp_path / f"src_{durable}", tmp_path / f"dst_{durable}"
        src_dir.mkdir()
        dst_dir.mkdir()
        job = make_job(writer, src_dir, dst_dir, tensors_for(writer, 6, 3 * MIB))  # 18 MiB: two 8 MiB stretches
        fsynced: list[tuple[int, bool]] = []  # (inode, is a folder)
        requested: dict[int, list[tuple[int, int]]] = {}  # inode -> writeback (offset, length) requests

        def recording_fsync(fd: int, calls: list[tuple[int, bool]] = fsynced) -> None:
            st = os.fstat(fd)
            calls.append((st.st_ino, stat.S_ISDIR(st.st_mode)))
            real_fsync(fd)

        def recording_writeback(fd: int, offset: int, length: int, flags: int, calls=requested) -> None:
            if flags & writeback.SYNC_FILE_RANGE_WRITE and not flags & writeback.SYNC_FILE_RANGE_WAIT_BEFORE:
                calls.setdefault(os.fstat(fd).st_ino, []).append((offset, length))
            real_sync_file_range(fd, offset, length, flags)

        monkeypatch.setattr(os, "fsync", recording_fsync)
        monkeypatch.setattr(writeback, "sync_file_range", recording_writeback)
        job.run(durable=durable)
        monkeypatch.setattr(os, "fsync", real_fsync)
        monkeypatch.setattr(writeback, "sync_file_range", real_sync_file_range)

        files = {os.stat(path).st_ino: path for path in job.outputs}
        if not durable:
            assert fsynced == [] and requested == {}
        else:
            assert sorted(ino for ino, is_dir in fsynced if not is_dir) == sorted(files)
            assert {ino for ino, is_dir in fsynced if is_dir} == {os.stat(dst_dir).st_ino}
            if writer in ("streaming", "sharded", "undelay"):  # the file-to-file writers pace writeback
                for path in job.outputs[1:]:
                    ranges = sorted(requested.get(os.stat(path).st_ino, []))
                    assert ranges, f"no writeback requested for {path.name}"
                    covered = 0
                    for offset, length in ranges:
                        assert offset == covered, f"{path.name}: writeback skipped [{covered}, {offset})"
                        covered = offset + length
                    assert covered == path.stat().st_size
        outputs[durable] = {path.name: path.read_bytes() for path in job.outputs}
        assert_no_temp_files(dst_dir)

    assert outputs[True] == outputs[False]
