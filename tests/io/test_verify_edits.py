"""Any single edit to a model makes ``verify_models`` report a difference, by position and by name.

A property test: hypothesis picks one edit of a model that holds tensors in every kind of place (main graph,
``graphs[0]``/``graphs[1]`` of one attribute, two same-named nodes, two overloads of one function) and where each
side stores them (inline or external, as ``onnx.save_model`` writes them). Each edit changes what the model holds:
one byte of a payload, one dim (same byte count, so the change is not refused as a broken tensor), the data type
(to another of the same byte length), a tensor moved to a sibling subgraph, node or function overload, a renamed
tensor, a pair of tensors swapped. verify must never call the two models equal; a rename is one-sided by name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._verify import VerifyResult, verify_models
from tests.checks import sha256_of_tree
from tests.verify_support import summary

OPSET = [helper.make_opsetid("", 21), helper.make_opsetid("ai.test", 1)]

# Data types of one byte length: changing one into another keeps every byte, only the meaning changes.
SAME_WIDTH = [
    [TensorProto.FLOAT, TensorProto.INT32, TensorProto.UINT32],
    [TensorProto.INT64, TensorProto.DOUBLE, TensorProto.UINT64],
    [TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT16, TensorProto.UINT16],
]


def constant(name: str, value: np.ndarray, *, node_name: str = "") -> onnx.NodeProto:
    return helper.make_node("Constant", [], [f"{name}_out"], name=node_name, value=numpy_helper.from_array(value, name))


def base_model() -> onnx.ModelProto:
    """Tensors in every kind of place, each with its own contents (no edit below can leave the model unchanged)."""
    rng = np.random.default_rng(19)
    branches = [
        helper.make_graph(
            [], "branch", [], [], initializer=[numpy_helper.from_array(rng.random((3, 2), np.float32), n)]
        )
        for n in ("b0", "b1")
    ]
    multi = helper.make_node("Multi", [], ["m"], name="multi", domain="ai.test")
    multi.attribute.append(helper.make_attribute("branches", branches))
    nodes = [
        multi,
        constant("c", rng.random(5, np.float32), node_name="k"),  # two nodes named 'k': the first holds a tensor
        helper.make_node("Constant", [], ["k_out"], name="k", value_float=1.0),
    ]
    graph = helper.make_graph(
        nodes,
        "main",
        [],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(rng.random((4, 6), np.float32), "w0"),
            numpy_helper.from_array(rng.integers(-1000, 1000, (6, 4)).astype(np.int64), "w1"),
            numpy_helper.from_array(rng.random(10).astype(np.float16), "w2"),
            numpy_helper.from_array(rng.random((4, 6), np.float32), "w3"),
        ],
    )
    functions = []
    for overload in ("fast", "exact"):
        function = helper.make_function(
            "ai.test", "F", [], ["fc_out"], [constant("fc", rng.random(4, np.float32))], [OPSET[0]]
        )
        function.overload = overload
        functions.append(function)
    return helper.make_model(graph, opset_imports=OPSET, functions=functions)


# --- the edits: each takes the model and the random numbers hypothesis drew, and changes the model in place ------


def tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [site.tensor for site in iter_tensors(model)]


def flip_a_byte(model: onnx.ModelProto, pick: int, position: int, mask: int) -> None:
    tensor = tensors(model)[pick % len(tensors(model))]
    raw = bytearray(tensor.raw_data)
    raw[position % len(raw)] ^= mask
    tensor.raw_data = bytes(raw)


def change_a_dim(model: onnx.ModelProto, pick: int, position: int, _: int) -> None:
    """Insert a dim of 1 (same element count), or swap two unequal dims when ``position`` is odd and there are."""
    tensor = tensors(model)[pick % len(tensors(model))]
    dims = list(tensor.dims)
    if position % 2 and len(dims) == 2 and dims[0] != dims[1]:
        dims.reverse()
    else:
        dims.insert(position % (len(dims) + 1), 1)
    tensor.ClearField("dims")
    tensor.dims.extend(dims)


def change_the_dtype(model: onnx.ModelProto, pick: int, choice: int, _: int) -> None:
    tensor = tensors(model)[pick % len(tensors(model))]
    family = next(group for group in SAME_WIDTH if tensor.data_type in group)
    others = [data_type for data_type in family if data_type != tensor.data_type]
    tensor.data_type = others[choice % len(others)]


def rename(model: onnx.ModelProto, pick: int, suffix: int, _: int) -> None:
    tensor = tensors(model)[pick % len(tensors(model))]
    tensor.name = f"{tensor.name}_{suffix}"


def swap_a_pair(model: onnx.ModelProto, pick: int, _: int, __: int) -> None:
    """Swap the contents of two tensors of one data type and shape (w0/w3, or the two branches' initializers)."""
    branches = model.graph.node[0].attribute[0].graphs
    pairs = [
        (model.graph.initializer[0], model.graph.initializer[3]),
        (branches[0].initializer[0], branches[1].initializer[0]),
    ]
    first, second = pairs[pick % len(pairs)]
    first.raw_data, second.raw_data = second.raw_data, first.raw_data


def move_to_the_sibling_subgraph(model: onnx.ModelProto, _: int, __: int, ___: int) -> None:
    """b0 leaves graphs[0] for graphs[1] (both subgraphs are named 'branch'): the walker order is unchanged."""
    branches = model.graph.node[0].attribute[0].graphs
    moved = branches[0].initializer.pop()
    branches[1].initializer.insert(0, moved)


def move_to_the_same_named_node(model: onnx.ModelProto, _: int, __: int, ___: int) -> None:
    """The tensor attribute of the first node 'k' goes to the second 'k', whose float attribute comes back."""
    first, second = model.graph.node[1], model.graph.node[2]
    tensor_attribute, float_attribute = first.attribute.pop(), second.attribute.pop()
    first.attribute.append(float_attribute)
    second.attribute.append(tensor_attribute)


def swap_the_overloads_constants(model: onnx.ModelProto, _: int, __: int, ___: int) -> None:
    """The overloads trade their constants and their order: the same tensors, in the same order, in other places."""
    fast, exact = model.functions
    fast.node[0].attribute[0].t.raw_data, exact.node[0].attribute[0].t.raw_data = (
        exact.node[0].attribute[0].t.raw_data,
        fast.node[0].attribute[0].t.raw_data,
    )
    reordered = [onnx.FunctionProto(), onnx.FunctionProto()]
    reordered[0].CopyFrom(exact)
    reordered[1].CopyFrom(fast)
    del model.functions[:]
    model.functions.extend(reordered)


EDITS: dict[str, Callable[[onnx.ModelProto, int, int, int], None]] = {
    "flip_a_byte": flip_a_byte,
    "change_a_dim": change_a_dim,
    "change_the_dtype": change_the_dtype,
    "rename": rename,
    "swap_a_pair": swap_a_pair,
    "move_to_the_sibling_subgraph": move_to_the_sibling_subgraph,
    "move_to_the_same_named_node": move_to_the_same_named_node,
    "swap_the_overloads_constants": swap_the_overloads_constants,
}


def save(model: onnx.ModelProto, folder: Path, external: bool) -> Path:
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=external, location="model.onnx.data", size_threshold=0)
    return path


