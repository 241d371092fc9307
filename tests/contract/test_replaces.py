"""``PlannedFile.replaces``: rule 3 by a writer's evidence. A writer that showed an existing file is its own (``run``'s
record of what it wrote, the ``config.json`` the caller named) names that file's identity; the contract lets it
replace that very file, and no other put at the name since."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onnx_light_ref.errors import ExistingFileError
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._write.contract import PlannedFile, WritePlan
from onnx_light_ref.io._write.execute import execute


def _identity(path: Path) -> FileIdentity:
    st = os.stat(path)
    return FileIdentity(st.st_dev, st.st_ino)


def _plan(path: Path, replaces: FileIdentity | None) -> WritePlan:
    data = b'{"new": true}\n'
    planned = PlannedFile(str(path), "data", len(data), writes=[(0, data)], format="json", replaces=replaces)
    return WritePlan("test", [], [planned])


def test_the_file_the_writer_vouches_for_is_replaced_without_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.write_text("{}")
    execute(_plan(target, _identity(target)), lambda _: None)
    assert target.read_text() == '{"new": true}\n'


def test_another_file_at_that_name_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.write_text("{}")
    vouched = _identity(target)
    other = tmp_path / "other.json"
    other.write_text('{"the user": "s"}')
    other.replace(target)  # another file now holds the name
    with pytest.raises(ExistingFileError, match=r"output file .*config\.json' exists"):
        execute(_plan(target, vouched), lambda _: None)
    assert target.read_text() == '{"the user": "s"}'
    with pytest.raises(ExistingFileError):
        execute(_plan(target, None), lambda _: None)  # no evidence: rule 3 as ever
