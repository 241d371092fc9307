"""``onnx-light-ref run`` writes only its outputs and prints only safe text (issue 19).

An output file that is a file the run reads (an input, the model, a weights file; by identity, also through hard
links and symlinks) is refused with one ``error:`` line, nothing written; names from the model reach the terminal
escaped; a tensor larger than the machine's memory (a sparse 8 TiB weights file) is one ``error:`` line, and
:class:`~onnx_light_ref.errors.TensorAllocationError` from the kernel.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref.errors import TensorAllocationError
from onnx_light_ref.ops import DelayedInitializer
from onnx_light_ref.ops._schema import make_delayed_initializer_node
from tests.checks import snapshot_tree, temp_files_under

OPSETS = [helper.make_opsetid("", 18), helper.make_opsetid("ai.rt", 1)]
TIB = 1024**4


def one_error_line(capsys: pytest.CaptureFixture[str], fragment: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in captured.err
    assert captured.out == ""
    return lines[0]


def add_model(folder: Path, output: str = "data", name: str = "model.onnx") -> Path:
    """``<output> = x + b`` with ``b`` = [10, 20] an external initializer in ``weights.bin``; returns the model path."""
    b = numpy_helper.from_array(np.array([10, 20], dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], [output])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [2])],
        [b],
    )
    path = folder / name
    model = helper.make_model(graph, opset_imports=OPSETS[:1], ir_version=10)
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


def delayed_model(folder: Path, output: str, filename: str, shape: list[int], load_device: str = "file") -> Path:
    node = make_delayed_initializer_node(
        output, shape=shape, dtype=TensorProto.FLOAT, load_device=load_device, filename=filename, offset=0, name="big"
    )
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)])
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=OPSETS, ir_version=10), str(path))
    return path


# ------------------------------------------------------------------------------- never overwrite a file it reads


def test_output_named_like_the_input_file_in_the_current_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--input x=data.npy``, an output named ``data``, default ``--output-dir .``: data.npy was replaced, exit 0."""
    model = add_model(tmp_path, output="data")
    np.save(tmp_path / "data.npy", np.array([1, 2], dtype=np.float32))
    monkeypatch.chdir(tmp_path)
    before = snapshot_tree(tmp_path)
    assert main(["run", str(model), "--input", "x=data.npy"]) == 1
    line = one_error_line(capsys, f"{str(tmp_path / 'data.npy')!r} is the file of --input 'x'")
    assert "nothing was written" in line
    assert snapshot_tree(tmp_path) == before


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_output_that_is_a_link_to_the_input_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], link: str
) -> None:
    model = add_model(tmp_path, output="y")
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    np.save(tmp_path / "in" / "x.npy", np.array([1, 2], dtype=np.float32))
    if link == "hard":
        os.link(tmp_path / "in" / "x.npy", tmp_path / "out" / "y.npy")
    else:
        (tmp_path / "out" / "y.npy").symlink_to(tmp_path / "in" / "x.npy")
    before = snapshot_tree(tmp_path)
    assert (
        main(["run", str(model), "--input", f"x={tmp_path / 'in' / 'x.npy'}", "--output-dir", str(tmp_path / "out")])
        == 1
    )
    one_error_line(capsys, "is the file of --input 'x' (the same file, a hard link of it or a symlink to it)")
    assert snapshot_tree(tmp_path) == before
    assert temp_files_under(tmp_path) == []


@pytest.mark.parametrize("target", ["weights", "model", "delayed-weights", "weights-via-symlink"])
def test_output_that_is_the_model_or_a_weights_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    np.save(tmp_path / "x.npy", np.array([1, 2], dtype=np.float32))
    out = tmp_path
    feeds = ["--input", f"x={tmp_path / 'x.npy'}"]
    if target == "weights":  # weights file "weights.bin" is no .npy: name the output so its file is the weights
        model = add_model(tmp_path, output="y")
        os.rename(tmp_path / "weights.bin", tmp_path / "y.npy")
        _relocate(model, "y.npy")
        fragment = "is the weights file of tensor 'b'"
    elif target == "model":
        model = add_model(tmp_path, output="m", name="m.npy")
        fragment = "is the model"
    elif target == "delayed-weights":
        np.array([1, 2], dtype="<f4").tofile(tmp_path / "w.npy")
        model = delayed_model(tmp_path, "w", "w.npy", [2])
        feeds = []
        fragment = "is the weights file of DelayedInitializer output 'w'"
    else:
        model = add_model(tmp_path, output="y")
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "y.npy").symlink_to(tmp_path / "weights.bin")
        out = tmp_path / "out"
        fragment = "is the weights file of tensor 'b'"
    before = snapshot_tree(tmp_path)
    assert main(["run", str(model), *feeds, "--output-dir", str(out)]) == 1
    one_error_line(capsys, fragment)
    assert snapshot_tree(tmp_path) == before


