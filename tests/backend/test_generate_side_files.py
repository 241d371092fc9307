"""``generate`` publishes each case's weights file: temp file beside it, fsync, rename, never through a symbolic link.

The seed cases name their weights absolutely in the system temporary directory, a folder other users can write to.
They used to be removed and written again in place (a window with no file, a torn file after a crash, no fsync).
Now each one is a staged file of the package's publisher: a symbolic link planted at the seed path is replaced (its
target keeps its bytes), an existing file is replaced by a rename (a reader holding it keeps the previous bytes),
and a failure before the rename leaves the previous file and no temp file.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref.backend import generate, seed_weights_paths
from onnx_light_ref.io._write import publish
from tests.checks import sha256_of_tree

EXPECTED = [np.array([3, 4, 5], dtype="<f4").tobytes(), bytes(8) + np.array([1.5, -2.0], dtype="<f4").tobytes()]


def _hidden_leftovers(folder: str) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.mark.usefixtures("own_system_temp_dir")
def test_a_symbolic_link_planted_at_a_seed_path_is_replaced_and_its_target_untouched(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = [outside / "victim_cpu.bin", outside / "victim_file.bin"]
    for victim, path in zip(victims, seed_weights_paths(), strict=True):
        victim.write_bytes(b"the user's own bytes, never to be overwritten")
        os.symlink(victim, path)
    before = sha256_of_tree(outside)

    generate(tmp_path / "out")

    assert sha256_of_tree(outside) == before
    for path, expected in zip(seed_weights_paths(), EXPECTED, strict=True):
        assert not os.path.islink(path)
        assert Path(path).read_bytes() == expected
    assert _hidden_leftovers(os.path.dirname(seed_weights_paths()[0])) == []


@pytest.mark.usefixtures("own_system_temp_dir")
def test_an_existing_seed_file_is_replaced_by_a_rename_not_rewritten(tmp_path: Path) -> None:
    """A hard link to the previous file (what a reader holding it sees) keeps the previous bytes: a new inode."""
    held = []
    for index, path in enumerate(seed_weights_paths()):
        Path(path).write_bytes(b"previous bytes, longer than the new payload")
        os.link(path, tmp_path / f"held_{index}")
        held.append(os.stat(path).st_ino)

    generate(tmp_path / "out")

    for index, (path, expected) in enumerate(zip(seed_weights_paths(), EXPECTED, strict=True)):
        assert Path(path).read_bytes() == expected
        assert os.stat(path).st_ino != held[index]
        assert (tmp_path / f"held_{index}").read_bytes() == b"previous bytes, longer than the new payload"
        assert os.stat(path).st_nlink == 1
    assert _hidden_leftovers(os.path.dirname(seed_weights_paths()[0])) == []


@pytest.mark.usefixtures("own_system_temp_dir")
def test_each_seed_file_is_written_fsynced_then_renamed_and_its_folder_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(publish, "before_syscall", calls.append)
    generate(tmp_path / "out")
    for _ in seed_weights_paths():
        write = calls.index("pwrite")
        fsync = calls.index("fsync", write)
        rename = min(calls.index(name, fsync) for name in ("renameat2", "rename") if name in calls[fsync:])
        assert calls.index("fsync", rename) > rename  # the folder, after the rename
        calls = calls[rename + 1 :]


@pytest.mark.usefixtures("own_system_temp_dir")
@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_a_failed_rename_leaves_the_previous_seed_path_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"the user's own bytes")
    cpu_path = seed_weights_paths()[0]
    if planted == "symlink":
        os.symlink(victim, cpu_path)
    else:
        Path(cpu_path).write_bytes(b"previous bytes")
    folder = os.path.dirname(cpu_path)
    before = sha256_of_tree(folder)

    def fail_at_rename(name: str) -> None:
        if name in ("renameat2", "rename"):
            raise OSError(errno.EIO, "injected rename failure")

    monkeypatch.setattr(publish, "before_syscall", fail_at_rename)
    with pytest.raises(OSError, match="injected rename failure"):
        generate(tmp_path / "out")

    assert sha256_of_tree(folder) == before  # the link (or the file) as it was, nothing else
    assert victim.read_bytes() == b"the user's own bytes"
    assert _hidden_leftovers(folder) == []
