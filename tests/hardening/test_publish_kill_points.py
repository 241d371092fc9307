"""Deterministic crash tests: SIGKILL every writer at each system call of its publication step, in turn.

``onnx_light_ref.io._write.publish.before_syscall`` is called before every system call the publication makes (the test
seam of that module). A forked child runs one writer with a hook that counts those calls during
:meth:`OutputTransaction.publish` (every writer's and the family's publication: one method) and SIGKILLs
the child at the k-th; a first child, never killed, counts them and reads, at each, the state a kill there would
leave (:mod:`tests.hardening.kill_states`: a SIGKILL leaves exactly what the folder holds at that instant). Each
distinct state is killed into once, at its first call, and the killed run must leave the state the counting run saw;
a later call that would leave a state already judged (most calls change nothing visible: ``fsync``, ``flock``,
``fstat``, the reads) has the same verdict and the same recovery, and is counted, not run again. For every distinct
state the destination left behind must be the previous model or the new one, *without any recovery*: it loads in
``onnx.load`` (with its external data), passes ``onnx.checker.check_model(path, full_check=True)``, runs in
onnxruntime and computes exactly the previous or the new values (the two runs use different values *and* different
offsets, so new bytes read through old offsets would show), and no file it references has more than one link.
Then the writer runs again (the next run is the recovery): it must succeed (a weights file the killed run moved in
before its commit is its own, recognized through the publication's journal when it is not named after the model),
compute the new values (full checker, onnxruntime) and leave no temp, bridge or journal file behind.

Everything happens on a tmpfs mounted under ``tmp_path`` (its fsyncs are free, so several hundred publications fit
in seconds; ``durable=True`` as by default, so the fsync calls are kill points too), or in ``tmp_path`` itself when
mounting is refused (slower, same assertions).

Scenarios: the streaming aligner with one and with three weights files (named after the model, and into ``w.bin``,
``--weights w.bin``), the in-memory aligner with three, the shared saver (also into ``w.bin``),
``undelay_initializers`` and ``link_external_data`` (two tensors linked to a safetensors checkpoint in the
destination folder, two written to its own weights file), each over a previous output written by the same
writer (so there is something to clobber; a re-run over itself is the case where the weights names stay the same)
and over an empty destination; the three-file re-publication again without ``RENAME_EXCHANGE`` (plain renames);
and publications whose cleanup fails (every removal after the commit answers EIO, so the writer raises
``PublishedWithErrorsError`` and leaves its previous versions on hidden names): a kill anywhere still leaves the
previous or the new model, and the next run sweeps what both the failed cleanup and the kill left.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref.errors import PublishedWithErrorsError
from onnx_light_ref.io._write import publish
from tests.checks import assert_no_temp_files, temp_files_under
from tests.hardening.forked import hook_every_publication
from tests.hardening.kill_states import folder_state
from tests.hardening.publication_scenarios import (
    NEW_ALIGNMENT,
    OLD_ALIGNMENT,
    WRITERS,
    computed,
    prepare,
    same,
    values,
)


def in_child(
    call: Callable[[], object],
    kill_at: int | None,
    *,
    exchange: bool = True,
    cleanup_fails: bool = False,
    watch: Path | None = None,
) -> list[str]:
    """Run ``call`` in a forked child, SIGKILLed before the ``kill_at``-th system call of its publication.

    ``cleanup_fails``: every ``unlink`` of the publication answers EIO instead (nothing is removed), and the
    ``PublishedWithErrorsError`` the writer then raises counts as the run's normal end.

    Returns, when the child was not killed, one item per such call it made (read back through a pipe): the state of
    ``watch`` (:func:`tests.hardening.kill_states.folder_state`) just before the call, which is what a kill there
    leaves, or ``""`` without ``watch``. Returns ``[]`` when it was killed.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            states: list[str] = []

            def hook(name: str) -> None:
                states.append(folder_state(watch) if watch is not None else "")
                if len(states) == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if cleanup_fails and name == "unlink":
                    raise OSError(errno.EIO, "unlink failed (injected)")

            hook_every_publication(hook)
            if not exchange:  # as on a kernel, libc or filesystem without renameat2(RENAME_EXCHANGE)
                publish._renameat2 = None
            try:
                call()
            except PublishedWithErrorsError:
                if not cleanup_fails:
                    raise
            with os.fdopen(write_end, "w") as report:
                report.write("\n".join(states))
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as report:  # read to the end before waiting: the report may not fit in the pipe
        reported = report.read()
    _, status = os.waitpid(pid, 0)
    if kill_at is None:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the writer failed (status {status})"
        return reported.split("\n") if reported else []
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed (status {status})"
    return []


