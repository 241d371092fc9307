"""Each backend test module gets its own system temporary directory for the seed cases' weights.

The two seed cases name their weights absolutely in ``tempfile.gettempdir()`` (onnx-light's cases do). Every module
here generates them and removes them when it ends; under pytest-xdist two modules on two workers would share
``/tmp/onnx_light_backend_delayedinitializer_*.bin`` and one module's cleanup would delete the files the other is
still reading. ``tempfile.tempdir`` (what ``gettempdir`` returns, ``TMPDIR`` honoured the same way) is pointed at a
folder of the module's own for its duration.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module", autouse=True)
def private_system_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("system-tmp")
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved


@pytest.fixture
def own_system_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A system temporary directory for one test: a test that writes or deletes the seed weights (to check what a
    refused run leaves) then never touches the files of the module's generated cases."""
    folder = tmp_path / "system-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder
