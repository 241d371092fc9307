"""Issue 11 acceptance: the layout options on sources written by real producers, checked by real consumers.

Sources: the same small MLP with tied weights (``W1`` and ``W1_tied`` hold the same bytes; ``W1_near`` differs from
them in its last byte only), written by

* onnxruntime (``session.optimized_model_external_initializers_file_name``: its optimized model, small tensors left
  inline by its ``min_size_in_bytes`` setting, MatMul+Add fused into Gemm),
* onnx-ir (``ir.save(max_shard_size_bytes=...)``: several ``w-0000k-of-0000n.data`` shards),
* onnx (``save_model(all_tensors_to_one_file=False)``: one file per tensor, named after it).

Each is aligned by both aligners with each option alone and combined (``align_threshold``, ``max_shard_size`` with a
cap smaller than the largest tensors, ``dedup``, ``size_threshold``, a custom weights name); every output must run in
onnxruntime with exactly the source's results, pass ``verify_models`` against the source, be byte-identical between
the streaming and in-memory aligners, and have the layout asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.checks import assert_no_temp_files, sha256_of_tree
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

ALIGNMENT = 4096
# Smaller than the three 16 KiB tensors (each must get a file of its own), larger than W2 (8 KiB).
CAP = 12288
TIED = ("W1", "W1_tied")


def build_tied_mlp() -> onnx.ModelProto:
    """y = ((relu(x @ W1 + b1) @ W1_tied + relu(...) @ W1_near) @ W2 + b2) * scale, everything inline."""
    rng = np.random.default_rng(11)
    w1 = rng.standard_normal((64, 64)).astype(np.float32)
    near = w1.copy()
    near.view(np.uint8).reshape(-1)[-1] ^= 1
    initializers = [
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(w1.copy(), "W1_tied"),
        numpy_helper.from_array(near, "W1_near"),
        numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b2"),
        numpy_helper.from_array(np.array([0.5], dtype=np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["a"]),
        helper.make_node("Add", ["a", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h"]),
        helper.make_node("MatMul", ["h", "W1_tied"], ["t"]),
        helper.make_node("MatMul", ["h", "W1_near"], ["n"]),
        helper.make_node("Add", ["t", "n"], ["s"]),
        helper.make_node("MatMul", ["s", "W2"], ["z"]),
        helper.make_node("Add", ["z", "b2"], ["z1"]),
        helper.make_node("Mul", ["z1", "scale"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tied_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


FEEDS = [{"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}]


def write_with_onnxruntime(folder: Path) -> Path:
    """onnxruntime's optimized model with external initializers (tensors under 100 bytes stay inline)."""
    inline = folder / "inline.onnx"
    onnx.save_model(build_tied_mlp(), str(inline))
    out = folder / "ort"
    out.mkdir()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out / "model.onnx")
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "100")
    ort.InferenceSession(str(inline), options, providers=["CPUExecutionProvider"])
    inline.unlink()
    return out / "model.onnx"


def write_with_onnx_ir(folder: Path) -> Path:
    """onnx-ir's sharded save: 20000-byte shards, every tensor external."""
    import onnx_ir as ir

    out = folder / "onnx_ir"
    out.mkdir()
    inline = folder / "inline.onnx"
    onnx.save_model(build_tied_mlp(), str(inline))
    ir.save(ir.load(str(inline)), out / "model.onnx", external_data="w.data", size_threshold_bytes=0,
            max_shard_size_bytes=20000)  # fmt: skip
    inline.unlink()
    return out / "model.onnx"


