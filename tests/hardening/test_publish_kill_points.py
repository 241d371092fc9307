"""Deterministic crash tests: SIGKILL every writer at each system call of its publication step, in turn.

``onnx_light_ref.io.write.publish.before_syscall`` is called before every system call the publication makes (the test
seam of that module). A forked child runs one writer with a hook that counts those calls during
:meth:`OutputTransaction.publish` and SIGKILLs the child at the k-th; a first child, never killed, counts them. For
every k the destination left behind must be the previous model or the new one, *without any recovery*: it loads in
``onnx.load`` (with its external data), passes ``onnx.checker.check_model(path, full_check=True)``, runs in
onnxruntime and computes exactly the previous or the new values (the two runs use different values *and* different
offsets, so new bytes read through old offsets would show), and no file it references has more than one link.
Then the writer runs again (the next run is the recovery): it must succeed, compute the new values and leave no
temp or bridge file behind.

Everything happens on a tmpfs mounted under ``tmp_path`` (its fsyncs are free, so several hundred publications fit
in seconds; ``durable=True`` as by default, so the fsync calls are kill points too), or in ``tmp_path`` itself when
mounting is refused (slower, same assertions).

Scenarios: the streaming aligner with one and with three weights files, the in-memory aligner with three, the
shared saver and ``undelay_initializers``, each over a previous output written by the same writer (so there is
something to clobber; a re-run over itself is the case where the weights names stay the same) and over an empty
destination; and the three-file re-publication again without ``RENAME_EXCHANGE`` (plain renames).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    save_model_with_shared_external_data,
)
from onnx_light_ref.io.write import publish
from onnx_light_ref.ops.convert import delay_initializers
from onnx_light_ref.ops.undelay import undelay_initializers
from tests.checks import assert_no_temp_files
from tests.models import identity_model, write_external_model

# Four tensors of 1200..3600 bytes: with max_shard_size=4096 the aligners write three weights files.
SIZES = {"a": 300, "b": 500, "c": 700, "d": 900}
SHARD_SIZE = 4096
OLD_ALIGNMENT, NEW_ALIGNMENT = 64, 128  # different offsets in the previous and the new output

Values = dict[str, np.ndarray]
Writer = Callable[[Path, Path, int], object]  # (source folder, destination .onnx, alignment)


def values(seed: int) -> Values:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(count, dtype=np.float32) for name, count in SIZES.items()}


def write_source(folder: Path, arrays: Values) -> None:
    """``model.onnx`` (external data) for the aligners, ``inline.onnx`` for the saver, ``delayed.onnx`` for undelay."""
    folder.mkdir()
    source = write_external_model(folder, arrays)
    onnx.save(identity_model(arrays), folder / "inline.onnx")
    onnx.save(delay_initializers(source), folder / "delayed.onnx")


def _align(function: Callable[..., object], shards: bool) -> Writer:
    extra = {"max_shard_size": SHARD_SIZE} if shards else {}
    return lambda src, dst, alignment: function(src / "model.onnx", dst, alignment=alignment, **extra)


def _shared(src: Path, dst: Path, alignment: int) -> object:
    return save_model_with_shared_external_data(onnx.load(src / "inline.onnx"), dst, alignment)


def _undelay(src: Path, dst: Path, alignment: int) -> object:
    return undelay_initializers(src / "delayed.onnx", dst, alignment=alignment)


WRITERS: dict[str, tuple[Writer, int]] = {  # writer, number of weights files it writes here
    "align-streaming": (_align(align_external_data_streaming, False), 1),
    "align-streaming-3-shards": (_align(align_external_data_streaming, True), 3),
    "align-in-memory-3-shards": (_align(align_external_data_in_memory, True), 3),
    "shared-save": (_shared, 1),
    "undelay": (_undelay, 1),
}


def in_child(call: Callable[[], object], kill_at: int | None, *, exchange: bool = True) -> int:
    """Run ``call`` in a forked child, SIGKILLed before the ``kill_at``-th system call of its publication.

    Returns how many such calls the child made (read back through a pipe) when it was not killed, else -1.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            count = 0

            def hook(_name: str) -> None:
                nonlocal count
                count += 1
                if count == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

            real_publish = publish.OutputTransaction.publish

            def counted_publish(self: publish.OutputTransaction, *args: object, **kwargs: object) -> object:
                publish.before_syscall = hook
                try:
                    return real_publish(self, *args, **kwargs)  # type: ignore[arg-type]
                finally:
                    publish.before_syscall = None

            publish.OutputTransaction.publish = counted_publish  # type: ignore[method-assign]
            if not exchange:  # as on a kernel, libc or filesystem without renameat2(RENAME_EXCHANGE)
                publish._renameat2 = None
            call()
            os.write(write_end, str(count).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        _, status = os.waitpid(pid, 0)
        reported = os.read(read_end, 64)
    finally:
        os.close(read_end)
    if kill_at is None:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the writer failed (status {status})"
        return int(reported)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed (status {status})"
    return -1


def computed(model_path: Path) -> Values:
    """What the model at ``model_path`` computes, after onnx's loader, its full checker and a link-count check."""
    onnx.load(str(model_path))  # loads the external data: refuses symlinks and hard-linked files
    onnx.checker.check_model(str(model_path), full_check=True)
    for location in {
        e.value
        for t in onnx.load(str(model_path), load_external_data=False).graph.initializer
        for e in t.external_data
        if e.key == "location"
    }:
        assert os.stat(model_path.parent / location).st_nlink == 1, f"{location} has several links"
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return {name.removeprefix("out_"): value for name, value in zip(names, session.run(None, {}), strict=True)}


def loaded(model_path: Path) -> Values:
    """The initializers onnx's loader reads (a cheaper check than :func:`computed`, for the recovery runs)."""
    model = onnx.load(str(model_path))
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}