# The in-memory aligner with one weights file publishes exactly as the streaming one (same transaction, same files):
# it runs with three. Without RENAME_EXCHANGE, the three-file re-publication (the longest sequence) runs again; so
# does it, and link over its previous output, with a cleanup that fails.
SCENARIOS = [
    *((name, over, True, False) for name in WRITERS for over in ("previous-output", "empty-destination")),
    ("align-streaming-3-shards", "previous-output", False, False),
    ("align-streaming-3-shards", "previous-output", True, True),
    ("link", "previous-output", True, True),
]


def _scenario_id(name: str, over: str, exchange: bool, cleanup_fails: bool) -> str:
    return f"{name}-{over}{'' if exchange else '-no-exchange'}{'-cleanup-fails' if cleanup_fails else ''}"


@pytest.mark.parametrize(
    ("name", "over", "exchange", "cleanup_fails"), SCENARIOS, ids=[_scenario_id(*row) for row in SCENARIOS]
)
def test_a_kill_at_any_system_call_of_the_publication_leaves_the_previous_or_the_new_model(
    work: Path, sources: tuple[Path, Path], name: str, over: str, exchange: bool, cleanup_fails: bool
) -> None:
    tmp_path = work
    writer, weights_files = WRITERS[name]
    old_src, new_src = sources
    old, new = values(1), values(2)
    template = tmp_path / "template"
    template.mkdir()
    prepare(name, template, old_src, new_src)
    if over == "previous-output":
        writer(old_src, template / "out.onnx", OLD_ALIGNMENT)
        assert same(computed(template / "out.onnx"), old)
    previous_names = sorted(p.name for p in template.iterdir())

    reference = tmp_path / "reference"
    shutil.copytree(template, reference)
    states = in_child(
        lambda: writer(new_src, reference / "out.onnx", NEW_ALIGNMENT),
        None,
        exchange=exchange,
        cleanup_fails=cleanup_fails,
        watch=reference,
    )
    calls = len(states)
    assert same(computed(reference / "out.onnx"), new)
    if cleanup_fails:  # the previous versions stay on hidden names; the next run sweeps them
        assert temp_files_under(reference), "the failed cleanup left nothing to sweep"
        writer(new_src, reference / "out.onnx", NEW_ALIGNMENT)
    assert_no_temp_files(reference)
    final_names = sorted(p.name for p in reference.iterdir())
    assert len(final_names) == 1 + weights_files
    assert calls > 5 * weights_files  # the seam sees the publication (a few calls per file at least)

    outcomes = {"previous": 0, "new": 0, "absent": 0}
    first_kill_at: dict[str, int] = {}  # each distinct state a kill leaves -> the first call that leaves it
    for kill_at, state in enumerate(states, start=1):
        if state in first_kill_at:
            continue
        first_kill_at[state] = kill_at
        dst = tmp_path / f"k{kill_at}"
        shutil.copytree(template, dst)
        in_child(
            lambda dst=dst: writer(new_src, dst / "out.onnx", NEW_ALIGNMENT),
            kill_at,
            exchange=exchange,
            cleanup_fails=cleanup_fails,
        )
        assert folder_state(dst) == state, f"kill at call {kill_at}: not the state the counting run saw there"

        if not (dst / "out.onnx").exists():
            assert over == "empty-destination", f"kill at call {kill_at}: the previous model is gone"
            outcomes["absent"] += 1
        else:
            got = computed(dst / "out.onnx")
            if same(got, new):
                outcomes["new"] += 1
            else:
                assert over == "previous-output" and same(got, old), f"kill at call {kill_at}: mixed model"
                outcomes["previous"] += 1
        visible = sorted(p.name for p in dst.iterdir() if not p.name.startswith("."))
        assert set(visible) <= {*previous_names, *final_names}, f"kill at call {kill_at}: {visible}"

        # The next run is the recovery: the same call succeeds (its own leftovers are recognized, never refused as
        # someone else's file), computes the new values (full checker, onnxruntime) and leaves nothing of the
        # killed run: no temp, bridge or journal file.
        writer(new_src, dst / "out.onnx", NEW_ALIGNMENT)
        assert same(computed(dst / "out.onnx"), new), f"kill at call {kill_at}: the rerun's model"
        assert [p.name for p in dst.iterdir() if p.name.startswith(".olr~")] == [], f"kill at call {kill_at}"
        assert sorted(p.name for p in dst.iterdir()) == final_names
        assert_no_temp_files(dst)
        shutil.rmtree(dst)

    print(
        f"{_scenario_id(name, over, exchange, cleanup_fails)}: {calls} kill points, {len(first_kill_at)} distinct "
        f"states killed into, outcomes {outcomes}"
    )
    # Both outcomes happen: the kills straddle the commit.
    assert outcomes["new"] > 0 and outcomes["previous" if over == "previous-output" else "absent"] > 0, outcomes


