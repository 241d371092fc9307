"""The file validated is the file read; the unbound kernel's folder is the directory opened (issue 26, 2 and 3).

File mode recorded ``(st_dev, st_ino, st_size)``; ext4 hands a freed inode number out again at once, so ``rm w.bin``
plus a new same-size ``w.bin`` (tensors in the other order), or two atomic replacements in a row, kept the triple and
the next run returned A and B swapped. Now the kernel holds the validated file open (its inode cannot be reused) and
reads from it; a name that designates another file is refused, naming it. The unbound kernel cached the current
directory by its path string: a directory renamed away and a new one made at the same path read the old ``w.bin``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.io._read import folder as folder_module
from onnx_light_ref.ops import DelayedInitializer, reference_evaluator
from tests.models import identity_model, save_external
from tests.ops.kernel_support import delayed_model, delayed_node, no_garbage_collection, open_descriptors

A = np.array([1.0, 2.0], dtype="<f4")
B = np.array([3.0, 4.0], dtype="<f4")


def _two_nodes(filename: str) -> onnx.ModelProto:
    """Outputs ``a`` (bytes 0-7) and ``b`` (bytes 8-15) of one file."""
    return delayed_model(
        delayed_node(filename, "file", output="a", name="a", shape=(2,)),
        delayed_node(filename, "file", output="b", name="b", shape=(2,), offset=8),
    )


def _rm_and_rewrite(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _two_atomic_replacements(path: Path, data: bytes) -> None:
    for payload in (np.full(4, 9, "<f4").tobytes(), data):  # the second temp file gets the first one's inode back
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(payload)
        os.replace(tmp, path)


REPLACEMENTS = {"rm-then-same-size-write": _rm_and_rewrite, "two-atomic-replacements": _two_atomic_replacements}


def _evaluators(folder: Path, filename: str) -> dict[str, ReferenceEvaluator]:
    model = _two_nodes(filename)
    return {
        "bound": ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(folder)]),
        "bound-trusted": ReferenceEvaluator(
            model, new_ops=[DelayedInitializer.bind(folder, allow_outside_folder=True)]
        ),
        "unbound": ReferenceEvaluator(model, new_ops=[DelayedInitializer]),
    }


@pytest.mark.parametrize("opener", ["openat2", "walk"])
@pytest.mark.parametrize("replace", list(REPLACEMENTS))
@pytest.mark.parametrize("relative", [True, False])
def test_a_replaced_file_is_refused_never_read_through_old_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opener: str, replace: str, relative: bool
) -> None:
    monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "w.bin"
    weights.write_bytes(A.tobytes() + B.tobytes())
    validated = os.stat(weights).st_ino
    sessions = _evaluators(tmp_path, "w.bin" if relative else str(weights))
    for sess in sessions.values():
        a, b = sess.run(None, {})
        np.testing.assert_array_equal(a, A)
        np.testing.assert_array_equal(b, B)

    REPLACEMENTS[replace](weights, B.tobytes() + A.tobytes())  # same size, the tensors swapped

    assert os.stat(weights).st_ino != validated  # held open: its number cannot be handed to the new file
    for kind, sess in sessions.items():
        with pytest.raises(UnsafeLocationError, match=r"node 'a': file '.*w\.bin' was replaced after it was") as info:
            sess.run(None, {})
        assert "Build a new evaluator" in str(info.value), kind
    # What a user who wants the new weights does: a new evaluator reads the new file.
    for sess in _evaluators(tmp_path, "w.bin" if relative else str(weights)).values():
        a, b = sess.run(None, {})
        np.testing.assert_array_equal(a, B)
        np.testing.assert_array_equal(b, A)


@pytest.mark.parametrize("load_device", ["file", "cpu"])
@pytest.mark.parametrize("replace", list(REPLACEMENTS))
def test_reference_evaluator_refuses_a_replaced_weights_file(tmp_path: Path, load_device: str, replace: str) -> None:
    """The evaluator's converted initializers: file mode refuses the new file; cpu mode read the old one once."""
    model = identity_model({"A": A, "B": B})
    path = save_external(model, tmp_path / "m.onnx", location="w.data")
    sess = reference_evaluator(path, load_device)
    first = sess.run(None, {})
    weights = tmp_path / "w.data"
    data = weights.read_bytes()
    REPLACEMENTS[replace](weights, data[8:16] + data[:8] + data[16:])
    if load_device == "file":
        with pytest.raises(UnsafeLocationError, match="was replaced after it was validated"):
            sess.run(None, {})
    else:
        for got, expected in zip(sess.run(None, {}), first, strict=True):
            np.testing.assert_array_equal(got, expected)
    sess.close()


