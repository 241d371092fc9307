"""OutputTransaction: several weights files and the ``.onnx`` published as one transaction, durable or not.

Each test writes real files in ``tmp_path`` and asserts on what a user would find there afterwards: the new files,
or exactly the previous ones (hash snapshot) and no temp file.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnx_light_ref.io._write.publish as publish
from onnx_light_ref import align_external_data_streaming
from onnx_light_ref.errors import PublishedWithErrorsError
from onnx_light_ref.io._arguments import ArgumentTypeError
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._write.publish import OutputTransaction, StagedFile
from tests.checks import assert_no_temp_files, dead_pid, sha256_of_tree
from tests.models import identity_model, write_external_model

WEIGHTS = ["shard-1.bin", "shard-2.bin", "shard-3.bin"]


def _write_job(
    folder: Path, *, durable: bool = True, tag: bytes = b"new", weights: Sequence[str] = tuple(WEIGHTS)
) -> None:
    with OutputTransaction(durable=durable) as outputs:
        for index, name in enumerate(weights):
            staged = outputs.stage(str(folder / name))
            staged.write_all(tag + bytes([index]) * 10, 0)
            staged.set_size(64)
        # Weights not named after the model are journaled (the executor decides it: io/_write/execute.py).
        journal = None if weights[0].startswith("model.onnx.") else str(folder / weights[0])
        outputs.publish([(str(folder / "model.onnx"), tag + b" model")], journal=journal)


def _record(monkeypatch: pytest.MonkeyPatch, name: str, calls: list, *, fail_at: int | None = None) -> None:
    real = getattr(os, name)

    def recording(*args: object) -> object:
        calls.append(args)
        if fail_at is not None and len(calls) == fail_at:
            raise OSError(5, f"{name} failed (simulated)")
        return real(*args)

    monkeypatch.setattr(publish.os, name, recording)


def _record_moves(monkeypatch: pytest.MonkeyPatch, calls: list, *, fail_at: int | None = None) -> None:
    """Record every move of a publication (an exchange or a rename), the ``fail_at``-th one raising EIO."""
    real = publish._move

    def recording(temp: str, final: str) -> publish._Move:
        calls.append((temp, final))
        if fail_at is not None and len(calls) == fail_at:
            raise OSError(5, "move failed (simulated)")
        return real(temp, final)

    monkeypatch.setattr(publish, "_move", recording)


def test_every_weights_file_then_the_model_is_published(tmp_path, monkeypatch):
    renames: list = []
    _record_moves(monkeypatch, renames)

    _write_job(tmp_path)

    assert [Path(dst).name for _, dst in renames] == [*WEIGHTS, "model.onnx"]
    assert (tmp_path / "shard-2.bin").read_bytes() == b"new" + bytes([1]) * 10 + bytes(51)
    assert (tmp_path / "model.onnx").read_bytes() == b"new model"
    assert_no_temp_files(tmp_path)


@pytest.mark.parametrize("failing_rename", [1, 2, 3, 4])
def test_a_failed_rename_restores_every_previous_file(tmp_path, monkeypatch, failing_rename):
    _write_job(tmp_path, tag=b"old")
    (tmp_path / "shard-3.bin").unlink()  # one destination absent before the run: it must stay absent
    before = sha256_of_tree(tmp_path)
    _record_moves(monkeypatch, [], fail_at=failing_rename)

    with pytest.raises(OSError, match="move failed"):
        _write_job(tmp_path)

    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_an_error_while_writing_deletes_every_temp_file(tmp_path):
    with pytest.raises(RuntimeError, match="copy failed"), OutputTransaction() as outputs:
        outputs.stage(str(tmp_path / "w.bin")).write_all(b"partial", 0)
        raise RuntimeError("copy failed")

    assert list(tmp_path.iterdir()) == []
    assert_no_temp_files(tmp_path)


NAMED_AFTER_THE_MODEL = ["model.onnx.data", "model.onnx.data.1", "model.onnx.data.2"]


@pytest.mark.parametrize(
    ("durable", "weights"),
    [(True, WEIGHTS), (True, NAMED_AFTER_THE_MODEL), (False, WEIGHTS)],
    ids=["durable", "durable-weights-named-after-the-model", "not-durable"],
)
def test_durable_false_skips_every_fsync_and_writes_the_same_bytes(tmp_path, monkeypatch, durable, weights):
    (tmp_path / "reference").mkdir()
    _write_job(tmp_path / "reference", weights=weights)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(publish.os, "fsync", recording_fsync)
    (tmp_path / "out").mkdir()

    _write_job(tmp_path / "out", durable=durable, weights=weights)

    assert sha256_of_tree(tmp_path / "out") == sha256_of_tree(tmp_path / "reference")
    if durable and weights == NAMED_AFTER_THE_MODEL:
        # four files; their one folder before the commit (the weights' names) and after it (the .onnx's)
        assert sorted(synced) == ["file"] * 4 + ["folder"] * 2
    elif durable:
        # weights not named after the model need a journal (docs/durability.md): one more file, and the folder
        # after it is written (its removal needs no fsync: a journal that comes back vouches for the new files only)
        assert sorted(synced) == ["file"] * 5 + ["folder"] * 3
    else:
        assert synced == []


def test_durable_false_still_renames_from_a_temp_name(tmp_path, monkeypatch):
    renames: list = []
    _record(monkeypatch, "replace", renames)

    _write_job(tmp_path, durable=False)

    temp_names = [Path(src).name for src, _ in renames]
    assert all(name.startswith(".") and name.endswith(".tmp") for name in temp_names), temp_names


@pytest.mark.parametrize("value", [0, 1, None, "no"])
def test_durable_must_be_a_bool(tmp_path, value):
    with pytest.raises(ArgumentTypeError, match=f"durable must be a bool, got {type(value).__name__}"):
        OutputTransaction(durable=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="durable must be a bool"):
        StagedFile(str(tmp_path / "w.bin"), durable=value)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("failing_move", [1, 2, 3])
def test_files_without_a_model_swap_back_every_file_when_a_move_fails(tmp_path, monkeypatch, failing_move):
    """Files that reference nothing (e.g. .npy outputs): a failed move swaps the earlier ones back, same inodes."""
    names = ["a.npy", "b.npy", "c.npy"]
    for name in names[:2]:  # c.npy absent before: it must stay absent
        (tmp_path / name).write_bytes(b"old " + name.encode())
    before = sha256_of_tree(tmp_path)
    inodes = {p.name: p.stat().st_ino for p in tmp_path.iterdir()}
    _record_moves(monkeypatch, [], fail_at=failing_move)

    with pytest.raises(OSError, match="move failed"), OutputTransaction() as outputs:
        for name in names:
            outputs.stage(str(tmp_path / name)).write_all(b"new " + name.encode(), 0)
        outputs.publish([])

    assert sha256_of_tree(tmp_path) == before
    assert {p.name: p.stat().st_ino for p in tmp_path.iterdir()} == inodes
    assert_no_temp_files(tmp_path)


# ------------------------------------------------------------------------------------ temp names and the sweeper


def test_a_destination_name_of_the_maximum_legal_length_publishes(tmp_path):
    """Temp names do not embed the final name, so any legal name works (they are at most 50 bytes)."""
    weights, model = tmp_path / ("w" * 250 + ".data"), tmp_path / ("m" * 250 + ".onnx")
    with OutputTransaction() as outputs:
        staged = outputs.stage(str(weights))
        assert len(os.path.basename(staged.temp_path)) <= 50
        staged.write_all(b"payload", 0)
        outputs.publish([(str(model), b"model")])
    assert weights.read_bytes() == b"payload" and model.read_bytes() == b"model"
    assert_no_temp_files(tmp_path)


def _temp_like(folder: Path, final_name: str, pid: int) -> Path:
    """A file named exactly like a temp file of ``final_name`` written by ``pid``."""
    path = folder / f".olr~{publish._name_tag(final_name)}~{pid}~{'ab' * 8}.tmp"
    path.write_bytes(b"left by a killed run")
    return path


def test_the_sweeper_removes_every_dead_writers_temp_files_of_the_folder_and_nothing_else(tmp_path):
    """Whatever final name they were made for: a killed sharded run leaves one per shard, later runs write fewer."""
    dead = dead_pid()
    stale = _temp_like(tmp_path, "m.onnx", dead)
    alive = _temp_like(tmp_path, "m.onnx", os.getppid())  # another process, running
    other_destination = _temp_like(tmp_path, "m.onnx.data.7", dead)
    old_style = tmp_path / f".m.onnx.{dead}.{'ab' * 8}.tmp"  # a user file in the previous naming scheme
    old_style.write_bytes(b"user data")
    lookalike = tmp_path / f".olr~{publish._name_tag('m.onnx')}~{dead}~not-a-token.tmp"
    lookalike.write_bytes(b"user data")
    bridge = tmp_path / f".olr~{publish._name_tag('m.onnx.data')}~{dead}~{'ab' * 8}.bridge"
    bridge.write_bytes(b"an earlier version's bridge name, no model references it")

    removed = publish.sweep_dead_writers(str(tmp_path))
    assert removed == sorted(str(path) for path in (stale, other_destination, bridge))
    assert alive.exists() and old_style.exists() and lookalike.exists()


def test_the_sweeper_removes_this_processs_own_leftovers_but_never_a_file_it_is_writing(tmp_path):
    """A long-running process must sweep what a failed cleanup of its own left, not only what dead processes left."""
    staged = StagedFile(str(tmp_path / "m.onnx"))
    leftover = _temp_like(tmp_path, "m.onnx.data", os.getpid())  # named like ours, owned by no staged file
    try:
        assert publish.sweep_dead_writers(str(tmp_path)) == [str(leftover)]
        assert os.path.exists(staged.temp_path)
    finally:
        staged.discard()
    assert not os.path.exists(staged.temp_path)


def test_the_sweeper_never_removes_a_source_of_the_current_job(tmp_path):
    source = _temp_like(tmp_path, "m.onnx", dead_pid())
    st = source.stat()
    identity = FileIdentity(st.st_dev, st.st_ino)

    assert publish.sweep_dead_writers(str(tmp_path), keep={identity}) == []
    with OutputTransaction(keep={identity}) as outputs:
        outputs.publish([(str(tmp_path / "m.onnx"), b"model")])
    assert source.read_bytes() == b"left by a killed run"


def test_the_sweeper_skips_a_temp_file_whose_lock_is_held(tmp_path):
    """A dead pid but a held lock: a writer in another pid namespace (a container) is still writing it."""
    held = _temp_like(tmp_path, "m.onnx", dead_pid())
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert publish.sweep_dead_writers(str(tmp_path)) == []
    finally:
        os.close(fd)
    assert publish.sweep_dead_writers(str(tmp_path)) == [str(held)]


def test_a_staged_file_holds_its_lock_until_renamed(tmp_path):
    staged = StagedFile(str(tmp_path / "w.bin"))
    staged.write_all(b"x", 0)
    staged.flush()  # the write descriptor is closed; the lock must still be held
    probe = os.open(staged.temp_path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        transaction = OutputTransaction()
        transaction.files.append(staged)
        transaction.publish([])
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the rename
    finally:
        os.close(probe)


def test_publication_holds_the_folder_lock_during_the_renames(tmp_path, monkeypatch):
    held_during_rename = []
    real_replace = os.replace

    def replace(src, dst):
        probe = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held_during_rename.append(False)
        except BlockingIOError:
            held_during_rename.append(True)
        finally:
            os.close(probe)
        return real_replace(src, dst)

    monkeypatch.setattr(publish.os, "replace", replace)
    _write_job(tmp_path)
    assert held_during_rename == [True] * 4


def _close_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def hook(name: str) -> None:
        if name == "close":
            raise OSError(errno.EIO, "close failed (injected)")

    monkeypatch.setattr(publish, "before_syscall", hook)


def test_the_folder_lock_raises_a_failed_close_and_frees_the_folder(tmp_path, monkeypatch):
    """Leaving the block normally: the failed ``close`` is the caller's to report (after a commit, a publication
    reports it as published with errors); the descriptor is freed all the same, as Linux does."""
    _close_fails(monkeypatch)
    with pytest.raises(OSError, match="close failed"), publish.folder_lock([str(tmp_path)]):
        pass
    monkeypatch.setattr(publish, "before_syscall", None)
    probe = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    finally:
        os.close(probe)


def test_the_folder_lock_never_hides_the_error_that_leaves_its_block(tmp_path, monkeypatch, caplog):
    _close_fails(monkeypatch)
    with (
        caplog.at_level(logging.WARNING, logger=publish.__name__),
        pytest.raises(ValueError, match="the block failed"),
        publish.folder_lock([str(tmp_path)]),
    ):
        raise ValueError("the block failed")
    assert any("closing a destination folder's lock failed" in r.message for r in caplog.records), caplog.text


# ------------------------------------------------------------------ a model over a previous one: what a reader sees

SIZES = {"a": 300, "b": 500, "c": 700, "d": 900}  # with max_shard_size=4096: three weights files


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(count, dtype=np.float32) for name, count in SIZES.items()}


def _loaded(model_path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(model_path))  # with its external data: refuses hard-linked files
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}


def _same(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> bool:
    return first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


@pytest.fixture
def realign(tmp_path: Path) -> tuple[Path, object]:
    """``out/m.onnx`` aligned (3 weights files, alignment 64) from old values; a call re-aligning it from new ones."""
    for tag, seed in (("old", 1), ("new", 2)):
        (tmp_path / tag).mkdir()
        write_external_model(tmp_path / tag, _arrays(seed))
    (tmp_path / "out").mkdir()
    dst = tmp_path / "out" / "m.onnx"
    result = align_external_data_streaming(tmp_path / "old" / "model.onnx", dst, alignment=64, max_shard_size=4096)
    assert len(result.weights_files) == 3
    return dst, lambda: align_external_data_streaming(
        tmp_path / "new" / "model.onnx", dst, alignment=128, max_shard_size=4096
    )


def test_a_reader_at_every_system_call_of_a_republication_sees_the_previous_or_the_new_model(realign, monkeypatch):
    """The same names are re-published (bridge step): before every system call, onnx loads the destination and
    every file in the folder has one link (no hard-link backup, ever)."""
    dst, run = realign
    seen = {"previous": 0, "new": 0}
    names: list[str] = []

    def reader(name: str) -> None:
        names.append(name)
        assert all(path.stat().st_nlink == 1 for path in dst.parent.iterdir()), name
        got = _loaded(dst)
        if _same(got, _arrays(2)):
            seen["new"] += 1
        else:
            assert _same(got, _arrays(1)), f"mixed model before system call {len(names)} ({name})"
            seen["previous"] += 1

    real_publish = publish.OutputTransaction.publish

    def publish_with_reader(self, *args, **kwargs):
        monkeypatch.setattr(publish, "before_syscall", reader)
        try:
            return real_publish(self, *args, **kwargs)
        finally:
            monkeypatch.setattr(publish, "before_syscall", None)

    monkeypatch.setattr(publish.OutputTransaction, "publish", publish_with_reader)
    run()

    assert _same(_loaded(dst), _arrays(2))
    assert seen["previous"] > 0 and seen["new"] > 0, seen
    assert names.count("renameat2") >= 5  # 3 weights through the bridge: commit A, 3 copies, commit B at least
    assert_no_temp_files(dst.parent)
    assert sorted(p.name for p in dst.parent.iterdir()) == ["m.onnx", "m.onnx.data", "m.onnx.data.1", "m.onnx.data.2"]


@pytest.mark.parametrize("failing_move", range(1, 6))
def test_a_failed_republication_restores_the_previous_files_exactly(realign, monkeypatch, failing_move):
    dst, run = realign
    before = sha256_of_tree(dst.parent)
    inodes = {p.name: p.stat().st_ino for p in dst.parent.iterdir()}
    _record_moves(monkeypatch, [], fail_at=failing_move)

    with pytest.raises(OSError, match="move failed"):
        run()

    assert sha256_of_tree(dst.parent) == before
    assert {p.name: p.stat().st_ino for p in dst.parent.iterdir()} == inodes  # swapped back, not copied back
    assert_no_temp_files(dst.parent)


@pytest.mark.parametrize("failing_move", range(1, 6))
def test_without_rename_exchange_a_failure_leaves_the_previous_or_the_new_model(realign, monkeypatch, failing_move):
    """No RENAME_EXCHANGE (old kernel, libc or filesystem): a replaced name cannot be restored, so undoing stops
    there; the destination is still a whole model, the previous or the new one, and the next run cleans up."""
    dst, run = realign
    monkeypatch.setattr(publish, "_renameat2", None)
    real_move = publish._move
    _record_moves(monkeypatch, [], fail_at=failing_move)

    with pytest.raises((OSError, PublishedWithErrorsError), match="move failed") as raised:
        run()

    # An OSError means nothing is published; once commit A cannot be undone, the new model is, on bridge names.
    got = _loaded(dst)
    if isinstance(raised.value, OSError):
        assert _same(got, _arrays(1))
    else:
        assert _same(got, _arrays(2)) and "is published" in str(raised.value)
        assert str(raised.value).count(".tmp'") == 3  # its three bridge files: the new weights' temp names
    assert all(path.stat().st_nlink == 1 for path in dst.parent.iterdir())
    monkeypatch.setattr(publish, "_move", real_move)
    run()
    assert _same(_loaded(dst), _arrays(2))
    assert_no_temp_files(dst.parent)


def test_a_previous_onnx_that_cannot_be_read_counts_as_referencing_every_existing_name(tmp_path):
    """The destination ``.onnx`` is a symlink (``O_NOFOLLOW`` cannot open it): what it references is unknown, so
    every existing weights name goes through the bridge step; the symlink itself is replaced, its target untouched."""
    for tag, seed in (("old", 1), ("new", 2)):
        (tmp_path / tag).mkdir()
        write_external_model(tmp_path / tag, _arrays(seed), name="m.onnx")
    (tmp_path / "out").mkdir()
    os.replace(tmp_path / "old" / "m.onnx.data", tmp_path / "out" / "m.onnx.data")
    (tmp_path / "out" / "m.onnx").symlink_to(tmp_path / "old" / "m.onnx")
    target_before = (tmp_path / "old" / "m.onnx").read_bytes()
    names: list[str] = []
    publish.before_syscall = names.append
    try:
        with OutputTransaction() as outputs:
            weights = outputs.stage(str(tmp_path / "out" / "m.onnx.data"))
            weights.write_all((tmp_path / "new" / "m.onnx.data").read_bytes(), 0)
            outputs.publish([(str(tmp_path / "out" / "m.onnx"), (tmp_path / "new" / "m.onnx").read_bytes())])
    finally:
        publish.before_syscall = None

    assert names.count("renameat2") == 3  # bridge .onnx (commit A), the weights copy, the final .onnx
    assert not (tmp_path / "out" / "m.onnx").is_symlink()
    assert _same(_loaded(tmp_path / "out" / "m.onnx"), _arrays(2))
    assert (tmp_path / "old" / "m.onnx").read_bytes() == target_before
    assert_no_temp_files(tmp_path / "out")


# --------------------------------------------------------- what the previous .onnx references: its metadata only


def _previous_with_huge_inline_payload(folder: Path) -> Path:
    """``m.onnx`` of 2.25 GiB (one inline payload, a hole of a sparse file) that also references ``m.onnx.data``."""
    from tests import wire_writer

    (folder / "m.onnx.data").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    external = onnx.TensorProto(name="e", data_type=onnx.TensorProto.FLOAT, dims=[4])
    external.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "m.onnx.data"), ("offset", "0"), ("length", "16")):
        external.external_data.add(key=key, value=value)
    huge = onnx.TensorProto(name="inline", data_type=onnx.TensorProto.UINT8, dims=[9 * 2**28])
    model = identity_model([external, huge])
    wire_writer.write_model(folder / "m.onnx", model, {"inline": wire_writer.Hole(9 * 2**28)})
    return folder / "m.onnx"


def test_the_previous_onnx_is_read_without_its_inline_payloads_even_past_protobufs_2_gib(tmp_path):
    """It used to be read whole (three copies: +1151 MiB for a 384 MiB model), and one past 2 GiB did not parse, so
    the weights name it references counted as unreferenced and was swapped under it without the bridge step."""
    previous = _previous_with_huge_inline_payload(tmp_path)
    assert previous.stat().st_size > 2**31

    references = publish._read_references(str(previous))

    assert references.known and references.paths == {str(tmp_path / "m.onnx.data")}
    assert references.has(str(tmp_path / "m.onnx.data")) and not references.has(str(tmp_path / "other.data"))


def test_a_previous_onnx_swapped_for_a_symlink_or_a_folder_references_the_unknown(tmp_path, monkeypatch):
    previous = tmp_path / "m.onnx"
    previous.write_bytes(identity_model({"a": np.zeros(4, np.float32)}).SerializeToString())
    real_load = publish.load_model_stripped

    def swapped(path, *args, **kwargs):  # between the lstat and the parse, another file takes the name
        (tmp_path / "other.onnx").write_bytes(previous.read_bytes())
        os.replace(tmp_path / "other.onnx", path)
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(publish, "load_model_stripped", swapped)
    assert not publish._read_references(str(previous)).known
    monkeypatch.undo()
    previous.unlink()
    previous.mkdir()
    assert not publish._read_references(str(previous)).known
    previous.rmdir()
    previous.write_bytes(b"not a model")
    assert publish._read_references(str(previous)) == publish._References(known=True)
