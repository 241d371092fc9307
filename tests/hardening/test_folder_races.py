"""Swap races against every reader of model-relative files: zero bytes from outside, zero raw ``OSError``.

A child process exchanges, as fast as it can, with ``renameat2(RENAME_EXCHANGE)`` (atomic, no moment where either
name is missing):

* ``folder``: the model's folder and a symbolic link to an outside folder laid out like it;
* ``subfolder``: the model's ``sub/`` and a symbolic link to the outside ``sub/``;
* ``file``: the weights file ``sub/w.bin`` and a symbolic link to the outside weights file.

Meanwhile each entry point runs again and again: the kernel (cpu mode, built anew each time; file mode, built once),
``reference_evaluator`` (file mode built once, cpu mode built anew), the streaming aligner, ``verify_models``,
``undelay_initializers`` and ``inspect``'s layout report. The outside weights hold a recognisable byte (``0x5A``) the
model's never do: every result is checked to hold the model's values only, and every failure must be one of the
package's typed errors (``ValueError`` subclasses) or ``FileNotFoundError``; any other ``OSError`` fails the test.
Both opener modes run (``openat2`` and the ``O_NOFOLLOW`` walk). The swap counts are printed (``-s`` shows them).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read import folder as folder_module
from onnx_light_ref.io._verify import verify_models
from onnx_light_ref.ops import DelayedInitializer, delay_initializers, reference_evaluator, undelay_initializers
from tests.models import identity_model, save_external, write_model

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "renameat2"),
    reason="renameat2(RENAME_EXCHANGE) is Linux (glibc >= 2.28) only",
)

N = 256  # float32 values of the one weight: 1 KiB
VALUES = np.arange(1, N + 1, dtype=np.float32)  # no byte 0x5A in any of them
SECRET = b"\x5a" * (N * 4)  # the outside weights: same size, so no size check gives the swap away
ITERATIONS = 15  # calls per test at least (8 entry points x 3 swaps x 2 opener modes)...
MIN_SWAPS = 100  # ...and more until the swapper made this many exchanges meanwhile (not a time: a count)
MAX_ITERATIONS = 5000  # a swapper that cannot run fails the test instead of looping forever

# The swapper: exchanges A and B in pairs (so it always stops in the original state) until SIGTERM, publishing its
# count of exchanges in the 8-byte file COUNTER after each pair. Plain Python + ctypes, started once per test.
_SWAPPER = r"""
import ctypes, mmap, os, signal, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
with open(sys.argv[3], "r+b") as f:
    counter = mmap.mmap(f.fileno(), 8)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
count = 0
sys.stdout.write("ready\n"); sys.stdout.flush()
while not stop:
    for _ in range(2):
        if libc.renameat2(-100, a, -100, b, 2) != 0:
            sys.stderr.write(f"renameat2: {os.strerror(ctypes.get_errno())}\n"); sys.exit(1)
        count += 1
    counter[:8] = struct.pack("<q", count)
