"""DelayedInitializer kernel: validation, cpu vs file reads, path resolution, outputs, concurrency, linked attrs."""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError, UnsupportedElementTypeError
from onnx_light_ref.onnx_compat import evaluator_shape_checks
from onnx_light_ref.ops import DelayedInitializer
from onnx_light_ref.ops.attributes import ATTRIBUTE_TYPES
from onnx_light_ref.ops.dtypes import PORTABLE_DTYPES, np_dtype_for

OPSETS = [oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)]


def make_node(output: str = "y", name: str = "", drop: tuple[str, ...] = (), **overrides: object) -> onnx.NodeProto:
    """A DelayedInitializer node; ``overrides`` replace attribute values (an AttributeProto replaces it whole)."""
    values: dict[str, object] = {
        "shape": [3],
        "dtype": TensorProto.FLOAT,
        "load_device": "cpu",
        "runtime_device": "cpu",
        "filename": "weights.bin",
        "offset": 0,
    }
    values.update(overrides)
    node = oh.make_node("DelayedInitializer", [], [output], domain="ai.rt", name=name)
    for key, attr_type in ATTRIBUTE_TYPES.items():
        if key in drop:
            continue
        value = values[key]
        if isinstance(value, AttributeProto):
            node.attribute.append(value)
        else:
            node.attribute.append(oh.make_attribute(key, value, attr_type=attr_type))
    return node


def make_model(node: onnx.NodeProto, elem_type: int = TensorProto.FLOAT, shape: list[int] | None = None):
    out = oh.make_tensor_value_info(node.output[0], elem_type, shape)
    return oh.make_model(oh.make_graph([node], "g", [], [out]), opset_imports=OPSETS)


def evaluator(node: onnx.NodeProto, op: type = DelayedInitializer, **kwargs) -> ReferenceEvaluator:
    return ReferenceEvaluator(make_model(node), new_ops=[op], **kwargs)


def typed_evaluator(node: onnx.NodeProto, dtype: int, shape: list[int], op: type = DelayedInitializer):
    return ReferenceEvaluator(make_model(node, dtype, shape), new_ops=[op], **evaluator_shape_checks())


def write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def f32(*values: float) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


@pytest.fixture
def weights(tmp_path: Path) -> str:
    """An absolute path to 12 bytes: float32 [3, 4, 5]."""
    return write(tmp_path / "weights.bin", f32(3, 4, 5))


# --------------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("missing", list(ATTRIBUTE_TYPES))
def test_missing_attribute_is_a_value_error_naming_node_and_attribute(weights: str, missing: str) -> None:
    node = make_node(name="loader", drop=(missing,), filename=weights)
    with pytest.raises(ValueError, match=rf"node 'loader': missing required attribute\(s\) '{missing}'"):
        evaluator(node)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"load_device": "gpu"}, "load_device must be 'cpu' or 'file', got 'gpu'"),
        ({"load_device": "CPU"}, "load_device must be 'cpu' or 'file', got 'CPU'"),
        ({"runtime_device": "cuda"}, "runtime_device must be 'cpu', got 'cuda'"),
        ({"filename": ""}, "filename must not be empty"),
        ({"offset": -1}, "offset must be non-negative, got -1"),
        ({"shape": [2, -1]}, r"shape must not contain negative dimensions, got \[2, -1\]"),
        ({"dtype": TensorProto.STRING}, r"dtype 8 \(string\) is not supported"),
        ({"dtype": 0}, r"dtype 0 \(undefined\) is not supported"),
        ({"dtype": 999}, r"dtype 999 \(<unknown 999>\) is not supported"),
        ({"shape": oh.make_attribute("shape", 3)}, r"attribute 'shape' must be INTS .*got int 3"),
        ({"dtype": oh.make_attribute("dtype", "float")}, r"attribute 'dtype' must be INT .*got str 'float'"),
        ({"offset": oh.make_attribute("offset", 1.0)}, r"attribute 'offset' must be INT .*got float32"),
        ({"filename": oh.make_attribute("filename", 3)}, r"attribute 'filename' must be STRING, got int 3"),
        ({"load_device": oh.make_attribute("load_device", ["cpu"])}, "attribute 'load_device' must be STRING"),
    ],
)
@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_invalid_attribute_is_a_value_error_at_construction(
    weights: str, overrides: dict, fragment: str, load_device: str
) -> None:
    attrs = {"filename": weights, "load_device": load_device, **overrides}
    node = make_node(name="w0", **attrs)
    with pytest.raises(ValueError, match=fragment) as info:
        evaluator(node)
    # A refused dtype is the typed UnsupportedElementTypeError (a ValueError); nothing else is a subclass.
    assert type(info.value) is (UnsupportedElementTypeError if "is not supported" in fragment else ValueError)
    assert "DelayedInitializer node 'w0'" in str(info.value)


