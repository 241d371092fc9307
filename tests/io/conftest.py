"""A zoo of real models with external data, one per shape of model the aligners must handle.

The ``zoo_model`` fixture is parametrized over the whole zoo: a test that takes it runs once per model. Every model
runs in onnxruntime with the ``feeds`` of its entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

# Same versions as tests/conftest.py's builders (conftest modules cannot import each other).
IR_VERSION = 10
OPSET = 18


@dataclass(frozen=True)
class Kit:
    """The shared builders of tests/conftest.py, handed to the zoo builders."""

    make_external_model: Callable[..., Path]
    build_identity_model: Callable[..., onnx.ModelProto]
    externalize: Callable[..., None]


@dataclass(frozen=True)
class ZooModel:
    """A source model on disk and how its consumers can check it."""

    name: str
    path: Path
    feeds: dict[str, np.ndarray] = field(default_factory=dict)


def reference_tensors() -> dict[str, np.ndarray]:
    """The reference implementation's test data: 28, 12 and 68 bytes of float32."""
    return {
        "w0": np.full(7, 1.5, dtype=np.float32),
        "w1": np.full(3, -2.0, dtype=np.float32),
        "w2": np.full(17, 3.0, dtype=np.float32),
    }


def _save_plain(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def _reference(folder: Path, kit: Kit) -> ZooModel:
    return ZooModel("reference", kit.make_external_model(folder, reference_tensors()))


def _several_files(folder: Path, kit: Kit) -> ZooModel:
    rng = np.random.default_rng(3)
    tensors = {
        "f32": rng.standard_normal(5).astype(np.float32),
        "i64": np.array([1, -2, 3], dtype=np.int64),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "u8": np.arange(13, dtype=np.uint8),
        "b": np.array([True, False]),
        "f64": rng.standard_normal((2, 2)),
        "i8": np.array([-1, 2, -3], dtype=np.int8),
    }
    model = kit.build_identity_model(tensors)
    files = ["a.bin", "sub/b.bin", "c.data"]
    # Written in reverse order with gaps, so source order differs from destination order and ranges are not packed.
    initializers = list(model.graph.initializer)[::-1]
    kit.externalize(initializers, folder, lambda t: files[len(t.name) % 3], gap=b"\xab" * 5)
    return ZooModel("several_files", _save_plain(model, folder / "model.onnx"))


def _subgraphs(folder: Path, kit: Kit) -> ZooModel:
    float3 = [3]

    def init(name: str, value: float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.full(3, value, dtype=np.float32), name)

    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w_then"], ["then_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", onnx.TensorProto.FLOAT, float3)],
        initializer=[init("w_then", 10.0)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "w_else"], ["else_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", onnx.TensorProto.FLOAT, float3)],
        initializer=[init("w_else", 20.0)],
    )
    body = helper.make_graph(
        [
            helper.make_node("Add", ["carried", "w_loop"], ["carried_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("iter", onnx.TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried", onnx.TensorProto.FLOAT, float3),
        ],
        [
            helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried_out", onnx.TensorProto.FLOAT, float3),
        ],
        initializer=[init("w_loop", 0.5)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "w_main"], ["y_main"]),
            helper.make_node("If", ["cond"], ["y_if"], then_branch=then_graph, else_branch=else_graph),
            helper.make_node("Loop", ["trips", "", "x"], ["y_loop"], body=body),
        ],
        "subgraphs",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, float3),
            helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("trips", onnx.TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, float3) for n in ("y_main", "y_if", "y_loop")],
        initializer=[init("w_main", 1.0)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    feeds = {"x": np.array([1, 2, 3], dtype=np.float32), "cond": np.array(True), "trips": np.array(4)}
    return ZooModel("subgraphs", path, feeds)


def _constants(folder: Path, kit: Kit) -> ZooModel:
    def constant(output: str, values: list[float]) -> onnx.NodeProto:
        tensor = numpy_helper.from_array(np.array(values, dtype=np.float32), f"{output}_value")
        return helper.make_node("Constant", [], [output], value=tensor)

    float4 = [4]
    branch_out = helper.make_tensor_value_info("branch_out", onnx.TensorProto.FLOAT, float4)
    then_graph = helper.make_graph([constant("branch_out", [1, 2, 3, 4])], "then", [], [branch_out])
    else_graph = helper.make_graph([constant("branch_out", [-1, -2, -3, -4])], "else", [], [branch_out])
    graph = helper.make_graph(
        [
            constant("c_main", [0.25, 0.5, 0.75, 1.0]),
            helper.make_node("Add", ["x", "c_main"], ["y_main"]),
            helper.make_node("If", ["cond"], ["y_if"], then_branch=then_graph, else_branch=else_graph),
        ],
        "constants",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, float4),
            helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, float4) for n in ("y_main", "y_if")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    path = folder / "model.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, size_threshold=0, convert_attribute=True, location="w.data"
    )
    feeds = {"x": np.arange(4, dtype=np.float32), "cond": np.array(False)}
    return ZooModel("constants", path, feeds)