def _relocate(model_path: Path, location: str) -> None:
    model = onnx.load(str(model_path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, str(model_path))


def test_an_existing_output_file_is_replaced_only_with_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run owns no file that no previous run wrote (rule 3 of the writer contract): an existing ``y.npy`` is
    refused, named, before the model runs; ``--overwrite`` replaces it."""
    model = add_model(tmp_path, output="y")
    np.save(tmp_path / "x.npy", np.array([1, 2], dtype=np.float32))
    (tmp_path / "out").mkdir()
    np.save(tmp_path / "out" / "y.npy", np.zeros(2, dtype=np.float32))
    argv = ["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]
    before = snapshot_tree(tmp_path)
    assert main(argv) == 1
    line = one_error_line(capsys, f"output file {str(tmp_path / 'out' / 'y.npy')!r} exists")
    assert "--overwrite" in line and "nothing was written" in line
    assert snapshot_tree(tmp_path) == before
    assert main([*argv, "--overwrite"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), [11, 22])
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------------------------- printed text is safe

HOSTILE = "y\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\u202eevil"


def test_output_names_are_printed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """OSC 52 (clipboard write), clear-screen and a bidi override in an output name reached the terminal raw."""
    model = add_model(tmp_path, output=HOSTILE)
    np.save(tmp_path / "x.npy", np.array([1, 2], dtype=np.float32))
    assert main(["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "y\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\u202eevil: shape [2] dtype float32" in out
    assert all(line.isprintable() for line in out.splitlines())


def test_error_lines_are_printed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An onnx error quoting a hostile name raw (here: a missing DelayedInitializer file named by the model)."""
    model = delayed_model(tmp_path, HOSTILE, "absent\x1b[2J.bin", [2])
    assert main(["run", str(model), "--output-dir", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert captured.err.rstrip("\n").isprintable()
    assert "\\x1b[2J" in captured.err


# ---------------------------------------------------------------------------------- larger than the machine's memory


def sparse_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: 0 blocks on disk


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_8_tib_sparse_tensor_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], load_device: str
) -> None:
    """Every size check passes (file and shape agree); allocation raised an untyped MemoryError and 30 lines."""
    sparse_file(tmp_path / "huge.bin", 8 * TIB)
    model = delayed_model(tmp_path, "w", "huge.bin", [2 * TIB], load_device)
    model_bytes, huge = model.read_bytes(), os.stat(tmp_path / "huge.bin")
    assert main(["run", str(model), "--output-dir", str(tmp_path / "out")]) == 1
    one_error_line(
        capsys,
        f"DelayedInitializer node 'big': a tensor of shape [{2 * TIB}] and dtype float32 needs {8 * TIB} bytes, "
        "more than this machine can allocate",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.bin", "model.onnx"]  # no out/, no temp file
    assert model.read_bytes() == model_bytes
    after = os.stat(tmp_path / "huge.bin")
    assert (after.st_size, after.st_mtime_ns, after.st_blocks) == (huge.st_size, huge.st_mtime_ns, huge.st_blocks)


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_kernel_raises_tensor_allocation_error(tmp_path: Path, load_device: str) -> None:
    sparse_file(tmp_path / "huge.bin", 8 * TIB)
    node = make_delayed_initializer_node(
        "w", shape=[2 * TIB], dtype=TensorProto.FLOAT, load_device=load_device, filename="huge.bin", offset=0
    )
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=10)
    with pytest.raises(TensorAllocationError, match=r"needs 8796093022208 bytes, more than this machine") as info:
        ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(tmp_path)]).run(None, {})
    assert isinstance(info.value, MemoryError)
    assert "DelayedInitializer node with output 'w'" in str(info.value)


_CHILD = """
import sys
import onnx_light_ref.ops._allocation as allocation
if sys.argv[1] == "numpy-decides":
    allocation.allocatable_bytes = lambda: None  # no bound known: only numpy's allocation can fail
from onnx_light_ref._cli import main
sys.exit(main(["run", sys.argv[2], "--output-dir", sys.argv[3]]))
"""


@pytest.mark.parametrize("mode", ["bound-from-rlimit", "numpy-decides"])
def test_allocation_failure_under_an_address_space_limit_is_one_error_line(tmp_path: Path, mode: str) -> None:
    """8 GiB under RLIMIT_AS = 2 GiB: refused from the limit, or numpy's MemoryError turned into the typed one."""
    sparse_file(tmp_path / "big.bin", 8 * 1024**3)
    model = delayed_model(tmp_path, "w", "big.bin", [2 * 1024**3])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(model), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, resource.RLIM_INFINITY)),
        check=False,
    )
    assert child.returncode == 1, child.stderr
    lines = child.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), child.stderr
    expected = "more than this machine can allocate" if mode == "bound-from-rlimit" else "and allocating them failed"
    assert f"needs {8 * 1024**3} bytes, {expected}" in lines[0]
    assert not (tmp_path / "out").exists()