def write_one_file_per_tensor(folder: Path) -> Path:
    """onnx's ``all_tensors_to_one_file=False``: each tensor in a file named after it."""
    out = folder / "onnx_per_tensor"
    out.mkdir()
    onnx.save_model(
        build_tied_mlp(),
        str(out / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=0,
    )
    return out / "model.onnx"


PRODUCERS = {
    "onnxruntime": write_with_onnxruntime,
    "onnx_ir_shards": write_with_onnx_ir,
    "onnx_one_file_per_tensor": write_one_file_per_tensor,
}


@pytest.fixture(scope="module", params=list(PRODUCERS))
def produced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source written by a real producer, checked to look like what that producer writes."""
    path = PRODUCERS[request.param](tmp_path_factory.mktemp(request.param))
    ranges = external_ranges(path)
    files = weights_files(path)
    if request.param == "onnxruntime":
        assert files == {"weights.bin"} and "scale" not in ranges and set(TIED) <= set(ranges)
    elif request.param == "onnx_ir_shards":
        assert len(files) > 1 and all(name.startswith("w-") for name in files)
    else:
        assert files == set(ranges) == {"W1", "W1_tied", "W1_near", "b1", "W2", "b2", "scale"}
    return path


OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "align_threshold": {"align_threshold": 1024},
    "shards": {"max_shard_size": CAP},
    "shards_named": {"max_shard_size": CAP, "dst_weights": "shard.bin"},
    "dedup": {"dedup": True},
    "size_threshold": {"size_threshold": 1},
    "all_combined": {"align_threshold": 1024, "max_shard_size": CAP, "dedup": True, "size_threshold": 1},
    "sub_page": {"alignment": 64, "align_threshold": 256, "max_shard_size": 20000, "dedup": True},
}


@pytest.mark.parametrize("option_set", list(OPTIONS))
def test_layout_options_on_real_producers(produced: Path, option_set: str, tmp_path: Path) -> None:
    options = dict(OPTIONS[option_set])
    dst_weights = options.pop("dst_weights", None)
    alignment = options.get("alignment", ALIGNMENT)
    threshold = options.get("align_threshold", 0)
    source_tree = sha256_of_tree(produced.parent)

    pair = align_both(produced, tmp_path, dst_weights, **options)

    assert sha256_of_tree(produced.parent) == source_tree
    assert_no_temp_files(tmp_path)
    assert_common(pair, FEEDS)
    dst = pair.streaming
    ranges = external_ranges(dst)
    source_ranges = external_ranges(produced)
    base = dst_weights or "model.onnx.data"

    # Tensors external in the source stay external; inline ones move out only when size_threshold asks.
    size_threshold = options.get("size_threshold")
    for site in sites(dst):
        external = site.label in ranges
        if site.label in source_ranges or (size_threshold is not None and tensor_nbytes(site.tensor) >= size_threshold):
            assert external, site.label
        else:
            assert not external, site.label

    # Tensors of at least align_threshold bytes start at a multiple of the alignment; smaller ones are packed.
    for label, where in ranges.items():
        if where.length >= threshold:
            assert where.offset % alignment == 0, (label, where)

    if "max_shard_size" in options:
        assert_shards(dst, base, options["max_shard_size"])
    else:
        assert weights_files(dst) == {base}

    by_bytes: dict[bytes, set[tuple[str, int]]] = {}
    for site in sites(dst):
        if site.label in ranges:
            where = ranges[site.label]
            by_bytes.setdefault(payload(site, dst.parent), set()).add((where.location, where.offset))
    if options.get("dedup"):
        # Identical bytes are stored once; the near-duplicate (last byte differs) keeps its own copy.
        assert all(len(places) == 1 for places in by_bytes.values()), by_bytes.values()
        assert ranges["W1"] == ranges["W1_tied"] and ranges["W1_near"] != ranges["W1"]
        stored = {(r.location, r.offset, r.length) for r in ranges.values()}
        assert sum(length for _, _, length in stored) == sum(len(data) for data in by_bytes)
    else:
        assert len({(r.location, r.offset) for r in ranges.values()}) == len(ranges)


def test_dedup_with_shards_stores_the_tied_weight_once_in_its_own_file(produced: Path, tmp_path: Path) -> None:
    """With a cap below a tied tensor's size, both names point at the single file holding that one copy."""
    pair = align_both(produced, tmp_path, max_shard_size=CAP, dedup=True)

    ranges = external_ranges(pair.streaming)
    tied = ranges["W1"]
    assert ranges["W1_tied"] == tied and tied.offset == 0
    assert os.path.getsize(pair.streaming.parent / tied.location) == tied.length == 64 * 64 * 4
    holders = {label for label, where in ranges.items() if where.location == tied.location}
    assert holders == set(TIED)
    # Without dedup the same model needs one more 16 KiB file.
    plain = align_both(produced, tmp_path / "plain", max_shard_size=CAP)
    assert len(weights_files(plain.streaming)) == len(weights_files(pair.streaming)) + 1
    assert plain.streaming_result - pair.streaming_result == 64 * 64 * 4
