"""What ``align_models`` reports is what happened (rule 5 of the writer contract), for a family of two members.

As ``tests/hardening/test_publication_outcomes.py`` does for the one-model writers:

* an injected EIO (the ``before_syscall`` seam of ``publish.py``) at each ``fsync`` and each ``unlink`` of the
  family publication, in turn, over an empty folder and over the previous family, ends either in an ``OSError``
  with the folder exactly as before (every file's bytes, nothing left), or in ``PublishedWithErrorsError`` naming
  both members as published (each computes the new values in onnxruntime), the ``FamilyResult`` attached, exactly
  the hidden files it names left, and a next run that sweeps them. Never success, never a third state;
* without ``RENAME_EXCHANGE`` a failed move between the two members' commits cannot be undone: the error says which
  member is new and which is still previous (each computes its own values), the command exits 3, a re-run
  publishes the whole family;
* the command exits 1 with nothing changed for a failure before the first commit (an fsync EIO propagates), and 3
  with one ``error: ... are published ..., but`` line for one after the last commit;
* a family run killed after staging its shards leaves dead writers' temp files that the next run sweeps.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref import FamilyResult, align_models
from onnx_light_ref._cli import main
from onnx_light_ref.errors import PublishedWithErrorsError
from onnx_light_ref.io._write import publish
from tests.checks import assert_no_temp_files, snapshot_tree, temp_files_under
from tests.family.family_models import Family, outputs_of, write_family
from tests.hardening.test_publication_outcomes import Seam, failing_at, hidden, seam, visible

__all__ = ["seam"]  # the fixture, used by name

OLD_ALIGNMENT, NEW_ALIGNMENT = 64, 128  # different offsets in the previous and the new family


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Family]:
    root = tmp_path_factory.mktemp("outcome_families")
    return write_family(root / "old", seed=1), write_family(root / "new", seed=2)


def computes(folder: Path, family: Family) -> bool:
    """Every member in ``folder`` computes what its source in ``family`` computes (onnxruntime)."""
    return all(same(outputs_of(folder / source.name), outputs_of(source)) for source in family.sources)


def same(first: list[np.ndarray], second: list[np.ndarray]) -> bool:
    return len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def members(folder: Path, family: Family) -> tuple[str, ...]:
    return tuple(str(folder / source.name) for source in family.sources)


@pytest.mark.parametrize("over", ["empty-folder", "previous-family"])
def test_an_eio_at_each_fsync_and_unlink_ends_unchanged_with_oserror_or_published_with_errors(
    work: Path, families: tuple[Family, Family], seam: Seam, over: str
) -> None:
    old, new = families
    template = work / "template"
    template.mkdir()
    if over == "previous-family":
        align_models(old.sources, template, alignment=OLD_ALIGNMENT)
    reference = work / "reference"
    shutil.copytree(template, reference)
    names: list[str] = []
    seam(names.append)
    expected = align_models(new.sources, reference, alignment=NEW_ALIGNMENT)
    seam(None)
    final_names = visible(reference)
    points = sum(call in ("fsync", "unlink") for call in names)
    assert points >= 6, names
    before = snapshot_tree(template)

    outcomes = {"unchanged": 0, "published": 0}
    for at in range(1, points + 1):
        dst = work / f"eio{at}"
        shutil.copytree(template, dst)
        seam(failing_at(at))
        try:
            with pytest.raises((OSError, PublishedWithErrorsError)) as raised:
                align_models(new.sources, dst, alignment=NEW_ALIGNMENT)
        finally:
            seam(None)
        error = raised.value
        if isinstance(error, OSError):
            assert error.errno == errno.EIO and "fsync failed (injected)" in str(error), error
            assert snapshot_tree(dst) == before, f"EIO at call {at}: the folder changed"
            outcomes["unchanged"] += 1
        else:
            assert not isinstance(error, OSError)
            assert error.published_models == members(dst, new) and error.previous_models == ()
            assert str(error).startswith(
                f"{str(dst / new.decoder.name)!r}, {str(dst / new.with_past.name)!r} are published (every new model "
                "is in place and loads), but "
            ), error
            assert isinstance(error.__cause__, OSError) and [e.errno for e in error.errors] == [errno.EIO]
            assert isinstance(error.result, FamilyResult) and int(error.result) == int(expected)
            assert computes(dst, new), f"EIO at call {at}: a member does not compute the new values"
            assert visible(dst) == final_names
            assert sorted(error.leftover_files) == hidden(dst)
            outcomes["published"] += 1
        align_models(new.sources, dst, alignment=NEW_ALIGNMENT)  # the next run: nothing of the failed one left
        assert computes(dst, new) and visible(dst) == final_names
        assert_no_temp_files(dst)
        shutil.rmtree(dst)
    print(f"family over {over}: {points} fault points, outcomes {outcomes}")
    assert outcomes["unchanged"] > 0 and outcomes["published"] > 0, outcomes


def _previous_family_elsewhere(root: Path, old: Family) -> Path:
    """The previous family under another weights name, so that the new run moves no name the previous one uses."""
    dst = root / "dst"
    dst.mkdir(parents=True)
    align_models(old.sources, dst, alignment=OLD_ALIGNMENT, weights_name="old.data")
    return dst


def _failing_second_commit(calls: int) -> Callable[[str], None]:
    """A seam hook failing the ``calls``-th rename: the second member's commit (weights, first member, second)."""
    count = 0

    def hook(name: str) -> None:
        nonlocal count
        if name == "rename":
            count += 1
            if count == calls:
                raise OSError(errno.EIO, "rename failed (injected)")

    return hook


