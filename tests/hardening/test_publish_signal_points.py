"""SIGINT and SIGTERM at each system call of a publication: the previous state or the new one, never a broken model.

The command line turns both signals into an exception (``cli.Interrupted``) that runs every cleanup on its way out.
Raised between a rename and its record, that cleanup undid the weights under a model already published (a fresh
destination left with ``dst.onnx`` pointing at a missing ``dst.onnx.data``; with ``--overwrite`` over a good model,
``dst.onnx`` pointing at a deleted bridge file). The publication now defers both signals from the first move to its
last step (and while a temp file is created and recorded, and while temp files are discarded): a signal acts where
the outcome is whole.

Each case runs the real command (``cli.main``) in a forked child whose ``publish.before_syscall`` seam sends the
signal to the process itself at the k-th system call of the publication, for every k a counting run sees: the same
seam the kill-point tests use. The child's handler is the command line's own. Whatever k, the command exits 130
(SIGINT) or 143 (SIGTERM) with one ``error: interrupted`` line, and the destination is *exactly* the previous state
(the same bytes, no hidden file, no folder the command created) or *exactly* the new one (the final names only,
computing the new values in onnx's loader, its full checker and onnxruntime).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.checks import assert_no_temp_files, sha256_of_tree
from tests.family.family_models import outputs_of, write_family
from tests.hardening.forked import hook_every_publication
from tests.hardening.publication_scenarios import computed, same, values

pytestmark = pytest.mark.slow


def _in_child(argv: list[str], signum: int | None, at: int | None) -> tuple[int, list[str], str]:
    """Run ``onnx-light-ref argv`` in a forked child, sending ``signum`` to itself before the ``at``-th system call of
    its publication; return its exit status, the names of the calls it saw, and what it printed on stderr."""
    from onnx_light_ref._cli import build_parser, main

    build_parser()  # every command module imported here once: each child starts with them
    read_end, write_end = os.pipe()
    err_read, err_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 99
        try:
            os.close(read_end)
            os.close(err_read)
            sys.stderr = open(err_write, "w", closefd=False)  # noqa: SIM115 (pytest captures sys.stderr; the child's)
            calls: list[str] = []

            def hook(name: str) -> None:
                calls.append(name)
                if len(calls) == at and signum is not None:
                    os.kill(os.getpid(), signum)

            hook_every_publication(hook)
            status = main(argv)
            with os.fdopen(write_end, "w") as report:
                report.write("\n".join(calls))
        finally:
            sys.stderr.flush()
            os._exit(status)
    os.close(write_end)
    os.close(err_write)
    with os.fdopen(read_end) as report:
        calls = report.read().split("\n")
    with os.fdopen(err_read) as err:
        printed = err.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the command died (status {status})"
    return os.WEXITSTATUS(status), [name for name in calls if name], printed


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _check_every_call(
    tmp_path: Path,
    prepare: Callable[[Path], None],
    argv: Callable[[Path], list[str]],
    outcome: Callable[[Path], str],
    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
) -> dict[str, int]:
    """For each system call of the publication, on a copy of the scene ``prepare`` made: the command ``argv(scene)``
    must leave the destination ``scene/out`` in exactly the previous or exactly the new state. The signals take
    turns from one call to the next (the command line handles both the same way; each meets every kind of call)."""
    template = tmp_path / "template"
    template.mkdir()
    prepare(template)
    reference = tmp_path / "reference"
    shutil.copytree(template, reference)
    status, calls, printed = _in_child(argv(reference), None, None)
    assert status == 0, printed
    new_names = _visible(reference / "out")
    assert len(calls) > 10, calls
    seen = {"previous": 0, "new": 0}
    for at in range(1, len(calls) + 1):
        for signum in (signals[at % len(signals)],):
            scene = tmp_path / f"s{at}-{signum}"
            shutil.copytree(template, scene)
            before = (_visible(scene / "out"), sha256_of_tree(scene / "out") if (scene / "out").exists() else {})
            status, _, printed = _in_child(argv(scene), signum, at)
            where = f"{signal.Signals(signum).name} at call {at} ({calls[at - 1]})"
            assert status == 128 + signum, f"{where}: exit {status}: {printed}"
            assert printed.strip().splitlines()[-1:] == ["error: interrupted"], f"{where}: {printed}"
            if (scene / "out").exists():
                assert_no_temp_files(scene / "out")
            state = (_visible(scene / "out"), sha256_of_tree(scene / "out") if (scene / "out").exists() else {})
            if state == before:
                seen["previous"] += 1
            else:
                assert state[0] == new_names, f"{where}: {state[0]} is neither the previous nor the new state"
                assert outcome(scene / "out") == "new", f"{where}: mixed model"
                seen["new"] += 1
            shutil.rmtree(scene)
    return seen


def test_a_signal_at_each_system_call_of_an_align_into_a_new_folder(work: Path, sources: tuple[Path, Path]) -> None:
    """The command creates the destination folder: interrupted before the commit, it removes it again."""
    new_src = sources[1] / "model.onnx"

    def argv(scene: Path) -> list[str]:
        return ["align", str(new_src), str(scene / "out" / "out.onnx"), "--no-progress"]

    def outcome(out: Path) -> str:
        return "new" if same(computed(out / "out.onnx"), values(2)) else ""

    seen = _check_every_call(work, lambda scene: None, argv, outcome)
    assert seen["previous"] and seen["new"], seen


@pytest.mark.parametrize("weights", [None, "w.bin"], ids=["named-after-the-model", "into-w.bin"])
def test_a_signal_at_each_system_call_of_a_re_alignment_over_the_previous_output(
    work: Path, sources: tuple[Path, Path], weights: str | None
) -> None:
    """The same names again: the bridged publication (commit A, the copies to the final names, commit B)."""
    old_src, new_src = (folder / "model.onnx" for folder in sources)
    extra = ["--max-shard-size", "4096", *(["--weights", weights] if weights else []), "--no-progress"]

    def prepare(scene: Path) -> None:
        (scene / "out").mkdir()
        args = ["align", str(old_src), str(scene / "out" / "out.onnx"), "--alignment", "64", *extra]
        assert _in_child(args, None, None)[0] == 0

    def argv(scene: Path) -> list[str]:
        return ["align", str(new_src), str(scene / "out" / "out.onnx"), "--alignment", "128", *extra]

    def outcome(out: Path) -> str:
        return "new" if same(computed(out / "out.onnx"), values(2)) else ""

    seen = _check_every_call(work, prepare, argv, outcome)
    assert seen["previous"] and seen["new"], seen


def test_a_signal_at_each_system_call_of_a_family_re_alignment(work: Path, tmp_path: Path) -> None:
    """Every member of a family over its previous version, each a bridged commit: all previous or all new."""
    old = write_family(tmp_path / "old", seed=1)
    new = write_family(tmp_path / "new", seed=2)

    def prepare(scene: Path) -> None:
        (scene / "out").mkdir()
        args = ["align-models", *map(str, old.sources), "--out", str(scene / "out"), "--alignment", "64"]
        assert _in_child([*args, "--no-progress"], None, None)[0] == 0

    def argv(scene: Path) -> list[str]:
        args = ["align-models", *map(str, new.sources), "--out", str(scene / "out"), "--alignment", "128"]
        return [*args, "--no-progress"]

    expected = {source.name: outputs_of(source) for source in new.sources}

    def outcome(out: Path) -> str:
        for name, wanted in expected.items():
            onnx.load(str(out / name))  # with its external data: refuses symlinks and hard-linked files
            onnx.checker.check_model(str(out / name), full_check=True)
            got = outputs_of(out / name)
            if len(got) != len(wanted) or not all(np.array_equal(a, b) for a, b in zip(got, wanted, strict=True)):
                return ""
        return "new"

    seen = _check_every_call(work, prepare, argv, outcome)
    assert seen["previous"] and seen["new"], seen