def test_unnamed_node_is_named_by_its_output(weights: str) -> None:
    with pytest.raises(ValueError, match=r"DelayedInitializer node with output 'w_out': offset must be"):
        evaluator(make_node(output="w_out", filename=weights, offset=-5))


def test_checks_run_in_documented_order(weights: str) -> None:
    every_error = {
        "load_device": "gpu",
        "runtime_device": "cuda",
        "filename": "",
        "offset": -1,
        "shape": [-1],
        "dtype": TensorProto.STRING,
    }
    expected = [
        "load_device must be",
        "runtime_device must be",
        "filename must not be empty",
        "offset must be non-negative",
        "negative dimensions",
        "is not supported",
    ]
    with pytest.raises(ValueError, match="missing required attribute"):
        evaluator(make_node(drop=("offset",), **every_error))
    for fixed, fragment in zip(list(every_error), expected, strict=True):
        with pytest.raises(ValueError, match=fragment):
            evaluator(make_node(**every_error))
        every_error.pop(fixed)
    evaluator(make_node(filename=weights, **every_error))


def test_too_large_shape_is_refused(weights: str) -> None:
    with pytest.raises(ValueError, match="is too large"):
        evaluator(make_node(filename=weights, shape=[2**40, 2**40]))


@pytest.mark.parametrize(
    ("filename", "fragment"),
    [
        # The reason comes from io.locations.check_location_syntax; match its gist, not its exact sentence.
        ("../weights.bin", r"'\.\.'"),
        ("sub/../../weights.bin", r"'\.\.'"),
        ("sub\\weights.bin", "backslash"),
        ("./", "not (name )?a file"),
    ],
)
@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_unsafe_relative_filename_is_refused_at_construction(
    tmp_path: Path, filename: str, fragment: str, load_device: str
) -> None:
    write(tmp_path / "weights.bin", f32(1, 2, 3))
    op = DelayedInitializer.bind(tmp_path / "models")
    with pytest.raises(UnsafeLocationError, match=fragment) as info:
        evaluator(make_node(name="n", filename=filename, load_device=load_device), op)
    assert f"DelayedInitializer node 'n': relative filename {filename!r} must stay inside the folder" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("filename", ["a\x00b.bin", "/tmp/a\x00b.bin"])
def test_nul_in_filename_is_refused(filename: str) -> None:
    with pytest.raises(ValueError, match="NUL byte"):
        evaluator(make_node(filename=filename, load_device="file"))


def _raw_attribute(name: str, attr_type: int, **fields: object) -> AttributeProto:
    attribute = AttributeProto(name=name, type=attr_type)  # type: ignore[arg-type]
    for field, value in fields.items():
        setattr(attribute, field, value)
    return attribute


