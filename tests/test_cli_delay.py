"""``onnx-light-ref delay SRC.onnx DST.onnx`` and ``write_delayed_model``: the writer contract's ``delay`` writer.

No weight byte is copied: DST.onnx's ``DelayedInitializer`` nodes (and the external initializers it keeps) read the
source's data files, named relative to DST.onnx's folder; a folder that cannot reach them is refused naming the node,
with nothing written. The rows of ``tests/contract/writers.py`` hold the contract's rules on its ``.onnx``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import reference_evaluator
from onnx_light_ref.errors import DestinationConflictError, UnsafeLocationError
from onnx_light_ref.ops import undelay_initializers, write_delayed_model
from tests.checks import run_onnxruntime, snapshot_tree, temp_files_under
from tests.cli_runner import run_cli
from tests.models import write_external_model

ARRAYS = {"a": np.arange(300, dtype=np.float32), "b": np.ones(50, dtype=np.float32)}


def _evaluate(path: Path) -> list[np.ndarray]:
    with reference_evaluator(str(path)) as evaluator:
        return [np.asarray(value) for value in evaluator.run(None, {})]


def _nodes(path: Path) -> dict[str, tuple[str, int]]:
    """Each DelayedInitializer node's output -> (filename, offset)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    found = {}
    for node in graph.node:
        if node.op_type == "DelayedInitializer":
            attributes = {a.name: a for a in node.attribute}
            found[node.output[0]] = (attributes["filename"].s.decode(), attributes["offset"].i)
    return found


def test_the_model_reads_the_sources_files_where_they_are(tmp_path: Path) -> None:
    source = write_external_model(tmp_path, ARRAYS)
    data = (tmp_path / "model.onnx.data").read_bytes()

    result = write_delayed_model(source, tmp_path / "delayed.onnx", "cpu", min_size=1024, durable=False)

    assert result.delayed_tensors == 1 and result.delayed_bytes == 1200
    assert result.data_files == (str(tmp_path / "model.onnx.data"),) and result.kept == {"below min_size": ("b",)}
    assert _nodes(tmp_path / "delayed.onnx") == {"a": ("model.onnx.data", 3)}  # after the 3 junk bytes
    for got, want in zip(_evaluate(tmp_path / "delayed.onnx"), ARRAYS.values(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert (tmp_path / "model.onnx.data").read_bytes() == data  # nothing copied, nothing changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["delayed.onnx", "model.onnx", "model.onnx.data"]


def test_a_destination_above_the_source_gets_relative_filenames(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    source = write_external_model(tmp_path / "export", ARRAYS)
    write_delayed_model(source, tmp_path / "delayed.onnx", min_size=1024, durable=False)
    assert _nodes(tmp_path / "delayed.onnx") == {"a": ("export/model.onnx.data", 3)}
    kept = onnx.load(str(tmp_path / "delayed.onnx"), load_external_data=False).graph.initializer
    assert [e.value for e in kept[0].external_data if e.key == "location"] == ["export/model.onnx.data"]
    for got, want in zip(_evaluate(tmp_path / "delayed.onnx"), ARRAYS.values(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_folder_that_cannot_reach_the_data_is_refused_naming_the_node(tmp_path: Path) -> None:
    source = write_external_model(tmp_path, ARRAYS)
    (tmp_path / "sub").mkdir()
    before = snapshot_tree(tmp_path)
    with pytest.raises(UnsafeLocationError) as raised:
        write_delayed_model(source, tmp_path / "sub" / "delayed.onnx")
    message = str(raised.value)
    assert (
        message.startswith("delay: DelayedInitializer node 'a' reads ") and str(tmp_path / "model.onnx.data") in message
    )
    assert "Write DST.onnx in the source's folder or a folder above it" in message
    assert message.endswith("nothing was written.") and "\n" not in message
    assert snapshot_tree(tmp_path) == before and temp_files_under(tmp_path) == []


def test_a_destination_that_is_the_sources_data_file_is_refused(tmp_path: Path) -> None:
    source = write_external_model(tmp_path, ARRAYS)
    (tmp_path / "delayed.onnx").symlink_to(tmp_path / "model.onnx.data")
    before = snapshot_tree(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(DestinationConflictError, match="writing it would destroy the source"):
            write_delayed_model(source, tmp_path / "delayed.onnx", overwrite=overwrite)
        assert snapshot_tree(tmp_path) == before


def test_the_source_can_be_delayed_in_place_and_undelayed_back(tmp_path: Path) -> None:
    source = write_external_model(tmp_path, ARRAYS)
    write_delayed_model(source, source, durable=False)
    assert set(_nodes(source)) == {"a", "b"}
    undelay_initializers(source, tmp_path / "back.onnx", durable=False)
    for got, want in zip(run_onnxruntime(tmp_path / "back.onnx", {}), ARRAYS.values(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_bad_arguments_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="load_device must be one of"):
        write_delayed_model(tmp_path / "absent.onnx", tmp_path / "d.onnx", "gpu")
    with pytest.raises(TypeError, match="overwrite"):
        write_delayed_model(tmp_path / "absent.onnx", tmp_path / "d.onnx", overwrite="yes")  # type: ignore[arg-type]


def test_the_command_writes_and_says_what_it_delayed_and_kept(tmp_path: Path) -> None:
    source = write_external_model(tmp_path, ARRAYS)
    done = run_cli("delay", str(source), str(tmp_path / "delayed.onnx"), "--min-size", "1K", "--load-device", "cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"wrote {tmp_path / 'delayed.onnx'}: 1 initializer(s) delayed (1200 bytes read from "
        f"{tmp_path / 'model.onnx.data'}, none copied)",
        "note: 1 kept as initializer(s) (below min_size): b",
    ]
    run = run_cli("run", str(tmp_path / "delayed.onnx"), "--output-dir", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "out_a.npy"), ARRAYS["a"])


def test_the_command_refuses_in_one_line_and_removes_the_folder_it_made(tmp_path: Path) -> None:
    source = write_external_model(tmp_path, ARRAYS)
    before = snapshot_tree(tmp_path)
    done = run_cli("delay", str(source), str(tmp_path / "new" / "delayed.onnx"))
    assert done.returncode == 1 and done.stderr.startswith("error: delay: DelayedInitializer node 'a' reads ")
    assert done.stderr.count("\n") == 1
    assert snapshot_tree(tmp_path) == before
