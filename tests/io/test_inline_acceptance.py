"""Issue 12 acceptance: ``size_threshold`` moves inline tensors out of models saved by onnx, checked by onnxruntime.

Sources, saved by ``onnx.save_model``:

* **inline**: one ``.onnx`` holding everything: initializers in ``raw_data``, tied copies, typed-field initializers
  (``float_data``, ``int64_data``, float16 in ``int32_data``), ``Constant`` nodes (raw, typed, sparse ``values`` and
  ``indices``), an ``If`` whose branches hold an initializer and a ``Constant``, a ``Loop`` whose body holds a
  typed-field initializer, and the 16-byte int64 shape of a ``Reshape``;
* **mixed**: the same model saved with ``save_as_external_data=True, all_tensors_to_one_file=False,
  size_threshold=1024``: large raw tensors external, one file each, everything else inline.

Each is aligned by both aligners with ``size_threshold`` alone and combined with the layout options; every output
runs in onnxruntime with exactly the source's results (both If branches), passes ``verify_models`` against the
source, is byte-identical between the two aligners, has every tensor of at least ``size_threshold`` bytes external
and every smaller one where it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.io._align import align_external_data_streaming
from tests.checks import assert_no_temp_files, run_onnxruntime, sha256_of_tree
from tests.io.acceptance_support import (
    align_both,
    assert_common,
    assert_shards,
    external_ranges,
    payload,
    sites,
    tensor_nbytes,
    weights_files,
)

TYPED = ("typed_f32", "typed_i64", "typed_f16", "c_typed_value", "loop_w")


def _vi(name: str, elem: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def build_inline_model() -> onnx.ModelProto:
    """Every place a tensor can hide in an inference model, all inline (see the module docstring)."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((16, 16)).astype(np.float32)  # 1024 bytes
    initializers = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(w.copy(), "W_tied"),
        numpy_helper.from_array(np.array([4, 8], dtype=np.int64), "shape"),  # 16 bytes, read by shape inference
        helper.make_tensor("typed_f32", TensorProto.FLOAT, [8, 16], rng.standard_normal(128).astype(np.float32)),
        helper.make_tensor("typed_i64", TensorProto.INT64, [16], list(range(-8, 8))),
        helper.make_tensor("typed_f16", TensorProto.FLOAT16, [16], rng.standard_normal(16).astype(np.float16)),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "tiny"),  # 64 bytes
    ]
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.arange(1, 9, dtype=np.float32), "sparse_values"),
        numpy_helper.from_array(np.arange(0, 32, 4, dtype=np.int64), "sparse_indices"),
        [32],
    )
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["r", "then_w"], ["t_out"])],
        "then",
        [],
        [_vi("t_out", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "then_w")],
    )
    else_constant = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "else_c_value")
    else_branch = helper.make_graph(
        [
            helper.make_node("Constant", [], ["ec"], value=else_constant),
            helper.make_node("Sub", ["r", "ec"], ["e0"]),
            helper.make_node("Mul", ["e0", "else_w"], ["e_out"]),
        ],
        "else",
        [],
        [_vi("e_out", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "else_w")],
    )
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "loop_w"], ["v_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("c_in", TensorProto.BOOL, []), _vi("v_in", TensorProto.FLOAT, [4, 8])],
        [_vi("c_out", TensorProto.BOOL, []), _vi("v_out", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor("loop_w", TensorProto.FLOAT, [4, 8], rng.standard_normal(32).astype(np.float32))],
    )
    typed_values = rng.standard_normal(16).astype(np.float32)
    constants = {
        "c_raw": numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "c_raw_value"),
        "c_big": numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "c_big_value"),
        "c_typed": helper.make_tensor("c_typed_value", TensorProto.FLOAT, [16], typed_values),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"]),
        helper.make_node("MatMul", ["a", "W_tied"], ["b"]),
        *(helper.make_node("Constant", [], [name], value=value) for name, value in constants.items()),
        helper.make_node("Constant", [], ["c_sparse"], sparse_value=sparse),
        helper.make_node("Add", ["b", "c_raw"], ["b1"]),
        helper.make_node("MatMul", ["b1", "c_big"], ["b2"]),
        helper.make_node("Add", ["b2", "c_typed"], ["b3"]),
        helper.make_node("Add", ["b3", "tiny"], ["b4"]),
        helper.make_node("Cast", ["typed_f16"], ["f16"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["b4", "f16"], ["b5"]),
        helper.make_node("Reshape", ["b5", "shape"], ["r"]),  # [2, 16] -> [4, 8]
        helper.make_node("If", ["cond"], ["branch"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Loop", ["trip", "", "branch"], ["looped"], body=body),
        helper.make_node("MatMul", ["x2", "typed_f32"], ["xt"]),
        helper.make_node("Cast", ["typed_i64"], ["i64"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["xt", "i64"], ["xt1"]),
        helper.make_node("Reshape", ["c_sparse", "shape"], ["s"]),
        helper.make_node("Add", ["looped", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "inline_zoo",
        [
            _vi("x", TensorProto.FLOAT, [2, 16]),
            _vi("x2", TensorProto.FLOAT, [4, 8]),
            _vi("cond", TensorProto.BOOL, []),
            _vi("trip", TensorProto.INT64, []),
        ],
        [_vi("y", TensorProto.FLOAT, [4, 8]), _vi("xt1", TensorProto.FLOAT, [4, 16])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(cond: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "x": rng.standard_normal((2, 16)).astype(np.float32),
        "x2": rng.standard_normal((4, 8)).astype(np.float32),
        "cond": np.array(cond),
        "trip": np.array(2, dtype=np.int64),
    }


FEEDS = [_feeds(True), _feeds(False)]


def write_inline(folder: Path) -> Path:
    onnx.save_model(build_inline_model(), str(folder / "model.onnx"))
    return folder / "model.onnx"


def write_mixed(folder: Path) -> Path:
    onnx.save_model(
        build_inline_model(),
        str(folder / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=1024,
    )
    return folder / "model.onnx"


SOURCES = {"inline": write_inline, "mixed": write_mixed}


@pytest.fixture(scope="module", params=list(SOURCES))
def source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = SOURCES[request.param](tmp_path_factory.mktemp(request.param))
    model = onnx.load_model(str(path), load_external_data=False)
    typed = [site.tensor for site in sites(path) if site.label in TYPED]
    assert len(typed) == len(TYPED) and all(not t.HasField("raw_data") for t in typed)  # really typed fields
    if request.param == "inline":
        assert weights_files(path) == set()
    else:
        assert set(external_ranges(path)) == weights_files(path) == {"W", "W_tied"}  # onnx: one file per tensor
    assert len(model.graph.node) > 0
    return path


OPTIONS: dict[str, dict[str, Any]] = {
    # Everything but the 16-byte Reshape shape, which onnxruntime must read inline (see the Reshape test below).
    "all_but_the_shape": {"size_threshold": 17},
    "64_bytes": {"size_threshold": 64},
    "1K": {"size_threshold": 1024},
    "64_bytes_aligned_threshold": {"size_threshold": 64, "align_threshold": 256},
    "64_bytes_shards": {"size_threshold": 64, "max_shard_size": 1500},
    "64_bytes_dedup": {"size_threshold": 64, "dedup": True},
    "combined_sub_page": {
        "size_threshold": 64,
        "alignment": 64,
        "align_threshold": 256,
        "max_shard_size": 1500,
        "dedup": True,
    },
}


@pytest.mark.parametrize("option_set", list(OPTIONS))
def test_size_threshold_on_models_saved_by_onnx(source: Path, option_set: str, tmp_path: Path) -> None:
    options = OPTIONS[option_set]
    size_threshold = options["size_threshold"]
    alignment = options.get("alignment", 4096)
    source_tree = sha256_of_tree(source.parent)
    before = {site.label: (site.tensor, payload(site, source.parent)) for site in sites(source)}

    pair = align_both(source, tmp_path, **options)

    assert sha256_of_tree(source.parent) == source_tree
    assert_no_temp_files(tmp_path)
    assert_common(pair, FEEDS)
    dst = pair.streaming
    ranges = external_ranges(dst)
    source_ranges = external_ranges(source)
    for site in sites(dst):
        nbytes = tensor_nbytes(site.tensor)
        # Inline tensors move where onnx's loader reads them back (not sparse ones, function defaults, training).
        moved = site.label in source_ranges or (nbytes >= size_threshold and site.onnx_loads)
        assert (site.label in ranges) == moved, (site.label, site.kind, site.where, nbytes)
        # Same bytes, same dims and type, wherever and however each side stores them (verify_models checks it
        # too; this states it per tensor, typed fields included).
        original, original_bytes = before[site.label]
        assert payload(site, dst.parent) == original_bytes, site.label
        assert (site.tensor.data_type, list(site.tensor.dims)) == (original.data_type, list(original.dims))
    for label, where in ranges.items():
        if where.length >= options.get("align_threshold", 0):
            assert where.offset % alignment == 0, (label, where)
    if "max_shard_size" in options:
        assert_shards(dst, "model.onnx.data", options["max_shard_size"])
    elif ranges:
        assert weights_files(dst) == {"model.onnx.data"}
    if options.get("dedup"):
        assert ranges["W"] == ranges["W_tied"]
    else:
        assert len({(r.location, r.offset) for r in ranges.values()}) == len(ranges)


def test_typed_field_tensors_come_out_as_raw_bytes_with_the_same_values(source: Path, tmp_path: Path) -> None:
    """float_data, int64_data and float16-in-int32_data tensors become external little-endian bytes, same values."""
    pair = align_both(source, tmp_path, size_threshold=17)

    before = {site.label: numpy_helper.to_array(site.tensor) for site in sites(source) if site.label in TYPED}
    after = onnx.load_model(str(pair.streaming))  # onnx's own loader reads the external bytes back
    found = {}
    for graph_tensor in _all_tensors(after):
        if graph_tensor.name in TYPED:
            found[graph_tensor.name] = numpy_helper.to_array(graph_tensor)
    assert found.keys() == before.keys()
    for name, array in before.items():
        assert found[name].dtype == array.dtype
        np.testing.assert_array_equal(found[name], array)
    ranges = external_ranges(pair.streaming)
    assert all(name in ranges for name in TYPED)


def _all_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    from onnx_light_ref.io._read.walker import iter_tensors

    return [site.tensor for site in iter_tensors(model)]


def _reshape_model(folder: Path) -> Path:
    weights = numpy_helper.from_array(np.arange(256, dtype=np.float32).reshape(16, 16) / 256, "w")  # 1024 bytes
    shape = numpy_helper.from_array(np.array([8, 8], dtype=np.int64), "shape")  # 16 bytes
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])],
        "reshape",
        [_vi("x", TensorProto.FLOAT, [4, 16])],
        [_vi("y", TensorProto.FLOAT, None)],
        [weights, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save_model(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def test_a_small_reshape_shape_stays_inline_so_onnxruntime_can_infer_shapes(tmp_path: Path) -> None:
    """A 16-byte Reshape shape stays inline with ``size_threshold=1024``, and onnxruntime runs the model.

    Why it matters: onnxruntime cannot infer shapes from external initializers. It runs onnx's shape inference while
    loading a model, and that inference never reads external data; for an operator whose output shape depends on a
    tensor's *values* (Reshape's ``shape``, Expand, Tile, Slice starts...) onnxruntime (1.32 here) then refuses the
    whole model: ``[ShapeInferenceError] Cannot parse data from external tensors. Please load external data into raw
    data for tensor: shape``. Such tensors are a few bytes, so a threshold like onnx's default (1024) keeps them
    inline while the weights move out; and whatever the threshold (``size_threshold=1`` here, which moved the shape
    out before issue 25), rule 2 of the writer contract keeps a shape tensor inline (``kept_inline_reasons``).
    """
    (tmp_path / "src").mkdir()
    source = _reshape_model(tmp_path / "src")
    x = {"x": np.arange(64, dtype=np.float32).reshape(4, 16)}
    expected = run_onnxruntime(source, x)

    kept = align_both(source, tmp_path / "kept", size_threshold=1024)

    assert set(external_ranges(kept.streaming)) == {"w"}
    np.testing.assert_array_equal(run_onnxruntime(kept.streaming, x)[0], expected[0])
    inferred = onnx.shape_inference.infer_shapes(onnx.load_model(str(kept.streaming), load_external_data=False))
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [8, 8]

    import onnxruntime as ort

    small = align_both(source, tmp_path / "small", size_threshold=1)
    assert set(external_ranges(small.streaming)) == {"w"}
    (tmp_path / "again").mkdir()
    again = align_external_data_streaming(source, tmp_path / "again" / "model.onnx", size_threshold=1)
    assert again.kept_inline_reasons == {"shape tensor": 1}
    for written in (small.streaming, small.in_memory):
        np.testing.assert_array_equal(run_onnxruntime(written, x)[0], expected[0])
        ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