@pytest.mark.parametrize("load_device", ["cpu", "file"])
@pytest.mark.parametrize(
    ("attribute", "fragment"),
    [
        (
            _raw_attribute("offset", AttributeProto.UNDEFINED, i=0),
            "attribute 'offset' has type UNDEFINED, which cannot be read; expected INT",
        ),
        (_raw_attribute("shape", AttributeProto.UNDEFINED), "attribute 'shape' has type UNDEFINED"),
        (
            _raw_attribute("filename", AttributeProto.STRING, s=b"w\xffeights.bin"),
            "attribute 'filename' is not valid UTF-8",
        ),
        (_raw_attribute("load_device", AttributeProto.STRING, s=b"\xc3"), "attribute 'load_device' is not valid UTF-8"),
    ],
)
def test_unreadable_attribute_proto_is_a_value_error_naming_the_node(
    tmp_path: Path, weights: str, load_device: str, attribute: AttributeProto, fragment: str
) -> None:
    """onnx's OpRun raised ``KeyError: 0`` (UNDEFINED type) and a bare ``UnicodeDecodeError`` (non-UTF-8 STRING)."""
    overrides: dict[str, object] = {"filename": weights, "load_device": load_device, attribute.name: attribute}
    node = make_node(name="bad", **overrides)
    with pytest.raises(ValueError, match=f"^DelayedInitializer node 'bad': {re.escape(fragment)}") as info:
        evaluator(node)
    assert type(info.value) is ValueError
    assert not isinstance(info.value, UnicodeError)


def test_extra_attribute_is_refused_whatever_its_value(weights: str) -> None:
    """A seventh attribute is refused by its name, before its value (here not even UTF-8) is looked at."""
    extra = _raw_attribute("note", AttributeProto.STRINGS)
    extra.strings.extend([b"ok", b"\x80"])
    node = make_node(name="bad", filename=weights)
    node.attribute.append(extra)
    with pytest.raises(ValueError, match=r"^DelayedInitializer node 'bad': attribute 'note' is not an attribute of"):
        evaluator(node)


# --------------------------------------------------------------------------------------------------- file errors


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_missing_file(tmp_path: Path, load_device: str) -> None:
    path = str(tmp_path / "absent.bin")
    node = make_node(filename=path, load_device=load_device, offset=4)
    if load_device == "cpu":
        with pytest.raises(FileNotFoundError, match="12 bytes at offset 4") as info:
            evaluator(node)
    else:
        sess = evaluator(node)  # construction never opens the file in file mode
        with pytest.raises(FileNotFoundError, match="12 bytes at offset 4") as info:
            sess.run(None, {})
    assert path in str(info.value)
    assert info.value.filename == path


@pytest.mark.parametrize("load_device", ["cpu", "file"])
@pytest.mark.parametrize(("size", "offset"), [(11, 0), (12, 1), (4, 8), (0, 0), (12, 100)])
def test_file_too_short(tmp_path: Path, load_device: str, size: int, offset: int) -> None:
    path = write(tmp_path / "short.bin", bytes(size))
    node = make_node(filename=path, load_device=load_device, offset=offset)
    fragment = rf"file '{path}' too short: needs {offset + 12} bytes \(12 bytes at offset {offset}\), has {size} bytes"
    if load_device == "cpu":
        with pytest.raises(ValueError, match=fragment):
            evaluator(node)
    else:
        sess = evaluator(node)
        with pytest.raises(ValueError, match=fragment):
            sess.run(None, {})


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_directory_is_not_a_regular_file(tmp_path: Path, load_device: str) -> None:
    folder = tmp_path / "folder.bin"
    folder.mkdir()
    node = make_node(filename=str(folder), load_device=load_device)
    with pytest.raises(ValueError, match="is not a regular file"):
        evaluator(node).run(None, {})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need os.mkfifo (POSIX)")
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is not a regular file"):
        evaluator(make_node(filename=str(fifo), load_device="cpu"))


def test_relative_directory_is_not_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "folder.bin").mkdir()
    sess = evaluator(make_node(filename="folder.bin", load_device="file"), DelayedInitializer.bind(tmp_path))
    with pytest.raises(ExternalDataError, match="not a regular file"):
        sess.run(None, {})


# --------------------------------------------------------------------------------------------------- cpu vs file


def test_cpu_mode_reads_once_at_construction(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    write(path, f32(3, 4, 5))
    sess = evaluator(make_node(filename=str(path), load_device="cpu"))
    write(path, f32(7, 7, 7))
    np.testing.assert_array_equal(sess.run(None, {})[0], [3, 4, 5])
    path.unlink()
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {})[0], [3, 4, 5])


