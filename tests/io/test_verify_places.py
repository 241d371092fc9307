"""``verify_models`` never calls two models equal when a tensor sits at another place, even where the readable path
(``where``) and the names are the same: ``graphs[0]`` and ``graphs[1]`` of one attribute, two nodes of one name, two
overloads of one model function. The place compared by position is the walker's structural one
(:attr:`TensorSite.place`); by name, the key tells them apart or the model is refused as unpairable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.io._verify import VerifyResult, verify_models
from tests.checks import sha256_of_tree
from tests.verify_support import summary

OPSET = [helper.make_opsetid("", 18), helper.make_opsetid("ai.test", 1)]
VALUE = np.arange(6, dtype=np.float32)


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def branch(with_weight: bool) -> onnx.GraphProto:
    """A subgraph named 'branch' either way: only its initializer list tells the two apart."""
    weights = [numpy_helper.from_array(VALUE, "w")] if with_weight else []
    return helper.make_graph([], "branch", [], [], initializer=weights)


def graphs_model(path: Path, holder: int) -> Path:
    """A node whose GRAPHS attribute holds two subgraphs; the weight is in ``graphs[holder]``."""
    node = helper.make_node("Multi", [], ["y"], name="multi", domain="ai.test")
    node.attribute.append(helper.make_attribute("branches", [branch(holder == 0), branch(holder == 1)]))
    graph = helper.make_graph([node], "main", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])])
    return save(helper.make_model(graph, opset_imports=OPSET), path)


def test_a_tensor_moved_from_graphs_0_to_graphs_1_differs(tmp_path):
    a = graphs_model(tmp_path / "a" / "model.onnx", holder=0)
    b = graphs_model(tmp_path / "b" / "model.onnx", holder=1)
    same = graphs_model(tmp_path / "same" / "model.onnx", holder=0)
    before = sha256_of_tree(tmp_path)

    by_position = verify_models(a, b)
    by_name = verify_models(a, b, by_name=True)

    assert summary(by_position) == summary(
        VerifyResult(
            False,
            0,
            0,
            "tensor #0 'w' (initializer in graph 'main' / node 'multi' (Multi) / branches[0]): place differs "
            "(A: initializer in graph 'main' / node 'multi' (Multi) / branches[0], "
            "B: initializer in graph 'main' / node 'multi' (Multi) / branches[1])",
        )
    )
    assert by_name.first_difference == (
        "tensor #0 'w' (initializer in graph 'main' / node 'multi' (Multi) / branches[0]) is only in A "
        "(B has a tensor of that name: initializer in graph 'main' / node 'multi' (Multi) / branches[1])"
    )
    assert summary(verify_models(a, same)) == summary(VerifyResult(True, 1, 24, None))
    assert sha256_of_tree(tmp_path) == before


def same_named_nodes_model(path: Path, holder: int) -> Path:
    """Two Constant nodes both named 'k'; the one at index ``holder`` holds the tensor, the other an int."""
    constant = numpy_helper.from_array(VALUE, "c")
    nodes = [
        helper.make_node(
            "Constant", [], [f"y{i}"], name="k", **({"value": constant} if i == holder else {"value_int": 1})
        )
        for i in range(2)
    ]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(2)]
    graph = helper.make_graph(nodes, "main", [], outputs)
    return save(helper.make_model(graph, opset_imports=OPSET), path)


def test_a_tensor_moved_between_two_nodes_of_the_same_name_differs(tmp_path):
    a = same_named_nodes_model(tmp_path / "a" / "model.onnx", holder=0)
    b = same_named_nodes_model(tmp_path / "b" / "model.onnx", holder=1)
    same = same_named_nodes_model(tmp_path / "same" / "model.onnx", holder=0)
    before = sha256_of_tree(tmp_path)

    assert verify_models(a, b).first_difference == (
        "tensor #0 'c' (attribute in graph 'main' / node 'k' (Constant) / value): place differs "
        "(A: graph / node #0 / attribute #0 'value' / t, B: graph / node #1 / attribute #0 'value' / t)"
    )
    # By name, a node whose name other nodes share is known by the name and its occurrence: the first 'k', the second.
    assert verify_models(a, b, by_name=True).first_difference == (
        "tensor #0 'c' (attribute in graph 'main' / node 'k' (Constant) / value) is only in A "
        "(B has a tensor of that name: attribute in graph 'main' / node 'k' (Constant) / value, at graph / node #1 / "
        "attribute #0 'value' / t where this one is at graph / node #0 / attribute #0 'value' / t)"
    )
    assert summary(verify_models(a, same, by_name=True)) == summary(VerifyResult(True, 1, 24, None))
    assert summary(verify_models(a, same)) == summary(VerifyResult(True, 1, 24, None))
    assert sha256_of_tree(tmp_path) == before


def overload(name: str, overload_name: str, value: np.ndarray) -> onnx.FunctionProto:
    constant = helper.make_node("Constant", [], ["Y"], value=numpy_helper.from_array(value, "c"))
    function = helper.make_function("ai.test", name, [], ["Y"], [constant], opset_imports=[OPSET[0]])
    function.overload = overload_name
    return function


def overloads_model(path: Path, order: list[tuple[str, np.ndarray]]) -> Path:
    """Two overloads of function ai.test::F, each a Constant, in the given order."""
    call = helper.make_node("F", [], ["y"], domain="ai.test")
    call.overload = order[0][0]
    graph = helper.make_graph([call], "main", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])])
    functions = [overload("F", name, value) for name, value in order]
    return save(helper.make_model(graph, opset_imports=OPSET, functions=functions), path)


def test_two_overloads_that_swapped_their_constants_differ(tmp_path):
    x, y = VALUE, VALUE + 100
    a = overloads_model(tmp_path / "a" / "model.onnx", [("fast", x), ("exact", y)])
    # The same two constants, in the same order, now held by the other overload.
    b = overloads_model(tmp_path / "b" / "model.onnx", [("exact", x), ("fast", y)])

    by_position = verify_models(a, b)
    by_name = verify_models(a, b, by_name=True)

    assert by_position.first_difference == (
        "tensor #0 'c' (attribute in function ai.test::F (overload 'fast') / node '#0' (Constant) / value): "
        "place differs (A: attribute in function ai.test::F (overload 'fast') / node '#0' (Constant) / value, "
        "B: attribute in function ai.test::F (overload 'exact') / node '#0' (Constant) / value)"
    )
    assert by_name.first_difference == (
        "tensor #0 'c' (attribute in function ai.test::F (overload 'fast') / node '#0' (Constant) / value): "
        "bytes differ at offset 2 of 24 (A: 0x00, B: 0xc8)"
    )
    reordered = overloads_model(tmp_path / "c" / "model.onnx", [("exact", y), ("fast", x)])
    assert summary(verify_models(a, reordered, by_name=True)) == summary(VerifyResult(True, 2, 48, None))
    assert not verify_models(a, reordered).equal  # by position, the order is part of the model
