"""A zoo of real models with external data, one per shape of model the aligners and writers must handle.

Import as ``from tests.zoo import ...``; ``tests/io/conftest.py`` wraps it in fixtures (``zoo_model`` runs a test once
per zoo model). Every model is built on :mod:`tests.models` (same IR version and opset as the rest of the suite) and
runs in onnxruntime with the ``feeds`` of its entry.

* :data:`ZOO` / :func:`build_zoo_model`: the builders by name, each writing one model into a given folder;
* :func:`reference_tensors`: the reference implementation's three float32 tensors;
* :func:`model_facts` / :class:`TensorFacts`: what a user can observe about every tensor of a saved model.

Builders write only under the folder they are given. :func:`model_facts` walks the model with the package's walker
(to list tensors in the order the writers see them) but reads every payload with plain file reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.io._read.walker import iter_tensors
from tests.checks import external_payload
from tests.models import (
    OPSET,
    externalize,
    identity_model,
    make_external_model,
    make_model,
    save_external,
    value_info,
    write_model,
)

__all__ = [
    "ZOO",
    "TensorFacts",
    "ZooModel",
    "build_zoo_model",
    "model_facts",
    "reference_tensors",
]


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


def _reference(folder: Path) -> ZooModel:
    return ZooModel("reference", make_external_model(folder, reference_tensors()))


def _several_files(folder: Path) -> ZooModel:
    rng = np.random.default_rng(3)
    tensors: dict[str, np.ndarray] = {
        "f32": rng.standard_normal(5).astype(np.float32),
        "i64": np.array([1, -2, 3], dtype=np.int64),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "u8": np.arange(13, dtype=np.uint8),
        "b": np.array([True, False]),
        "f64": rng.standard_normal((2, 2)),
        "i8": np.array([-1, 2, -3], dtype=np.int8),
    }
    model = identity_model(tensors)
    files = ["a.bin", "sub/b.bin", "c.data"]
    # Written in reverse order with gaps, so source order differs from destination order and ranges are not packed.
    initializers = list(model.graph.initializer)[::-1]
    externalize(initializers, folder, lambda t: files[len(t.name) % 3], gap=b"\xab" * 5)
    return ZooModel("several_files", write_model(folder / "model.onnx", model))


def _subgraphs(folder: Path) -> ZooModel:
    float3 = [3]

    def init(name: str, value: float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.full(3, value, dtype=np.float32), name)

    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w_then"], ["then_out"])],
        "then",
        [],
        [value_info("then_out", TensorProto.FLOAT, float3)],
        initializer=[init("w_then", 10.0)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "w_else"], ["else_out"])],
        "else",
        [],
        [value_info("else_out", TensorProto.FLOAT, float3)],
        initializer=[init("w_else", 20.0)],
    )
    body = helper.make_graph(
        [
            helper.make_node("Add", ["carried", "w_loop"], ["carried_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            value_info("iter", TensorProto.INT64, []),
            value_info("cond_in", TensorProto.BOOL, []),
            value_info("carried", TensorProto.FLOAT, float3),
        ],
        [value_info("cond_out", TensorProto.BOOL, []), value_info("carried_out", TensorProto.FLOAT, float3)],
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
            value_info("x", TensorProto.FLOAT, float3),
            value_info("cond", TensorProto.BOOL, []),
            value_info("trips", TensorProto.INT64, []),
        ],
        [value_info(n, TensorProto.FLOAT, float3) for n in ("y_main", "y_if", "y_loop")],
        initializer=[init("w_main", 1.0)],
    )
    path = save_external(make_model(graph), folder / "model.onnx", "model.onnx.data")
    feeds = {"x": np.array([1, 2, 3], dtype=np.float32), "cond": np.array(True), "trips": np.array(4)}
    return ZooModel("subgraphs", path, feeds)


def _constants(folder: Path) -> ZooModel:
    def constant(output: str, values: list[float]) -> onnx.NodeProto:
        tensor = numpy_helper.from_array(np.array(values, dtype=np.float32), f"{output}_value")
        return helper.make_node("Constant", [], [output], value=tensor)

    float4 = [4]
    branch_out = value_info("branch_out", TensorProto.FLOAT, float4)
    then_graph = helper.make_graph([constant("branch_out", [1, 2, 3, 4])], "then", [], [branch_out])
    else_graph = helper.make_graph([constant("branch_out", [-1, -2, -3, -4])], "else", [], [branch_out])
    graph = helper.make_graph(
        [
            constant("c_main", [0.25, 0.5, 0.75, 1.0]),
            helper.make_node("Add", ["x", "c_main"], ["y_main"]),
            helper.make_node("If", ["cond"], ["y_if"], then_branch=then_graph, else_branch=else_graph),
        ],
        "constants",
        [value_info("x", TensorProto.FLOAT, float4), value_info("cond", TensorProto.BOOL, [])],
        [value_info(n, TensorProto.FLOAT, float4) for n in ("y_main", "y_if")],
    )
    path = save_external(make_model(graph), folder / "model.onnx", "w.data", convert_attribute=True)
    feeds = {"x": np.arange(4, dtype=np.float32), "cond": np.array(False)}
    return ZooModel("constants", path, feeds)


def _function(folder: Path) -> ZooModel:
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
        [value_info("x", TensorProto.FLOAT, [5])],
        [value_info("y", TensorProto.FLOAT, [5])],
    )
    model = make_model(graph, domains={"ai.test": 1}, functions=[function])
    externalize([model.functions[0].node[0].attribute[0].t], folder, "function.bin", gap=b"\x01" * 3)
    return ZooModel("function", write_model(folder / "model.onnx", model), {"x": np.ones(5, dtype=np.float32)})


def _sparse(folder: Path) -> ZooModel:
    values = numpy_helper.from_array(np.array([1.5, -2.5, 3.5], dtype=np.float32), "sp")
    indices = numpy_helper.from_array(np.array([1, 4, 8], dtype=np.int64), "")
    sparse = helper.make_sparse_tensor(values, indices, [10])
    dense = numpy_helper.from_array(np.arange(6, dtype=np.int32), "dense")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["sp"], ["out_sp"]), helper.make_node("Identity", ["dense"], ["out_dense"])],
        "sparse",
        [],
        [value_info("out_sp", TensorProto.FLOAT, [10]), value_info("out_dense", TensorProto.INT32, [6])],
        initializer=[dense],
        sparse_initializer=[sparse],
    )
    model = make_model(graph)
    sparse_proto = model.graph.sparse_initializer[0]
    externalize([model.graph.initializer[0], sparse_proto.values, sparse_proto.indices], folder, "sparse.bin")
    # onnx.load leaves sparse tensors external (it resolves dense initializers and attributes only); onnxruntime
    # reads them.
    return ZooModel("sparse", write_model(folder / "model.onnx", model))


def _inline_mixed(folder: Path) -> ZooModel:
    tensors: dict[str, np.ndarray] = {
        "big": np.linspace(0, 1, 100, dtype=np.float32),  # 400 bytes: external
        "small_raw": np.array([7.0, 8.0], dtype=np.float32),  # 8 bytes: below the threshold, inline raw_data
        "typed": np.array([5, 6, 7], dtype=np.int64),  # typed int64_data: never external
        "big2": np.arange(50, dtype=np.int64),  # 400 bytes: external
    }
    return ZooModel("inline_mixed", make_external_model(folder, tensors, size_threshold=64, typed_inline=["typed"]))


def _checksum(folder: Path) -> ZooModel:
    model = identity_model(reference_tensors())
    externalize(model.graph.initializer, folder, "weights.bin", checksum=True)
    return ZooModel("checksum", write_model(folder / "model.onnx", model))


def _zero_length(folder: Path) -> ZooModel:
    tensors: dict[str, np.ndarray] = {
        "a": np.arange(10, dtype=np.float32),
        "empty_mid": np.zeros((0,), dtype=np.float32),
        "b": np.array([1, 2, 3], dtype=np.int32),
        "empty_last": np.zeros((0, 4), dtype=np.float32),
    }
    model = identity_model(tensors)
    externalize(model.graph.initializer, folder, "w.bin")
    return ZooModel("zero_length", write_model(folder / "model.onnx", model))


def _shared_range(folder: Path) -> ZooModel:
    same = np.array([4.0, 5.0, 6.0], dtype=np.float32)
    model = identity_model({"first": same, "other": np.array([9, 9], dtype=np.int64), "second": same.copy()})
    first, other, second = model.graph.initializer
    externalize([first, other], folder, "w.bin")
    # "second" points at exactly the bytes of "first", as a deduplicating writer would store it.
    second.ClearField("raw_data")
    second.data_location = TensorProto.EXTERNAL
    second.external_data.extend(first.external_data)
    return ZooModel("shared_range", write_model(folder / "model.onnx", model))


ZOO: dict[str, Callable[[Path], ZooModel]] = {
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


def build_zoo_model(name: str, folder: str | Path) -> ZooModel:
    """Write zoo model ``name`` (a key of :data:`ZOO`) into the existing ``folder``.

    Args:
        name: which model.
        folder: where the model and its data files go (nothing is written elsewhere).

    Returns:
        The model's entry.

    Raises:
        KeyError: ``name`` is not in the zoo.
    """
    return ZOO[name](Path(folder))


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
    """Facts about every tensor of the model at ``path`` (metadata parsed only), in walker order.

    Args:
        path: a saved ``.onnx`` file; external payloads are read relative to its folder.

    Returns:
        One entry per tensor, as the package's walker lists them.
    """
    model = onnx.load_model(str(path), load_external_data=False)
    facts = []
    for site in iter_tensors(model):
        tensor = site.tensor
        if tensor.data_location == TensorProto.EXTERNAL:
            entries: dict[str, str] | None = {e.key: e.value for e in tensor.external_data}
            keys = tuple(e.key for e in tensor.external_data)
            payload = external_payload(tensor, path.parent)
        else:
            entries, keys, payload = None, (), tensor.SerializeToString()
        facts.append(TensorFacts(site.where, tensor.name, tensor.data_type, tuple(tensor.dims), entries, keys, payload))
    return facts