def test_without_rename_exchange_a_failure_between_two_commits_names_the_new_and_the_previous_member(
    work: Path, families: tuple[Family, Family], seam: Seam, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = families
    monkeypatch.setattr(publish, "_renameat2", None)  # a kernel, libc or filesystem without RENAME_EXCHANGE
    probe = _previous_family_elsewhere(work / "probe", old)
    names: list[str] = []
    seam(names.append)
    align_models(new.sources, probe, alignment=NEW_ALIGNMENT)
    seam(None)
    assert names.count("rename") == 3  # the weights file, then each member's commit
    dst = _previous_family_elsewhere(work, old)

    seam(_failing_second_commit(3))
    with pytest.raises(PublishedWithErrorsError) as raised:
        align_models(new.sources, dst, alignment=NEW_ALIGNMENT)
    seam(None)

    error = raised.value
    decoder, with_past = members(dst, new)
    assert error.published_models == (decoder,) and error.previous_models == (with_past,)
    assert error.model_path == decoder and error.sync_failed
    assert str(error) == (
        f"{decoder!r} is published (each new model is in place and loads), but the publication failed ([Errno 5] "
        f"rename failed (injected)) and could not be undone: {with_past!r} is still the previous version (each "
        "loads and computes its previous values). Run the job again to publish the whole family."
    )
    assert isinstance(error.result, FamilyResult)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.published_models, copy.previous_models, str(copy)) == ((decoder,), (with_past,), str(error))
    assert same(outputs_of(Path(decoder)), outputs_of(new.decoder))
    assert same(outputs_of(Path(with_past)), outputs_of(old.with_past))
    align_models(new.sources, dst, alignment=NEW_ALIGNMENT)  # a re-run publishes the whole family
    assert computes(dst, new)
    assert_no_temp_files(dst)


def test_the_command_exits_3_naming_the_new_and_the_previous_member(
    work: Path,
    families: tuple[Family, Family],
    seam: Seam,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    old, new = families
    monkeypatch.setattr(publish, "_renameat2", None)
    dst = _previous_family_elsewhere(work, old)
    argv = ["align-models", *map(str, new.sources), "--out", str(dst), "--alignment", "128", "--no-progress"]
    capsys.readouterr()
    seam(_failing_second_commit(3))
    assert main(argv) == 3
    seam(None)
    out, err = capsys.readouterr()
    decoder, with_past = members(dst, new)
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: {decoder!r} is published (each new model is in place and loads), but ")
    assert f"{with_past!r} is still the previous version" in err
    assert main(argv) == 0
    assert computes(dst, new)


def test_the_command_exits_1_unchanged_before_the_first_commit_and_3_after_the_last(
    work: Path, families: tuple[Family, Family], seam: Seam, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = families
    dst = work / "dst"
    dst.mkdir()
    align_models(old.sources, dst, alignment=OLD_ALIGNMENT)
    argv = ["align-models", *map(str, new.sources), "--out", str(dst), "--alignment", "128", "--no-progress"]
    before = snapshot_tree(dst)
    capsys.readouterr()

    seam(failing_at(1, errno.EIO, ("fsync",)))  # the first weights file's fsync: an error, never swallowed
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: fsync of ") and err.count("\n") == 1, err
    assert snapshot_tree(dst) == before

    seam(failing_at(1, errno.EIO, ("unlink",)))  # the first removal after the last commit
    assert main(argv) == 3
    out, err = capsys.readouterr()
    decoder, with_past = members(dst, new)
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(
        f"error: {decoder!r}, {with_past!r} are published (every new model is in place and loads), but removing "
    ), err
    assert computes(dst, new)
    seam(None)
    assert main(argv) == 0
    assert hidden(dst) == []


def test_a_family_run_killed_after_staging_its_shards_is_swept_by_the_next_run(
    work: Path, families: tuple[Family, Family]
) -> None:
    """A killed sharded run leaves one temp file per shard (each a shard of disk); a later run writing one file
    removes them all: every dead writer's temp file of the folder, whatever its final name."""
    _, new = families
    dst = work / "dst"
    dst.mkdir()
    pid = os.fork()
    if pid == 0:  # the child: killed right before its publication, every shard and member staged
        try:

            def killed(*_args: object, **_kwargs: object) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            publish.OutputTransaction.publish = killed  # type: ignore[method-assign, assignment]
            align_models(new.sources, dst, alignment=NEW_ALIGNMENT, max_shard_size=8192)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert len(temp_files_under(dst)) >= 3 and visible(dst) == []

    result = align_models(new.sources, dst, alignment=NEW_ALIGNMENT)

    assert len(result.weights_files) == 1
    assert_no_temp_files(dst)
    assert visible(dst) == sorted([new.decoder.name, new.with_past.name, "weights.data"])
    assert computes(dst, new)
