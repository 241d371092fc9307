"""The tensor walker: every tensor of a model, once, in the documented order, as the live proto."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_light_ref.io.walker import iter_graphs, iter_tensors


def tensor(name: str, value: float = 0.0) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([value], dtype=np.float32), name)


def sparse(name: str) -> onnx.SparseTensorProto:
    return helper.make_sparse_tensor(tensor(name), numpy_helper.from_array(np.array([0], dtype=np.int64), ""), [4])


def subgraph(name: str, initializer: str) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Constant", [], [f"{name}_out"], name=f"{name}_const", value=tensor(f"{name}_attr"))],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, [1])],
        initializer=[tensor(initializer)],
    )


def model_with_every_kind_of_tensor() -> onnx.ModelProto:
    node = helper.make_node(
        "Custom",
        [],
        ["y"],
        name="custom",
        domain="ai.test",
        t=tensor("attr_t"),
        tensors=[tensor("attr_tensors_0"), tensor("attr_tensors_1")],
        sparse_tensor=sparse("attr_sparse"),
        sparse_tensors=[sparse("attr_sparses_0")],
        g=subgraph("g", "g_init"),
        graphs=[subgraph("gs0", "gs0_init"), subgraph("gs1", "gs1_init")],
    )
    graph = helper.make_graph(
        [node],
        "main",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        initializer=[tensor("init_0"), tensor("init_1")],
        sparse_initializer=[sparse("sparse_init")],
    )
    function = helper.make_function(
        "ai.test",
        "F",
        [],
        ["Y"],
        [helper.make_node("Constant", [], ["Y"], value=tensor("function_const"))],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    return helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 18)])


def test_every_tensor_is_visited_once_in_the_documented_order():
    sites = list(iter_tensors(model_with_every_kind_of_tensor()))

    # helper.make_node stores attributes sorted by name: g, graphs, sparse_tensor, sparse_tensors, t, tensors.
    assert [a.name for a in model_with_every_kind_of_tensor().graph.node[0].attribute][:2] == ["g", "graphs"]
    assert [(site.kind, site.tensor.name) for site in sites] == [
        ("initializer", "init_0"),
        ("initializer", "init_1"),
        ("sparse_initializer_values", "sparse_init"),
        ("sparse_initializer_indices", ""),
        ("initializer", "g_init"),  # subgraph g, right where its attribute is: initializers, then nodes
        ("attribute", "g_attr"),
        ("initializer", "gs0_init"),
        ("attribute", "gs0_attr"),
        ("initializer", "gs1_init"),
        ("attribute", "gs1_attr"),
        ("sparse_attribute_values", "attr_sparse"),
        ("sparse_attribute_indices", ""),
        ("sparse_attribute_values", "attr_sparses_0"),
        ("sparse_attribute_indices", ""),
        ("attribute", "attr_t"),
        ("attribute", "attr_tensors_0"),
        ("attribute", "attr_tensors_1"),
        ("attribute", "function_const"),  # model functions come last
    ]


def test_sites_say_where_each_tensor_lives():
    sites = {site.label: site for site in iter_tensors(model_with_every_kind_of_tensor())}

    assert sites["init_0"].where == "graph 'main'"
    assert sites["init_0"].node is None
    assert sites["attr_t"].where == "graph 'main' / node 'custom' (Custom) / t"
    assert sites["attr_t"].node.name == "custom"
    assert (
        sites["gs1_attr"].where
        == "graph 'main' / node 'custom' (Custom) / graphs / node 'gs1_const' (Constant) / value"
    )
    assert sites["function_const"].where.startswith("function ai.test::F / node '#0' (Constant)")
    assert isinstance(sites["function_const"].container, onnx.FunctionProto)
    # Sparse indices usually have no name: the label says what and where they are instead.
    unnamed = [label for label in sites if label.startswith("<unnamed")]
    assert "<unnamed sparse initializer indices in graph 'main'>" in unnamed


def test_the_walker_yields_the_live_protos():
    model = model_with_every_kind_of_tensor()

    for site in iter_tensors(model):
        site.tensor.doc_string = "seen"

    assert model.graph.initializer[0].doc_string == "seen"
    assert model.graph.node[0].attribute[1].graphs[1].initializer[0].doc_string == "seen"
    assert model.functions[0].node[0].attribute[0].t.doc_string == "seen"


def test_the_walker_never_opens_external_files(tmp_path):
    model = model_with_every_kind_of_tensor()
    external = model.graph.initializer[0]
    onnx.external_data_helper.set_external_data(external, "does-not-exist.bin", offset=0, length=4)
    external.ClearField("raw_data")
    external.data_location = onnx.TensorProto.EXTERNAL

    names = [site.tensor.name for site in iter_tensors(model)]

    assert names[0] == "init_0"


def test_iter_graphs_visits_the_graphs_in_the_order_iter_tensors_does():
    model = model_with_every_kind_of_tensor()

    graphs = [graph.name for graph in iter_graphs(model.graph)]
    graphs_holding_tensors = list(
        dict.fromkeys(s.container.name for s in iter_tensors(model) if s.kind == "initializer")
    )

    assert graphs == ["main", "g", "gs0", "gs1"]
    assert graphs_holding_tensors == graphs
