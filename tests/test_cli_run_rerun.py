"""``run`` repeats itself: a rerun replaces the outputs a previous ``run`` wrote in its folder, without
``--overwrite``, and still refuses every other file at an output name (a user's own ``y.npy``, even of the model
output's dtype and shape; one of ours changed since). The evidence is ``.onnx-light-ref-run.json``, written with the
outputs (``onnx_light_ref/_commands/run_record.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.io._write import publish
from tests.checks import snapshot_tree, temp_files_under
from tests.test_cli_run import one_error_line, run_cli, save_linear_model

RECORD = ".onnx-light-ref-run.json"


def _scene(tmp_path: Path) -> tuple[Path, str, np.ndarray]:
    path = save_linear_model(tmp_path)
    x = np.ones((2, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    return path, f"x={tmp_path / 'x.npy'}", ReferenceEvaluator(str(path)).run(None, {"x": x})[0]


def test_the_same_command_twice_replaces_its_own_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, feed, expected = _scene(tmp_path)
    out = tmp_path / "out"
    assert run_cli(path, out, feed) == 0
    first = (out / "y.npy").stat().st_ino

    assert run_cli(path, out, feed) == 0, capsys.readouterr().err

    np.testing.assert_array_equal(np.load(out / "y.npy"), expected)
    assert (out / "y.npy").stat().st_ino != first  # a new file, published as the first one was
    record = json.loads((out / RECORD).read_text())
    assert sorted(record["files"]) == ["w_sum.npy", "y.npy"]
    assert record["files"]["y.npy"]["size"] == (out / "y.npy").stat().st_size
    assert temp_files_under(tmp_path) == []


@pytest.mark.parametrize("whose", ["the user's expected output", "ours, edited since"])
def test_a_file_at_an_output_name_run_did_not_write_is_still_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], whose: str
) -> None:
    """The planned name, a valid .npy, the output's dtype and shape: a reference output saved to compare with, or
    one of ours the user changed; neither matches the record."""
    path, feed, expected = _scene(tmp_path)
    out = tmp_path / "out"
    if whose == "ours, edited since":
        assert run_cli(path, out, feed) == 0
    out.mkdir(exist_ok=True)
    np.save(out / "y.npy", expected + 1)
    before = snapshot_tree(tmp_path)
    capsys.readouterr()

    assert run_cli(path, out, feed) == 1

    one_error_line(capsys, f"output file {str(out / 'y.npy')!r} exists")
    assert snapshot_tree(tmp_path) == before


def test_the_command_line_message_gives_the_command_line_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, feed, _ = _scene(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "y.npy").write_bytes(b"mine")
    capsys.readouterr()
    assert run_cli(path, out, feed) == 1
    err = capsys.readouterr().err
    assert "or pass --overwrite to replace it; nothing was written." in err and "overwrite=True" not in err
    assert run_cli(path, out, feed, extra=("--overwrite",)) == 0
    assert run_cli(path, out, feed) == 0  # recorded now: the next rerun needs nothing


def test_each_models_outputs_are_remembered_in_a_shared_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, feed, _ = _scene(tmp_path)
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["z"])],
        "second",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 8])],
    )
    second = tmp_path / "second.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(second))
    out = tmp_path / "out"
    for model in (path, second, path, second):  # each rerun recognises its own outputs, the other's are kept
        assert run_cli(model, out, feed) == 0, capsys.readouterr().err
    assert sorted(json.loads((out / RECORD).read_text())["files"]) == ["w_sum.npy", "y.npy", "z.npy"]
    np.testing.assert_array_equal(np.load(out / "z.npy"), -np.ones((2, 8), dtype=np.float32))


def test_a_foreign_file_at_the_record_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, feed, _ = _scene(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / RECORD).write_text('{"another tool": "state"}')
    before = snapshot_tree(tmp_path)
    capsys.readouterr()
    assert run_cli(path, out, feed) == 1
    one_error_line(capsys, f"output file {str(out / RECORD)!r} exists")
    assert snapshot_tree(tmp_path) == before


def test_an_output_edited_in_place_while_the_model_ran_is_refused_under_the_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, feed, expected = _scene(tmp_path)
    out = tmp_path / "out"
    assert run_cli(path, out, feed) == 0
    real_publish = publish.OutputTransaction.publish

    def edit_then_publish(self: publish.OutputTransaction, *args: object, **kwargs: object) -> object:
        with open(out / "y.npy", "r+b") as file:  # same file, other bytes
            file.seek(-4, os.SEEK_END)
            file.write(b"\0\0\0\0")
        return real_publish(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(publish.OutputTransaction, "publish", edit_then_publish)
    capsys.readouterr()
    assert run_cli(path, out, feed) == 1
    one_error_line(capsys, "changed since this run recognised it as one a previous run wrote")
    assert np.load(out / "y.npy")[-1, -1] == 0 and temp_files_under(tmp_path) == []
    np.testing.assert_array_equal(np.load(out / "y.npy")[0], expected[0])
