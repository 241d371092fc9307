"""``run``'s inputs (issue 26, section 6): every corner is one ``error:`` line, defaults are defaults.

An empty ``.npy`` gave a raw ``EOFError`` traceback, a graph input of unknown ``elem_type`` (999) a raw
``KeyError``; a graph input that has an initializer (an overridable default, which onnx's evaluator runs without)
was refused with ``missing --input for ['bias']``; a FIFO given as ``--input`` is looked at, never opened. A malformed
``.npy`` header (a dict never closed, a stray ``)``, a NUL, non-ASCII keys, a huge header length) gave a 22-47-line
``tokenize.TokenError`` traceback (issue 40).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref.ops import reference_evaluator
from tests.checks import snapshot_tree

X = np.array([1.0, 2.0], dtype=np.float32)
BIAS = np.array([10.0, 20.0], dtype=np.float32)


def one_error_line(capsys: pytest.CaptureFixture[str], fragment: str) -> None:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in captured.err


def _identity_model(folder: Path, elem_type: int = TensorProto.FLOAT) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", elem_type, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    path = folder / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def _model_with_a_default(folder: Path) -> Path:
    """y = x + bias, where ``bias`` is a graph input with an (external) initializer: a default the caller may feed."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("bias", 1, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(BIAS, "bias")],
    )
    path = folder / "d.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path, save_as_external_data=True, location="d.data", size_threshold=0)
    return path


def _run(path: Path, out: Path, *feeds: str, load_device: str = "file") -> int:
    argv = ["run", str(path), "--output-dir", str(out), "--load-device", load_device]
    for feed in feeds:
        argv += ["--input", feed]
    return main(argv)


def npy(header: bytes, *, version: int = 1, length: int | None = None, data: bytes = bytes(8)) -> bytes:
    """A ``.npy`` file with ``header`` as its header text, as it is (numpy would not write it)."""
    size = len(header) if length is None else length
    field = size.to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + field + header + data


GOOD = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "the file is empty (0 bytes), not a .npy file"),
        (b"\x93NUMPY\x01\x00", "EOF: reading array header length"),  # a header cut short: numpy's own words
        (b"\x93NUMPY\x01\x00\x76\x00{'descr'", "cannot load input 'x'"),  # cut inside the header dict
        # numpy's tokenizer: tokenize.TokenError, a 22-47-line traceback before
        (npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), \n"), "TokenError: "),
        (npy(GOOD[:-1] + b")}\n"), "is malformed ("),  # a stray ")": TokenError on Python 3.10, ValueError later
        (npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': ((2,), }\n"), "TokenError: "),
        (npy(GOOD + b"\x00\n"), "is malformed ("),  # a NUL: TokenError or ValueError, by Python version
        (npy(GOOD[:-1] + "'é': 1}\n".encode("latin-1")), "ValueError: Header does not contain the correct keys"),
        (npy(GOOD[:-1] + "'é': 1}\n".encode(), version=3), "ValueError: Header does not contain the correct keys"),
        (npy(GOOD[:-1] + b"[1]: 2}\n"), "TypeError: unhashable type: 'list'"),
        (
            npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"(" * 5000 + b")" * 5000 + b")}\n"),
            "Header info length (10054) is large",
        ),
        (
            npy(GOOD + b"\n", length=65535),
            "its .npy header length is 65535 bytes, but the file holds 66 bytes after it",
        ),
        (npy(GOOD + b"\n", version=2, length=2**32 - 1), "header length is 4294967295 bytes, but the file holds"),
        (npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n"), "the shape [-2], with a negative"),
    ],
    ids=[
        "empty",
        "cut-after-magic",
        "cut-in-header",
        "dict-never-closed",
        "stray-paren",
        "unbalanced-paren",
        "nul",
        "non-ascii-latin1",
        "non-ascii-utf8-v3",
        "unhashable-key",
        "over-numpys-header-limit",
        "huge-header-length",
        "huge-header-length-v2",
        "negative-dimension",
    ],
)
def test_an_empty_truncated_or_malformed_npy_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, fragment: str
) -> None:
    path = _identity_model(tmp_path)
    (tmp_path / "x.npy").write_bytes(content)
    before = snapshot_tree(tmp_path)
    assert _run(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(capsys, fragment)
    assert snapshot_tree(tmp_path) == before


def test_the_header_error_names_the_input_and_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dict never closed (a TokenError traceback before), then the same file with its header closed runs."""
    path = _identity_model(tmp_path)
    (tmp_path / "x.npy").write_bytes(npy(GOOD + b"\n"))
    assert _run(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}") == 0
    capsys.readouterr()
    (tmp_path / "x.npy").write_bytes(npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), \n"))
    assert _run(path, tmp_path / "out2", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(
        capsys, f"error: cannot load input 'x' from {str(tmp_path / 'x.npy')!r}: its .npy header is malformed"
    )


def test_an_unknown_declared_element_type_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = _identity_model(tmp_path, elem_type=999)
    np.save(tmp_path / "x.npy", X)
    before = snapshot_tree(tmp_path)
    assert _run(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}") == 1
    one_error_line(capsys, "input 'x' is declared with element type 999, which is not a TensorProto.DataType")
    assert snapshot_tree(tmp_path) == before


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_a_graph_input_with_an_initializer_is_a_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], load_device: str
) -> None:
    path = _model_with_a_default(tmp_path)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "bias.npy", -BIAS)
    expected_default = ReferenceEvaluator(str(path)).run(None, {"x": X})[0]  # onnx's evaluator, unfed: the default
    np.testing.assert_array_equal(expected_default, X + BIAS)
    np.testing.assert_array_equal(reference_evaluator(path, load_device).run(None, {"x": X})[0], X + BIAS)

    assert _run(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}", load_device=load_device) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), X + BIAS)
    feeds = (f"x={tmp_path / 'x.npy'}", f"bias={tmp_path / 'bias.npy'}")
    assert _run(path, tmp_path / "out2", *feeds, load_device=load_device) == 0  # fed: it overrides the default
    np.testing.assert_array_equal(np.load(tmp_path / "out2" / "y.npy"), X - BIAS)
    capsys.readouterr()

    assert _run(path, tmp_path / "out3", f"bias={tmp_path / 'bias.npy'}", load_device=load_device) == 1
    one_error_line(capsys, "missing --input for ['x']")  # an input without a default is still required


def test_a_fed_default_is_still_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _model_with_a_default(tmp_path)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "bias.npy", np.zeros(3, np.float32))
    assert _run(path, tmp_path / "out", f"x={tmp_path / 'x.npy'}", f"bias={tmp_path / 'bias.npy'}") == 1
    one_error_line(capsys, "input 'bias' has shape [3], the model expects [2]")


@pytest.mark.skipif(not hasattr(os, "O_PATH"), reason="looking before opening needs O_PATH (Linux)")
def test_a_fifo_input_is_looked_at_never_opened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused saying what it is, from an ``O_PATH`` look (``tests/io/test_folder_outcomes.py`` proves the writer
    stays blocked)."""
    path = _identity_model(tmp_path)
    fifo = tmp_path / "x.npy"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'released')"])
    try:
        assert _run(path, tmp_path / "out", f"x={fifo}") == 1
        one_error_line(capsys, "is not a regular file: it is a FIFO (named pipe), which was not opened; expected a")
    finally:
        with open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb"):
            writer.wait(timeout=60)
    assert not (tmp_path / "out").exists()
