"""What dead writers leave in a destination folder, and what the next run removes (issue 25, rule 5).

* A sharded run killed while it copies leaves one hidden temp file per shard, each a shard of disk. A later run
  that writes fewer shards used to sweep only the temp files of the names it writes: the others stayed forever.
  Now every dead writer's temp file of the folder goes, whatever final name it was made for (real SIGKILL, real
  disk freed).
* Never one a model references (a dead writer's bridge file that a variant, in the folder or in a parent folder,
  loads), never one a live writer holds (its lock), never a source, never a file the filesystem refuses to let go
  (an immutable file: EPERM, skipped with a warning while the job goes on).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref import align_external_data_streaming, save_model_with_shared_external_data
from onnx_light_ref.io._read import reference_scan
from onnx_light_ref.io._write import publish
from tests.checks import assert_no_temp_files, dead_pid, run_onnxruntime
from tests.contract.sharers import TEST_FIELD_BUDGET, grown
from tests.hardening.publication_scenarios import computed, same, values
from tests.models import identity_model

SHARD = 64 * 1024


def _big_source(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Four tensors of 64 KiB: four weights files with ``max_shard_size=64 KiB``, one without."""
    rng = np.random.default_rng(5)
    arrays = {f"t{i}": rng.standard_normal(SHARD // 4).astype(np.float32) for i in range(4)}
    folder.mkdir()
    onnx.save(identity_model(arrays), str(folder / "model.onnx"), save_as_external_data=True, location="w.bin")
    return folder / "model.onnx", arrays


def _killed_while_copying(src: Path, dst: Path) -> None:
    """Align ``src`` to ``dst`` in four shards in a forked child, SIGKILLed when half of the bytes are copied."""
    pid = os.fork()
    if pid == 0:
        try:

            def progress(done: int, total: int) -> None:
                if done * 2 >= total:
                    os.kill(os.getpid(), signal.SIGKILL)

            align_external_data_streaming(src, dst, max_shard_size=SHARD, progress=progress, durable=False)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("via", ["api", "cli"])
def test_a_later_run_writing_fewer_shards_sweeps_every_temp_file_a_killed_sharded_run_left(
    tmp_path: Path, via: str
) -> None:
    src, arrays = _big_source(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    _killed_while_copying(src, out / "model.onnx")
    left = _hidden(out)
    assert len(left) == 4 and all(name.startswith(".olr~") and name.endswith(".tmp") for name in left), left
    assert sum((out / name).stat().st_size for name in left) >= 4 * SHARD  # each one a whole shard of disk
    assert len({name.split("~")[1] for name in left}) == 4  # four final names: W, W.1, W.2, W.3

    if via == "api":  # one file: it writes W only
        result = align_external_data_streaming(src, out / "model.onnx")
        assert result.weights_files == (str(out / "model.onnx.data"),) and result.stale_weights_files == ()
    else:
        cli = subprocess.run(
            [sys.executable, "-m", "onnx_light_ref", "align", str(src), str(out / "model.onnx"), "--no-progress"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert cli.returncode == 0 and cli.stderr == "" and "note:" not in cli.stdout, cli
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "model.onnx.data"]
    for array, output in zip(arrays.values(), run_onnxruntime(out / "model.onnx", {}), strict=True):
        assert np.array_equal(array, output)


def _bridge_of(folder: Path, final_name: str, pid: int, payload: bytes) -> Path:
    path = folder / f".olr~{publish._name_tag(final_name)}~{pid}~{'cd' * 8}.bridge"
    path.write_bytes(payload)
    return path


def _model_on(path: Path, location: str, array: np.ndarray) -> None:
    tensor = numpy_helper.from_array(array, "w")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(array.nbytes))):
        tensor.external_data.add(key=key, value=value)
    path.write_bytes(identity_model([tensor]).SerializeToString())


@pytest.mark.parametrize("where", ["same-folder", "parent-folder"])
def test_a_dead_writers_bridge_file_that_a_model_loads_is_never_swept(tmp_path: Path, where: str) -> None:
    """A run killed between its two commits leaves a model on bridge names; a variant saved from it uses them too.
    The next publication into the folder must not delete what that variant loads (from its folder or a parent)."""
    out = tmp_path / "root" / "out"
    out.mkdir(parents=True)
    array = np.arange(16, dtype=np.float32)
    bridge = _bridge_of(out, "model.onnx.data", dead_pid(), array.tobytes())
    unreferenced = _bridge_of(out, "model.onnx.data.1", dead_pid(), b"left by the same killed run")
    variant = out / "variant.onnx" if where == "same-folder" else tmp_path / "root" / "variant.onnx"
    _model_on(variant, bridge.name if where == "same-folder" else f"out/{bridge.name}", array)

    sources = tmp_path / "src"
    sources.mkdir()
    arrays = values(3)
    onnx.save(identity_model(arrays), str(sources / "model.onnx"), save_as_external_data=True, location="w.bin")
    align_external_data_streaming(sources / "model.onnx", out / "model.onnx")

    assert bridge.exists() and not unreferenced.exists()
    assert np.array_equal(run_onnxruntime(variant, {})[0], array)
    assert same(computed(out / "model.onnx"), arrays)


@pytest.mark.parametrize("near", ["unreadable", "no-model"])
@pytest.mark.parametrize("where", ["same-folder", "parent-folder"])
def test_no_dead_writers_file_is_swept_while_a_model_near_cannot_be_read(
    tmp_path: Path, where: str, near: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A "cannot read" is not "references nothing": a ``.onnx`` able to reach the folder whose references cannot be
    read (a variant of the killed run's model, too large for the reference scan) may load the bridge or
    temp files, so none is removed while it is there; the warning names it. Once it is gone, the next run sweeps
    them. A ``.onnx`` protobuf refuses (cut short) loads nothing: it keeps nothing, a warning names it."""
    out = tmp_path / "root" / "out"
    out.mkdir(parents=True)
    array = np.arange(16, dtype=np.float32)
    bridge = _bridge_of(out, "model.onnx.data", dead_pid(), array.tobytes())
    temp = out / f".olr~{publish._name_tag('model.onnx.data.2')}~{dead_pid()}~{'ab' * 8}.tmp"
    temp.write_bytes(b"left by a killed run")
    variant = out / "variant.onnx" if where == "same-folder" else tmp_path / "root" / "variant.onnx"
    _model_on(variant, bridge.name if where == "same-folder" else f"out/{bridge.name}", array)
    whole = variant.read_bytes()
    monkeypatch.setattr(reference_scan, "MAX_FIELDS", TEST_FIELD_BUDGET)
    variant.write_bytes(
        grown(onnx.load_from_string(whole)).SerializeToString() if near == "unreadable" else whole[: len(whole) // 2]
    )

    sources = tmp_path / "src"
    sources.mkdir()
    arrays = values(3)
    onnx.save(identity_model(arrays), str(sources / "model.onnx"), save_as_external_data=True, location="w.bin")
    with caplog.at_level(logging.WARNING, logger="onnx_light_ref"):
        align_external_data_streaming(sources / "model.onnx", out / "model.onnx")

    assert same(computed(out / "model.onnx"), arrays)
    if near == "no-model":
        assert not bridge.exists() and not temp.exists()
        assert f"{str(variant)!r} is not an ONNX model" in caplog.text
        return
    assert bridge.read_bytes() == array.tobytes() and temp.read_bytes() == b"left by a killed run"
    assert str(variant) in caplog.text and "cannot be read as a model" in caplog.text and "move it away" in caplog.text
    variant.write_bytes(whole)  # repaired: it loads what was kept
    assert np.array_equal(run_onnxruntime(variant, {})[0], array)
    variant.unlink()
    align_external_data_streaming(sources / "model.onnx", out / "model.onnx")
    assert not bridge.exists() and not temp.exists()


def test_a_users_file_named_almost_like_a_dead_writers_is_never_swept(tmp_path: Path) -> None:
    """The sweep deletes only names of the publisher's exact pattern: not one with a trailing newline (``$`` matches
    before it), not one whose pid is written in other digits (``\\d`` takes Arabic-Indic digits, ``int()`` reads
    them as a dead pid). A real dead writer's file beside them is swept."""
    out = tmp_path / "out"
    out.mkdir()
    pid = dead_pid()
    tag = publish._name_tag("model.onnx.data")
    digits = "".join(chr(0x0660 + int(d)) for d in str(pid))
    hostile = [
        f".olr~{tag}~{pid}~{'ab' * 8}.tmp\n",
        f".olr~{tag}~{pid}~{'ab' * 8}.bridge\n",
        f".olr~{tag}~{digits}~{'ab' * 8}.tmp",
        f".olr~{tag}~{digits}~{'ab' * 8}.bridge",
    ]
    for name in hostile:
        (out / name).write_bytes(b"a user's file")
    real = out / f".olr~{tag}~{pid}~{'cd' * 8}.tmp"
    real.write_bytes(b"left by a killed run")
    sources = tmp_path / "src"
    sources.mkdir()
    arrays = values(3)
    onnx.save(identity_model(arrays), str(sources / "model.onnx"), save_as_external_data=True, location="w.bin")

    align_external_data_streaming(sources / "model.onnx", out / "model.onnx")

    assert not real.exists()
    assert all((out / name).read_bytes() == b"a user's file" for name in hostile)
    assert not any(publish.is_publisher_file(name) for name in hostile)
    assert same(computed(out / "model.onnx"), arrays)


def test_a_temp_file_a_live_writer_holds_is_never_swept(tmp_path: Path) -> None:
    """A dead pid but a held lock (a writer in another pid namespace): kept, while the job publishes."""
    held = tmp_path / f".olr~{publish._name_tag('model.onnx.data.3')}~{dead_pid()}~{'ef' * 8}.tmp"
    held.write_bytes(b"still being written")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); time.sleep(60)", str(held)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        save_model_with_shared_external_data(identity_model(values(4)), tmp_path / "model.onnx", size_threshold=0)
        assert held.read_bytes() == b"still being written"
    finally:
        holder.kill()
        holder.wait()
    save_model_with_shared_external_data(identity_model(values(4)), tmp_path / "model.onnx", size_threshold=0)
    assert not held.exists()


def test_a_dead_writers_file_the_filesystem_will_not_remove_is_skipped_and_the_job_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An immutable file (``chattr +i``; for a user, another user's file in a sticky folder): EPERM, not ours."""
    stuck = tmp_path / f".olr~{publish._name_tag('model.onnx.data')}~{dead_pid()}~{'ab' * 8}.tmp"
    stuck.write_bytes(b"x")
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(stuck)], check=False).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and e2fsprogs)")
    try:
        with caplog.at_level(logging.WARNING, logger="onnx_light_ref.io._write.publish"):
            save_model_with_shared_external_data(identity_model(values(5)), tmp_path / "model.onnx", size_threshold=0)
        assert same(computed(tmp_path / "model.onnx"), values(5))
        assert stuck.exists()
        assert any("cannot remove" in r.message and str(stuck) in r.message for r in caplog.records), caplog.text
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    save_model_with_shared_external_data(identity_model(values(5)), tmp_path / "model.onnx", size_threshold=0)
    assert_no_temp_files(tmp_path)