def test_file_mode_reads_at_every_run(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    sess = evaluator(make_node(filename=str(path), load_device="file"))  # the file does not exist yet
    write(path, f32(1, 2, 3))
    np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])
    write(path, f32(4, 5, 6))
    np.testing.assert_array_equal(sess.run(None, {})[0], [4, 5, 6])
    path.unlink()
    with pytest.raises(FileNotFoundError):
        sess.run(None, {})


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_outputs_are_writable_fresh_arrays(weights: str, load_device: str) -> None:
    sess = evaluator(make_node(filename=weights, load_device=load_device))
    first = sess.run(None, {})[0]
    assert first.flags.writeable and first.flags.c_contiguous
    first[:] = -1
    second = sess.run(None, {})[0]
    np.testing.assert_array_equal(second, [3, 4, 5])
    assert not np.shares_memory(first, second)


def test_scalar_shape(tmp_path: Path) -> None:
    path = write(tmp_path / "s.bin", np.array([2.5], dtype="<f8").tobytes())
    for mode in ("cpu", "file"):
        node = make_node(filename=path, load_device=mode, shape=[], dtype=TensorProto.DOUBLE)
        out = typed_evaluator(node, TensorProto.DOUBLE, []).run(None, {})[0]
        assert out.shape == () and out.dtype == np.float64 and out == 2.5


@pytest.mark.parametrize("load_device", ["cpu", "file"])
@pytest.mark.parametrize(
    ("filename", "bound"), [("/nonexistent/folder/never.bin", False), ("never.bin", True), ("never.bin", False)]
)
def test_zero_size_tensor_never_opens_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load_device: str, filename: str, bound: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    node = make_node(filename=filename, load_device=load_device, shape=[0, 4], offset=10**6)
    op = DelayedInitializer.bind(tmp_path) if bound else DelayedInitializer
    sess = typed_evaluator(node, TensorProto.FLOAT, [0, 4], op)
    out = sess.run(None, {})[0]
    assert out.shape == (0, 4) and out.dtype == np.float32


def test_offset_and_trailing_bytes(tmp_path: Path) -> None:
    data = b"\xff" * 5 + np.array([10, -20], dtype="<i8").tobytes() + b"trailing bytes"
    path = write(tmp_path / "w.bin", data)
    for mode in ("cpu", "file"):
        node = make_node(filename=path, load_device=mode, shape=[2], dtype=TensorProto.INT64, offset=5)
        np.testing.assert_array_equal(typed_evaluator(node, TensorProto.INT64, [2]).run(None, {})[0], [10, -20])


def test_bytes_are_little_endian_and_output_is_native(tmp_path: Path) -> None:
    path = write(tmp_path / "w.bin", b"\x01\x00\x00\x00\x00\x01\x00\x00")
    for mode in ("cpu", "file"):
        node = make_node(filename=path, load_device=mode, shape=[2], dtype=TensorProto.INT32)
        out = evaluator(node).run(None, {})[0]
        assert out.dtype.isnative
        np.testing.assert_array_equal(out, [1, 256])


@pytest.mark.parametrize("dtype", PORTABLE_DTYPES)  # the extended types: tests/ops/test_element_types.py
@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_every_allowed_dtype_round_trips(tmp_path: Path, dtype: int, load_device: str) -> None:
    np_dtype = np_dtype_for(dtype)
    expected = (np.arange(6) % 4).astype(np_dtype).reshape(2, 3)
    path = write(tmp_path / "w.bin", expected.astype(np_dtype.newbyteorder("<")).tobytes())
    node = make_node(filename=path, load_device=load_device, shape=[2, 3], dtype=dtype)
    out = typed_evaluator(node, dtype, [2, 3]).run(None, {})[0]
    assert out.dtype == np_dtype
    np.testing.assert_array_equal(out, expected)


