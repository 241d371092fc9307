"""What ``allow_outside_folder`` / ``--allow-outside-folder`` does, as its docstring and help now say it.

``reference_evaluator``'s docstring said "Relative names stay confined either way" and ``run``'s help spoke of
absolute names only; with the opt-in, a relative ``filename`` (or ``location``) that is a symbolic link inside the
folder reads a file outside it (what ``docs/delayed_initializer.md`` describes). Each statement of the texts is
checked here against the code: without the opt-in such a link is refused before anything is read or written; with
it, its target's bytes are read, and ``..`` stays refused.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_light_ref._cli import main
from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.ops import reference_evaluator
from onnx_light_ref.ops._schema import make_delayed_initializer_node
from tests.checks import sha256_of_tree

SECRET = np.array([6.0, 7.0, 8.0], dtype=np.float32)


def layout(tmp_path: Path, filename: str, kind: str) -> Path:
    """``model/m.onnx`` whose tensor ``y`` is read from ``filename`` (a DelayedInitializer node, or an external
    initializer); ``model/link.bin`` is a symbolic link to ``outside/secret.bin``."""
    (tmp_path / "model").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(SECRET.tobytes())
    (tmp_path / "model" / "link.bin").symlink_to("../outside/secret.bin")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    if kind == "node":
        node = make_delayed_initializer_node(
            "y", shape=[3], dtype=TensorProto.FLOAT, load_device="file", filename=filename, offset=0
        )
        graph = helper.make_graph([node], "g", [], [y])
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("ai.rt", 1)]
    else:
        tensor = TensorProto(name="y", data_type=TensorProto.FLOAT, dims=[3], data_location=TensorProto.EXTERNAL)
        for key, value in (("location", filename), ("offset", "0"), ("length", "12")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        graph = helper.make_graph([], "g", [], [y], [tensor])
        opsets = [helper.make_opsetid("", 18)]
    path = tmp_path / "model" / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))
    return path


def help_text(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(out.getvalue().split())


def test_the_texts_say_a_relative_symbolic_link_reads_outside_the_folder():
    doc = " ".join(inspect.getdoc(reference_evaluator).split())  # type: ignore[arg-type]
    assert "Relative names stay confined" not in doc
    assert "a relative name that is a symbolic link in the folder reads the file it points to, wherever it is" in doc
    for command in ("run", "undelay"):
        text = help_text(command)
        assert "--allow-outside-folder trust" in text
        assert (
            "a relative name that is a symbolic link in the folder reads the file it points to, wherever it is" in text
        )
        assert "'..' stays refused" in text


@pytest.mark.parametrize("load_device", ["file", "cpu"])
@pytest.mark.parametrize("kind", ["node", "location"])
def test_reference_evaluator_reads_through_a_relative_link_only_with_the_opt_in(tmp_path, kind, load_device):
    path = layout(tmp_path, "link.bin", kind)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError, match=r"'link\.bin'.*is a symbolic link or goes through one"):
        reference_evaluator(path, load_device)
    with reference_evaluator(path, load_device, allow_outside_folder=True) as session:
        np.testing.assert_array_equal(session.run(None, {})[0], SECRET)  # the file outside the folder
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("kind", ["node", "location"])
def test_dotdot_stays_refused_with_the_opt_in(tmp_path, kind):
    path = layout(tmp_path, "../outside/secret.bin", kind)
    with pytest.raises(UnsafeLocationError, match=r"'\.\.'"):
        reference_evaluator(path, allow_outside_folder=True)


def test_run_reads_through_the_link_with_the_flag_and_refuses_it_without(tmp_path, capsys):
    path = layout(tmp_path, "link.bin", "node")
    before = sha256_of_tree(tmp_path)
    assert main(["run", str(path), "--output-dir", str(tmp_path / "out")]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "'link.bin'" in line and "is a symbolic link or goes through one" in line
    assert sha256_of_tree(tmp_path) == before  # no output folder either

    assert main(["run", str(path), "--output-dir", str(tmp_path / "out"), "--allow-outside-folder"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), SECRET)


def test_undelay_copies_the_links_target_with_the_flag_and_refuses_it_without(tmp_path, capsys):
    path = layout(tmp_path, "link.bin", "node")
    before = sha256_of_tree(tmp_path)
    assert main(["undelay", str(path), str(tmp_path / "out" / "m.onnx")]) == 1
    assert "is a symbolic link or goes through one" in capsys.readouterr().err
    assert sha256_of_tree(tmp_path) == before

    assert main(["undelay", str(path), str(tmp_path / "out" / "m.onnx"), "--allow-outside-folder"]) == 0
    assert (tmp_path / "out" / "m.onnx.data").read_bytes()[:12] == SECRET.tobytes()
