"""``verify_models``: a user rewrote a model (re-aligned, sharded, inlined...) and wants proof that no tensor changed.

Equal models are stored every way real producers store them (inline raw, inline typed fields, one data file, one file
per tensor, onnx-ir shards, onnxruntime's optimized-model initializers file, our aligner); differences are planted
with plain file edits and must be reported exactly; unsafe or broken references are refused before any comparison.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import os
import re
import shutil
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref.errors import ExternalDataError, InvalidModelError, UnsafeLocationError
from onnx_light_ref.io import _verify as verify_module
from onnx_light_ref.io._read import wire as wire_module
from onnx_light_ref.io._read.model_file import PROTOBUF_LIMIT
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._verify import MAX_CHUNK_SIZE, VerifyResult, verify_models
from onnx_light_ref.ops import delay_initializers, undelay_initializers
from tests import large_inline
from tests.checks import assert_no_temp_files, sha256_of_tree
from tests.memory_folder import in_memory_folder
from tests.models import externalize, identity_model, make_external_model
from tests.verify_support import flip_byte, summary

IR_VERSION = 10
OPSET = 18


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {
        "w0": rng.standard_normal((32, 32)).astype(np.float32),  # 4096 bytes
        "w1": rng.integers(-(2**40), 2**40, size=300, dtype=np.int64),  # 2400 bytes
        "w2": rng.standard_normal(333).astype(np.float16),  # 666 bytes: not a multiple of any chunk used below
        "w3": rng.standard_normal((8, 8)).astype(np.float32),
    }


def save_inline(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def internalized(path: Path, dst: Path) -> Path:
    """A copy of the model at ``path`` with every external tensor moved inline (plain reads, no package code)."""
    model = onnx.load_model(str(path), load_external_data=False)
    for site in iter_tensors(model):
        tensor = site.tensor
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        with open(path.parent / entries["location"], "rb") as data_file:
            data_file.seek(int(entries.get("offset", "0")))
            tensor.raw_data = data_file.read(int(entries["length"]))
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
    return save_inline(model, dst)


def entries_of(model_path: Path, name: str) -> dict[str, str]:
    model = onnx.load_model(str(model_path), load_external_data=False)
    tensor = next(site.tensor for site in iter_tensors(model) if site.tensor.name == name)
    return {e.key: e.value for e in tensor.external_data}


def external_model(folder: Path) -> Path:
    """The test weights saved by onnx's own writer into ``folder/model.onnx.data``, back to back."""
    folder.mkdir(parents=True, exist_ok=True)
    return make_external_model(folder, weights(), size_threshold=0)


def assert_equal(result: VerifyResult, tensors: int, nbytes: int) -> None:
    assert summary(result) == summary(VerifyResult(True, tensors, nbytes, None)), result


TOTAL = sum(a.nbytes for a in weights().values())


# --- equal models, stored differently ------------------------------------------------------------------------------


@pytest.fixture
def inline_model(tmp_path) -> Path:
    return save_inline(identity_model(weights()), tmp_path / "inline" / "model.onnx")


def test_inline_and_one_external_file_are_equal(tmp_path, inline_model):
    external = external_model(tmp_path / "ext")

    assert_equal(verify_models(inline_model, external), 4, TOTAL)
    assert_equal(verify_models(external, inline_model, chunk_size=7), 4, TOTAL)


def test_typed_fields_equal_their_raw_bytes_inline_or_external(tmp_path):
    tensors = weights()
    typed = save_inline(identity_model(tensors, typed_inline=list(tensors)), tmp_path / "typed" / "model.onnx")
    assert len(onnx.load(str(typed)).graph.initializer[1].int64_data) == 300  # really typed, not raw_data
    external = external_model(tmp_path / "ext")

    assert_equal(verify_models(typed, external, chunk_size=1000), 4, TOTAL)


def test_sub_byte_and_bool_typed_tensors_equal_their_packed_raw_bytes(tmp_path):
    def model_with(tensors: list[onnx.TensorProto], path: Path) -> Path:
        graph = helper.make_graph([], "g", [], [], initializer=tensors)
        return save_inline(helper.make_model(graph, ir_version=IR_VERSION), path)

    values = [1, -2, 3, -4, 5]
    typed = model_with(
        [
            helper.make_tensor("i4", TensorProto.INT4, [5], values),
            helper.make_tensor("b", TensorProto.BOOL, [2], [1, 0]),
        ],
        tmp_path / "typed" / "model.onnx",
    )
    raw = model_with(
        [
            helper.make_tensor("i4", TensorProto.INT4, [5], bytes([0xE1, 0xC3, 0x05]), raw=True),
            helper.make_tensor("b", TensorProto.BOOL, [2], b"\x01\x00", raw=True),
        ],
        tmp_path / "raw" / "model.onnx",
    )

    assert_equal(verify_models(typed, raw), 2, 5)


def test_one_file_per_tensor_written_by_onnx_equals_one_file(tmp_path):
    per_tensor = tmp_path / "per_tensor" / "model.onnx"
    per_tensor.parent.mkdir()
    onnx.save_model(
        identity_model(weights()),
        str(per_tensor),
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=0,
    )
    assert sorted(os.listdir(per_tensor.parent)) == ["model.onnx", "w0", "w1", "w2", "w3"]
    one_file = external_model(tmp_path / "one")

    assert_equal(verify_models(per_tensor, one_file, chunk_size=1024), 4, TOTAL)


def test_onnx_ir_shards_equal_the_source(tmp_path, inline_model):
    ir = pytest.importorskip("onnx_ir")
    sharded = tmp_path / "ir" / "model.onnx"
    sharded.parent.mkdir()
    ir.save(
        ir.load(str(inline_model)),
        str(sharded),
        external_data="model.onnx.data",
        size_threshold_bytes=0,
        max_shard_size_bytes=3000,
    )
    assert len([name for name in os.listdir(sharded.parent) if name.endswith(".data")]) >= 3

    assert_equal(verify_models(inline_model, sharded, chunk_size=512), 4, TOTAL)


def test_onnxruntime_optimized_model_initializers_file_equals_the_source(tmp_path, inline_model):
    ort = pytest.importorskip("onnxruntime")
    optimized = tmp_path / "ort" / "model.onnx"
    optimized.parent.mkdir()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(optimized)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "100")
    ort.InferenceSession(str(inline_model), options, providers=["CPUExecutionProvider"])
    assert entries_of(optimized, "w0")["location"] == "weights.bin"

    assert_equal(verify_models(inline_model, optimized), 4, TOTAL)


def test_every_zoo_model_equals_its_aligned_and_its_inlined_copies(tmp_path, zoo_model):
    aligned = tmp_path / "aligned" / "model.onnx"
    aligned.parent.mkdir()
    align_external_data_streaming(zoo_model.path, aligned, alignment=64)
    inline = internalized(zoo_model.path, tmp_path / "inline" / "model.onnx")
    count = len(list(iter_tensors(onnx.load_model(str(zoo_model.path), load_external_data=False))))

    for a, b in ((zoo_model.path, aligned), (aligned, inline), (inline, zoo_model.path)):
        result = verify_models(a, b, chunk_size=5)
        assert result.equal, result.first_difference
        assert result.tensors == count


def test_a_model_equals_itself_and_progress_ends_at_the_total(tmp_path):
    model = external_model(tmp_path)
    calls = []

    result = verify_models(model, model, progress=lambda done, total: calls.append((done, total)))

    assert_equal(result, 4, TOTAL)
    assert calls[-1] == (TOTAL, TOTAL)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cycle_collector_is_left_as_it_was_after_a_verdict_and_after_a_refusal(tmp_path, enabled):
    """verify pauses Python's cycle collector while it lists the tensors (a speed-up: nothing to collect), and gives
    it back as the caller had it, also when a model is refused."""
    model = external_model(tmp_path)
    gc_was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert verify_models(model, model).equal
        assert gc.isenabled() is enabled
        with pytest.raises(FileNotFoundError, match=r"missing\.onnx"):
            verify_models(model, tmp_path / "missing.onnx")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if gc_was else gc.disable()


def test_progress_reports_every_chunk_up_to_the_total(tmp_path, inline_model):
    external = external_model(tmp_path / "ext")
    calls: list[tuple[int, int]] = []

    verify_models(inline_model, external, chunk_size=1024, progress=lambda done, total: calls.append((done, total)))

    dones = [done for done, _ in calls]
    assert dones == sorted(dones) and calls[-1] == (TOTAL, TOTAL)
    assert len(calls) == sum(-(-a.nbytes // 1024) for a in weights().values())


# --- differences ---------------------------------------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    """Two identical external models in two folders: tests edit B."""
    return (
        external_model(tmp_path / "a"),
        external_model(tmp_path / "b"),
    )


@pytest.mark.parametrize("chunk_size", [1, 7, 4096, 4 * 1024 * 1024])
def test_a_tensor_differing_only_in_its_last_byte_is_found_exactly(pair, chunk_size):
    a, b = pair
    entries = entries_of(b, "w1")
    flip_byte(b.parent / entries["location"], int(entries["offset"]) + 2399)

    result = verify_models(a, b, chunk_size=chunk_size)

    assert not result.equal
    assert result.tensors == 1  # w0 was equal
    assert result.first_difference is not None
    assert result.first_difference.startswith("tensor #1 'w1' (initializer in graph 'identity'): ")
    expected_a = weights()["w1"].tobytes()[2399]
    assert result.first_difference.endswith(
        f"bytes differ at offset 2399 of 2400 (A: 0x{expected_a:02x}, B: 0x{expected_a ^ 1:02x})"
    )


def test_external_bytes_differing_from_the_other_sides_inline_bytes(tmp_path, inline_model):
    external = external_model(tmp_path / "ext")
    entries = entries_of(external, "w2")
    flip_byte(external.parent / entries["location"], int(entries["offset"]))

    result = verify_models(inline_model, external, chunk_size=100)

    assert "tensor #2 'w2'" in result.first_difference and "bytes differ at offset 0 of 666" in result.first_difference


def edited(model_path: Path, dst: Path, edit) -> Path:
    """A copy of ``model_path`` (and its folder) with ``edit(model)`` applied to the parsed model."""
    shutil.copytree(model_path.parent, dst)
    model = onnx.load_model(str(dst / model_path.name), load_external_data=False)
    edit(model)
    onnx.save_model(model, str(dst / model_path.name))
    return dst / model_path.name


def test_dims_difference_is_reported_before_any_byte_is_read(tmp_path, pair):
    a, _ = pair
    b = edited(a, tmp_path / "reshaped", lambda m: m.graph.initializer[0].dims.__setitem__(slice(None), [16, 64]))
    calls = []

    result = verify_models(a, b, progress=lambda *args: calls.append(args))

    assert summary(result) == summary(
        VerifyResult(
            False, 0, 0, "tensor #0 'w0' (initializer in graph 'identity'): dims differ (A: [32, 32], B: [16, 64])"
        )
    )
    assert calls == []


def test_dtype_difference_with_the_same_bytes(tmp_path, pair):
    a, _ = pair
    b = edited(a, tmp_path / "retyped", lambda m: setattr(m.graph.initializer[3], "data_type", TensorProto.INT32))

    result = verify_models(a, b)

    assert result.first_difference == (
        "tensor #3 'w3' (initializer in graph 'identity'): data type differs (A: FLOAT, B: INT32)"
    )


def test_renamed_tensor(tmp_path, pair):
    a, _ = pair
    b = edited(a, tmp_path / "renamed", lambda m: setattr(m.graph.initializer[2], "name", "w2_renamed"))

    result = verify_models(a, b)

    assert result.first_difference == (
        "tensor #2 'w2' (initializer in graph 'identity'): name differs (A: 'w2', B: 'w2_renamed')"
    )


def test_missing_last_tensor(tmp_path, pair):
    a, _ = pair
    b = edited(a, tmp_path / "fewer", lambda m: m.graph.initializer.pop())

    assert verify_models(a, b).first_difference == (
        "tensor #3 'w3' (initializer in graph 'identity') is only in A; A has 4 tensors, B has 3"
    )
    assert verify_models(b, a).first_difference == (
        "tensor #3 'w3' (initializer in graph 'identity') is only in B; A has 3 tensors, B has 4"
    )


def test_missing_middle_tensor_and_reordered_tensors(tmp_path, pair):
    a, _ = pair
    fewer = edited(a, tmp_path / "fewer", lambda m: m.graph.initializer.pop(1))

    def swap(model: onnx.ModelProto) -> None:
        first, second = onnx.TensorProto(), onnx.TensorProto()
        first.CopyFrom(model.graph.initializer[0])
        second.CopyFrom(model.graph.initializer[1])
        model.graph.initializer[0].CopyFrom(second)
        model.graph.initializer[1].CopyFrom(first)

    swapped = edited(a, tmp_path / "swapped", swap)

    assert verify_models(a, fewer).first_difference == (
        "tensor #1 'w1' (initializer in graph 'identity'): name differs (A: 'w1', B: 'w2'); A has 4 tensors, B has 3"
    )
    assert verify_models(a, swapped).first_difference == (
        "tensor #0 'w0' (initializer in graph 'identity'): name differs (A: 'w0', B: 'w1')"
    )


def subgraph_model(folder: Path, then_value: np.ndarray, *, external: bool) -> Path:
    """``If`` whose then-branch holds a Constant tensor (external when asked) and an initializer."""
    folder.mkdir(parents=True)
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(then_value, "then_const"), name="k")
    then_graph = helper.make_graph(
        [const], "then", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, list(then_value.shape))]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph, name="if")],
        "main",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    if external:
        then_branch = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
        externalize([then_branch.node[0].attribute[0].t], folder, "sub/then.bin", gap=b"\xff" * 5)
    return save_inline(model, folder / "model.onnx")