# ------------------------------------------------------------------- a sweep racing a writer that creates its file


def _foreign_names(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make this process's new temp names carry a pid that is dead here, as a writer's in another pid namespace
    (a container sharing the folder) looks from this one; returns that pid."""
    foreign = dead_pid()
    real = publish._own_name
    monkeypatch.setattr(
        publish, "_own_name", lambda final, suffix: real(final, suffix).replace(f"~{os.getpid()}~", f"~{foreign}~")
    )
    return foreign


def _in_another_process(call: Callable[[], object]) -> object:
    """``call()`` in a forked child (a real second process, its own pid and locks); returns what it returned."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            publish.before_syscall = None
            os.write(write_end, json.dumps(call()).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as reader:
        reported = reader.read()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return json.loads(reported)


def _olr_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".olr~"))


@pytest.mark.parametrize("when", ["dup", "flock", "stat", "created"])
def test_a_sweep_of_another_process_never_takes_a_temp_file_from_the_writer_creating_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Between its exclusive create and its ``flock`` a temp file was visible and unlocked: another process's sweep,
    seeing a dead pid (a writer in another pid namespace), removed it, and the writer went on writing a file with no
    name. A sweep at each system call of the creation now leaves the writer a named, locked file that publishes."""
    _foreign_names(monkeypatch)
    sweeps: list[object] = []

    def hook(name: str) -> None:
        if name == when and not sweeps:
            sweeps.append(_in_another_process(lambda: publish.sweep_dead_writers(str(tmp_path))))

    monkeypatch.setattr(publish, "before_syscall", hook)
    staged = publish.StagedFile(str(tmp_path / "w.bin"))
    if when == "created":
        sweeps.append(_in_another_process(lambda: publish.sweep_dead_writers(str(tmp_path))))
    monkeypatch.setattr(publish, "before_syscall", None)

    assert len(sweeps) == 1, "the sweep did not run"
    assert staged.fd is not None and os.path.samestat(os.stat(staged.temp_path), os.fstat(staged.fd))
    assert _olr_files(tmp_path) == [os.path.basename(staged.temp_path)]  # a name given up is gone too
    assert _in_another_process(lambda: publish.sweep_dead_writers(str(tmp_path))) == []  # locked: kept
    staged.write_all(b"new weights", 0)
    transaction = publish.OutputTransaction()
    transaction.files.append(staged)
    transaction.publish([])
    assert (tmp_path / "w.bin").read_bytes() == b"new weights"
    assert _olr_files(tmp_path) == []


def test_a_writer_gives_up_a_new_temp_name_whose_lock_a_sweep_of_another_process_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: a sweep holds the new file's lock (it is deciding to remove it) when its writer tries to
    lock it. The writer removes that name and creates another; the sweep then finds nothing left to remove."""
    _foreign_names(monkeypatch)
    to_child_read, to_child_write = os.pipe()
    from_child_read, from_child_write = os.pipe()
    sweeper: list[int] = []

    def sweep_holding_at_unlink() -> None:
        """The real sweep in a forked child, held (lock taken, file judged dead) at its unlink until told to go."""
        pid = os.fork()
        if pid == 0:
            status = 1
            try:

                def hold(name: str) -> None:
                    if name == "unlink":
                        os.write(from_child_write, b"holding\n")
                        os.read(to_child_read, 1)

                publish.before_syscall = hold
                removed = publish.sweep_dead_writers(str(tmp_path))
                status = 0 if removed == [] else 2
            finally:
                os._exit(status)
        sweeper.append(pid)
        assert os.read(from_child_read, 64) == b"holding\n"

    def hook(name: str) -> None:
        if name == "flock" and not sweeper:
            sweep_holding_at_unlink()

    monkeypatch.setattr(publish, "before_syscall", hook)
    try:
        staged = publish.StagedFile(str(tmp_path / "w.bin"))
    finally:
        monkeypatch.setattr(publish, "before_syscall", None)
        os.write(to_child_write, b"g")
        _, status = os.waitpid(sweeper[0], 0)
        for fd in (to_child_read, to_child_write, from_child_read, from_child_write):
            os.close(fd)

    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the sweep removed something"
    assert staged.fd is not None and os.path.samestat(os.stat(staged.temp_path), os.fstat(staged.fd))
    assert _olr_files(tmp_path) == [os.path.basename(staged.temp_path)]
    staged.discard()
    assert _olr_files(tmp_path) == []