# The largest tensor the strategy below draws (3 dims of at most 4) in the widest allowed dtype, plus the largest
# offset and trailing garbage: the payload must hold all of it. A 512-byte payload silently truncated a 32-element
# complex128 tensor at offset 1 (511 of 512 bytes), a file the kernel rightly refuses as too short.
_MAX_OFFSET, _MAX_TRAILING = 64, 16
_MAX_TENSOR_BYTES = 4**3 * max(np_dtype_for(dtype).itemsize for dtype in PORTABLE_DTYPES)


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(PORTABLE_DTYPES),
    shape=st.lists(st.integers(0, 4), max_size=3),
    offset=st.integers(0, _MAX_OFFSET),
    trailing=st.integers(0, _MAX_TRAILING),
    payload=st.binary(
        min_size=_MAX_OFFSET + _MAX_TENSOR_BYTES + _MAX_TRAILING,
        max_size=_MAX_OFFSET + _MAX_TENSOR_BYTES + _MAX_TRAILING,
    ),
)
def test_any_range_reads_the_same_bytes(
    tmp_path_factory: pytest.TempPathFactory, dtype: int, shape: list[int], offset: int, trailing: int, payload: bytes
) -> None:
    np_dtype = np_dtype_for(dtype)
    nbytes = int(np.prod(shape)) * np_dtype.itemsize
    data = payload[: offset + nbytes + trailing]
    assert len(data) == offset + nbytes + trailing  # the file holds the whole tensor and the trailing bytes
    path = write(tmp_path_factory.mktemp("h") / "w.bin", data)
    expected = np.frombuffer(data, dtype=np_dtype.newbyteorder("<"), count=nbytes // np_dtype.itemsize, offset=offset)
    for mode in ("cpu", "file"):
        node = make_node(filename=path, load_device=mode, shape=shape, dtype=dtype, offset=offset)
        out = typed_evaluator(node, dtype, shape).run(None, {})[0]
        assert out.tobytes() == expected.astype(np_dtype).tobytes()


# --------------------------------------------------------------------------------------------------- relative names


def test_relative_filename_defaults_to_cwd_at_construction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "a" / "w.bin", f32(1, 2, 3))
    write(tmp_path / "b" / "w.bin", f32(9, 9, 9))
    monkeypatch.chdir(tmp_path / "a")
    sess = evaluator(make_node(filename="w.bin", load_device="file"))
    monkeypatch.chdir(tmp_path / "b")
    np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])


def test_bind_resolves_against_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "model" / "sub" / "w.bin", f32(1, 2, 3))
    monkeypatch.chdir(tmp_path)
    bound = DelayedInitializer.bind(Path("model"))
    monkeypatch.chdir("/")
    assert bound.__name__ == "DelayedInitializer" and issubclass(bound, DelayedInitializer)
    assert bound.op_domain == "ai.rt"
    assert DelayedInitializer.bind(tmp_path).bind(tmp_path / "model").__name__ == "DelayedInitializer"
    for mode in ("cpu", "file"):
        sess = evaluator(make_node(filename="sub/w.bin", load_device=mode), bound)
        np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])


def test_absolute_filename_outside_the_binding_needs_the_opt_in(tmp_path: Path, weights: str) -> None:
    with pytest.raises(UnsafeLocationError, match="outside the model's folder"):
        evaluator(make_node(filename=weights), DelayedInitializer.bind(tmp_path / "elsewhere"))
    bound = DelayedInitializer.bind(tmp_path / "elsewhere", allow_outside_folder=True)
    sess = evaluator(make_node(filename=weights), bound)
    np.testing.assert_array_equal(sess.run(None, {})[0], [3, 4, 5])


def test_missing_relative_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"'gone.bin' does not exist .*12 bytes at offset 0"):
        evaluator(make_node(filename="gone.bin", load_device="cpu"), DelayedInitializer.bind(tmp_path))


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_symlink_escaping_the_folder_is_refused(tmp_path: Path, load_device: str) -> None:
    outside = write(tmp_path / "secret.bin", f32(6, 6, 6))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "link.bin").symlink_to(outside)
    (model_dir / "linked_dir").symlink_to(tmp_path)
    bound = DelayedInitializer.bind(model_dir)
    for filename in ("link.bin", "linked_dir/secret.bin"):
        node = make_node(filename=filename, load_device=load_device)
        with pytest.raises(UnsafeLocationError, match="outside"):
            evaluator(node, bound).run(None, {})