def _function(folder: Path, kit: Kit) -> ZooModel:
    bias = numpy_helper.from_array(np.array([1, 2, 3, 4, 5], dtype=np.float32), "bias_value")
    function = helper.make_function(
        "ai.test",
        "AddBias",
        ["X"],
        ["Y"],
        [helper.make_node("Constant", [], ["bias"], value=bias), helper.make_node("Add", ["X", "bias"], ["Y"])],
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    graph = helper.make_graph(
        [helper.make_node("AddBias", ["x"], ["y"], domain="ai.test")],
        "function",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.test", 1)],
        functions=[function],
        ir_version=IR_VERSION,
    )
    kit.externalize([model.functions[0].node[0].attribute[0].t], folder, "function.bin", gap=b"\x01" * 3)
    return ZooModel("function", _save_plain(model, folder / "model.onnx"), {"x": np.ones(5, dtype=np.float32)})


def _sparse(folder: Path, kit: Kit) -> ZooModel:
    values = numpy_helper.from_array(np.array([1.5, -2.5, 3.5], dtype=np.float32), "sp")
    indices = numpy_helper.from_array(np.array([1, 4, 8], dtype=np.int64), "")
    sparse = helper.make_sparse_tensor(values, indices, [10])
    dense = numpy_helper.from_array(np.arange(6, dtype=np.int32), "dense")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["sp"], ["out_sp"]), helper.make_node("Identity", ["dense"], ["out_dense"])],
        "sparse",
        [],
        [
            helper.make_tensor_value_info("out_sp", onnx.TensorProto.FLOAT, [10]),
            helper.make_tensor_value_info("out_dense", onnx.TensorProto.INT32, [6]),
        ],
        initializer=[dense],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    sparse_proto = model.graph.sparse_initializer[0]
    kit.externalize([model.graph.initializer[0], sparse_proto.values, sparse_proto.indices], folder, "sparse.bin")
    # onnx.load leaves sparse tensors external (it resolves dense initializers and attributes only); onnxruntime
    # reads them.
    return ZooModel("sparse", _save_plain(model, folder / "model.onnx"))


def _inline_mixed(folder: Path, kit: Kit) -> ZooModel:
    tensors = {
        "big": np.linspace(0, 1, 100, dtype=np.float32),  # 400 bytes: external
        "small_raw": np.array([7.0, 8.0], dtype=np.float32),  # 8 bytes: below the threshold, inline raw_data
        "typed": np.array([5, 6, 7], dtype=np.int64),  # typed int64_data: never external
        "big2": np.arange(50, dtype=np.int64),  # 400 bytes: external
    }
    path = kit.make_external_model(folder, tensors, size_threshold=64, typed_inline=["typed"])
    return ZooModel("inline_mixed", path)


def _checksum(folder: Path, kit: Kit) -> ZooModel:
    model = kit.build_identity_model(reference_tensors())
    kit.externalize(model.graph.initializer, folder, "weights.bin", checksum=True)
    return ZooModel("checksum", _save_plain(model, folder / "model.onnx"))