def test_subgraph_tensor_difference_names_its_place(tmp_path):
    value = np.arange(4, dtype=np.float32)
    a = subgraph_model(tmp_path / "a", value, external=True)
    same = subgraph_model(tmp_path / "same", value.copy(), external=False)
    changed = value.copy()
    changed[2] = 9.0
    b = subgraph_model(tmp_path / "b", changed, external=False)

    assert_equal(verify_models(a, same), 1, 16)
    assert verify_models(a, b).first_difference == (
        "tensor #0 'then_const' (attribute in graph 'main' / node 'if' (If) / then_branch / node 'k' (Constant) / "
        "value): bytes differ at offset 10 of 16 (A: 0x00, B: 0x10)"
    )


def sparse_constant_model(folder: Path, indices: list[int], *, external: bool) -> Path:
    """A Constant whose ``sparse_value`` attribute holds values and indices (external when asked)."""
    folder.mkdir(parents=True)
    values = numpy_helper.from_array(np.array([1.5, -2.5, 3.5], dtype=np.float32), "sp_values")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array(indices, dtype=np.int64), ""), [10])
    node = helper.make_node("Constant", [], ["y"], sparse_value=sparse, name="sparse_const")
    graph = helper.make_graph([node], "main", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    if external:
        attribute = model.graph.node[0].attribute[0].sparse_tensor
        externalize([attribute.values, attribute.indices], folder, "sparse.bin")
    return save_inline(model, folder / "model.onnx")


def test_sparse_attribute_tensors_compare_values_and_indices(tmp_path):
    a = sparse_constant_model(tmp_path / "a", [1, 4, 8], external=True)
    same = sparse_constant_model(tmp_path / "same", [1, 4, 8], external=False)
    other = sparse_constant_model(tmp_path / "other", [1, 4, 9], external=False)

    assert_equal(verify_models(a, same, chunk_size=3), 2, 12 + 24)
    assert verify_models(a, other).first_difference == (
        "tensor #1 \"<unnamed sparse attribute indices in graph 'main' / node 'sparse_const' (Constant) / "
        "sparse_value>\" (sparse attribute indices in graph 'main' / node 'sparse_const' (Constant) / sparse_value): "
        "bytes differ at offset 16 of 24 (A: 0x08, B: 0x09)"
    )


def test_string_tensors_compare_element_by_element(tmp_path):
    def model_with(values: list[bytes], name: str) -> Path:
        tensor = helper.make_tensor("s", TensorProto.STRING, [len(values)], values)
        graph = helper.make_graph([], "g", [], [], initializer=[tensor])
        return save_inline(helper.make_model(graph, ir_version=IR_VERSION), tmp_path / name / "model.onnx")

    a = model_with([b"alpha", b"beta"], "a")
    assert verify_models(a, model_with([b"alpha", b"beta"], "same")).equal
    assert verify_models(a, model_with([b"alpha", b"bet"], "b")).first_difference == (
        "tensor #0 's' (initializer in graph 'g'): string element 1 differs (A: b'beta', B: b'bet')"
    )


def sparse_initializer_model(folder: Path, dense_shape: list[int]) -> Path:
    """A sparse initializer with fixed values and indices, and the given dense shape."""
    values = numpy_helper.from_array(np.array([1.5, -2.5], dtype=np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, 3], dtype=np.int64), "sp_indices")
    graph = helper.make_graph(
        [], "g", [], [], sparse_initializer=[helper.make_sparse_tensor(values, indices, dense_shape)]
    )
    return save_inline(helper.make_model(graph, ir_version=IR_VERSION), folder / "model.onnx")