def test_symlink_inside_the_folder_is_refused_as_onnx_refuses_it_unless_trusted(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    write(model_dir / "real.bin", f32(1, 2, 3))
    (model_dir / "alias.bin").symlink_to(model_dir / "real.bin")
    with pytest.raises(UnsafeLocationError, match="symbolic link"):
        evaluator(make_node(filename="alias.bin", load_device="file"), DelayedInitializer.bind(model_dir))
    trusted = DelayedInitializer.bind(model_dir, allow_outside_folder=True)
    sess = evaluator(make_node(filename="alias.bin", load_device="file"), trusted)
    np.testing.assert_array_equal(sess.run(None, {})[0], [1, 2, 3])


# --------------------------------------------------------------------------------------------------- concurrency


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_concurrent_runs_of_one_evaluator(tmp_path: Path, load_device: str) -> None:
    # Two nodes read different ranges of one file: any shared file position would mix them up.
    values = np.arange(4096, dtype="<f4")
    path = write(tmp_path / "w.bin", values.tobytes())
    nodes = [
        make_node(output="a", filename=path, load_device=load_device, shape=[1000], offset=0),
        make_node(output="b", filename=path, load_device=load_device, shape=[1000], offset=4 * 3000),
    ]
    outputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, [1000]) for n in ("a", "b")]
    model = oh.make_model(oh.make_graph(nodes, "g", [], outputs), opset_imports=OPSETS)
    sess = ReferenceEvaluator(model, new_ops=[DelayedInitializer])
    barrier = threading.Barrier(8)

    def worker(_: int) -> int:
        barrier.wait()
        for _ in range(150):
            a, b = sess.run(None, {})
            np.testing.assert_array_equal(a, values[:1000])
            np.testing.assert_array_equal(b, values[3000:4000])
            a[:] = 0  # a caller mutating its output must not affect the others
        return 1

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert sum(pool.map(worker, range(8))) == 8


# --------------------------------------------------------------------------------------------------- linked attrs


def _linked(name: str, attr_type: int) -> AttributeProto:
    attr = AttributeProto()
    attr.name = name
    attr.ref_attr_name = f"f_{name}"
    attr.type = attr_type
    return attr


def test_function_linked_attributes_are_read_per_call(tmp_path: Path) -> None:
    path = write(tmp_path / "w.bin", np.arange(10, dtype="<f4").tobytes())
    body = make_node(
        shape=[2],
        load_device="cpu",
        filename=_linked("filename", AttributeProto.STRING),
        offset=_linked("offset", AttributeProto.INT),
    )
    function = oh.make_function(
        "local", "Load", [], ["y"], [body], [oh.make_opsetid("ai.rt", 1)], attributes=["f_filename", "f_offset"]
    )
    calls = [
        oh.make_node("Load", [], ["a"], domain="local", f_filename=path, f_offset=0),
        oh.make_node("Load", [], ["b"], domain="local", f_filename=path, f_offset=8),
    ]
    outputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a", "b")]
    opsets = {"": 18, "ai.rt": 1, "local": 1}
    # new_ops does not reach model-local functions: the function gets its own evaluator with the op.
    function_sess = ReferenceEvaluator(function, new_ops=[DelayedInitializer])
    sess = ReferenceEvaluator(oh.make_graph(calls, "g", [], outputs), opsets=opsets, functions=[function_sess])
    a, b = sess.run(None, {})
    np.testing.assert_array_equal(a, [0, 1])
    np.testing.assert_array_equal(b, [2, 3])

    calls[1].attribute[1].i = -3  # f_offset: validated when the call runs, naming the node
    sess = ReferenceEvaluator(oh.make_graph(calls, "g", [], outputs), opsets=opsets, functions=[function_sess])
    with pytest.raises(ValueError, match="DelayedInitializer node with output 'y': offset must be non-negative"):
        sess.run(None, {})
