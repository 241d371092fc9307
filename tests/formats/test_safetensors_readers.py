"""Every reader refuses a reference into a ``.safetensors`` file that its header contradicts, as ``inspect`` does.

``inspect`` calls such a reference a ``header mismatch`` (``test_safetensors_inspect.py``); the readers used to read
the bytes anyway: header text, or another key's bytes, as the tensor's weights. Now the aligners, ``align_models``,
``verify``, ``delay_initializers``, ``reference_evaluator``, ``undelay_initializers``, ``run``, the
``DelayedInitializer`` kernel (bound, unbound, either load device) and the backend all raise
``SafetensorsReferenceError`` with the message ``inspect`` shows, before writing anything; a reference that agrees
with the header reads what ``safetensors.safe_open`` reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import safetensors
import safetensors.numpy as st_numpy
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming, align_models, verify_models
from onnx_light_ref._cli import main
from onnx_light_ref.backend import DelayedInitializerBackend
from onnx_light_ref.errors import SafetensorsReferenceError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.ops import (
    DelayedInitializer,
    delay_initializers,
    reference_evaluator,
    register_schemas,
    undelay_initializers,
)
from tests.checks import sha256_of_tree
from tests.models import external_tensor, make_model, value_info
from tests.ops.kernel_support import delayed_model, delayed_node

CHECKPOINT = {"a": np.arange(4, dtype=np.float32) + 0.5, "b": np.arange(6, dtype=np.int32).reshape(2, 3) - 3}
WEIGHTS = "model.safetensors"


def _key_offset(path: Path, key: str) -> int:
    """Where ``key``'s bytes start in the file: ``8 + N + data_offsets[0]``, read from the header by hand."""
    size = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + size])
    return 8 + size + header[key]["data_offsets"][0]


# A reference by (tensor name, dtype, dims, where it points): into the header, at another key's range as the tensor's
# own key, at a key's range of another dtype and shape under a name that is no key, and exactly its key (agrees).
CASES: dict[str, Callable[[Path], tuple[str, int, list[int], int]]] = {
    "inside the header": lambda f: ("a", TensorProto.FLOAT, [4], 0),
    "its key is elsewhere": lambda f: ("a", TensorProto.INT32, [2, 3], _key_offset(f, "b")),
    "another key's dtype and shape": lambda f: ("x", TensorProto.FLOAT, [6], _key_offset(f, "b")),
}
MESSAGES = {
    "inside the header": "overlap its safetensors header (file offsets [0, ",
    "its key is elsewhere": "disagree with the safetensors header entry of the same key, at [",
    "another key's dtype and shape": "are key 'b', I32 [2, 3], not F32 [6] (24 bytes)",
}


def _checkpoint(folder: Path) -> Path:
    path = folder / WEIGHTS
    st_numpy.save_file(CHECKPOINT, str(path))
    return path


def _external_model(folder: Path, name: str, dtype: int, dims: list[int], offset: int) -> Path:
    """``<folder>/model.onnx``: ``y = Identity(name)``, ``name`` an external initializer at ``offset`` of WEIGHTS."""
    length = int(np.prod(dims)) * 4
    array = np.zeros(dims, onnx.helper.tensor_dtype_to_np_dtype(dtype))
    tensor = external_tensor(name, array, [("location", WEIGHTS), ("offset", str(offset)), ("length", str(length))])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", [name], ["y"])], "g", [], [value_info("y", dtype, dims)], [tensor]
    )
    path = folder / "model.onnx"
    path.write_bytes(make_model(graph).SerializeToString())
    return path


def _delayed_model(folder: Path, name: str, dtype: int, dims: list[int], offset: int, load_device: str) -> Path:
    """``<folder>/delayed.onnx``: one DelayedInitializer node producing ``name`` from WEIGHTS at ``offset``."""
    node = delayed_node(WEIGHTS, load_device, output=name, name="n", shape=tuple(dims), dtype=dtype, offset=offset)
    graph = onnx.helper.make_graph(
        [node, onnx.helper.make_node("Identity", [name], ["y"])], "g", [], [value_info("y", dtype, dims)]
    )
    model = make_model(graph, domains={"ai.rt": 1})
    path = folder / "delayed.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture(params=sorted(CASES))