def test_sparse_tensors_with_the_same_values_but_another_dense_shape_differ(tmp_path):
    a = sparse_initializer_model(tmp_path / "a", [4])
    b = sparse_initializer_model(tmp_path / "b", [400])

    assert verify_models(a, sparse_initializer_model(tmp_path / "same", [4])).equal
    result = verify_models(a, b)
    assert not result.equal
    assert result.bytes_compared == 0  # a metadata difference: found before any byte
    assert result.first_difference == (
        "tensor #0 'sp' (sparse initializer values in graph 'g'): sparse tensor dims differ (A: [4], B: [400])"
    )


def string_model(folder: Path, tensor: TensorProto) -> Path:
    graph = helper.make_graph([], "g", [], [], initializer=[tensor])
    return save_inline(helper.make_model(graph, ir_version=IR_VERSION), folder / "model.onnx")


def test_string_tensors_holding_raw_data_or_another_count_than_their_dims_are_invalid(tmp_path):
    def raw_strings(data: bytes) -> TensorProto:
        tensor = TensorProto(name="s", data_type=TensorProto.STRING, dims=[2])
        tensor.raw_data = data
        return tensor

    # Two different raw_data payloads: comparing string_data alone (empty on both sides) called them equal.
    a = string_model(tmp_path / "a", raw_strings(b"abc"))
    b = string_model(tmp_path / "b", raw_strings(b"xyz"))
    short = helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"b"])
    short.dims[:] = [3]
    c = string_model(tmp_path / "c", short)
    before = sha256_of_tree(tmp_path)

    with pytest.raises(InvalidModelError, match=r"model A: STRING tensor 's' \(graph 'g'\) holds raw_data"):
        verify_models(a, b)
    with pytest.raises(InvalidModelError, match=r"model A: STRING tensor 's' .* 2 elements .* dims \[3\] need 3"):
        verify_models(c, c)
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("dims", [[2**40], [3], [11]], ids=["huge", "short", "long"])
def test_raw_data_of_another_size_than_its_dims_is_an_invalid_model(tmp_path, dims):
    tensor = numpy_helper.from_array(np.arange(10, dtype=np.float32), "x")  # 40 bytes
    tensor.dims[:] = dims
    a = string_model(tmp_path / "a", tensor)
    before = sha256_of_tree(tmp_path)

    # Both sides identical, yet no value: equal=True would certify a tensor nobody can load.
    with pytest.raises(InvalidModelError, match=rf"model A: tensor 'x' .*40 bytes of raw_data.*need {dims[0] * 4} "):
        verify_models(a, a)
    assert sha256_of_tree(tmp_path) == before


def test_negative_dims_of_an_inline_tensor_are_an_invalid_model(tmp_path):
    tensor = numpy_helper.from_array(np.arange(2, dtype=np.float32), "x")
    tensor.dims[:] = [-2]
    a = string_model(tmp_path / "a", tensor)

    with pytest.raises(InvalidModelError, match=r"model A: tensor 'x' has negative dims \[-2\]"):
        verify_models(a, a)


# --- checksums ------------------------------------------------------------------------------------------------------


def test_checksums_of_tensor_bytes_or_whole_file_pass_and_wrong_ones_are_listed(tmp_path):
    tensors = weights()
    per_tensor = identity_model(tensors)
    externalize(per_tensor.graph.initializer, tmp_path / "a", "w.bin", checksum=True)  # sha1 of each tensor's bytes
    a = save_inline(per_tensor, tmp_path / "a" / "model.onnx")
    whole_file = identity_model(tensors)
    externalize(whole_file.graph.initializer, tmp_path / "b", "w.bin")
    digest = hashlib.sha1((tmp_path / "b" / "w.bin").read_bytes()).hexdigest()  # the spec's wording: the whole file
    for tensor in whole_file.graph.initializer:
        tensor.external_data.add(key="checksum", value=digest)
    whole_file.graph.initializer[2].external_data[-1].value = "0" * 40
    b = save_inline(whole_file, tmp_path / "b" / "model.onnx")

    result = verify_models(a, b, chunk_size=1000, check_checksums=True)

    assert result.equal and result.tensors == 4
    assert result.checksum_mismatches == (
        "model B: tensor 'w2' (graph 'identity'): checksum '" + "0" * 40 + "' matches neither the SHA1 of its 666 "
        "bytes in 'w.bin' nor that of the whole file",
    )
    assert verify_models(a, b).checksum_mismatches == ()  # not checked unless asked


# --- refusals -------------------------------------------------------------------------------------------------------


def with_location(model_path: Path, name: str, **changes: str) -> None:
    model = onnx.load_model(str(model_path), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.name == name)
    for entry in tensor.external_data:
        if entry.key in changes:
            entry.value = changes[entry.key]
    onnx.save_model(model, str(model_path))


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"location": "../outside.bin"}, UnsafeLocationError, ["'w3'", "'../outside.bin'", "'..' component"]),
        ({"location": "missing.bin"}, FileNotFoundError, ["'w3'", "'missing.bin'", "does not exist"]),
        ({"length": "256", "offset": "9000"}, ExternalDataError, ["'w3'", "[offset 9000, +256 bytes)", "exceeds"]),
    ],
    ids=["unsafe location", "missing file", "out of bounds"],
)
def test_broken_references_are_refused_before_any_comparison(tmp_path, pair, change, error, words):
    a, b = pair
    (tmp_path / "outside.bin").write_bytes(b"\0" * 1024)
    with_location(b, "w3", **change)
    # A metadata difference on the first tensor as well: validation still comes first.
    with_location(a, "w0")
    before = sha256_of_tree(tmp_path)
    calls = []

    with pytest.raises(error) as caught:
        verify_models(a, b, progress=lambda *args: calls.append(args))

    for word in words:
        assert word in str(caught.value)
    assert calls == []
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_symlink_escaping_the_folder_is_refused(tmp_path, pair):
    a, b = pair
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8192)
    (b.parent / "link.bin").symlink_to(tmp_path / "secret.bin")
    with_location(b, "w0", location="link.bin", offset="0")

    with pytest.raises(UnsafeLocationError, match="outside the model's folder"):
        verify_models(a, b)


