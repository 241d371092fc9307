"""bfloat16 at every place a tensor reaches onnx's evaluator: the values the model holds, on every onnx.

onnx 1.17's loader (``numpy_helper.to_array``, what its ``ReferenceEvaluator`` converts tensors with) ignores the
``raw_data`` of a bfloat16 tensor and returns uninitialized memory. The ``DelayedInitializer`` kernel reads the bytes
itself, but the tensors ``reference_evaluator`` loads eagerly (an initializer that is also a graph input, an external
``Constant``) went into ``raw_data``: ``run`` exited 0 with 4096 values of 4096 wrong. Every path now hands onnx a
bfloat16 tensor in the form it reads (``int32_data`` on 1.17,
:func:`~onnx_light_ref.io._read.onnx_compat.make_onnx_readable`). Each case here casts the tensor to float32 and
compares it, exactly, with numpy's widening of the same bits; it runs on the floor (onnx 1.17) and on the newest onnx.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_light_ref.backend import DelayedInitializerBackend
from onnx_light_ref.io._read.onnx_compat import make_onnx_readable, onnx_ignores_raw_data, to_array_reads_raw_data
from onnx_light_ref.ops import reference_evaluator
from onnx_light_ref.ops._evaluate import readable_model
from tests.cli_runner import run_cli
from tests.models import IR_VERSION, externalize, write_model

COUNT = 4096
BITS = (np.random.default_rng(3).standard_normal(COUNT).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
EXPECTED = (BITS.astype(np.uint32) << 16).view(np.float32)  # what the bfloat16 bits are, widened exactly
RAW = BITS.astype("<u2").tobytes()
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [COUNT])


def bf16(name: str) -> TensorProto:
    return TensorProto(name=name, data_type=TensorProto.BFLOAT16, dims=[COUNT], raw_data=RAW)


def cast(source: str, output: str = "y") -> onnx.NodeProto:
    return helper.make_node("Cast", [source], [output], to=TensorProto.FLOAT)


def model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], initializers: list[TensorProto]):
    graph = helper.make_graph(nodes, "bf16", inputs, [Y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)


def initializer_also_a_graph_input() -> onnx.ModelProto:
    return model([cast("W")], [helper.make_tensor_value_info("W", TensorProto.BFLOAT16, [COUNT])], [bf16("W")])


def converted_initializer() -> onnx.ModelProto:
    return model([cast("W")], [], [bf16("W")])


def constant() -> onnx.ModelProto:
    return model([helper.make_node("Constant", [], ["W"], value=bf16("value")), cast("W")], [], [])


def subgraphs() -> onnx.ModelProto:
    """An If whose then-branch has an initializer (converted) and whose else-branch has a Constant (eager)."""
    then_branch = helper.make_graph(
        [cast("Wt", "yt")], "then", [], [helper.make_tensor_value_info("yt", 1, [COUNT])], [bf16("Wt")]
    )
    constant_node = helper.make_node("Constant", [], ["We"], value=bf16("value"))
    else_branch = helper.make_graph(
        [constant_node, cast("We", "ye")], "else", [], [helper.make_tensor_value_info("ye", 1, [COUNT])]
    )
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    return model([node], [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])], [])


PLACES: dict[str, Callable[[], onnx.ModelProto]] = {
    "initializer also a graph input": initializer_also_a_graph_input,
    "converted initializer": converted_initializer,
    "Constant value": constant,
    "subgraph initializer and subgraph Constant": subgraphs,
}


def bf16_tensors(graph: onnx.GraphProto) -> list[TensorProto]:
    """The live bfloat16 tensors of ``graph`` and its subgraphs (initializers and ``t`` attributes)."""
    found = [t for t in graph.initializer if t.data_type == TensorProto.BFLOAT16]
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                found.append(attribute.t)
            if attribute.HasField("g"):
                found.extend(bf16_tensors(attribute.g))
    return found


def save(folder: Path, place: str, external: bool) -> Path:
    built = PLACES[place]()
    if external:
        tensors = bf16_tensors(built.graph)
        externalize(tensors, folder, "weights.data")
        assert tensors and all(t.data_location == TensorProto.EXTERNAL for t in bf16_tensors(built.graph))
    return write_model(folder / "model.onnx", built)


def feeds_for(place: str, cond: bool) -> dict[str, np.ndarray]:
    return {"cond": np.array(cond)} if place.startswith("subgraph") else {}


def test_the_floor_is_where_onnx_ignores_bfloat16_raw_data():
    """The defect this file guards against exists on onnx 1.17 only: the fix is a pass-through elsewhere."""
    assert onnx_ignores_raw_data(bf16("W")) == (not to_array_reads_raw_data(TensorProto.BFLOAT16))
    tensor = bf16("W")
    assert make_onnx_readable(tensor) == onnx_ignores_raw_data(bf16("W"))
    assert tensor.HasField("raw_data") == to_array_reads_raw_data(TensorProto.BFLOAT16)


@pytest.mark.parametrize("load_device", ["file", "cpu"])
@pytest.mark.parametrize("external", [True, False], ids=["external", "inline"])
@pytest.mark.parametrize("place", list(PLACES))
def test_reference_evaluator_gives_the_bfloat16_values_everywhere(tmp_path, place, external, load_device):
    path = save(tmp_path, place, external)
    with reference_evaluator(path, load_device) as session:
        for cond in (True, False) if place.startswith("subgraph") else (True,):
            (y,) = session.run(None, feeds_for(place, cond))
            assert y.dtype == np.float32
            assert np.array_equal(y, EXPECTED), f"{np.count_nonzero(y != EXPECTED)} of {COUNT} values wrong"


@pytest.mark.parametrize("place", ["initializer also a graph input", "Constant value"])
@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_run_writes_the_bfloat16_values(tmp_path, place, load_device):
    path = save(tmp_path / "model", place, external=True)
    result = run_cli("run", str(path), "--output-dir", str(tmp_path / "out"), "--load-device", load_device)
    assert result.returncode == 0, result.stderr
    assert np.array_equal(np.load(tmp_path / "out" / "y.npy"), EXPECTED)


@pytest.mark.parametrize("place", ["initializer also a graph input", "Constant value", "subgraph"])
def test_the_backend_gives_the_bfloat16_values_and_leaves_the_model_alone(place):
    built = PLACES["subgraph initializer and subgraph Constant" if place == "subgraph" else place]()
    before = built.SerializeToString()
    with DelayedInitializerBackend.prepare(built) as rep:
        (y,) = rep.run(feeds_for("subgraph" if place == "subgraph" else "", True))
    assert np.array_equal(y, EXPECTED)
    assert built.SerializeToString() == before
    assert (readable_model(built) is built) == to_array_reads_raw_data(TensorProto.BFLOAT16)
