"""What a writer reports is what happened (issue 25, rule 5): every fault of a publication ends in one of two answers.

Every writer (both aligners, one file and three shards, the shared saver, ``undelay_initializers``,
``link_external_data``), over its previous output and over an empty destination:

* an injected EIO (the ``before_syscall`` seam of ``publish.py`` raising ``OSError(EIO)``) at each ``fsync`` and each
  ``unlink`` of the publication, in turn, ends either in an ``OSError`` with the destination folder exactly as before
  (every file's bytes, nothing left), or in ``PublishedWithErrorsError`` with the new model in place (onnxruntime
  computes the new values), the writer's result attached, exactly the hidden files it names left, and a next run
  that sweeps them. Never success, never a third state. (No real filesystem here fails one fsync on demand.)
* a real fault: the destination folder made immutable (``chattr +i``) before each system call of the writer in turn,
  so that every later create, rename and unlink in it fails with EPERM, undoing included, in a forked child so that
  what it leaves is a dead writer's: an ``OSError`` with the previous model, ``PublishedWithErrorsError`` with the
  new one, or success when nothing changed a name after it; and the run after ``chattr -i`` sweeps everything. (A
  read-only remount would be the natural fault, but Linux refuses it while a file is open for writing: EBUSY for
  the whole publication.)

"Not supported" fsync answers (EINVAL, ENOTSUP) are ignored; EIO, ENOSPC and EROFS are not. The command line turns
each outcome into exit status 1 (nothing published) or 3 (published, one ``error: ... is published ..., but`` line).
"""

from __future__ import annotations

import errno
import os
import pickle
import resource
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import (
    AlignResult,
    LinkResult,
    SaveResult,
    align_external_data_streaming,
    save_model_with_shared_external_data,
)
from onnx_light_ref._cli import main
from onnx_light_ref.errors import PublishedWithErrorsError
from onnx_light_ref.io._write import publish
from tests.checks import assert_no_temp_files, snapshot_tree
from tests.hardening.publication_scenarios import (
    NEW_ALIGNMENT,
    OLD_ALIGNMENT,
    WRITERS,
    computed,
    loaded,
    prepare,
    same,
    values,
)

OLD, NEW = values(1), values(2)
RESULT_TYPES: dict[str, type] = {"shared-save": SaveResult, "undelay": int, "link": LinkResult}  # else AlignResult
SCENARIOS = [(name, over) for name in WRITERS for over in ("previous-output", "empty-destination")]
Seam = Callable[[Callable[[str], None] | None], None]


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch) -> Seam:
    """``seam(hook)``: set ``publish.before_syscall`` (None clears it; monkeypatch clears it at the end anyway)."""
    return lambda hook: monkeypatch.setattr(publish, "before_syscall", hook)


def failing_at(at: int, code: int = errno.EIO, kinds: tuple[str, ...] = ("fsync", "unlink")) -> Callable[[str], None]:
    """A seam hook raising ``OSError(code)`` at the ``at``-th call named one of ``kinds`` (0: at every one)."""
    count = 0

    def hook(name: str) -> None:
        nonlocal count
        if name in kinds:
            count += 1
            if at in (0, count):
                raise OSError(code, f"{name} failed (injected)")

    return hook


def template_of(work: Path, name: str, over: str, sources: tuple[Path, Path]) -> Path:
    """The destination folder before the run: the writer's previous output (old values), or only what it reads."""
    writer, _ = WRITERS[name]
    template = work / "template"
    template.mkdir()
    prepare(name, template, *sources)
    if over == "previous-output":
        writer(sources[0], template / "out.onnx", OLD_ALIGNMENT)
    return template


def visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def hidden(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.name.startswith("."))