def test_hard_linked_data_file_is_refused_unless_allowed(tmp_path, pair):
    a, b = pair
    data = b.parent / entries_of(b, "w0")["location"]
    os.link(data, tmp_path / "elsewhere.data")

    with pytest.raises(UnsafeLocationError, match="2 hard links"):
        verify_models(a, b)
    assert_equal(verify_models(a, b, allow_hard_links=True), 4, TOTAL)


def test_a_file_that_is_not_a_model_and_a_missing_model(tmp_path, pair):
    a, _ = pair
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xfenot a model at all")

    with pytest.raises(InvalidModelError, match=r"garbage\.onnx"):
        verify_models(a, garbage)
    with pytest.raises(FileNotFoundError, match=r"nothing\.onnx"):
        verify_models(tmp_path / "nothing.onnx", a)


def test_typed_data_that_does_not_fit_its_dims_is_an_invalid_model(tmp_path, inline_model):
    bad = helper.make_tensor("w0", TensorProto.FLOAT, [2], [1.0, 2.0])
    bad.dims[:] = [5]
    graph = helper.make_graph([], "g", [], [], initializer=[bad])
    b = save_inline(helper.make_model(graph, ir_version=IR_VERSION), tmp_path / "bad" / "model.onnx")
    same_meta = helper.make_tensor("w0", TensorProto.FLOAT, [5], [0.0] * 5)
    a = save_inline(
        helper.make_model(helper.make_graph([], "g", [], [], initializer=[same_meta]), ir_version=IR_VERSION),
        tmp_path / "good" / "model.onnx",
    )

    with pytest.raises(InvalidModelError, match=r"'w0'.*does not fit its dims"):
        verify_models(a, b)


def test_a_data_file_shortened_during_the_comparison(pair):
    a, b = pair
    data = b.parent / entries_of(b, "w3")["location"]

    def shorten(done: int, total: int) -> None:
        if done == 4096:  # w0 compared: cut the file before w3 is read
            os.truncate(data, 4096)

    with pytest.raises(ExternalDataError, match="shortened after it was validated"):
        verify_models(a, b, chunk_size=4096, progress=shorten)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"chunk_size": 0}, ValueError),
        ({"chunk_size": 1.5}, TypeError),
        ({"check_checksums": "yes"}, TypeError),
        ({"allow_hard_links": 1}, TypeError),
        ({"by_name": "yes"}, TypeError),
    ],
)
def test_bad_arguments_are_refused_before_any_io(tmp_path, kwargs, error):
    with pytest.raises(error):
        verify_models(tmp_path / "none.onnx", tmp_path / "none.onnx", **kwargs)


def test_a_chunk_size_over_the_maximum_is_refused_before_any_io(tmp_path):
    with pytest.raises(ValueError) as caught:
        verify_models(tmp_path / "none.onnx", tmp_path / "none.onnx", chunk_size=64 * 2**30)

    assert str(caught.value) == f"chunk_size must be <= {MAX_CHUNK_SIZE}, got {64 * 2**30}."
    assert list(tmp_path.iterdir()) == []