def same(first: Values, second: Values) -> bool:
    return first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


@dataclass
class Scenario:
    writer: Writer
    weights_files: int
    old_src: Path
    new_src: Path
    previous: Path | None  # a folder holding the previous output, copied before each kill


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kill_sources")
    write_source(root / "old", values(1))
    write_source(root / "new", values(2))
    return root / "old", root / "new"


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs under ``tmp_path`` (unmounted at the end, whatever happens), else ``tmp_path`` itself."""
    target = tmp_path / "tmpfs"
    target.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target)], capture_output=True, check=False
    )
    if mount.returncode != 0:
        yield tmp_path
        return
    try:
        yield target
    finally:
        if subprocess.run(["umount", str(target)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=True)


# The in-memory aligner with one weights file publishes exactly as the streaming one (same transaction, same files):
# it runs with three. Without RENAME_EXCHANGE, the three-file re-publication (the longest sequence) runs again.
SCENARIOS = [
    *((name, over, True) for name in WRITERS for over in ("previous-output", "empty-destination")),
    ("align-streaming-3-shards", "previous-output", False),
]


@pytest.mark.parametrize(
    ("name", "over", "exchange"),
    SCENARIOS,
    ids=[f"{name}-{over}{'' if exchange else '-no-exchange'}" for name, over, exchange in SCENARIOS],
)
def test_a_kill_at_any_system_call_of_the_publication_leaves_the_previous_or_the_new_model(
    work: Path, sources: tuple[Path, Path], name: str, over: str, exchange: bool
) -> None:
    tmp_path = work
    writer, weights_files = WRITERS[name]
    old_src, new_src = sources
    old, new = values(1), values(2)
    template = tmp_path / "template"
    template.mkdir()
    if over == "previous-output":
        writer(old_src, template / "out.onnx", OLD_ALIGNMENT)
        assert same(computed(template / "out.onnx"), old)
    previous_names = sorted(p.name for p in template.iterdir())

    reference = tmp_path / "reference"
    shutil.copytree(template, reference)
    calls = in_child(lambda: writer(new_src, reference / "out.onnx", NEW_ALIGNMENT), None, exchange=exchange)
    assert same(computed(reference / "out.onnx"), new)
    assert_no_temp_files(reference)
    final_names = sorted(p.name for p in reference.iterdir())
    assert len(final_names) == 1 + weights_files
    assert calls > 5 * weights_files  # the seam sees the publication (a few calls per file at least)

    outcomes = {"previous": 0, "new": 0, "absent": 0}
    for kill_at in range(1, calls + 1):
        dst = tmp_path / f"k{kill_at}"
        shutil.copytree(template, dst)
        in_child(lambda dst=dst: writer(new_src, dst / "out.onnx", NEW_ALIGNMENT), kill_at, exchange=exchange)

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

        # The next run is the recovery: it publishes, computes the new values and leaves nothing of the killed run.
        writer(new_src, dst / "out.onnx", NEW_ALIGNMENT)
        assert same(loaded(dst / "out.onnx"), new)
        assert sorted(p.name for p in dst.iterdir()) == final_names
        assert_no_temp_files(dst)
        shutil.rmtree(dst)

    print(f"{name} over {over}, exchange={exchange}: {calls} kill points, outcomes {outcomes}")
    # Both outcomes happen: the kills straddle the commit.
    assert outcomes["new"] > 0 and outcomes["previous" if over == "previous-output" else "absent"] > 0, outcomes