def check_published(error: PublishedWithErrorsError, dst: Path, expected: object, final_names: list[str]) -> None:
    """The new model is in place and computes the new values; the error says so and names exactly what is left."""
    model = dst / "out.onnx"
    assert not isinstance(error, OSError)
    assert error.model_path == str(model)
    assert str(error).startswith(f"{str(model)!r} is published (the new model is in place and loads), but "), error
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.EIO
    assert [e.errno for e in error.errors] == [errno.EIO]
    assert type(error.result) is type(expected) and int(error.result) == int(expected)  # type: ignore[call-overload]
    assert same(computed(model), NEW)
    assert visible(dst) == final_names
    assert sorted(error.leftover_files) == hidden(dst)
    if error.sync_failed:
        assert error.leftover_files == () and "that makes it durable failed (Input/output error)" in str(error)
    else:
        assert len(error.leftover_files) == 1 and "removing the hidden file" in str(error)


@pytest.mark.parametrize(("name", "over"), SCENARIOS, ids=[f"{name}-{over}" for name, over in SCENARIOS])
def test_an_eio_at_each_fsync_and_unlink_ends_unchanged_with_oserror_or_published_with_errors(
    work: Path, sources: tuple[Path, Path], seam: Seam, name: str, over: str
) -> None:
    writer, _ = WRITERS[name]
    new_src = sources[1]
    template = template_of(work, name, over, sources)
    reference = work / "reference"
    shutil.copytree(template, reference)
    names: list[str] = []
    seam(names.append)
    expected = writer(new_src, reference / "out.onnx", NEW_ALIGNMENT)
    seam(None)
    final_names = visible(reference)
    points = sum(call in ("fsync", "unlink") for call in names)
    assert points >= 4, names
    before = snapshot_tree(template)

    outcomes = {"unchanged": 0, "published": 0}
    for at in range(1, points + 1):
        dst = work / f"eio{at}"
        shutil.copytree(template, dst)
        seam(failing_at(at))
        try:
            with pytest.raises((OSError, PublishedWithErrorsError)) as raised:
                writer(new_src, dst / "out.onnx", NEW_ALIGNMENT)
        finally:
            seam(None)
        if isinstance(raised.value, OSError):
            assert raised.value.errno == errno.EIO and "fsync failed (injected)" in str(raised.value)
            assert snapshot_tree(dst) == before, f"EIO at call {at}: the destination changed"
            outcomes["unchanged"] += 1
        else:
            check_published(raised.value, dst, expected, final_names)
            outcomes["published"] += 1
        writer(new_src, dst / "out.onnx", NEW_ALIGNMENT)  # the next run: published, nothing of the failed one left
        assert same(loaded(dst / "out.onnx"), NEW)
        assert visible(dst) == final_names
        assert_no_temp_files(dst)
        shutil.rmtree(dst)
    print(f"{name} over {over}: {points} fault points, outcomes {outcomes}")
    assert outcomes["unchanged"] > 0 and outcomes["published"] > 0, outcomes