def test_the_base_model_equals_itself_however_it_is_stored(tmp_path):
    inline = save(base_model(), tmp_path / "inline", external=False)
    external = save(base_model(), tmp_path / "external", external=True)

    stored = tensors(onnx.load_model(str(external), load_external_data=False))
    assert len(stored) == 9
    assert any(t.data_location == TensorProto.EXTERNAL for t in stored)
    for by_name in (False, True):
        assert summary(verify_models(inline, external, by_name=by_name)) == summary(
            VerifyResult(True, 9, 504, None)
        )  # 404 + 2 x 24 + 20 + 2 x 16


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edit=st.sampled_from(sorted(EDITS)),
    numbers=st.tuples(st.integers(0, 2**16), st.integers(0, 2**16), st.integers(1, 255)),
    storage=st.tuples(st.booleans(), st.booleans()),
)
# The edits the first place key could not see: each used to verify as equal by position.
@example(edit="move_to_the_sibling_subgraph", numbers=(0, 0, 1), storage=(False, False))
@example(edit="move_to_the_same_named_node", numbers=(0, 0, 1), storage=(False, True))
@example(edit="swap_the_overloads_constants", numbers=(0, 0, 1), storage=(True, False))
def test_a_single_edit_is_always_a_difference_by_position_and_by_name(tmp_path_factory, edit, numbers, storage):
    folder = tmp_path_factory.mktemp("edit")
    edited = base_model()
    EDITS[edit](edited, *numbers)
    assert edited != base_model()  # the edit changed the model
    a = save(base_model(), folder / "a", external=storage[0])
    b = save(edited, folder / "b", external=storage[1])
    before = sha256_of_tree(folder)

    by_position = verify_models(a, b)
    by_name = verify_models(a, b, by_name=True)

    assert not by_position.equal and by_position.first_difference, by_position
    assert not by_name.equal and by_name.first_difference, by_name
    if edit == "rename":
        # A renamed initializer is one-sided by name; an attribute tensor is paired by its slot, its name compared.
        assert by_name.first_difference.endswith("is only in A") or "name differs" in by_name.first_difference
    assert sha256_of_tree(folder) == before


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_every_edit_is_a_difference_whatever_the_storage(tmp_path, edit):
    """Each edit once on every storage pairing, so that none depends on hypothesis drawing it."""
    for a_external in (False, True):
        for b_external in (False, True):
            edited = base_model()
            EDITS[edit](edited, 1, 3, 0x80)
            folder = tmp_path / f"{a_external}-{b_external}"
            a = save(base_model(), folder / "a", external=a_external)
            b = save(edited, folder / "b", external=b_external)

            for by_name in (False, True):
                assert not verify_models(a, b, by_name=by_name).equal, (edit, a_external, b_external, by_name)