def wrong(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path, str, tuple[str, int, list[int], int]]:
    """A folder with WEIGHTS, a model and a delayed model pointing where the header disagrees, and the message
    ``inspect`` gives for it."""
    checkpoint = _checkpoint(tmp_path)
    reference = CASES[request.param](checkpoint)
    model = _external_model(tmp_path, *reference)
    _delayed_model(tmp_path, *reference, "file")
    for destination in ("out", "family"):  # the aligners' destination folders, which they never create
        (tmp_path / destination).mkdir()
    (tensor,) = build_layout_report(model).tensors
    assert tensor.status == "header mismatch"
    assert MESSAGES[request.param] in tensor.message
    return tmp_path, model, tensor.message, reference


def _refused(call: Callable[[], object], message: str, folder: Path) -> None:
    before = sha256_of_tree(folder, every_entry=True)
    with pytest.raises(SafetensorsReferenceError) as caught:
        call()
    assert type(caught.value) is SafetensorsReferenceError
    assert str(caught.value) == message
    assert sha256_of_tree(folder, every_entry=True) == before  # nothing written, no source byte changed


def test_every_reader_of_the_external_model_refuses_it_with_inspect_s_message(wrong) -> None:
    folder, model, message, _ = wrong
    readers: dict[str, Callable[[], object]] = {
        "align (streaming)": lambda: align_external_data_streaming(model, folder / "out" / "m.onnx"),
        "align (in memory)": lambda: align_external_data_in_memory(model, folder / "out" / "m.onnx"),
        "align_models": lambda: align_models([model], folder / "family"),
        "align (safetensors)": lambda: align_external_data_streaming(
            model, folder / "st.onnx", weights_format="safetensors"
        ),
        "verify": lambda: verify_models(model, model),
        "delay_initializers": lambda: delay_initializers(model),
        "reference_evaluator (file)": lambda: reference_evaluator(model),
        "reference_evaluator (cpu)": lambda: reference_evaluator(model, "cpu"),
        "undelay_initializers": lambda: undelay_initializers(model, folder / "undelayed.onnx"),
    }
    for name, call in readers.items():
        try:
            _refused(call, message, folder)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_the_kernel_refuses_a_delayed_node_the_header_contradicts(wrong, load_device: str) -> None:
    folder, _, message, reference = wrong
    delayed = _delayed_model(folder, *reference, load_device)
    model = onnx.load(str(delayed))
    register_schemas()
    readers: dict[str, Callable[[], object]] = {
        "bound kernel": lambda: ReferenceEvaluator(model, new_ops=[DelayedInitializer.bind(folder)]),
        "reference_evaluator": lambda: reference_evaluator(delayed, load_device),
        "backend": lambda: DelayedInitializerBackend.prepare(model, base_dir=folder),
        "undelay_initializers": lambda: undelay_initializers(delayed, folder / "undelayed.onnx"),
    }
    for name, call in readers.items():
        try:
            _refused(call, message, folder)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


def test_the_unbound_kernel_refuses_an_absolute_filename_the_header_contradicts(wrong) -> None:
    folder, _, message, (name, dtype, dims, offset) = wrong
    absolute = str(folder / WEIGHTS)
    node = delayed_node(absolute, "file", output=name, name="n", shape=tuple(dims), dtype=dtype, offset=offset)
    model = delayed_model(node, elem_type=dtype)
    _refused(
        lambda: ReferenceEvaluator(model, new_ops=[DelayedInitializer]),
        message.replace(repr(WEIGHTS), repr(absolute)),
        folder,
    )


