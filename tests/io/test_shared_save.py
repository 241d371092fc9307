"""save_model_with_shared_external_data: a variant saved next to the first model writes only its new weights.

The story of every test: ``first.onnx`` + ``first.onnx.data`` are written by onnx itself; a variant is assembled from
the first model loaded with ``load_external_data=False`` plus new tensors made by ``numpy_helper.from_array`` (inline
``raw_data``); the variant is saved with the public function. Assertions are on what a user would open: file sizes
and bytes, the saved ``external_data`` entries, ``onnx.load`` and onnxruntime outputs, and on what must not happen
(first model's files modified, stray or temp files, the in-memory model changed by a refused call).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import onnx_light_ref.io._shared_save
import onnx_light_ref.io._write.publish
from onnx_light_ref import save_model_with_shared_external_data
from onnx_light_ref.errors import (
    DanglingReferenceError,
    DestinationConflictError,
    ExternalDataError,
    UnsafeLocationError,
)
from tests.models import IR_VERSION, OPSET, identity_model, mlp_model

# The reference implementation's test data (notes/reference-onnx-light.md, section 3).
FIRST_TENSORS = {"a0": np.full(7, 1.5, np.float32), "a1": np.full(11, -2.0, np.float32)}  # 28 B, 44 B
NEW_TENSORS = {"n0": np.full(5, 7.0, np.float32), "n1": np.full(3, -3.5, np.float32)}  # 20 B, 12 B


# --------------------------------------------------------------------------------------------------------- helpers


def save_first(folder: Path, model: onnx.ModelProto | None = None, **kwargs: object) -> Path:
    """Write ``first.onnx`` + ``first.onnx.data`` with onnx's own external-data writer (every tensor external)."""
    path = folder / "first.onnx"
    options = {"size_threshold": 0, "location": "first.onnx.data", **kwargs}
    onnx.save_model(model or identity_model(FIRST_TENSORS), str(path), save_as_external_data=True, **options)
    return path


def add_outputs(model: onnx.ModelProto, tensors: dict[str, np.ndarray]) -> None:
    """Add new initializers (inline raw_data) to ``model``, each returned by an Identity node."""
    for name, array in tensors.items():
        model.graph.initializer.append(numpy_helper.from_array(array, name))
        model.graph.node.append(helper.make_node("Identity", [name], [f"out_{name}"]))
        dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
        model.graph.output.append(helper.make_tensor_value_info(f"out_{name}", dtype, array.shape))


def reference_variant(folder: Path) -> onnx.ModelProto:
    """first.onnx saved in ``folder``, loaded without data, plus ``n0`` and ``n1``."""
    first = save_first(folder)
    variant = onnx.load_model(str(first), load_external_data=False)
    add_outputs(variant, NEW_TENSORS)
    return variant


def tree(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``: equal snapshots mean nothing was written."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]


def entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def tensors_by_name(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def set_entry(tensor: onnx.TensorProto, key: str, value: str) -> None:
    for entry in tensor.external_data:
        if entry.key == key:
            entry.value = value
            return
    raise KeyError(key)


def read_range(folder: Path, tensor: onnx.TensorProto) -> bytes:
    """An external tensor's bytes, read with plain file reads (independent of the package)."""
    info = entries(tensor)
    with open(folder / info["location"], "rb") as data:
        data.seek(int(info.get("offset", "0")))
        return data.read(int(info["length"]))


# ------------------------------------------------------------------------------------- the reference arithmetic


def test_reference_arithmetic(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    first_files = tree(tmp_path)
    first_entries = {
        t.name: list(t.external_data)
        for t in onnx.load_model(str(tmp_path / "first.onnx"), load_external_data=False).graph.initializer
    }

    total = save_model_with_shared_external_data(variant, tmp_path / "second.onnx", alignment=64, size_threshold=0)

    # 20 B of n0, padding to 64, 12 B of n1.
    assert total == 76
    assert (tmp_path / "second.onnx.data").stat().st_size == 76
    assert {k: v for k, v in tree(tmp_path).items() if k.startswith("first")} == first_files
    assert sorted(tree(tmp_path)) == ["first.onnx", "first.onnx.data", "second.onnx", "second.onnx.data"]

    saved = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False))
    assert all(t.data_location == onnx.TensorProto.EXTERNAL and not t.HasField("raw_data") for t in saved.values())
    for name in FIRST_TENSORS:
        assert list(saved[name].external_data) == first_entries[name]  # verbatim, all keys
    data = (tmp_path / "second.onnx.data").read_bytes()
    for name, array in NEW_TENSORS.items():
        info = entries(saved[name])
        assert info["location"] == "second.onnx.data"
        assert int(info["offset"]) % 64 == 0
        assert int(info["length"]) == array.nbytes
        assert data[int(info["offset"]) : int(info["offset"]) + array.nbytes] == array.tobytes()
    assert entries(saved["n0"])["offset"] == "0" and entries(saved["n1"])["offset"] == "64"
    assert data[20:64] == bytes(44)  # padding is zeros

    # The in-memory model was mutated like the saved one.
    assert variant.SerializeToString() == (tmp_path / "second.onnx").read_bytes()

    loaded = onnx.load_model(str(tmp_path / "second.onnx"))
    for name, array in {**FIRST_TENSORS, **NEW_TENSORS}.items():
        np.testing.assert_array_equal(numpy_helper.to_array(tensors_by_name(loaded)[name]), array)


def test_positional_call_and_default_alignment(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)

    total = save_model_with_shared_external_data(variant, str(tmp_path / "second.onnx"), size_threshold=0)

    assert total == 4096 + 12 == (tmp_path / "second.onnx.data").stat().st_size
    saved = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False))
    assert [entries(saved[n])["offset"] for n in NEW_TENSORS] == ["0", "4096"]

    (tmp_path / "packed").mkdir()
    packed = reference_variant(tmp_path / "packed")
    assert save_model_with_shared_external_data(packed, tmp_path / "packed" / "second.onnx", 0, size_threshold=0) == 32
    saved = tensors_by_name(onnx.load_model(str(tmp_path / "packed" / "second.onnx"), load_external_data=False))
    assert [entries(saved[n])["offset"] for n in NEW_TENSORS] == ["0", "20"]