def test_no_temp_file_is_swept_while_another_process_publishes_into_the_folder(tmp_path: Path) -> None:
    """A writer in another pid namespace, mid-publication, has swapped the previous version of a final name onto its
    temp name (nobody holds that file's lock) and needs it to undo a failure. A job staging a file there swept it;
    outside a publication, temp files are now swept only while no publication holds the folder's lock."""
    previous = tmp_path / f".olr~{publish._name_tag('model.onnx.data')}~{dead_pid()}~{'ab' * 8}.tmp"
    previous.write_bytes(b"the previous version, swapped out")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        staged = publish.StagedFile(str(tmp_path / "other.bin"))
        staged.discard()
        assert previous.read_bytes() == b"the previous version, swapped out"
    finally:
        holder.kill()
        holder.wait()
    staged = publish.StagedFile(str(tmp_path / "other.bin"))  # the publication is over: a dead writer's file now
    staged.discard()
    assert _olr_files(tmp_path) == []


# ------------------------------------------------------- hidden files a model saved during the publication uses


def _save_in_another_process(model: onnx.ModelProto, path: Path) -> None:
    """The shared saver in a forked child: ``model``'s external tensors reused as they are (no weights file)."""

    def save() -> int:
        return int(save_model_with_shared_external_data(model, path))

    assert _in_another_process(save) == 0