def outcome_in_child(call: Callable[[], object], at: int, folder: Path) -> str:
    """Run ``call`` in a forked child that makes ``folder`` immutable before its ``at``-th system call of the seam.

    Returns ``"ok"``, ``"oserror <errno>"``, ``"published"`` or ``"other <type>: <message>"`` (read through a pipe).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            count = 0

            def hook(_name: str) -> None:
                nonlocal count
                count += 1
                if count == at:
                    subprocess.run(["chattr", "+i", str(folder)], check=True, capture_output=True)

            publish.before_syscall = hook
            try:
                call()
                report = "ok"
            except PublishedWithErrorsError:
                report = "published"
            except OSError as exc:
                report = f"oserror {exc.errno}"
            except BaseException as exc:  # reported, then failed by the parent
                report = f"other {type(exc).__name__}: {exc}"
            os.write(write_end, report.encode()[:4000])
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        os.waitpid(pid, 0)
        return os.read(read_end, 4096).decode()
    finally:
        os.close(read_end)


REAL_FAULT_SCENARIOS = [
    ("align-streaming-3-shards", "previous-output"),
    ("align-in-memory-3-shards", "empty-destination"),
    ("shared-save", "previous-output"),
    ("undelay", "previous-output"),
    ("link", "previous-output"),
]


@pytest.mark.parametrize(("name", "over"), REAL_FAULT_SCENARIOS, ids=[f"{n}-{o}" for n, o in REAL_FAULT_SCENARIOS])
def test_an_immutable_folder_at_each_system_call_ends_with_the_previous_model_or_the_new_one_reported(
    work: Path, sources: tuple[Path, Path], name: str, over: str
) -> None:
    probe = work / "probe"
    probe.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(probe)], check=False).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and e2fsprogs)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    probe.rmdir()
    writer, _ = WRITERS[name]
    new_src = sources[1]
    template = template_of(work, name, over, sources)
    reference = work / "reference"
    shutil.copytree(template, reference)
    names: list[str] = []
    publish.before_syscall = names.append
    try:
        writer(new_src, reference / "out.onnx", NEW_ALIGNMENT)
    finally:
        publish.before_syscall = None
    final_names = visible(reference)
    shutil.rmtree(reference)

    outcomes: dict[str, int] = {}
    for at in range(1, len(names) + 1):
        dst = work / "dst"
        shutil.copytree(template, dst)
        try:
            report = outcome_in_child(lambda dst=dst: writer(new_src, dst / "out.onnx", NEW_ALIGNMENT), at, dst)
        finally:
            subprocess.run(["chattr", "-i", str(dst)], check=True, capture_output=True)
        outcomes[report] = outcomes.get(report, 0) + 1
        model = dst / "out.onnx"
        if report == f"oserror {errno.EPERM}":
            if over == "previous-output":
                assert same(computed(model), OLD), f"immutable at call {at}: the previous model changed"
            else:
                assert not model.exists()
        elif report in ("published", "ok"):
            assert same(computed(model), NEW), f"immutable at call {at}"
            assert report == "published" or hidden(dst) == [], f"immutable at call {at}: success, but {hidden(dst)}"
        else:
            pytest.fail(f"immutable at call {at} ({names[at - 1]}): {report}")
        writer(new_src, model, NEW_ALIGNMENT)  # the next run sweeps what the child (now dead) left
        assert same(loaded(model), NEW)
        assert visible(dst) == final_names
        assert_no_temp_files(dst)
        shutil.rmtree(dst)
    print(f"{name} over {over}: {len(names)} fault points, outcomes {outcomes}")
    assert outcomes.get(f"oserror {errno.EPERM}", 0) > 0, outcomes
    # Over a previous output the removals after the commit fail too; into an empty folder there are none.
    assert outcomes.get("published", 0) > 0 if over == "previous-output" else "published" not in outcomes, outcomes


# --------------------------------------------------------------------------------- fsync answers, one by one


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)])
def test_an_fsync_that_is_not_supported_is_ignored_and_the_model_is_published(
    work: Path, sources: tuple[Path, Path], seam: Seam, code: int
) -> None:
    template = template_of(work, "align-streaming-3-shards", "previous-output", sources)
    seam(failing_at(0, code, ("fsync",)))
    result = WRITERS["align-streaming-3-shards"][0](sources[1], template / "out.onnx", NEW_ALIGNMENT)
    assert isinstance(result, AlignResult) and len(result.weights_files) == 3
    assert same(computed(template / "out.onnx"), NEW)
    assert_no_temp_files(template)


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT])
@pytest.mark.parametrize("which", ["first", "last-before-the-commit"])
def test_an_fsync_error_before_the_commit_changes_nothing_and_raises_it(
    work: Path, sources: tuple[Path, Path], seam: Seam, code: int, which: str
) -> None:
    """The first fsync is a weights file's; the last one before the commit, the weights folder's (it used to be
    logged at DEBUG while align returned success)."""
    template = template_of(work, "align-streaming", "empty-destination", sources)
    names: list[str] = []
    seam(names.append)
    WRITERS["align-streaming"][0](sources[0], work / "probe.onnx", NEW_ALIGNMENT)
    fsyncs = names.count("fsync")
    assert fsyncs == 4  # the weights file, the .onnx, the weights folder, then (after the commit) the .onnx folder
    before = snapshot_tree(template)
    seam(failing_at(1 if which == "first" else 3, code, ("fsync",)))
    with pytest.raises(OSError) as raised:
        WRITERS["align-streaming"][0](sources[1], template / "out.onnx", NEW_ALIGNMENT)
    assert raised.value.errno == code
    staged = "'" + str(template / "out.onnx.data") + "' (staged as"
    what = staged if which == "first" else f"the folder {str(template)!r}"
    assert str(raised.value).startswith(f"[Errno {code}] fsync of {what}"), raised.value
    assert "its data may not be on disk (durable=False, --no-fsync, skips every fsync)" in str(raised.value)
    assert snapshot_tree(template) == before


def test_durable_false_makes_no_fsync_so_no_fsync_error(work: Path, sources: tuple[Path, Path], seam: Seam) -> None:
    seam(failing_at(0, errno.EIO, ("fsync",)))
    align_external_data_streaming(sources[1] / "model.onnx", work / "out.onnx", alignment=NEW_ALIGNMENT, durable=False)
    assert same(computed(work / "out.onnx"), NEW)


# ------------------------------------------------------- after the commit, at the public API and the command line


def test_a_failed_folder_fsync_after_the_commit_is_published_with_errors_never_an_oserror(
    work: Path, sources: tuple[Path, Path], seam: Seam
) -> None:
    dst = work / "out.onnx"
    seam(failing_at(4, errno.EIO, ("fsync",)))  # the 4th fsync: the .onnx folder's, after the commit
    with pytest.raises(PublishedWithErrorsError) as raised:
        align_external_data_streaming(sources[1] / "model.onnx", dst, alignment=NEW_ALIGNMENT)
    error = raised.value
    assert not isinstance(error, OSError)
    assert str(error) == (
        f"{str(dst)!r} is published (the new model is in place and loads), but the fsync of the folder "
        f"{str(work)!r} that makes it durable failed (Input/output error) (the new model is in place but may not "
        "survive a power loss: run the job again or sync)"
    )
    assert error.sync_failed and error.leftover_files == ()
    assert isinstance(error.result, AlignResult) and error.result.weights_files == (str(work / "out.onnx.data"),)
    assert same(computed(dst), NEW)
    assert visible(work) == ["out.onnx", "out.onnx.data"] and hidden(work) == []


def test_a_failed_removal_of_a_previous_version_is_named_and_swept_by_the_next_run(
    work: Path, sources: tuple[Path, Path], seam: Seam
) -> None:
    dst = work / "out.onnx"
    align_external_data_streaming(sources[0] / "model.onnx", dst, alignment=OLD_ALIGNMENT, max_shard_size=4096)
    seam(failing_at(2, errno.EIO, ("unlink",)))
    with pytest.raises(PublishedWithErrorsError) as raised:
        align_external_data_streaming(sources[1] / "model.onnx", dst, alignment=NEW_ALIGNMENT, max_shard_size=4096)
    seam(None)
    error = raised.value
    (leftover,) = error.leftover_files
    assert os.path.basename(leftover).startswith(".olr~") and os.path.exists(leftover)
    assert str(error) == (
        f"{str(dst)!r} is published (the new model is in place and loads), but removing the hidden file "
        f"{leftover!r} failed (unlink failed (injected)) (1 hidden file(s) are left; the next publication into this "
        "folder removes them)"
    )
    assert not error.sync_failed and len(error.result.weights_files) == 3
    assert same(computed(dst), NEW) and hidden(work) == [leftover]
    align_external_data_streaming(sources[1] / "model.onnx", dst, alignment=NEW_ALIGNMENT, max_shard_size=4096)
    assert hidden(work) == []


def _inline_variant(src: Path) -> onnx.ModelProto:
    return onnx.load(str(src / "inline.onnx"))


def test_the_shared_saver_keeps_the_callers_model_as_published_after_the_commit(
    work: Path, sources: tuple[Path, Path], seam: Seam
) -> None:
    """It used to give the caller's proto its inline bytes back while the .onnx on disk pointed at the new file."""
    dst = work / "variant.onnx"
    model = _inline_variant(sources[1])
    seam(failing_at(4, errno.EIO, ("fsync",)))  # after the commit
    with pytest.raises(PublishedWithErrorsError) as raised:
        save_model_with_shared_external_data(model, dst, 64)
    assert isinstance(raised.value.result, SaveResult) and raised.value.result.new_tensors == 4
    on_disk = onnx.load(str(dst), load_external_data=False)
    assert model.SerializeToString() == on_disk.SerializeToString()
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert same(computed(dst), NEW)