def test_only_reused_tensors_writes_no_weights_file(tmp_path: Path) -> None:
    first = save_first(tmp_path)
    variant = onnx.load_model(str(first), load_external_data=False)
    before = tree(tmp_path)

    assert save_model_with_shared_external_data(variant, tmp_path / "second.onnx", size_threshold=0) == 0

    assert sorted(tree(tmp_path)) == ["first.onnx", "first.onnx.data", "second.onnx"]
    assert {k: v for k, v in tree(tmp_path).items() if k != "second.onnx"} == before
    loaded = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx")))
    for name, array in FIRST_TENSORS.items():
        np.testing.assert_array_equal(numpy_helper.to_array(loaded[name]), array)


# ------------------------------------------------------------------------------------------ a real variant runs


def mlp_reference(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    h = np.maximum(x @ w["W0"] + w["b0"], 0)
    h = np.maximum(h @ w["W1"] + w["b1"], 0)
    return h @ w["W2"] + w["b2"]


def run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_variant_with_a_new_last_layer_runs_in_onnxruntime(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shapes = {"W0": (8, 16), "b0": (16,), "W1": (16, 16), "b1": (16,), "W2": (16, 4), "b2": (4,)}
    weights = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    first = save_first(tmp_path, mlp_model(weights))
    first_files = tree(tmp_path)

    head = {"W2": rng.standard_normal((16, 4)).astype(np.float32), "b2": rng.standard_normal(4).astype(np.float32)}
    variant = onnx.load_model(str(first), load_external_data=False)
    for tensor in variant.graph.initializer:
        if tensor.name in head:
            tensor.CopyFrom(numpy_helper.from_array(head[tensor.name], tensor.name))

    total = save_model_with_shared_external_data(variant, tmp_path / "second.onnx", size_threshold=0)

    # The variant's data file holds the new head and nothing else: W2 (256 B) padded to 4096, then b2 (16 B).
    assert total == 4096 + 16 == (tmp_path / "second.onnx.data").stat().st_size
    data = (tmp_path / "second.onnx.data").read_bytes()
    assert data[:256] == head["W2"].tobytes() and data[4096:] == head["b2"].tobytes()
    assert tree(tmp_path)["first.onnx.data"] == first_files["first.onnx.data"]
    saved = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False))
    for name in ("W0", "b0", "W1", "b1"):
        assert entries(saved[name])["location"] == "first.onnx.data"
        assert read_range(tmp_path, saved[name]) == weights[name].tobytes()

    x = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(run(first, x), mlp_reference(x, weights), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        run(tmp_path / "second.onnx", x), mlp_reference(x, {**weights, **head}), rtol=1e-5, atol=1e-5
    )
    assert tree(tmp_path)["first.onnx.data"] == first_files["first.onnx.data"]