def test_the_largest_chunk_size_allocates_only_what_the_tensors_need(tmp_path, pair):
    a, b = pair
    flip_byte(b.parent / "model.onnx.data", TOTAL - 1)

    tracemalloc.start()
    try:
        equal = verify_models(a, a, chunk_size=MAX_CHUNK_SIZE, check_checksums=True)
        different = verify_models(a, b, chunk_size=MAX_CHUNK_SIZE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert equal.equal and equal.bytes_compared == TOTAL
    assert different.first_difference is not None and "bytes differ" in different.first_difference
    # Two buffers of at most the largest tensor (4 KiB) and the model protos: far below one 1 GiB buffer.
    assert peak < 4 * 2**20, peak


# --- pairing by name ------------------------------------------------------------------------------------------------


def delay_undelay_round_trip(source: Path) -> Path:
    """``source`` with its two big initializers delayed, then undelayed: they come back after the two kept ones."""
    delayed = source.parent / "delayed.onnx"
    onnx.save_model(delay_initializers(source, min_size=1000), str(delayed))
    restored = source.parent / "restored.onnx"
    undelay_initializers(delayed, restored)
    return restored


def test_a_delay_undelay_round_trip_is_equal_by_name_and_differs_by_position(tmp_path):
    source = external_model(tmp_path / "m")
    restored = delay_undelay_round_trip(source)
    names = [t.name for t in onnx.load_model(str(restored), load_external_data=False).graph.initializer]
    assert names == ["w2", "w3", "w0", "w1"]  # the restored ones after the kept ones
    before = sha256_of_tree(tmp_path)

    assert_equal(verify_models(source, restored, by_name=True, chunk_size=1000), 4, TOTAL)
    assert_equal(verify_models(restored, source, by_name=True), 4, TOTAL)
    assert verify_models(source, restored).first_difference == (
        "tensor #0 'w0' (initializer in graph 'identity'): name differs (A: 'w0', B: 'w2')"
    )
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def reordered(model: onnx.ModelProto) -> None:
    model.graph.initializer.reverse()


def test_a_byte_difference_is_still_found_by_name(tmp_path, pair):
    a, _ = pair
    b = edited(a, tmp_path / "reversed", reordered)
    assert_equal(verify_models(a, b, by_name=True), 4, TOTAL)
    entries = entries_of(b, "w1")
    flip_byte(b.parent / entries["location"], int(entries["offset"]) + 7)

    result = verify_models(a, b, by_name=True)

    assert not result.equal
    assert result.tensors == 1  # w0 was equal; pairs go in A's order
    expected_a = weights()["w1"].tobytes()[7]
    assert result.first_difference == (
        "tensor #1 'w1' (initializer in graph 'identity'): bytes differ at offset 7 of 2400 "
        f"(A: 0x{expected_a:02x}, B: 0x{expected_a ^ 1:02x})"
    )


def test_a_renamed_tensor_is_a_difference_by_name(tmp_path, pair):
    a, _ = pair
    b = edited(a, tmp_path / "renamed", lambda m: setattr(m.graph.initializer[2], "name", "w2_renamed"))

    result = verify_models(a, b, by_name=True)

    assert summary(result) == summary(
        VerifyResult(False, 0, 0, "tensor #2 'w2' (initializer in graph 'identity') is only in A")
    )  # found before any byte is read


def test_a_missing_tensor_is_a_difference_by_name_on_either_side(tmp_path, pair):
    a, _ = pair
    fewer = edited(a, tmp_path / "fewer", lambda m: (m.graph.initializer.pop(1), reordered(m)))

    assert verify_models(a, fewer, by_name=True).first_difference == (
        "tensor #1 'w1' (initializer in graph 'identity') is only in A"
    )
    assert verify_models(fewer, a, by_name=True).first_difference == (
        "B's tensor #1 'w1' (initializer in graph 'identity') is only in B"
    )


def outer_weight_model(folder: Path, *, in_subgraph: bool) -> Path:
    """``If`` whose then-branch returns ``w``, an initializer of the main graph or of the branch itself."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32), "w")
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [6])],
        initializer=[w] if in_subgraph else [],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [6])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph, name="if")],
        "main",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
        initializer=[] if in_subgraph else [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    folder.mkdir(parents=True)
    return save_inline(model, folder / "model.onnx")


def test_a_tensor_moved_to_another_graph_is_a_difference_by_name(tmp_path):
    main = outer_weight_model(tmp_path / "main", in_subgraph=False)
    sub = outer_weight_model(tmp_path / "sub", in_subgraph=True)

    assert_equal(verify_models(sub, outer_weight_model(tmp_path / "same", in_subgraph=True), by_name=True), 1, 24)
    assert verify_models(main, sub, by_name=True).first_difference == (
        "tensor #0 'w' (initializer in graph 'main') is only in A (B has a tensor of that name: initializer in "
        "graph 'main' / node 'if' (If) / then_branch)"
    )


def two_sparse_model(folder: Path, *, reverse: bool, second_indices: list[int]) -> Path:
    """Two sparse initializers with unnamed indices, in either order."""
    sparse = [
        helper.make_sparse_tensor(
            numpy_helper.from_array(np.array([1.5, -2.5], dtype=np.float32), "sp0"),
            numpy_helper.from_array(np.array([0, 3], dtype=np.int64)),
            [4],
        ),
        helper.make_sparse_tensor(
            numpy_helper.from_array(np.array([7.0, 8.0], dtype=np.float32), "sp1"),
            numpy_helper.from_array(np.array(second_indices, dtype=np.int64)),
            [9],
        ),
    ]
    if reverse:
        sparse.reverse()
    graph = helper.make_graph([], "g", [], [], sparse_initializer=sparse)
    return save_inline(helper.make_model(graph, ir_version=IR_VERSION), folder / "model.onnx")


def test_unnamed_sparse_indices_are_paired_through_their_values_name(tmp_path):
    a = two_sparse_model(tmp_path / "a", reverse=False, second_indices=[1, 5])
    b = two_sparse_model(tmp_path / "b", reverse=True, second_indices=[1, 5])
    changed = two_sparse_model(tmp_path / "c", reverse=True, second_indices=[1, 6])

    assert_equal(verify_models(a, b, by_name=True), 4, 48)  # 2 x (8 + 16) bytes
    assert "name differs (A: 'sp0', B: 'sp1')" in verify_models(a, b).first_difference
    assert verify_models(a, changed, by_name=True).first_difference == (
        """tensor #3 "<unnamed sparse initializer indices in graph 'g'>" (sparse initializer indices in graph 'g'): """
        "bytes differ at offset 8 of 16 (A: 0x05, B: 0x06)"
    )


def test_a_renamed_attribute_tensor_is_a_difference_by_name(tmp_path):
    value = np.arange(4, dtype=np.float32)
    a = subgraph_model(tmp_path / "a", value, external=True)
    b = edited(a, tmp_path / "b", lambda m: setattr(m.graph.node[0].attribute[1].g.node[0].attribute[0].t, "name", "x"))

    assert_equal(verify_models(a, subgraph_model(tmp_path / "same", value, external=False), by_name=True), 1, 16)
    assert verify_models(a, b, by_name=True).first_difference == (
        "tensor #0 'then_const' (attribute in graph 'main' / node 'if' (If) / then_branch / node 'k' (Constant) / "
        "value): name differs (A: 'then_const', B: 'x')"
    )


def test_a_name_twice_in_one_graph_cannot_be_paired_by_name(tmp_path, pair):
    a, _ = pair
    b = edited(a, tmp_path / "twice", lambda m: setattr(m.graph.initializer[3], "name", "w1"))
    before = sha256_of_tree(tmp_path)

    with pytest.raises(InvalidModelError) as caught:
        verify_models(a, b, by_name=True)

    assert str(caught.value) == (
        "model B: initializer 'w1' (graph 'identity') and initializer 'w1' (graph 'identity') have the same name in "
        "the same graph (or belong to same-named attributes of one node): tensors cannot be paired by name; compare "
        "them by position."
    )
    assert verify_models(a, b).first_difference.endswith("name differs (A: 'w3', B: 'w1')")
    assert sha256_of_tree(tmp_path) == before