def test_align_into_weights_of_another_name_killed_after_moving_them_in_is_rerun_identically(
    work: Path, sources: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``align --weights w.bin`` killed between moving ``w.bin`` in and its commit left a ``w.bin`` no model
    references and not named after the model: the identical rerun was refused (``ExistingFileError``, exit 1). The
    publication's journal now says it is this job's own leftover: the rerun publishes and leaves nothing hidden."""
    from onnx_light_ref._cli import main

    dst = work / "out"
    dst.mkdir()
    args = ["align", str(sources[1] / "model.onnx"), str(dst / "out.onnx"), "--weights", "w.bin", "--no-progress"]
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            moved: list[str] = []

            def hook(name: str) -> None:
                if moved:  # w.bin is in place; the .onnx is not
                    os.kill(os.getpid(), signal.SIGKILL)
                if name == "rename" and not os.path.exists(dst / "w.bin"):
                    moved.append(name)

            publish.before_syscall = hook
            main(args)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert (dst / "w.bin").exists() and not (dst / "out.onnx").exists()
    journals = [p.name for p in dst.iterdir() if p.name.endswith(".journal")]

    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err
    assert journals, "no journal named w.bin"

    assert same(computed(dst / "out.onnx"), values(2))
    assert sorted(p.name for p in dst.iterdir()) == ["out.onnx", "w.bin"]


def _evaluated(model: Path) -> list[np.ndarray]:
    """What a model read through DelayedInitializer nodes computes (onnxruntime cannot run it: our evaluator)."""
    from onnx_light_ref import reference_evaluator

    for node in onnx.load(str(model), load_external_data=False).graph.node:
        for attribute in node.attribute:
            if attribute.name == "filename":  # every file it reads has one link and is no symlink
                path = model.parent / attribute.s.decode()
                assert not path.is_symlink() and path.stat().st_nlink == 1
    evaluator = reference_evaluator(str(model))
    try:
        return list(evaluator.run(None, {}))
    finally:
        evaluator.close()


def test_a_kill_at_any_system_call_of_a_delayed_initializer_model_over_its_previous_output(
    work: Path, sources: tuple[Path, Path]
) -> None:
    """The model reads its weights through DelayedInitializer nodes only: their filenames reference the weights file
    the re-alignment rewrites, so it must go through bridge names as external data does (it did not: a kill between
    the weights' move and the commit left the previous model reading new bytes at its old offsets)."""
    old_src, new_src = sources

    def write(src: Path, dst: Path, alignment: int) -> object:
        return align_external_data_streaming(src / "delayed.onnx", dst, alignment=alignment)

    template = work / "template"
    template.mkdir()
    write(old_src, template / "out.onnx", OLD_ALIGNMENT)
    old, new = (sorted(array.tobytes() for array in values(seed).values()) for seed in (1, 2))
    assert sorted(a.tobytes() for a in _evaluated(template / "out.onnx")) == old
    reference = work / "reference"
    shutil.copytree(template, reference)
    states = in_child(lambda: write(new_src, reference / "out.onnx", NEW_ALIGNMENT), None, watch=reference)
    assert sorted(a.tobytes() for a in _evaluated(reference / "out.onnx")) == new
    seen: dict[str, str] = {}
    for kill_at, state in enumerate(states, start=1):
        if state in seen:
            continue
        dst = work / f"k{kill_at}"
        shutil.copytree(template, dst)
        in_child(lambda dst=dst: write(new_src, dst / "out.onnx", NEW_ALIGNMENT), kill_at)
        assert folder_state(dst) == state, f"kill at call {kill_at}: not the state the counting run saw there"
        got = sorted(a.tobytes() for a in _evaluated(dst / "out.onnx"))
        assert got in (old, new), f"kill at call {kill_at}: mixed model"
        seen[state] = "new" if got == new else "previous"
        write(new_src, dst / "out.onnx", NEW_ALIGNMENT)  # the recovery
        assert sorted(a.tobytes() for a in _evaluated(dst / "out.onnx")) == new
        assert_no_temp_files(dst)
        shutil.rmtree(dst)
    assert set(seen.values()) == {"previous", "new"}, seen