def reshape_model(weight: np.ndarray, shape: np.ndarray) -> onnx.ModelProto:
    """``y = Reshape(x @ W, shape)``: the ``shape`` initializer is what onnxruntime must read inline."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "reshape",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, weight.shape[0]])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(shape, "shape")],
    )
    return helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)])


def test_default_size_threshold_keeps_a_reshape_shape_inline_and_onnxruntime_runs_the_variant(tmp_path: Path) -> None:
    """Issue 22: with the old default (0) the 16-byte int64 ``shape`` went external and onnxruntime refused the
    variant ("Cannot parse data from external tensors"); the default is onnx's own 1024."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((16, 32)).astype(np.float32)  # 2 KiB: above the threshold
    shape = np.array([4, 16], dtype=np.int64)  # 16 bytes: below it
    first = save_first(tmp_path, reshape_model(weight, shape))
    first_files = tree(tmp_path)
    new_weight = rng.standard_normal((16, 32)).astype(np.float32)
    variant = onnx.load_model(str(first), load_external_data=False)
    variant.graph.initializer[0].CopyFrom(numpy_helper.from_array(new_weight, "W"))
    variant.graph.initializer[1].CopyFrom(numpy_helper.from_array(shape, "shape"))

    total = save_model_with_shared_external_data(variant, tmp_path / "second.onnx")

    assert total == new_weight.nbytes == (tmp_path / "second.onnx.data").stat().st_size
    saved = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False))
    assert saved["shape"].data_location == onnx.TensorProto.DEFAULT and saved["shape"].raw_data == shape.tobytes()
    assert entries(saved["W"])["location"] == "second.onnx.data"
    x = rng.standard_normal((2, 16)).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "second.onnx"), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, (x @ new_weight).reshape(4, 16), rtol=1e-5, atol=1e-5)
    assert tree(tmp_path)["first.onnx.data"] == first_files["first.onnx.data"]