def test_the_shared_saver_restores_the_callers_model_when_nothing_is_published(
    work: Path, sources: tuple[Path, Path], seam: Seam
) -> None:
    dst = work / "variant.onnx"
    model = _inline_variant(sources[1])
    before = model.SerializeToString()
    seam(failing_at(3, errno.EIO, ("fsync",)))  # the weights folder's, before the commit
    with pytest.raises(OSError, match="fsync of the folder"):
        save_model_with_shared_external_data(model, dst, 64)
    assert model.SerializeToString() == before
    assert list(work.iterdir()) == []


def _cli_args(name: str, src: Path, dst: Path) -> list[str]:
    if name == "align":
        return ["align", str(src / "model.onnx"), str(dst), "--alignment", "128", "--no-progress"]
    if name == "undelay":
        return ["undelay", str(src / "delayed.onnx"), str(dst), "--alignment", "128", "--no-progress"]
    return ["link", str(src / "model.onnx"), str(dst.parent / f"{src.name}.safetensors"), str(dst), "--no-progress"]


@pytest.mark.parametrize("command", ["align", "undelay", "link"])
def test_the_cli_exits_3_saying_the_model_is_published_after_the_commit_and_1_with_nothing_changed_before(
    work: Path, sources: tuple[Path, Path], seam: Seam, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    name = {"align": "align-streaming", "undelay": "undelay", "link": "link"}[command]
    template = template_of(work, name, "previous-output", sources)
    dst = template / "out.onnx"
    before = snapshot_tree(template)
    seam(failing_at(1, errno.EIO, ("fsync",)))
    assert main(_cli_args(command, sources[1], dst)) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: fsync of ") and err.count("\n") == 1, err
    assert snapshot_tree(template) == before

    seam(failing_at(1, errno.EIO, ("unlink",)))  # the first removal after the commit
    assert main(_cli_args(command, sources[1], dst)) == 3
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: {str(dst)!r} is published (the new model is in place and loads), but removing ")
    assert same(computed(dst), NEW)
    seam(None)
    assert main(_cli_args(command, sources[1], dst)) == 0
    assert hidden(template) == []


def test_run_output_dir_exits_3_when_removing_a_previous_output_fails(
    tmp_path: Path, seam: Seam, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_cli_run import save_linear_model

    model = save_linear_model(tmp_path)
    np.save(tmp_path / "x.npy", np.ones((2, 8), dtype=np.float32))
    out_dir = tmp_path / "out"
    args = ["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(out_dir)]
    assert main(args) == 0
    capsys.readouterr()
    seam(failing_at(1, errno.EIO, ("unlink",)))
    assert main([*args, "--overwrite"]) == 3
    _, err = capsys.readouterr()
    # y.npy, w_sum.npy and the record of what run wrote there (.onnx-light-ref-run.json)
    assert err.startswith(f"error: {str(out_dir / 'y.npy')!r} (and 2 more output(s)) is published"), err
    assert sorted(p.name for p in out_dir.iterdir() if not p.name.startswith(".")) == ["w_sum.npy", "y.npy"]
    assert [Path(p).name for p in hidden(out_dir) if not Path(p).name.startswith(".olr~")] == [
        ".onnx-light-ref-run.json"
    ]
    assert len(hidden(out_dir)) == 2  # the record and the one temp file left


def test_published_with_errors_is_neither_an_oserror_nor_a_valueerror_and_pickles_with_its_fields() -> None:
    """The two documented answers are distinct types: code restoring on OSError never catches a published model."""
    assert not issubclass(PublishedWithErrorsError, (OSError, ValueError))
    assert issubclass(PublishedWithErrorsError, RuntimeError)
    error = PublishedWithErrorsError("m.onnx is published", model_path="m.onnx", leftover_files=["x"], result=3)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.model_path, copy.leftover_files, copy.result) == (str(error), "m.onnx", ("x",), 3)


# ------------------------------------------------------------------- descriptors: EMFILE, and the folder lock's close


def olr_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".olr~"))


