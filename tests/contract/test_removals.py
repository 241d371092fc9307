"""Files a writer asks to delete once its models are published (an earlier layout's: ``--delete-stale``).

They go through the same guard as the outputs: only a regular file the destination owns (rule 3), that no other
model can reach and reference (rule 1) and that the job does not read is removed, after the commit, under the folder
lock; any other stays, with a warning naming why. A removal that fails after the commit is reported as such.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from onnx_light_ref.errors import PublishedWithErrorsError
from onnx_light_ref.io._plan.sites import SITE_EXTERNALIZED
from onnx_light_ref.io._write.contract import PlannedFile, PlannedModel, WritePlan
from onnx_light_ref.io._write.execute import execute
from tests.contract.recorded import recorded
from tests.contract.sharers import external_model
from tests.models import identity_model, write_model

PAYLOAD = np.arange(4, dtype=np.float32)


def _plan(folder: Path, removals: list[Path]) -> WritePlan:
    model = identity_model([numpy_helper.from_array(PAYLOAD, "w")])
    sites = recorded(model, (SITE_EXTERNALIZED, str(folder / "m.onnx.data"), 0, PAYLOAD.nbytes))
    weights = PlannedFile(str(folder / "m.onnx.data"), "weights", PAYLOAD.nbytes, writes=[(0, PAYLOAD.tobytes())])
    plan = WritePlan("test", [PlannedModel(str(folder / "m.onnx"), model, sites, 0)], [weights])
    plan.removals = [str(path) for path in removals]
    return plan


def test_the_earlier_files_the_destination_owns_and_nobody_uses_go_after_the_commit(tmp_path: Path) -> None:
    for name in ("m.onnx.data.1", "m.onnx.data.2", "users.bin", "other.bin"):
        (tmp_path / name).write_bytes(b"earlier")
    write_model(tmp_path / "variant.onnx", external_model("m.onnx.data.2"))  # a variant still reads that shard

    execute(_plan(tmp_path, [tmp_path / n for n in ("m.onnx.data.1", "m.onnx.data.2", "other.bin")]), lambda _: None)

    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["m.onnx", "m.onnx.data", "m.onnx.data.2", "other.bin", "users.bin", "variant.onnx"]


def test_a_file_kept_is_named_with_the_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "x.bin").write_bytes(b"the user's")
    with caplog.at_level(logging.WARNING):
        execute(_plan(tmp_path, [tmp_path / "x.bin", tmp_path / "absent.bin"]), lambda _: None)
    assert (tmp_path / "x.bin").read_bytes() == b"the user's"
    assert f"kept the earlier file {tmp_path / 'x.bin'} (the destination does not own it)" in caplog.text


def test_a_removal_that_fails_after_the_commit_is_published_with_errors(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "m.onnx.data.1").write_bytes(b"earlier")
    real_unlink = os.unlink

    def unlink(path: object, *args: object, **kwargs: object) -> None:
        if str(path).endswith("m.onnx.data.1"):
            raise OSError(errno.EIO, "unlink failed (injected)")
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(PublishedWithErrorsError, match=r"removing the earlier file .*m\.onnx\.data\.1' failed"):
        execute(_plan(tmp_path, [tmp_path / "m.onnx.data.1"]), lambda _: "result")
    assert (tmp_path / "m.onnx").exists() and (tmp_path / "m.onnx.data.1").exists()
