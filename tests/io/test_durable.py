"""``durable=False`` on every writer: no fsync at all, the same bytes, still published from temp names.

Each writer runs twice on the same real source, once durable (the default) and once not, into two folders; the test
records every ``os.fsync`` (file or folder) and compares the two output trees byte for byte.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    save_model_with_shared_external_data,
)
from tests.checks import assert_no_temp_files
from tests.models import make_external_model
from tests.zoo import reference_tensors


def _streaming(src: Path, folder: Path, durable: bool) -> int:
    return align_external_data_streaming(src, folder / "out.onnx", alignment=64, durable=durable)


def _in_memory(src: Path, folder: Path, durable: bool) -> int:
    return align_external_data_in_memory(src, folder / "out.onnx", alignment=64, durable=durable)


def _shared(src: Path, folder: Path, durable: bool) -> int:
    # The variant is saved next to a copy of its source, so that its reused references resolve from there.
    for path in src.parent.iterdir():
        shutil.copyfile(path, folder / path.name)
    variant = onnx.load_model(str(src), load_external_data=False)
    variant.graph.initializer.append(numpy_helper.from_array(np.full(5, 7.0, np.float32), "n0"))
    return save_model_with_shared_external_data(variant, folder / "variant.onnx", 64, durable=durable, size_threshold=0)


WRITERS: dict[str, Callable[[Path, Path, bool], int]] = {
    "streaming": _streaming,
    "in_memory": _in_memory,
    "shared": _shared,
}


def _outputs(folder: Path) -> dict[str, bytes]:
    """The files a run wrote (the shared saver's folder also holds the copied source)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith(("out.", "variant."))}


@pytest.mark.parametrize("name", list(WRITERS))
def test_durable_false_skips_every_fsync_and_writes_the_same_bytes(tmp_path, monkeypatch, name):
    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", reference_tensors())
    synced: dict[bool, list[str]] = {True: [], False: []}
    real_fsync = os.fsync
    for durable in (True, False):
        folder = tmp_path / f"durable_{durable}"
        folder.mkdir()

        def recording_fsync(fd: int, calls: list[str] = synced[durable]) -> None:
            calls.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", recording_fsync)
        WRITERS[name](src, folder, durable)
        monkeypatch.setattr(os, "fsync", real_fsync)

    assert synced[False] == []
    # weights file, .onnx, their folder before the commit (the weights' name) and after it (the .onnx's)
    assert sorted(synced[True]) == ["file", "file", "folder", "folder"]
    durable_files = _outputs(tmp_path / "durable_True")
    assert len(durable_files) == 2
    assert _outputs(tmp_path / "durable_False") == durable_files
    assert_no_temp_files(tmp_path)


@pytest.mark.parametrize("name", list(WRITERS))
def test_durable_false_still_publishes_from_temp_names(tmp_path, monkeypatch, name):
    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", reference_tensors())
    (tmp_path / "out").mkdir()
    renamed: list[str] = []
    real_replace = os.replace

    def recording_replace(source: str, destination: str) -> None:
        renamed.append(Path(source).name)
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", recording_replace)

    WRITERS[name](src, tmp_path / "out", False)

    assert len(renamed) == 2
    assert all(n.startswith(".") and n.endswith(".tmp") for n in renamed), renamed
