"""The backend's prepared model owns the descriptors of the op it binds, and releases them.

``DelayedInitializerBackend.prepare(model, base_dir=d)`` binds ``DelayedInitializer`` to ``d``: the bound class holds
the folder's descriptor and, in file mode, each weights file. A class lives in reference cycles, so before the rep
closed it, every prepare left those descriptors open until the cyclic garbage collector ran (never, with it off: a
harness preparing thousands of cases ran out of descriptors). 40 prepare/run cycles with the collector off must end
with the descriptors they started with, whether the rep is closed, used in ``with``, or just dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref.backend import DelayedInitializerBackend
from onnx_light_ref.backend._backend import DelayedInitializerBackendRep
from tests.ops.kernel_support import delayed_model, delayed_node, no_garbage_collection, open_descriptors

CYCLES = 40
VALUES = np.array([1.5, -2.0, 3.25, 0.0], dtype="<f4")


def _model(folder: Path, load_device: str) -> onnx.ModelProto:
    (folder / "weights.bin").write_bytes(VALUES.tobytes())
    model = delayed_model(delayed_node("weights.bin", load_device))
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4]))
    model.ir_version = 10
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    return model


def _cycle(folder: Path, model: onnx.ModelProto, how: str) -> None:
    if how == "run_model":
        (value,) = DelayedInitializerBackend.run_model(model, [], base_dir=folder)
        np.testing.assert_array_equal(value, VALUES)
        return
    if how == "run_node":
        (value,) = DelayedInitializerBackend.run_node(model.graph.node[0], [], base_dir=folder)
        np.testing.assert_array_equal(value, VALUES)
        return
    source = folder / "model.onnx" if how == "path" else model
    rep = DelayedInitializerBackend.prepare(source, base_dir=None if how == "path" else folder)
    if how == "with":
        with rep:
            np.testing.assert_array_equal(rep.run([])[0], VALUES)
        assert rep.closed
        return
    np.testing.assert_array_equal(rep.run([])[0], VALUES)
    if how == "close":
        rep.close()
        rep.close()  # idempotent
    # "dropped", "path": the last reference goes here


@pytest.mark.parametrize("load_device", ["file", "cpu"])
@pytest.mark.parametrize("how", ["close", "with", "dropped", "path", "run_model", "run_node"])
def test_prepare_and_run_leak_no_descriptor_with_the_collector_off(tmp_path: Path, how: str, load_device: str) -> None:
    model = _model(tmp_path, load_device)
    _cycle(tmp_path, model, how)  # imports and first-use caches, outside the count
    with no_garbage_collection():
        before = open_descriptors()
        for _ in range(CYCLES):
            _cycle(tmp_path, model, how)
        assert open_descriptors() == before


def test_a_closed_rep_refuses_to_run_and_its_op_is_closed(tmp_path: Path) -> None:
    rep = DelayedInitializerBackend.prepare(_model(tmp_path, "file"), base_dir=tmp_path)
    assert isinstance(rep, DelayedInitializerBackendRep) and not rep.closed
    rep.close()
    assert rep.closed
    with pytest.raises(
        ValueError, match=r"this prepared model was closed \(close\(\), or the end of its 'with' block\)"
    ):
        rep.run([])


def test_a_prepare_that_fails_releases_the_folder_it_bound(tmp_path: Path) -> None:
    """The evaluator's construction fails (the weights file is too short): the bound op is closed at once."""
    model = _model(tmp_path, "cpu")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 3)
    with no_garbage_collection():
        before = open_descriptors()
        for _ in range(CYCLES):
            with pytest.raises(ValueError, match="too short: needs 16 bytes"):
                DelayedInitializerBackend.prepare(model, base_dir=tmp_path)
        assert open_descriptors() == before


def test_the_unbound_rep_still_runs_and_closes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a folder the op is the unbound one (it owns nothing); close() still ends the rep."""
    model = _model(tmp_path, "file")
    monkeypatch.chdir(tmp_path)
    with no_garbage_collection():
        before = open_descriptors()
        for _ in range(CYCLES):
            with DelayedInitializerBackend.prepare(model) as rep:
                np.testing.assert_array_equal(rep.run([])[0], VALUES)
        assert open_descriptors() == before