sys.stdout.write(f"{count}\n")
"""

ALLOWED = (ValueError, FileNotFoundError)  # ExternalDataError, UnsafeLocationError, InvalidModelError are ValueErrors
SWAP_COUNTS: dict[str, int] = {}


@dataclass
class Tree:
    root: Path
    model: Path  # model/m.onnx: one external weight in sub/w.bin
    light: Path  # model/light.onnx: the same weight as a DelayedInitializer node reading sub/w.bin
    clean: Path  # clean/m.onnx: an untouched copy, the other side of verify
    out: Path  # where writers write


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    model_dir = tmp_path / "model"
    (model_dir / "sub").mkdir(parents=True)
    model = save_external(identity_model({"w": VALUES}), model_dir / "m.onnx", "sub/w.bin")
    light = write_model(model_dir / "light.onnx", delay_initializers(model, "file"))
    clean_dir = tmp_path / "clean"
    (clean_dir / "sub").mkdir(parents=True)
    clean = save_external(identity_model({"w": VALUES}), clean_dir / "m.onnx", "sub/w.bin")
    evil = tmp_path / "evil"
    (evil / "sub").mkdir(parents=True)
    (evil / "sub" / "w.bin").write_bytes(SECRET)
    (tmp_path / "folder_link").symlink_to(evil)
    (model_dir / "sub_link").symlink_to(evil / "sub")
    (model_dir / "sub" / "w_link").symlink_to(evil / "sub" / "w.bin")
    (tmp_path / "out").mkdir()
    return Tree(tmp_path, model, light, clean, tmp_path / "out")


def _swap_pair(tree: Tree, kind: str) -> tuple[Path, Path]:
    return {
        "folder": (tree.root / "model", tree.root / "folder_link"),
        "subfolder": (tree.root / "model" / "sub", tree.root / "model" / "sub_link"),
        "file": (tree.root / "model" / "sub" / "w.bin", tree.root / "model" / "sub" / "w_link"),
    }[kind]


@pytest.fixture(params=["openat2", "walk"])
def opener(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(folder_module.PROBE, "force_walk", request.param == "walk")
    assert folder_module.openat2_available() == (request.param == "openat2")
    return str(request.param)


@pytest.fixture(params=["folder", "subfolder", "file"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Swapping:
    """Runs the swapper child for the duration of a ``with`` block; ``count`` is its number of exchanges."""

    def __init__(self, a: Path, b: Path, counter: Path) -> None:
        self.a, self.b = a, b
        self.count = 0
        counter.write_bytes(bytes(8))
        self._counter_path = counter

    def swaps_so_far(self) -> int:
        return int(struct.unpack("<q", self._counter[:8])[0])

    def __enter__(self) -> Swapping:
        with open(self._counter_path, "r+b") as f:
            self._counter = mmap.mmap(f.fileno(), 8)
        self.child = subprocess.Popen(
            [sys.executable, "-c", _SWAPPER, str(self.a), str(self.b), str(self._counter_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.child.stdout is not None
        assert self.child.stdout.readline() == "ready\n"
        return self

    def __exit__(self, *exc: object) -> None:
        self.child.send_signal(signal.SIGTERM)
        out, err = self.child.communicate(timeout=60)
        assert self.child.returncode == 0, err
        self.count = int(out.strip())
        self._counter.close()


def _check_values(values: np.ndarray) -> None:
    assert values.tobytes() == VALUES.tobytes(), "read bytes that are not the model's (from outside the folder?)"


def _check_weights_file(path: Path) -> None:
    data = path.read_bytes()
    assert b"\x5a\x5a\x5a\x5a" not in data, f"{path} holds bytes from outside the model's folder"
    assert VALUES.tobytes() in data


def _race(name: str, tree: Tree, kind: str, call: Callable[[], None]) -> None:
    """Run ``call`` ITERATIONS times while the swapper runs; allowed failures only; record the swap count."""
    outcomes = {"ok": 0, "refused": 0}
    a, b = _swap_pair(tree, kind)
    with Swapping(a, b, tree.root / "swap-counter") as swapping:
        calls = 0
        while calls < ITERATIONS or (swapping.swaps_so_far() < MIN_SWAPS and calls < MAX_ITERATIONS):
            calls += 1
            try:
                call()
            except ALLOWED:
                outcomes["refused"] += 1
            else:
                outcomes["ok"] += 1
    assert swapping.count >= MIN_SWAPS
    assert not (tree.root / "model").is_symlink() and (tree.root / "model" / "sub" / "w.bin").is_file()
    SWAP_COUNTS[f"{name}/{kind}"] = SWAP_COUNTS.get(f"{name}/{kind}", 0) + swapping.count
    print(f"{name} {kind}: {swapping.count} swaps, {outcomes}, total swaps so far {sum(SWAP_COUNTS.values())}")


def test_kernel_cpu_mode(tree: Tree, kind: str, opener: str) -> None:
    light = delay_initializers(tree.model, "cpu")
    # Bound once (bind() opens and holds the folder; binding a path while it names another folder would read that
    # folder, as the caller asked); each construction then reads through the held folder.
    bound = DelayedInitializer.bind(tree.model.parent)

    def call() -> None:
        sess = ReferenceEvaluator(light, new_ops=[bound])
        _check_values(sess.run(None, {})[0])

    _race("kernel-cpu", tree, kind, call)


def test_kernel_file_mode(tree: Tree, kind: str, opener: str) -> None:
    sess = ReferenceEvaluator(
        delay_initializers(tree.model, "file"), new_ops=[DelayedInitializer.bind(tree.model.parent)]
    )
    _race("kernel-file", tree, kind, lambda: _check_values(sess.run(None, {})[0]))


def test_evaluator_file_mode_built_once(tree: Tree, kind: str, opener: str) -> None:
    sess = reference_evaluator(tree.model, "file")
    _race("evaluator-file", tree, kind, lambda: _check_values(sess.run(None, {})[0]))


def test_evaluator_cpu_mode_built_each_time(tree: Tree, kind: str, opener: str) -> None:
    _race("evaluator-cpu", tree, kind, lambda: _check_values(reference_evaluator(tree.model, "cpu").run(None, {})[0]))


def test_align_streaming(tree: Tree, kind: str, opener: str) -> None:
    dst = tree.out / "a.onnx"

    def call() -> None:
        align_external_data_streaming(tree.model, dst, durable=False)
        _check_weights_file(tree.out / "a.onnx.data")

    _race("align", tree, kind, call)


def test_verify(tree: Tree, kind: str, opener: str) -> None:
    def call() -> None:
        result = verify_models(tree.model, tree.clean)
        assert result.equal, f"verify compared other bytes: {result.difference}"

    _race("verify", tree, kind, call)


def test_undelay(tree: Tree, kind: str, opener: str) -> None:
    def call() -> None:
        undelay_initializers(tree.light, tree.out / "u.onnx", durable=False)
        _check_weights_file(tree.out / "u.onnx.data")

    _race("undelay", tree, kind, call)


def test_inspect(tree: Tree, kind: str, opener: str) -> None:
    model_folder = str(tree.root / "model")

    def call() -> None:
        report = build_layout_report(tree.model)
        for file in report.files:
            # Named by the held folder's path and the location: never a path resolved outside the folder.
            assert file.path is None or file.path.startswith(model_folder + os.sep), file.path

    _race("inspect", tree, kind, call)


def test_no_raw_os_error_whatever_the_folder_becomes(tree: Tree, opener: str) -> None:
    """Issue 19: only typed errors or FileNotFoundError from the kernel and the evaluator, whatever the folder does."""
    sess = reference_evaluator(tree.model, "file")
    os.rename(tree.root / "model", tree.root / "gone")
    _check_values(sess.run(None, {})[0])  # the held folder is still readable under its new name
    with pytest.raises(FileNotFoundError):
        reference_evaluator(tree.model, "file")  # no folder under the old name
    weights = tree.root / "gone" / "sub" / "w.bin"
    weights.unlink()
    with pytest.raises(FileNotFoundError, match=r"'sub/w.bin' does not exist"):
        sess.run(None, {})
    os.mkfifo(weights)  # would block a plain open()
    with pytest.raises(ExternalDataError, match="not a regular file"):
        sess.run(None, {})
    weights.unlink()
    weights.mkdir()
    with pytest.raises(ExternalDataError, match="not a regular file"):
        sess.run(None, {})
    weights.rmdir()
    (tree.root / "gone" / "sub").rename(tree.root / "gone" / "sub.old")
    (tree.root / "gone" / "sub").write_bytes(b"a file where a folder was")
    with pytest.raises(FileNotFoundError):
        sess.run(None, {})
    os.unlink(tree.root / "gone" / "sub")
    os.symlink("/proc/self/root/etc", tree.root / "gone" / "sub")
    with pytest.raises(ExternalDataError, match="symbolic link"):
        sess.run(None, {})


@pytest.fixture(scope="module", autouse=True)
def _report_swaps() -> Iterator[None]:
    yield
    if SWAP_COUNTS:
        print(f"\nfolder races: {sum(SWAP_COUNTS.values())} swaps in total: {SWAP_COUNTS}")


def test_a_replaced_weights_file_is_a_typed_error_in_file_mode(tree: Tree) -> None:
    """The issue's [7, 7, 7, 7]: a file-mode evaluator must not read a replaced weights file through old offsets."""
    sess = reference_evaluator(tree.model, "file")
    replacement = tree.root / "model" / "sub" / "w.new"
    replacement.write_bytes(np.full(N, 7, dtype=np.float32).tobytes())
    os.replace(replacement, tree.root / "model" / "sub" / "w.bin")
    with pytest.raises(ExternalDataError, match=r"file 'sub/w.bin' was replaced after it was validated"):
        sess.run(None, {})
