"""The tensor walker: every tensor of a model, once, in the documented order, as the live proto."""

from __future__ import annotations

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import helper, numpy_helper

from onnx_light_ref.io._read.walker import TensorSite, describe_place, inline_reason, iter_graphs, iter_tensors


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
        == "graph 'main' / node 'custom' (Custom) / graphs[1] / node 'gs1_const' (Constant) / value"
    )
    assert sites["function_const"].where.startswith("function ai.test::F / node '#0' (Constant)")
    assert isinstance(sites["function_const"].container, onnx.FunctionProto)
    # Sparse indices usually have no name: the label says what and where they are instead.
    unnamed = [label for label in sites if label.startswith("<unnamed")]
    assert "<unnamed sparse initializer indices in graph 'main'>" in unnamed


def test_every_site_has_every_field_of_a_tensor_site():
    """Initializer sites are built as plain tuples (faster than the named tuple's constructor): they must still be
    complete TensorSites, each field where its name says."""
    model = model_with_every_kind_of_tensor()
    for site in iter_tensors(model):
        assert type(site) is TensorSite and len(site) == len(TensorSite._fields)
        assert site == TensorSite(**site._asdict())
    init = next(site for site in iter_tensors(model) if site.label == "init_0")
    assert (init.kind, init.node, init.scope, init.sparse, init.onnx_loads) == (
        "initializer",
        None,
        "model",
        None,
        True,
    )
    assert init.container is model.graph and init.key == (("graph",), ("initializer", "init_0"))
    assert init.place == (("graph",), ("initializer", 0))


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


def model_with_function_defaults_and_training_info() -> onnx.ModelProto:
    """The places added after the first walker: a function's default attributes and the training graphs."""
    function = helper.make_function(
        "ai.test",
        "F",
        ["X"],
        ["Y"],
        [helper.make_node("Identity", ["X"], ["Y"], name="body")],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    function.attribute_proto.extend(
        [
            helper.make_attribute("alpha", tensor("default_t")),
            helper.make_attribute("many", [tensor("default_tensors_0"), tensor("default_tensors_1")]),
            helper.make_attribute("sparse", sparse("default_sparse")),
            helper.make_attribute("body", subgraph("default_g", "default_g_init")),
        ]
    )
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["y"], name="call", domain="ai.test")],
        "main",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        initializer=[tensor("init_0")],
    )
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 18)])
    first = model.training_info.add()
    first.initialization.CopyFrom(helper.make_graph([], "init", [], [], initializer=[tensor("training_init")]))
    first.algorithm.CopyFrom(subgraph("algo", "algo_init"))
    binding = first.update_binding.add()
    binding.key, binding.value = "init_0", "algo_out"
    second = model.training_info.add()  # an algorithm without initialization graph
    second.algorithm.CopyFrom(subgraph("algo2", "algo2_init"))
    return model


def test_function_defaults_then_training_graphs_come_after_the_older_places():
    sites = list(iter_tensors(model_with_function_defaults_and_training_info()))

    assert [(site.scope, site.kind, site.tensor.name) for site in sites] == [
        ("model", "initializer", "init_0"),
        ("function", "function_default", "default_t"),  # attribute_proto in its order
        ("function", "function_default", "default_tensors_0"),
        ("function", "function_default", "default_tensors_1"),
        ("function", "sparse_function_default_values", "default_sparse"),
        ("function", "sparse_function_default_indices", ""),
        ("function", "initializer", "default_g_init"),  # a default graph is visited like any subgraph
        ("function", "attribute", "default_g_attr"),
        ("training", "initializer", "training_init"),  # training_info[0]: initialization, then algorithm
        ("training", "initializer", "algo_init"),
        ("training", "attribute", "algo_attr"),
        ("training", "initializer", "algo2_init"),  # training_info[1] has no initialization graph
        ("training", "attribute", "algo2_attr"),
    ]


def test_function_defaults_and_training_sites_say_where_they_are():
    model = model_with_function_defaults_and_training_info()
    sites = {site.label: site for site in iter_tensors(model)}

    default = sites["default_t"]
    assert default.where == "function ai.test::F / default of attribute 'alpha'"
    assert default.node is None
    assert default.container is model.functions[0]
    assert sites["default_g_attr"].where == (
        "function ai.test::F / default of attribute 'body' / node 'default_g_const' (Constant) / value"
    )
    assert sites["training_init"].where == "training_info[0] initialization graph 'init'"
    assert sites["training_init"].container is model.training_info[0].initialization
    assert sites["algo2_init"].where == "training_info[1] algorithm graph 'algo2'"
    assert (
        sites["<unnamed sparse function default indices in function ai.test::F / default of attribute 'sparse'>"].kind
        == "sparse_function_default_indices"
    )