def test_emfile_at_each_dup_of_a_publication_leaves_no_temp_file_and_the_destination_unchanged(
    work: Path, sources: tuple[Path, Path], seam: Seam
) -> None:
    """Every temp file's lock descriptor is a ``dup`` made right after the file is created; out of descriptors
    there (EMFILE), the file used to stay behind, unknown to the transaction. Each one in turn, through a re-run
    over itself (three weights files, the bridge files and copies): ``OSError(EMFILE)``, nothing changed."""
    name = "align-streaming-3-shards"
    template = template_of(work, name, "previous-output", sources)
    writer, _ = WRITERS[name]
    probe = work / "probe"
    shutil.copytree(template, probe)
    names: list[str] = []
    seam(names.append)
    writer(sources[1], probe / "out.onnx", NEW_ALIGNMENT)
    seam(None)
    dups = names.count("dup")
    assert dups >= 3 + 1 + 3 + 1  # three weights files and the .onnx, three copies and the bridge .onnx
    before = snapshot_tree(template)
    for at in range(1, dups + 1):
        dst = work / f"emfile{at}"
        shutil.copytree(template, dst)
        seam(failing_at(at, errno.EMFILE, ("dup",)))
        with pytest.raises(OSError) as raised:
            writer(sources[1], dst / "out.onnx", NEW_ALIGNMENT)
        seam(None)
        assert raised.value.errno == errno.EMFILE and "dup failed (injected)" in str(raised.value)
        assert snapshot_tree(dst) == before, f"EMFILE at dup {at}: the destination changed"
        assert olr_files(dst) == []
        shutil.rmtree(dst)