def _relocated(model_path: Path, prefix: str, location: str | None = None) -> onnx.ModelProto:
    """The model at ``model_path`` (metadata) with every location replaced by ``location`` (if given), prefixed."""
    model = onnx.load(str(model_path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = prefix + (location if location is not None else entry.value)
    return model


@pytest.mark.parametrize("hidden", ["bridge", "previous"])
def test_a_hidden_file_a_model_saved_during_the_publication_uses_is_kept_after_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, hidden: str
) -> None:
    """Re-aligning over itself goes through bridge names; a variant saved by another process from the model while
    it stood on them (between commit A and the final names) references the bridge file, and one saved from
    the previous files on their hidden names references a previous version. Both used to be deleted after the
    commit, breaking the variant; they are kept, with a warning, until no model uses them."""
    old, new = values(1), values(2)
    for name, arrays in (("old", old), ("new", new)):
        (tmp_path / name).mkdir()
        onnx.save(identity_model(arrays), str(tmp_path / name / "m.onnx"), save_as_external_data=True, location="w")
    root = tmp_path / "root"
    out = root / "out"
    out.mkdir(parents=True)
    align_external_data_streaming(tmp_path / "old" / "m.onnx", out / "model.onnx", alignment=64)
    previous_model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    previous_weights = (out / "model.onnx.data").read_bytes()
    variant = root / "variant.onnx"
    seen: list[str] = []

    def hook(name: str) -> None:
        if seen:
            return
        if hidden == "bridge":  # commit A is done: the model stands on its bridge (temp) names
            standing = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.initializer[0]
            location = next(entry.value for entry in standing.external_data if entry.key == "location")
            if location.startswith(".olr~"):
                seen.append(location)
                _save_in_another_process(_relocated(out / "model.onnx", "out/"), variant)
        elif hidden == "previous":
            swapped = [p.name for p in out.glob(".olr~*.tmp") if p.read_bytes() == previous_weights]
            if swapped:
                seen.append(swapped[0])
                onnx.save(previous_model, str(tmp_path / "old" / "previous.onnx"))  # not a folder above out/
                _save_in_another_process(_relocated(tmp_path / "old" / "previous.onnx", "out/", swapped[0]), variant)

    monkeypatch.setattr(publish, "before_syscall", hook)
    with caplog.at_level(logging.WARNING, logger="onnx_light_ref.io._write.publish"):
        align_external_data_streaming(tmp_path / "new" / "m.onnx", out / "model.onnx", alignment=128)
    monkeypatch.setattr(publish, "before_syscall", None)

    assert seen, "the variant was not saved during the publication"
    kept = out / seen[0]
    assert kept.exists()
    assert same(computed(variant), new if hidden == "bridge" else old)
    assert same(computed(out / "model.onnx"), new)
    assert any("kept the hidden file" in r.message and str(kept) in r.message for r in caplog.records), caplog.text
    assert _olr_files(out) == [kept.name]

    align_external_data_streaming(tmp_path / "new" / "m.onnx", out / "model.onnx", alignment=64)
    assert kept.exists() and same(computed(variant), new if hidden == "bridge" else old)  # still in use
    variant.unlink()
    align_external_data_streaming(tmp_path / "new" / "m.onnx", out / "model.onnx", alignment=128)
    assert _olr_files(out) == []  # no model uses it any more: the next publication swept it
    assert same(computed(out / "model.onnx"), new)