def test_size_threshold_zero_keeps_the_reshape_shape_inline_so_onnxruntime_runs_it(tmp_path: Path) -> None:
    """``size_threshold=0`` moved the 16-byte Reshape shape out and onnxruntime refused the variant ("Cannot parse
    data from external tensors"); rule 2 of the writer contract keeps a shape tensor inline whatever the threshold."""
    weight = np.ones((16, 32), np.float32)
    first = save_first(tmp_path, reshape_model(weight, np.array([4, 16], dtype=np.int64)))
    variant = onnx.load_model(str(first), load_external_data=False)
    variant.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([4, 16], dtype=np.int64), "shape"))

    result = save_model_with_shared_external_data(variant, tmp_path / "second.onnx", size_threshold=0)
    assert (int(result), result.new_tensors, result.kept_inline_reasons) == (0, 0, {"shape tensor": 1})
    ort.InferenceSession(str(tmp_path / "second.onnx"), providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------------------------------------------- guards


def _over_first(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    return tmp_path / "first.onnx", {}


def _hard_link(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    os.link(tmp_path / "first.onnx.data", tmp_path / "linked.bin")
    return tmp_path / "second.onnx", {"location": "linked.bin"}


def _in_subfolder(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    (tmp_path / "sub").mkdir()
    return tmp_path / "sub" / "second.onnx", {}


def _absolute_reference(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    set_entry(tensors_by_name(variant)["a0"], "location", str(tmp_path / "first.onnx.data"))
    return tmp_path / "second.onnx", {}


def _dotdot_reference(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    # Resolves to the real file, yet loaders refuse '..': so must we.
    set_entry(tensors_by_name(variant)["a0"], "location", f"../{tmp_path.name}/first.onnx.data")
    return tmp_path / "second.onnx", {}


def _range_past_end(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    size = (tmp_path / "first.onnx.data").stat().st_size
    set_entry(tensors_by_name(variant)["a0"], "offset", str(size - 4))
    return tmp_path / "second.onnx", {}


def _through_a_file(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    set_entry(tensors_by_name(variant)["a0"], "location", "first.onnx.data/a0")
    return tmp_path / "second.onnx", {}


def _inline_and_external(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    tensors_by_name(variant)["a1"].raw_data = FIRST_TENSORS["a1"].tobytes()
    return tmp_path / "second.onnx", {}


def _external_without_entries(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    tensors_by_name(variant)["n1"].ClearField("raw_data")
    tensors_by_name(variant)["n1"].data_location = onnx.TensorProto.EXTERNAL
    return tmp_path / "second.onnx", {}


def _raw_and_typed_in_subgraph(tmp_path: Path, variant: onnx.ModelProto) -> tuple[Path, dict[str, object]]:
    # A new tensor holding both raw_data and float_data, inside an If branch: moving only raw_data out would publish
    # an EXTERNAL tensor with inline values, refused by onnx's checker and every reader.
    both = numpy_helper.from_array(np.arange(4, dtype=np.float32), "both")
    both.float_data.extend([9.0] * 4)
    branch = helper.make_graph([helper.make_node("Identity", ["both"], ["y"])], "then", [], [], [both])
    branch.output.append(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4]))
    empty = helper.make_graph([helper.make_node("Identity", ["n0"], ["z"])], "else", [], [])
    empty.output.append(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [5]))
    variant.graph.input.append(helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []))
    variant.graph.node.append(helper.make_node("If", ["cond"], ["if_out"], then_branch=branch, else_branch=empty))
    return tmp_path / "second.onnx", {}


def _arguments(**kwargs: object) -> Callable[[Path, onnx.ModelProto], tuple[Path, dict[str, object]]]:
    return lambda tmp_path, variant: (tmp_path / "second.onnx", kwargs)


FIX = "Save the variant in the folder of the model that owns its weights"

GUARDS = {
    "save over first.onnx": (_over_first, DestinationConflictError, ["first.onnx.data", "reused tensor", "destroy"]),
    "hard link of a reused file": (_hard_link, DestinationConflictError, ["linked.bin", "hard link", "'a0'"]),
    "variant in a subfolder": (_in_subfolder, DanglingReferenceError, ["'a0'", "does not exist", FIX]),
    "absolute reference": (_absolute_reference, DanglingReferenceError, ["'a0'", "absolute", FIX]),
    "'..' reference": (_dotdot_reference, DanglingReferenceError, ["'a0'", "'..'", FIX]),
    "range past the end": (_range_past_end, DanglingReferenceError, ["'a0'", "exceeds the size", FIX]),
    "reference through a file": (_through_a_file, DanglingReferenceError, ["'a0'", FIX]),
    "inline and external": (_inline_and_external, ExternalDataError, ["'a1'", "both inline raw_data"]),
    "EXTERNAL without entries": (_external_without_entries, ExternalDataError, ["'n1'", "no external_data entries"]),
    "raw_data and float_data": (
        _raw_and_typed_in_subgraph,
        ExternalDataError,
        ["'both'", "raw_data and in float_data"],
    ),
    "alignment 3": (_arguments(alignment=3), ValueError, ["alignment", "power of two", "3"]),
    "alignment -1": (_arguments(alignment=-1), ValueError, ["alignment", "-1"]),
    "alignment not an int": (_arguments(alignment=64.0), TypeError, ["alignment", "float"]),
    "size_threshold -1": (_arguments(size_threshold=-1), ValueError, ["size_threshold", "-1"]),
    "size_threshold str": (_arguments(size_threshold="8"), ValueError, ["size_threshold", "'8'"]),
    "size_threshold bool": (_arguments(size_threshold=True), ValueError, ["size_threshold", "True"]),
    "location with '..'": (_arguments(location="../new.data"), UnsafeLocationError, ["'../new.data'", "'..'"]),
    "absolute location": (_arguments(location="/tmp/new.data"), UnsafeLocationError, ["'/tmp/new.data'", "absolute"]),
    "location naming the model": (_arguments(location="second.onnx"), DestinationConflictError, ["same"]),
}


@pytest.mark.parametrize("case", list(GUARDS))
def test_guard_refuses_before_writing_anything(tmp_path: Path, case: str) -> None:
    setup, error, fragments = GUARDS[case]
    variant = reference_variant(tmp_path)
    dst, kwargs = setup(tmp_path, variant)
    before_files = tree(tmp_path)
    before_model = variant.SerializeToString()

    with pytest.raises(error) as raised:
        save_model_with_shared_external_data(variant, dst, **{"size_threshold": 0, **kwargs})

    for fragment in fragments:
        assert fragment in str(raised.value)
    assert tree(tmp_path) == before_files  # no new file, first's files untouched
    assert temp_files(tmp_path) == []
    assert variant.SerializeToString() == before_model


def test_model_must_be_a_model_proto(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(TypeError, match=r"onnx\.ModelProto, got GraphProto"):
        save_model_with_shared_external_data(variant.graph, tmp_path / "second.onnx")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str"):
        save_model_with_shared_external_data(str(tmp_path / "first.onnx"), tmp_path / "second.onnx")  # type: ignore[arg-type]
    assert tree(tmp_path) == before


@pytest.mark.parametrize("case", ["variant in a subfolder", "past the end"])
def test_unchecked_references_are_written_as_they_are(tmp_path: Path, case: str) -> None:
    """check_references=False skips what depends on the files (present, in range), never the syntax rules."""
    setup = {"variant in a subfolder": _in_subfolder, "past the end": _range_past_end}[case]
    variant = reference_variant(tmp_path)
    dst, _ = setup(tmp_path, variant)
    reused = {n: list(tensors_by_name(variant)[n].external_data) for n in FIRST_TENSORS}
    first_files = tree(tmp_path)

    total = save_model_with_shared_external_data(variant, dst, 64, check_references=False, size_threshold=0)

    assert total == 76
    saved = tensors_by_name(onnx.load_model(str(dst), load_external_data=False))
    assert {n: list(saved[n].external_data) for n in FIRST_TENSORS} == reused
    assert entries(saved["n0"])["location"] == "second.onnx.data"
    assert {k: v for k, v in tree(tmp_path).items() if k.startswith("first")} == first_files


def test_unchecked_reference_naming_the_secondary_file_is_refused(tmp_path: Path) -> None:
    # Saved as sub/first.onnx, the new weights would go to sub/first.onnx.data: exactly where the reused
    # "first.onnx.data" references resolve from sub/, so the reused tensors would read the new bytes.
    variant = reference_variant(tmp_path)
    (tmp_path / "sub").mkdir()
    before_files, before_model = tree(tmp_path), variant.SerializeToString()

    with pytest.raises(DestinationConflictError, match=r"'a0'.*would read the new bytes"):
        save_model_with_shared_external_data(
            variant, tmp_path / "sub" / "first.onnx", check_references=False, size_threshold=0
        )

    assert tree(tmp_path) == before_files and temp_files(tmp_path) == []
    assert variant.SerializeToString() == before_model


def test_only_reused_tensors_may_be_saved_in_a_subfolder_unchecked(tmp_path: Path) -> None:
    first = save_first(tmp_path)
    variant = onnx.load_model(str(first), load_external_data=False)
    (tmp_path / "sub").mkdir()
    assert (
        save_model_with_shared_external_data(
            variant, tmp_path / "sub" / "first.onnx", check_references=False, size_threshold=0
        )
        == 0
    )
    assert sorted(tree(tmp_path / "sub")) == ["first.onnx"]


# ------------------------------------------------------------------------------------- failures after mutation


def _fail(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device (simulated)")


def test_failure_at_publication_rolls_the_model_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    variant = reference_variant(tmp_path)
    before_files, before_model = tree(tmp_path), variant.SerializeToString()
    monkeypatch.setattr(onnx_light_ref.io._write.publish._Publication, "commit", _fail)

    with pytest.raises(OSError, match="simulated"):
        save_model_with_shared_external_data(variant, tmp_path / "second.onnx", 64, size_threshold=0)

    assert variant.SerializeToString() == before_model
    assert tree(tmp_path) == before_files and temp_files(tmp_path) == []


@pytest.mark.parametrize("failing_rename", [1, 2], ids=["weights rename", "onnx rename"])
def test_failed_rename_leaves_no_file_and_the_model_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_rename: int
) -> None:
    variant = reference_variant(tmp_path)
    before_files, before_model = tree(tmp_path), variant.SerializeToString()
    calls = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        calls.append(dst)
        if len(calls) == failing_rename:
            _fail()
        real_replace(src, dst)

    monkeypatch.setattr(onnx_light_ref.io._write.publish.os, "replace", replace)

    with pytest.raises(OSError, match="simulated"):
        save_model_with_shared_external_data(variant, tmp_path / "second.onnx", 64, size_threshold=0)

    # Only the first renames are ours to check: publication may rename more while undoing (publish.py's business).
    assert [Path(p).name for p in calls[:failing_rename]] == ["second.onnx.data", "second.onnx"][:failing_rename]
    assert variant.SerializeToString() == before_model
    assert tree(tmp_path) == before_files and temp_files(tmp_path) == []


CHANGES = {
    # another process replaces the reused file by a file of the same size (other bytes), as a re-save would
    "replaced": "import os, sys; open(sys.argv[1] + '.new', 'wb').write(b'\\x7f' * os.path.getsize(sys.argv[1])); "
    "os.replace(sys.argv[1] + '.new', sys.argv[1])",
    "truncated": "import os, sys; os.truncate(sys.argv[1], os.path.getsize(sys.argv[1]) // 2)",
    "removed": "import os, sys; os.unlink(sys.argv[1])",
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("over", ["empty-destination", "previous-variant"])
def test_a_reused_file_changed_by_another_process_before_the_commit_stops_the_save(
    tmp_path: Path, change: str, over: str
) -> None:
    """The reused references were checked when the save was planned only: a file another process replaced or
    truncated while the new weights were written was published against. They are checked again under the folder
    lock right before the first move; the save fails, nothing is published, the caller's model is unchanged."""
    variant = reference_variant(tmp_path)
    if over == "previous-variant":
        previous = onnx.ModelProto()
        previous.CopyFrom(variant)
        save_model_with_shared_external_data(previous, tmp_path / "second.onnx", 64, size_threshold=0)
    before_model = variant.SerializeToString()
    reused = tmp_path / "first.onnx.data"
    changed: list[int] = []

    def progress(done: int, total: int) -> None:  # the new weights are being written: after the plan
        if not changed:
            changed.append(subprocess.run([sys.executable, "-c", CHANGES[change], str(reused)], check=True).returncode)

    before = {name: digest for name, digest in tree(tmp_path).items() if name != reused.name}
    with pytest.raises(DanglingReferenceError) as raised:
        save_model_with_shared_external_data(variant, tmp_path / "second.onnx", 64, size_threshold=0, progress=progress)

    message = str(raised.value)
    assert changed and message.startswith("reused tensor 'a0': its file 'first.onnx.data' "), message
    if change == "removed":
        assert "changed after the save was planned (" in message
    else:
        assert "was replaced or truncated after the save was planned (device/inode " in message
    assert message.endswith("nothing was published."), message
    assert variant.SerializeToString() == before_model
    assert {name: digest for name, digest in tree(tmp_path).items() if name != reused.name} == before
    assert temp_files(tmp_path) == []


# ---------------------------------------------------------------------------------------- what stays inline


def test_size_threshold_and_typed_fields_keep_tensors_inline(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    big = np.arange(32, dtype=np.float32)  # 128 B
    add_outputs(variant, {"big": big})
    typed = helper.make_tensor("typed", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])  # float_data, no raw_data
    variant.graph.initializer.append(typed)
    inline_before = {n: t.SerializeToString() for n, t in tensors_by_name(variant).items() if n in ("n0", "typed")}

    total = save_model_with_shared_external_data(variant, tmp_path / "second.onnx", 64, size_threshold=16)

    # n1 (12 B) and typed stay inline; n0 (20 B) at 0, big (128 B) at 64.
    assert total == 64 + 128
    saved = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False))
    assert saved["n1"].raw_data == NEW_TENSORS["n1"].tobytes() and saved["n1"].data_location == 0
    assert saved["typed"].SerializeToString() == inline_before["typed"]
    assert [entries(saved[n])["offset"] for n in ("n0", "big")] == ["0", "64"]
    loaded = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx")))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded["big"]), big)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded["typed"]), [1.0, 2.0, 3.0])


def test_zero_size_new_tensor(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    add_outputs(variant, {"empty": np.zeros((0, 3), np.float32)})

    total = save_model_with_shared_external_data(variant, tmp_path / "second.onnx", 64, size_threshold=0)

    # n0 at 0, n1 (12 B) at 64, so the file ends at 76; empty (no bytes) stays inline: rule 2 of the writer contract,
    # the same for every writer (nothing to point at, and no offset onnx 1.17 could misread as "the rest of the file").
    assert total == 76 == (tmp_path / "second.onnx.data").stat().st_size
    saved = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False))
    assert entries(saved["empty"]) == {} and saved["empty"].data_location != onnx.TensorProto.EXTERNAL
    loaded = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx")))
    assert numpy_helper.to_array(loaded["empty"]).shape == (0, 3)
    session = ort.InferenceSession(str(tmp_path / "second.onnx"), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {}), strict=True))
    assert outputs["out_empty"].shape == (0, 3)
    np.testing.assert_array_equal(outputs["out_n1"], NEW_TENSORS["n1"])


# ------------------------------------------------------------------------------------ subgraphs and attributes


def constant(output: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [output], value=numpy_helper.from_array(array, f"{output}_value"))


def branch(name: str, initializers: dict[str, np.ndarray], constant_value: np.ndarray) -> onnx.GraphProto:
    """out = init + const (both float32[4])."""
    (init_name,) = initializers
    return helper.make_graph(
        [constant(f"{name}_c", constant_value), helper.make_node("Add", [init_name, f"{name}_c"], [f"{name}_out"])],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )


def if_model(then_graph: onnx.GraphProto, else_graph: onnx.GraphProto) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            constant("c_main", np.full(4, 100.0, np.float32)),
            helper.make_node("If", ["cond"], ["y_if"], then_branch=then_graph, else_branch=else_graph),
            helper.make_node("Add", ["y_if", "c_main"], ["y"]),
        ],
        "if_model",
        [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def subgraph(model: onnx.ModelProto, branch_name: str) -> onnx.GraphProto:
    """The live ``then_branch``/``else_branch`` of the model's If node."""
    return next(a.g for a in model.graph.node[1].attribute if a.name == branch_name)


def test_subgraphs_and_constant_attributes(tmp_path: Path) -> None:
    first_model = if_model(
        branch("then", {"s_then": np.arange(4, dtype=np.float32)}, np.full(4, 0.5, np.float32)),
        branch("else", {"s_else": np.full(4, -1.0, np.float32)}, np.full(4, 0.25, np.float32)),
    )
    first = save_first(tmp_path, first_model, convert_attribute=True)
    first_files = tree(tmp_path)
    variant = onnx.load_model(str(first), load_external_data=False)
    then_graph = subgraph(variant, "then_branch")
    reused = {
        t.name: list(t.external_data)
        for t in (variant.graph.node[0].attribute[0].t, then_graph.initializer[0], then_graph.node[0].attribute[0].t)
    }
    assert set(reused) == {"c_main_value", "s_then", "then_c_value"} and all(reused.values())
    # The else branch becomes new: a new initializer and a new Constant attribute inside the subgraph.
    subgraph(variant, "else_branch").CopyFrom(
        branch("else", {"s_new": np.full(4, 10.0, np.float32)}, np.full(4, 2.0, np.float32))
    )

    total = save_model_with_shared_external_data(variant, tmp_path / "second.onnx", 64, size_threshold=0)

    assert total == 64 + 16  # s_new (16 B) at 0, else_c_value (16 B) at 64
    assert tree(tmp_path)["first.onnx.data"] == first_files["first.onnx.data"]
    saved = onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False)
    assert list(saved.graph.node[0].attribute[0].t.external_data) == reused["c_main_value"]
    then_graph, else_graph = subgraph(saved, "then_branch"), subgraph(saved, "else_branch")
    assert list(then_graph.initializer[0].external_data) == reused["s_then"]
    assert list(then_graph.node[0].attribute[0].t.external_data) == reused["then_c_value"]
    assert entries(else_graph.initializer[0]) == {"location": "second.onnx.data", "offset": "0", "length": "16"}
    assert entries(else_graph.node[0].attribute[0].t) == {
        "location": "second.onnx.data",
        "offset": "64",
        "length": "16",
    }

    session = ort.InferenceSession(str(tmp_path / "second.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"cond": np.array(True)})[0], np.arange(4) + 0.5 + 100)
    np.testing.assert_array_equal(session.run(None, {"cond": np.array(False)})[0], np.full(4, 10.0 + 2.0 + 100))


def test_reused_tensors_in_subgraph_are_guarded_too(tmp_path: Path) -> None:
    first_model = if_model(
        branch("then", {"s_then": np.arange(4, dtype=np.float32)}, np.full(4, 0.5, np.float32)),
        branch("else", {"s_else": np.full(4, -1.0, np.float32)}, np.full(4, 0.25, np.float32)),
    )
    first = save_first(tmp_path, first_model, convert_attribute=True)
    variant = onnx.load_model(str(first), load_external_data=False)
    then_graph = subgraph(variant, "then_branch")
    set_entry(then_graph.initializer[0], "location", "missing.data")
    before_files, before_model = tree(tmp_path), variant.SerializeToString()

    with pytest.raises(DanglingReferenceError, match=r"'s_then'.*missing\.data"):
        save_model_with_shared_external_data(variant, tmp_path / "second.onnx", size_threshold=0)

    assert tree(tmp_path) == before_files and variant.SerializeToString() == before_model


# ---------------------------------------------------------------------------------- progress and locations


def test_progress_is_monotonic_and_ends_at_the_payload(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    big = np.ones(9 * 1024 * 1024 // 4, np.float32)  # 9 MiB: more than one 8 MiB write slice
    add_outputs(variant, {"big": big})
    calls: list[tuple[int, int]] = []

    save_model_with_shared_external_data(
        variant,
        tmp_path / "second.onnx",
        64,
        progress=lambda done, total: calls.append((done, total)),
        size_threshold=0,
    )

    payload = 20 + 12 + big.nbytes
    assert len(calls) >= 4
    assert {total for _, total in calls} == {payload}
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert calls[-1] == (payload, payload)


def test_location_in_an_existing_subfolder(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    (tmp_path / "sub").mkdir()

    total = save_model_with_shared_external_data(
        variant, tmp_path / "second.onnx", 64, location="sub/new.bin", size_threshold=0
    )

    assert total == 76 == (tmp_path / "sub" / "new.bin").stat().st_size
    assert not (tmp_path / "second.onnx.data").exists()
    saved = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False))
    assert entries(saved["n1"]) == {"location": "sub/new.bin", "offset": "64", "length": "12"}
    loaded = tensors_by_name(onnx.load_model(str(tmp_path / "second.onnx")))
    for name, array in {**FIRST_TENSORS, **NEW_TENSORS}.items():
        np.testing.assert_array_equal(numpy_helper.to_array(loaded[name]), array)


def test_location_in_a_missing_subfolder_writes_nothing(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    before_files, before_model = tree(tmp_path), variant.SerializeToString()

    with pytest.raises(FileNotFoundError, match="destination folder does not exist"):
        save_model_with_shared_external_data(
            variant, tmp_path / "second.onnx", location="missing/new.bin", size_threshold=0
        )

    assert tree(tmp_path) == before_files and temp_files(tmp_path) == []
    assert variant.SerializeToString() == before_model


@pytest.mark.parametrize("check_references", [True, False])
def test_a_missing_destination_folder_is_never_created(tmp_path: Path, check_references: bool) -> None:
    """Only the command line creates folders; the library refuses (a dangling reuse, or the missing folder)."""
    variant = reference_variant(tmp_path)
    before_files, before_model = tree(tmp_path), variant.SerializeToString()
    error = DanglingReferenceError if check_references else FileNotFoundError
    fragment = "would dangle" if check_references else "destination folder does not exist"

    with pytest.raises(error, match=fragment):
        save_model_with_shared_external_data(
            variant,
            tmp_path / "missing" / "second.onnx",
            check_references=check_references,
            size_threshold=0,
        )

    assert not (tmp_path / "missing").exists()
    assert tree(tmp_path) == before_files and temp_files(tmp_path) == []
    assert variant.SerializeToString() == before_model


def test_resaving_a_variant_replaces_its_own_weights(tmp_path: Path) -> None:
    variant = reference_variant(tmp_path)
    save_model_with_shared_external_data(variant, tmp_path / "second.onnx", 64, size_threshold=0)
    # Reloaded without data, every tensor is now reused, n0/n1 from second.onnx.data; nothing new is written.
    again = onnx.load_model(str(tmp_path / "second.onnx"), load_external_data=False)
    add_outputs(again, {"n2": np.full(2, 9.0, np.float32)})

    with pytest.raises(DestinationConflictError, match=r"second\.onnx\.data"):
        save_model_with_shared_external_data(again, tmp_path / "second.onnx", 64, size_threshold=0)
    assert save_model_with_shared_external_data(again, tmp_path / "third.onnx", 64, size_threshold=0) == 8
    loaded = tensors_by_name(onnx.load_model(str(tmp_path / "third.onnx")))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded["n1"]), NEW_TENSORS["n1"])
    np.testing.assert_array_equal(numpy_helper.to_array(loaded["n2"]), [9.0, 9.0])


# ------------------------------------------------------------------------------------------------- property


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=6),
    alignment=st.sampled_from([0, 1, 2, 8, 64, 256]),
    size_threshold=st.integers(min_value=0, max_value=64),
)
def test_layout_of_new_tensors(sizes: list[int], alignment: int, size_threshold: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        variant = reference_variant(Path(folder))
        rng = np.random.default_rng(len(sizes))
        new = {f"x{i}": rng.integers(0, 256, size, dtype=np.uint8) for i, size in enumerate(sizes)}
        add_outputs(variant, new)

        total = save_model_with_shared_external_data(
            variant, Path(folder) / "second.onnx", alignment, size_threshold=size_threshold
        )

        step = max(alignment, 1)
        every = {**NEW_TENSORS, **new}
        moved = [name for name in ("n0", "n1", *new) if every[name].nbytes >= max(size_threshold, 1)]
        data_path = Path(folder) / "second.onnx.data"
        assert total == (data_path.stat().st_size if moved else 0)
        assert data_path.exists() == bool(moved)
        saved = tensors_by_name(onnx.load_model(str(Path(folder) / "second.onnx"), load_external_data=False))
        cursor = 0
        for name in moved:
            info = entries(saved[name])
            offset, length = int(info["offset"]), int(info["length"])
            if length == 0:  # at the end of the file: onnx 1.17 reads a zero length as "the rest of the file"
                assert offset == total
                continue
            assert offset % step == 0 and offset >= cursor and offset + length <= total
            cursor = offset + length
        assert total == cursor  # no trailing padding
        loaded = tensors_by_name(onnx.load_model(str(Path(folder) / "second.onnx")))
        for name, array in {**FIRST_TENSORS, **NEW_TENSORS, **new}.items():
            np.testing.assert_array_equal(numpy_helper.to_array(loaded[name]), array)


def test_a_reused_reference_through_a_symlink_needs_the_opt_in(tmp_path: Path) -> None:
    """onnx refuses a data path through a symbolic link; a trusted layout (the Hugging Face cache) opts in."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "sha").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").symlink_to("../blobs/sha")
    reused = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "w")
    reused.ClearField("raw_data")
    reused.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "16")):
        reused.external_data.add(key=key, value=value)
    model = identity_model([reused])
    with pytest.raises(DanglingReferenceError, match="symbolic link"):
        save_model_with_shared_external_data(model, folder / "v.onnx")
    assert sorted(p.name for p in folder.iterdir()) == ["w.bin"]
    save_model_with_shared_external_data(model, folder / "v.onnx", allow_outside_folder=True)
    assert onnx.load(str(folder / "v.onnx"), load_external_data=False).graph.initializer[0].external_data[0].value == (
        "w.bin"
    )