def test_run_refuses_it_with_one_error_line_and_no_output_folder(wrong, capsys: pytest.CaptureFixture[str]) -> None:
    folder, model, message, _ = wrong
    before = sha256_of_tree(folder, every_entry=True)
    assert main(["run", str(model), "--output-dir", str(folder / "out")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: cannot evaluate {str(model)!r}: {message}\n"
    assert sha256_of_tree(folder, every_entry=True) == before


def _moved_in_place(checkpoint: Path) -> None:
    """Rewrite ``checkpoint`` in place, same size: a header of the same length with "a" and "b" swapped in the data
    section (what a re-save that reorders tensors does), the mtime moved on so a coarse clock cannot hide it."""
    raw = checkpoint.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    a, b = CHECKPOINT["a"].tobytes(), CHECKPOINT["b"].tobytes()
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [len(b), len(b) + len(a)]},
        "b": {"dtype": "I32", "shape": [2, 3], "data_offsets": [0, len(b)]},
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= size
    with open(checkpoint, "r+b") as f:
        f.write(raw[:8] + text.ljust(size) + b + a)
    stat = checkpoint.stat()
    os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert checkpoint.stat().st_size == len(raw)
    with safetensors.safe_open(str(checkpoint), framework="numpy") as opened:  # a valid file the library opens
        np.testing.assert_array_equal(opened.get_tensor("a"), CHECKPOINT["a"])


def test_a_header_rewritten_in_place_after_construction_is_refused_at_the_next_run(tmp_path: Path) -> None:
    """File mode reads the file at every run: a header that moved the tensor since construction is refused then."""
    checkpoint = _checkpoint(tmp_path)
    offset = _key_offset(checkpoint, "a")
    delayed = _delayed_model(tmp_path, "a", TensorProto.FLOAT, [4], offset, "file")
    with reference_evaluator(delayed) as sess:
        np.testing.assert_array_equal(sess.run(None, {})[0], CHECKPOINT["a"])
        _moved_in_place(checkpoint)
        with pytest.raises(SafetensorsReferenceError) as caught:
            sess.run(None, {})
    (tensor,) = build_layout_report(_external_model(tmp_path, "a", TensorProto.FLOAT, [4], offset)).tensors
    assert str(caught.value) == tensor.message
    assert "disagree with the safetensors header entry of the same key" in tensor.message


# ------------------------------------------------------------------------------------------- what agrees still reads


def _expected(checkpoint: Path, key: str) -> np.ndarray:
    with safetensors.safe_open(str(checkpoint), framework="numpy") as opened:
        return opened.get_tensor(key)


@pytest.mark.parametrize("key", ["a", "b"])
def test_a_reference_that_agrees_with_the_header_reads_what_safe_open_reads(tmp_path: Path, key: str) -> None:
    checkpoint = _checkpoint(tmp_path)
    expected = _expected(checkpoint, key)
    dtype = onnx.helper.np_dtype_to_tensor_dtype(expected.dtype)
    reference = (key, dtype, list(expected.shape), _key_offset(checkpoint, key))
    model = _external_model(tmp_path, *reference)
    assert build_layout_report(model).ok
    for load_device in ("file", "cpu"):
        with reference_evaluator(model, load_device) as sess:
            np.testing.assert_array_equal(sess.run(None, {})[0], expected)
        delayed = _delayed_model(tmp_path, *reference, load_device)
        kernel = DelayedInitializer.bind(tmp_path)
        with kernel:
            (value,) = ReferenceEvaluator(onnx.load(str(delayed)), new_ops=[kernel]).run(None, {})
        np.testing.assert_array_equal(value, expected)
    assert delay_initializers(model).graph.node[0].op_type == "DelayedInitializer"
    undelay_initializers(delayed, tmp_path / "undelayed.onnx")
    (value,) = ReferenceEvaluator(str(tmp_path / "undelayed.onnx")).run(None, {})
    np.testing.assert_array_equal(value, expected)
    (tmp_path / "aligned").mkdir()
    align_external_data_streaming(model, tmp_path / "aligned" / "m.onnx")
    onnx.checker.check_model(str(tmp_path / "aligned" / "m.onnx"), full_check=True)
    assert verify_models(model, tmp_path / "aligned" / "m.onnx").equal
    (tmp_path / "family").mkdir()
    align_models([model], tmp_path / "family")
    assert verify_models(model, tmp_path / "family" / "model.onnx").equal
    assert main(["run", str(model), "--output-dir", str(tmp_path / "run")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "run" / "y.npy"), expected)