def test_a_descriptor_limit_reached_right_after_a_temp_file_is_created_leaves_nothing(tmp_path: Path) -> None:
    """A real EMFILE: a child process whose ``RLIMIT_NOFILE`` leaves room for the temp file's descriptor and not
    for its lock's."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        report = "no error"
        try:
            os.close(read_end)
            lowest = os.open(os.devnull, os.O_RDONLY)  # the descriptor the temp file will get
            os.close(lowest)
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest + 1, hard))
            try:
                publish.StagedFile(str(tmp_path / "w.bin"))
            except OSError as exc:
                report = f"{exc.errno} {olr_files(tmp_path)}"
            os.write(write_end, report.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.read().decode() == f"{errno.EMFILE} []"
    assert list(tmp_path.iterdir()) == []


def test_a_failed_close_of_the_folder_lock_after_the_commit_is_published_with_errors_never_an_oserror(
    work: Path, sources: tuple[Path, Path], seam: Seam
) -> None:
    """The folder lock is released after the commit; its ``close`` failing (EIO, as NFS can answer) used to
    propagate as an ``OSError``, which says nothing was published."""
    template = template_of(work, "align-streaming-3-shards", "previous-output", sources)
    dst = template / "out.onnx"
    names: list[str] = []
    seam(names.append)
    expected = WRITERS["align-streaming-3-shards"][0](sources[1], dst, OLD_ALIGNMENT)
    seam(None)
    assert names[-1] == "close"  # the last system call of a publication: the folder lock's close
    seam(failing_at(names.count("close"), errno.EIO, ("close",)))
    with pytest.raises(PublishedWithErrorsError) as raised:
        WRITERS["align-streaming-3-shards"][0](sources[1], dst, NEW_ALIGNMENT)
    seam(None)
    error = raised.value
    assert not isinstance(error, OSError)
    assert str(error) == (
        f"{str(dst)!r} is published (the new model is in place and loads), but releasing the lock of the "
        "destination folder(s) failed (close failed (injected))"
    )
    assert [e.errno for e in error.errors] == [errno.EIO] and error.leftover_files == () and not error.sync_failed
    assert isinstance(error.result, AlignResult) and error.result.weights_files == expected.weights_files
    assert same(computed(dst), NEW)
    assert olr_files(template) == []