def test_same_named_nodes_are_paired_by_name_and_occurrence(tmp_path):
    a = outer_weight_model(tmp_path / "a", in_subgraph=True)

    def duplicate_if(model: onnx.ModelProto) -> None:
        model.graph.node.append(model.graph.node[0])

    def weight_in_the_second_if(model: onnx.ModelProto) -> None:
        duplicate_if(model)
        del model.graph.node[0].attribute[1].g.initializer[:]  # then_branch of the first 'if'

    twice = edited(a, tmp_path / "twice", duplicate_if)
    second = edited(a, tmp_path / "second", weight_in_the_second_if)

    # B's first 'if' is now "the first of two": another key, at the same place.
    assert verify_models(a, twice, by_name=True).first_difference == (
        "tensor #0 'w' (initializer in graph 'main' / node 'if' (If) / then_branch) is only in A (B has a tensor of "
        "that name: initializer in graph 'main' / node 'if' (If) / then_branch)"
    )
    assert verify_models(twice, second, by_name=True).first_difference == (
        "tensor #0 'w' (initializer in graph 'main' / node 'if' (If) / then_branch) is only in A (B has a tensor of "
        "that name: initializer in graph 'main' / node 'if' (If) / then_branch, at graph / node #1 / attribute #1 "
        "'then_branch' / g / initializer #0 where this one is at graph / node #0 / attribute #1 'then_branch' / g / "
        "initializer #0)"
    )
    assert verify_models(second, second, by_name=True).equal


def test_same_named_attributes_holding_subgraphs_cannot_be_paired_by_name(tmp_path):
    a = outer_weight_model(tmp_path / "a", in_subgraph=True)

    def duplicate_then_branch(model: onnx.ModelProto) -> None:
        model.graph.node[0].attribute.append(model.graph.node[0].attribute[1])

    b = edited(a, tmp_path / "b", duplicate_then_branch)
    before = sha256_of_tree(tmp_path)

    with pytest.raises(
        InvalidModelError,
        match=r"^model B: two subgraphs are both reached as graph 'main' / node 'if' \(If\) / then_branch: two "
        "attributes of one node have the same name",
    ):
        verify_models(a, b, by_name=True)
    assert summary(verify_models(b, b)) == summary(VerifyResult(True, 2, 48, None))  # by position, the two are compared
    assert sha256_of_tree(tmp_path) == before


# --- memory by construction ----------------------------------------------------------------------------------------


def test_the_read_path_only_uses_two_chunk_buffers_and_positional_reads():
    tree = ast.parse(Path(verify_module.__file__).read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None) for node in calls
    }
    # No whole-file reads, no mapping, no numpy file loaders, no open(): bytes only come through pread_exact.
    assert names.isdisjoint({"read", "readinto", "read_bytes", "open", "mmap", "fromfile", "memmap", "load"})
    assert "pread_exact" in names
    allocations = [ast.unparse(node.args[0]) for node in calls if getattr(node.func, "id", None) == "bytearray"]
    # Two empty buffers, each grown in one place only, never past chunk_size (itself at most MAX_CHUNK_SIZE).
    assert sorted(allocations) == ["0", "0", "size"]
    grow = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_buffer")
    assert "size = min(self.chunk_size, max(n, 2 * len(buffer)))" in ast.unparse(grow)


# --- a .onnx over protobuf's 2 GiB limit, its weights inline (sparse files: a few MiB of real blocks each) ----------

LARGE_TOTAL = 16 + 12 + large_inline.COUNT * large_inline.LENGTH  # small (raw_data) + typed (float_data) + large
DEEP = (large_inline.COUNT - 1, 1_500_001)  # the last tensor, beyond byte 2**31 of the file, between its markers


