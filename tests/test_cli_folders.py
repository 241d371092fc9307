"""``commands.folders``: the writing commands create missing destination folders and remove them after a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnx_light_ref._commands.folders import FolderError, make_folders, remove_created_folders
from tests.checks import snapshot_tree


def test_missing_folders_are_created_with_their_parents_and_listed_deepest_first(tmp_path: Path) -> None:
    (tmp_path / "exists").mkdir()

    created = make_folders([tmp_path / "a" / "b", tmp_path / "exists", tmp_path / "a" / "b" / "c" / "d"])

    assert created == [str(tmp_path / path) for path in ("a/b/c/d", "a/b/c", "a/b", "a")]
    assert (tmp_path / "a" / "b" / "c" / "d").is_dir()
    remove_created_folders(created)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]


def test_a_folder_under_a_file_removes_what_the_call_created_and_names_the_folder(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_bytes(b"not a folder")
    before = snapshot_tree(tmp_path)

    with pytest.raises(FolderError) as raised:
        make_folders([tmp_path / "new" / "a", tmp_path / "blocker" / "sub"])

    assert str(raised.value) == f"cannot create the folder {str(tmp_path / 'blocker' / 'sub')!r}: Not a directory"
    assert isinstance(raised.value, OSError)  # caught as such by every command
    assert snapshot_tree(tmp_path) == before


def test_only_empty_folders_are_removed(tmp_path: Path) -> None:
    created = make_folders([tmp_path / "a" / "b"])
    (tmp_path / "a" / "b" / "written-by-someone").write_bytes(b"keep")

    remove_created_folders(created)

    assert (tmp_path / "a" / "b" / "written-by-someone").read_bytes() == b"keep"