def test_every_tensor_has_a_place_no_other_tensor_has():
    for model in (model_with_every_kind_of_tensor(), model_with_function_defaults_and_training_info()):
        places = [site.place for site in iter_tensors(model)]

        assert len(set(places)) == len(places)


def test_places_tell_apart_what_names_cannot():
    """Two nodes of one name, graphs[0] and graphs[1] of one attribute, t and tensors[0], two overloads of a
    function: the readable ``where`` may coincide, the place never does (nor the key: a shared node name is
    counted)."""
    model = model_with_every_kind_of_tensor()
    model.graph.node.append(model.graph.node[0])  # a second node named 'custom', tensors and subgraphs included
    second = helper.make_function(
        "ai.test",
        "F",
        [],
        ["Y"],
        [helper.make_node("Constant", [], ["Y"], value=tensor("function_const"))],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    second.overload = "v2"
    model.functions.append(second)
    sites = list(iter_tensors(model))
    by_label: dict[str, list] = {}
    for site in sites:
        by_label.setdefault(site.label, []).append(site)

    assert len({site.place for site in sites}) == len(sites)
    first, again = by_label["attr_t"]
    assert first.where == again.where
    assert (first.key[1][0], again.key[1][0]) == (("node", "custom", 0), ("node", "custom", 1))
    assert describe_place(first.place) == "graph / node #0 / attribute #4 't' / t"
    assert describe_place(again.place) == "graph / node #1 / attribute #4 't' / t"
    gs0, gs1 = by_label["gs0_init"][0], by_label["gs1_init"][0]
    assert describe_place(gs1.place) == "graph / node #0 / attribute #1 'graphs' / graphs[1] / initializer #0"
    assert gs0.place != gs1.place
    assert gs1.where == "graph 'main' / node 'custom' (Custom) / graphs[1]"
    plain, overloaded = by_label["function_const"]
    assert describe_place(plain.place).startswith("function #0 ai.test::F / node #0")
    assert describe_place(overloaded.place).startswith("function #1 ai.test::F overload 'v2' / node #0")
    assert overloaded.where.startswith("function ai.test::F (overload 'v2') / node '#0'")
    indices = by_label["<unnamed sparse attribute indices in graph 'main' / node 'custom' (Custom) / sparse_tensors>"]
    assert describe_place(indices[0].place).endswith("/ sparse_tensors[0] indices")


def test_a_tensor_in_t_or_in_tensors_has_another_place():
    in_t = helper.make_attribute("value", tensor("x"))
    in_tensors = helper.make_attribute("value", [tensor("x")])
    places = []
    for attribute in (in_t, in_tensors):
        node = helper.make_node("Custom", [], ["y"], domain="ai.test")
        node.attribute.append(attribute)
        graph = helper.make_graph([node], "main", [], [])
        (site,) = iter_tensors(helper.make_model(graph))
        places.append(describe_place(site.place))

    assert places == [
        "graph / node #0 / attribute #0 'value' / t",
        "graph / node #0 / attribute #0 'value' / tensors[0]",
    ]


def test_models_without_the_new_places_keep_their_order_and_scope():
    sites = list(iter_tensors(model_with_every_kind_of_tensor()))

    assert {site.scope for site in sites[:-1]} == {"model"}
    assert sites[-1].scope == "function"
    assert sites[-1].kind == "attribute"  # a node attribute inside a function is still an attribute


def _fields_reaching_tensors() -> set[tuple[str, str]]:
    """Every (message, field) of onnx.proto on a path from ModelProto to a TensorProto, read from the descriptors."""
    tensor_name = onnx.TensorProto.DESCRIPTOR.full_name
    reachable: set[str] = {tensor_name}
    messages: dict[str, object] = {}

    def collect(descriptor) -> None:
        if descriptor.full_name in messages:
            return
        messages[descriptor.full_name] = descriptor
        for field in descriptor.fields:
            if field.message_type is not None:
                collect(field.message_type)

    collect(onnx.ModelProto.DESCRIPTOR)
    changed = True
    while changed:
        changed = False
        for name, descriptor in messages.items():
            if name not in reachable and any(
                f.message_type is not None and f.message_type.full_name in reachable for f in descriptor.fields
            ):
                reachable.add(name)
                changed = True
    return {
        (descriptor.name, field.name)
        for name, descriptor in messages.items()
        if name != tensor_name
        for field in descriptor.fields
        if field.message_type is not None and field.message_type.full_name in reachable
    }


def test_the_walker_covers_every_field_of_onnx_proto_that_can_hold_a_tensor():
    # If a future onnx adds a place for tensors, this fails until the walker (and this list) learn about it.
    assert _fields_reaching_tensors() == {
        ("ModelProto", "graph"),
        ("ModelProto", "functions"),
        ("ModelProto", "training_info"),
        ("TrainingInfoProto", "initialization"),
        ("TrainingInfoProto", "algorithm"),
        ("GraphProto", "initializer"),
        ("GraphProto", "sparse_initializer"),
        ("GraphProto", "node"),
        ("NodeProto", "attribute"),
        ("FunctionProto", "node"),
        ("FunctionProto", "attribute_proto"),
        ("AttributeProto", "t"),
        ("AttributeProto", "tensors"),
        ("AttributeProto", "sparse_tensor"),
        ("AttributeProto", "sparse_tensors"),
        ("AttributeProto", "g"),
        ("AttributeProto", "graphs"),
        ("SparseTensorProto", "values"),
        ("SparseTensorProto", "indices"),
    }


def test_every_tensor_in_the_serialized_model_is_yielded():
    # Count TensorProtos by walking the message tree generically (ListFields), independent of the walker's code.
    def count(message) -> int:
        total = 1 if isinstance(message, onnx.TensorProto) else 0
        for field, value in message.ListFields():
            if field.message_type is None:
                continue
            items = [value] if isinstance(value, Message) else value  # a repeated field is a container
            total += sum(count(item) for item in items)
        return total

    for model in (model_with_every_kind_of_tensor(), model_with_function_defaults_and_training_info()):
        assert len(list(iter_tensors(model))) == count(model)


def _model_with_every_place_and_odd_attribute_types() -> onnx.ModelProto:
    """Every place at once, plus a function node holding a subgraph and attributes whose ``type`` disagrees with
    the field they fill (onnx's loader descends into ``g``/``graphs`` by ``type``, not by field)."""
    model = model_with_every_kind_of_tensor()
    extra = model_with_function_defaults_and_training_info()
    model.functions.extend(extra.functions)
    model.training_info.extend(extra.training_info)
    inner = helper.make_node("If", ["c"], ["o"], name="fn_if", then_branch=subgraph("fn_then", "fn_then_init"))
    inner.attribute.append(helper.make_attribute("else_branch", subgraph("fn_else", "fn_else_init")))
    model.functions[0].node.append(inner)
    odd = helper.make_node("Custom", [], ["z"], name="odd", domain="ai.test")
    mistyped = odd.attribute.add()
    mistyped.name, mistyped.type = "g_as_tensor", onnx.AttributeProto.TENSOR
    mistyped.g.CopyFrom(subgraph("mistyped_g", "mistyped_g_init"))
    both = odd.attribute.add()
    both.name, both.type = "g_and_graphs", onnx.AttributeProto.GRAPH
    both.g.CopyFrom(subgraph("both_g", "both_g_init"))
    both.graphs.append(subgraph("both_gs", "both_gs_init"))
    model.graph.node.append(odd)
    return model


def test_onnx_loads_is_exactly_what_onnx_load_reads_back(tmp_path):
    """Oracle: every tensor made EXTERNAL; after onnx.load(load_external_data=True), the ones still EXTERNAL are
    exactly the sites with onnx_loads False."""
    from onnx.external_data_helper import uses_external_data

    model = _model_with_every_place_and_odd_attribute_types()
    sites = list(iter_tensors(model))
    data = bytearray()
    for index, site in enumerate(sites):
        site.tensor.name = f"t{index}"
        payload = site.tensor.raw_data
        site.tensor.ClearField("raw_data")
        site.tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", "w.bin"), ("offset", str(len(data))), ("length", str(len(payload)))):
            entry = site.tensor.external_data.add()
            entry.key, entry.value = key, value
        data += payload
    (tmp_path / "w.bin").write_bytes(bytes(data))
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    loaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=True)
    still_external = {site.tensor.name for site in iter_tensors(loaded) if uses_external_data(site.tensor)}
    expected = {site.tensor.name for site in sites if not site.onnx_loads}
    assert still_external == expected
    assert {site.tensor.name for site in sites if site.onnx_loads} == {
        site.tensor.name for site in iter_tensors(loaded) if not uses_external_data(site.tensor)
    }
    # Every kind of place onnx skips is represented, so the comparison covers each rule.
    reasons = {inline_reason(site) for site in sites}
    assert reasons == {
        None,
        "sparse tensor",
        "function default attribute",
        "training_info",
        "initializer of a subgraph in a function",
        "subgraph not reached by onnx's loader",
    }