def _zero_length(folder: Path, kit: Kit) -> ZooModel:
    tensors = {
        "a": np.arange(10, dtype=np.float32),
        "empty_mid": np.zeros((0,), dtype=np.float32),
        "b": np.array([1, 2, 3], dtype=np.int32),
        "empty_last": np.zeros((0, 4), dtype=np.float32),
    }
    model = kit.build_identity_model(tensors)
    kit.externalize(model.graph.initializer, folder, "w.bin")
    return ZooModel("zero_length", _save_plain(model, folder / "model.onnx"))


def _shared_range(folder: Path, kit: Kit) -> ZooModel:
    same = np.array([4.0, 5.0, 6.0], dtype=np.float32)
    model = kit.build_identity_model({"first": same, "other": np.array([9, 9], dtype=np.int64), "second": same.copy()})
    first, other, second = model.graph.initializer
    kit.externalize([first, other], folder, "w.bin")
    # "second" points at exactly the bytes of "first", as a deduplicating writer would store it.
    second.ClearField("raw_data")
    second.data_location = onnx.TensorProto.EXTERNAL
    second.external_data.extend(first.external_data)
    return ZooModel("shared_range", _save_plain(model, folder / "model.onnx"))


ZOO: dict[str, Callable[[Path, Kit], ZooModel]] = {
    "reference": _reference,
    "several_files": _several_files,
    "subgraphs": _subgraphs,
    "constants": _constants,
    "function": _function,
    "sparse": _sparse,
    "inline_mixed": _inline_mixed,
    "checksum": _checksum,
    "zero_length": _zero_length,
    "shared_range": _shared_range,
}


@pytest.fixture
def kit(
    make_external_model: Callable[..., Path],
    build_identity_model: Callable[..., onnx.ModelProto],
    externalize: Callable[..., None],
) -> Kit:
    return Kit(make_external_model, build_identity_model, externalize)


@pytest.fixture(params=sorted(ZOO))
def zoo_model(request: pytest.FixtureRequest, tmp_path: Path, kit: Kit) -> ZooModel:
    """Each zoo model in turn, built in ``tmp_path/src``."""
    folder = tmp_path / "src"
    folder.mkdir()
    return ZOO[request.param](folder, kit)


@pytest.fixture(name="build_zoo_model")
def _build_zoo_model_fixture(kit: Kit) -> Callable[[str, Path], ZooModel]:
    """``build_zoo_model(name, folder)``: one zoo model by name."""
    return lambda name, folder: ZOO[name](Path(folder), kit)


@pytest.fixture(name="reference_tensors")
def _reference_tensors_fixture() -> Callable[[], dict[str, np.ndarray]]:
    return reference_tensors


@dataclass(frozen=True)
class TensorFacts:
    """What a user can observe about one tensor of a saved model: its place, type, entries and bytes."""

    where: str
    name: str
    data_type: int
    dims: tuple[int, ...]
    entries: dict[str, str] | None  # None when the tensor is inline
    entry_keys: tuple[str, ...]  # in file order, to check the exact layout of the rewritten entries
    payload: bytes  # external bytes read with plain file reads, or the inline proto's serialized bytes


def model_facts(path: Path) -> list[TensorFacts]:
    """Facts about every tensor of the model at ``path`` (metadata parsed only), in walker order."""
    from onnx_light_ref.io.walker import iter_tensors

    model = onnx.load_model(str(path), load_external_data=False)
    facts = []
    for site in iter_tensors(model):
        tensor = site.tensor
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            with open(path.parent / entries["location"], "rb") as data_file:
                data_file.seek(int(entries["offset"]))
                payload = data_file.read(int(entries["length"]))
            keys = tuple(e.key for e in tensor.external_data)
        else:
            entries, keys, payload = None, (), tensor.SerializeToString()
        facts.append(TensorFacts(site.where, tensor.name, tensor.data_type, tuple(tensor.dims), entries, keys, payload))
    return facts


@pytest.fixture(name="model_facts")
def _model_facts_fixture() -> Callable[[Path], list[TensorFacts]]:
    return model_facts