def write_large(path: Path, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    large_inline.write_large_inline_model(path, **kwargs)
    # Settle delayed allocation before anyone snapshots st_blocks: without it the block count of a just-written
    # sparse file can change while verify (which never writes) reads it, and files_state fails now and then.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.stat().st_size > PROTOBUF_LIMIT
    if large_inline.real_bytes(path.parent) > 16 * 2**20:
        pytest.skip(f"{path.parent} does not keep holes in sparse files")
    return path


def files_state(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Size, modification time and real blocks of every file: hashing gigabytes of holes would prove no more."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_blocks) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def large_folder(tmp_path_factory) -> Iterator[Path]:
    """The sparse files of this section, in memory when the tests may mount (``tests/memory_folder.py``: reading
    holes from ext4 zero-fills page cache, most of this file's time)."""
    with in_memory_folder(tmp_path_factory.mktemp("large"), "1g") as folder:
        yield folder


@pytest.fixture
def large_tmp(large_folder, request) -> Iterator[Path]:
    """A fresh folder of the test's own in :func:`large_folder`, removed after the test."""
    folder = large_folder / request.node.name
    folder.mkdir()
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def large_a(large_folder) -> Path:
    return write_large(large_folder / "a" / "model.onnx")


@pytest.mark.slow  # reads 2 GiB of holes from each of two files: 2-12 s here (page cache, load)
def test_a_model_over_2_gib_with_a_byte_difference_deep_inside_a_payload(large_tmp, large_a):
    b = write_large(large_tmp / "b" / "model.onnx", flip=DEEP)
    before = files_state(b.parent), files_state(large_a.parent)
    chunk = 1024 * 1024
    result = verify_models(large_a, b, chunk_size=chunk)
    index = large_inline.FIRST_LARGE + DEEP[0]
    done_before = 16 + 12 + DEEP[0] * large_inline.LENGTH
    assert summary(result) == summary(
        VerifyResult(
            False,
            index,
            done_before + DEEP[1] // chunk * chunk,
            f"tensor #{index} '{large_inline.large_name(DEEP[0])}' (initializer in graph '{large_inline.GRAPH}'): "
            f"bytes differ at offset {DEEP[1]} of {large_inline.LENGTH} (A: 0x00, B: 0x01)",
        )
    )
    assert (files_state(b.parent), files_state(large_a.parent)) == before


def test_a_model_over_2_gib_equals_itself_without_reading_its_payloads(large_a):
    seen: list[tuple[int, int]] = []
    result = verify_models(large_a, large_a, progress=lambda done, total: seen.append((done, total)))
    assert_equal(result, large_inline.FIRST_LARGE + large_inline.COUNT, LARGE_TOTAL)
    assert seen[-1] == (LARGE_TOTAL, LARGE_TOTAL)


@pytest.mark.slow  # aligns and reads 2 GiB of holes: 3-7 s here
def test_a_model_over_2_gib_equals_its_aligned_externalized_copy(large_tmp, large_a):
    aligned = large_tmp / "aligned" / "model.onnx"
    aligned.parent.mkdir()
    # dedup: the large tensors are mostly holes, equal but for their markers; each distinct one is stored once, so
    # the copy costs a few MiB of real blocks instead of 2 GiB.
    align_external_data_streaming(large_a, aligned, size_threshold=1024, durable=False, dedup=True)
    assert large_inline.real_bytes(aligned.parent) < 16 * 2**20
    copy = onnx.load_model(str(aligned), load_external_data=False)
    assert sum(t.data_location == TensorProto.EXTERNAL for t in copy.graph.initializer) == large_inline.COUNT
    tensors = large_inline.FIRST_LARGE + large_inline.COUNT
    assert_equal(verify_models(large_a, aligned), tensors, LARGE_TOTAL)
    assert_equal(verify_models(aligned, large_a, by_name=True, chunk_size=1024 * 1024), tensors, LARGE_TOTAL)


def test_a_model_over_2_gib_is_parsed_by_the_wire_scan_and_a_small_one_is_not(large_tmp, large_a, monkeypatch):
    calls: list[str] = []
    real_scan = wire_module.load_model_stripped

    def scan(path, min_length, **kwargs):
        calls.append(os.path.basename(os.path.dirname(path)))
        return real_scan(path, min_length, **kwargs)

    monkeypatch.setattr(wire_module, "load_model_stripped", scan)
    small_a = save_inline(identity_model(weights()), large_tmp / "small" / "model.onnx")
    assert_equal(verify_models(small_a, external_model(large_tmp / "ext")), 4, TOTAL)
    assert calls == []
    assert verify_models(large_a, large_a).equal
    assert calls == ["a", "a"]


def test_a_stripped_payload_that_does_not_fit_its_dims_is_an_invalid_model(large_tmp):
    model = large_inline.large_inline_model()
    model.graph.initializer[large_inline.FIRST_LARGE + 1].dims[0] = large_inline.LENGTH - 1
    b = write_large(large_tmp / "b" / "model.onnx", model=model)
    before = files_state(b.parent)
    with pytest.raises(
        InvalidModelError,
        match=rf"model A: tensor 'w0001' \(.*\) has {large_inline.LENGTH} bytes of raw_data, but its dims "
        rf"\[{large_inline.LENGTH - 1}\] and data type UINT8 need {large_inline.LENGTH - 1} bytes",
    ):
        verify_models(b, b)  # the same file: equal ranges, but each is checked against its dims first
    assert files_state(b.parent) == before


def test_a_model_over_2_gib_with_a_name_that_is_not_utf8_is_an_invalid_model(large_tmp, large_a):
    b = write_large(large_tmp / "b" / "model.onnx")
    with open(b, "r+b") as f:
        head = f.read(64 * 1024)
        assert head.count(b"typed") == 1
        f.seek(head.index(b"typed"))
        f.write(b"typ\xffd")
    before = files_state(b.parent)
    with pytest.raises(InvalidModelError, match=r"graph\.initializer\[1\]\.name is not valid UTF-8 \(b'typ\\xffd'\)"):
        verify_models(large_a, b)
    assert files_state(b.parent) == before


def test_a_weights_file_over_2_gib_given_as_a_model_is_an_invalid_model(tmp_path, large_a):
    weights_file = tmp_path / "model.onnx.data"
    with open(weights_file, "wb") as f:
        f.truncate(PROTOBUF_LIMIT + 4096)  # zeros: field number 0 is no protobuf tag
    with pytest.raises(
        InvalidModelError,
        match=r"model\.onnx\.data' is not a valid ONNX model: invalid field tag 0 .* at byte offset 0",
    ):
        verify_models(large_a, weights_file)
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx.data"]


@pytest.mark.parametrize("change", ["modified", "replaced"])
def test_a_model_over_2_gib_changed_after_it_was_parsed_is_refused(large_tmp, change):
    a = write_large(large_tmp / "a" / "model.onnx")
    b = write_large(large_tmp / "b" / "model.onnx", flip=DEEP)
    other = write_large(large_tmp / "other" / "model.onnx")

    def after_the_first_chunk(done: int, total: int) -> None:
        # The small inline tensors come first: the .onnx is opened for the first stripped payload, after this.
        if done == 16:
            if change == "modified":
                st = a.stat()
                os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
            else:
                os.replace(other, a)

    before = files_state(b.parent)
    with pytest.raises(
        ExternalDataError,
        match=rf"model A \({re.escape(repr(str(a)))}\) was {change} after it was parsed.*; its inline tensors cannot "
        "be compared",
    ):
        verify_models(a, b, progress=after_the_first_chunk)
    assert files_state(b.parent) == before
    assert [p.name for p in a.parent.iterdir()] == ["model.onnx"]