def test_a_file_rewritten_in_place_is_read_anew(tmp_path: Path) -> None:
    """The spec's file mode: the same file, same size, rewritten in place, is read at every run."""
    weights = tmp_path / "w.bin"
    weights.write_bytes(A.tobytes() + B.tobytes())
    sess = ReferenceEvaluator(_two_nodes("w.bin"), new_ops=[DelayedInitializer.bind(tmp_path)])
    with open(weights, "r+b") as data:
        data.write(B.tobytes() + A.tobytes())
    a, b = sess.run(None, {})
    np.testing.assert_array_equal(a, B)
    np.testing.assert_array_equal(b, A)


def test_the_bytes_come_from_the_held_file_even_if_the_name_changes_after_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replacement between the run's look-up and its read cannot hand over the new file's bytes."""
    weights = tmp_path / "w.bin"
    weights.write_bytes(A.tobytes() + B.tobytes())
    model = delayed_model(delayed_node("w.bin", "file", shape=(2,)))
    sess = ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(tmp_path)])
    real_stat_file = folder_module.ModelFolder.stat_file

    def replaced_right_after(self: folder_module.ModelFolder, location: str, **kwargs: object) -> os.stat_result:
        st = real_stat_file(self, location, **kwargs)  # type: ignore[arg-type]
        (tmp_path / "new.bin").write_bytes(B.tobytes() + A.tobytes())
        os.replace(tmp_path / "new.bin", weights)
        return st

    monkeypatch.setattr(folder_module.ModelFolder, "stat_file", replaced_right_after)
    np.testing.assert_array_equal(sess.run(None, {})[0], A)  # the validated file's bytes, not the new file's


def test_a_removed_file_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(A.tobytes() + B.tobytes())
    sess = ReferenceEvaluator(_two_nodes("w.bin"), new_ops=[DelayedInitializer.bind(tmp_path)])
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="removed after it was validated; nothing was read"):
        sess.run(None, {})


def test_a_file_missing_at_construction_is_held_from_the_first_run_that_finds_it(tmp_path: Path) -> None:
    sess = ReferenceEvaluator(_two_nodes("late.bin"), new_ops=[DelayedInitializer.bind(tmp_path)])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sess.run(None, {})
    (tmp_path / "late.bin").write_bytes(A.tobytes() + B.tobytes())
    np.testing.assert_array_equal(sess.run(None, {})[0], A)
    _rm_and_rewrite(tmp_path / "late.bin", B.tobytes() + A.tobytes())
    with pytest.raises(UnsafeLocationError, match="was replaced"):
        sess.run(None, {})


def test_the_cli_reads_the_file_of_its_own_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``run`` builds its evaluator for one run: a file replaced between two commands is simply the new file."""
    weights = tmp_path / "w.bin"
    weights.write_bytes(A.tobytes() + B.tobytes())
    onnx.save(_two_nodes("w.bin"), tmp_path / "m.onnx")
    for expected in (A, B):
        out = ["--output-dir", str(tmp_path / "out"), "--overwrite"]  # the second run replaces the first's outputs
        assert main(["run", str(tmp_path / "m.onnx"), *out]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / "out" / "a.npy"), expected)
        _rm_and_rewrite(weights, B.tobytes() + A.tobytes())
    capsys.readouterr()


# ----------------------------------------------------------------------------------------- section 3: the cwd


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_unbound_kernel_holds_the_directory_opened_not_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load_device: str
) -> None:
    """The issue's case: an evaluator alive in the old directory, the directory renamed away, a new one at its path."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "w.bin").write_bytes(np.full(4, 1.0, "<f4").tobytes())
    model = delayed_model(delayed_node("w.bin", load_device))
    monkeypatch.chdir(work)
    old = ReferenceEvaluator(model, new_ops=[DelayedInitializer])  # alive throughout
    os.rename(work, tmp_path / "moved")
    work.mkdir()
    (work / "w.bin").write_bytes(np.full(4, 2.0, "<f4").tobytes())

    # The process is still in the renamed directory: that one is current, and its file is read.
    np.testing.assert_array_equal(ReferenceEvaluator(model, new_ops=[DelayedInitializer]).run(None, {})[0], [1.0] * 4)
    monkeypatch.chdir(work)  # now built in the new directory (same path): the new directory's file
    np.testing.assert_array_equal(ReferenceEvaluator(model, new_ops=[DelayedInitializer]).run(None, {})[0], [2.0] * 4)
    np.testing.assert_array_equal(old.run(None, {})[0], [1.0] * 4)  # the first evaluator keeps its directory


def test_unbound_kernels_share_one_hold_per_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many nodes, many evaluators in one directory: one descriptor for the directory, one per distinct file."""
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    monkeypatch.chdir(tmp_path)
    nodes = [delayed_node("w.bin", "file", output=f"y{i}", name=f"n{i}") for i in range(20)]
    with no_garbage_collection():  # earlier tests' evaluators, freed meanwhile, would change the count
        before = open_descriptors()
        sessions = [ReferenceEvaluator(delayed_model(*nodes), new_ops=[DelayedInitializer]) for _ in range(3)]
        assert open_descriptors() - before == 2  # the current directory and w.bin
    for sess in sessions:
        assert len(sess.run(None, {})) == 20
