"""undelay_initializers: DelayedInitializer models become standard external-data models that onnxruntime runs.

Round trips ``undelay(delay(m))`` on real models (an MLP, If/Loop subgraph weights, a Constant and inline
initializers), checked against onnxruntime on ``m``; refusals checked for type, message, nothing written and sources
unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.errors import DestinationConflictError, ExternalDataError, UnsafeLocationError
from onnx_light_ref.ops import delay_initializers, undelay_initializers
from tests.checks import assert_no_temp_files, run_onnxruntime, sha256_of_tree
from tests.models import (
    IR_VERSION,
    OPSET,
    build_control_flow_model,
    control_flow_feeds,
    mlp_model,
    save_external,
)


def build_mlp() -> onnx.ModelProto:
    """A two-layer MLP, ``x`` of shape ``(3, 8)`` to ``y`` of shape ``(3, 4)``."""
    rng = np.random.default_rng(7)
    weights = {
        "W1": rng.standard_normal((8, 16)).astype(np.float32),
        "b1": rng.standard_normal(16).astype(np.float32),
        "W2": rng.standard_normal((16, 4)).astype(np.float32),
        "b2": rng.standard_normal(4).astype(np.float32),
    }
    return mlp_model(weights, batch=3)


def build_constant_model() -> onnx.ModelProto:
    """``y = x * W + c + s``: W external, ``s`` a small inline initializer, ``c`` a Constant node's value."""
    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "W")
    s = numpy_helper.from_array(np.full(8, 0.5, dtype=np.float32), "s")
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.arange(8, dtype=np.float32)))
    nodes = [
        const,
        helper.make_node("Mul", ["x", "W"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["a"]),
        helper.make_node("Add", ["a", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
        [w, s],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def delayed_copy(source: Path, load_device: str = "file") -> Path:
    """``delay_initializers`` of a saved model, saved next to it (its filenames are relative to that folder)."""
    path = source.parent / "delayed.onnx"
    onnx.save(delay_initializers(source, load_device), path)
    return path


def delayed_nodes(model: onnx.ModelProto) -> int:
    from onnx_light_ref.io._read.walker import iter_graphs

    return sum(node.op_type == "DelayedInitializer" for g in iter_graphs(model.graph) for node in g.node)


def external_offsets(model: onnx.ModelProto) -> dict[str, int]:
    from onnx_light_ref.io._read.walker import iter_tensors

    offsets = {}
    for site in iter_tensors(model):
        if site.tensor.data_location == TensorProto.EXTERNAL:
            offsets[site.tensor.name] = int({e.key: e.value for e in site.tensor.external_data}["offset"])
    return offsets


# ----------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_mlp_round_trip_runs_in_onnxruntime(tmp_path: Path, load_device: str) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    source = save_external(build_mlp(), tmp_path / "src" / "mlp.onnx")
    delayed = delayed_copy(source, load_device)
    assert delayed_nodes(onnx.load(delayed, load_external_data=False)) == 4
    before = {p.name: p.read_bytes() for p in (tmp_path / "src").iterdir()}

    written = undelay_initializers(delayed, tmp_path / "out" / "mlp.onnx")

    feeds = {"x": np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)}
    expected = run_onnxruntime(source, feeds)
    got = run_onnxruntime(tmp_path / "out" / "mlp.onnx", feeds)
    np.testing.assert_array_equal(got[0], expected[0])
    result = onnx.load(tmp_path / "out" / "mlp.onnx", load_external_data=False)
    assert delayed_nodes(result) == 0
    assert all(o.domain != "ai.rt" for o in result.opset_import)
    assert {t.name for t in result.graph.initializer} == {"W1", "b1", "W2", "b2"}
    assert all(offset % 4096 == 0 for offset in external_offsets(result).values())
    assert written == os.path.getsize(tmp_path / "out" / "mlp.onnx.data")
    assert {p.name: p.read_bytes() for p in (tmp_path / "src").iterdir()} == before
    onnx.checker.check_model(str(tmp_path / "out" / "mlp.onnx"))


@pytest.mark.parametrize("cond", [True, False])
def test_if_loop_subgraph_weights_round_trip(tmp_path: Path, cond: bool) -> None:
    source = save_external(build_control_flow_model(), tmp_path / "model.onnx")
    delayed = delayed_copy(source)
    assert delayed_nodes(onnx.load(delayed, load_external_data=False)) >= 2
    dst = tmp_path / "out.onnx"
    undelay_initializers(delayed, dst, tmp_path / "out.weights", alignment=64, durable=False)
    for a, b in zip(
        run_onnxruntime(dst, control_flow_feeds(cond)), run_onnxruntime(source, control_flow_feeds(cond)), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    result = onnx.load(dst, load_external_data=False)
    assert delayed_nodes(result) == 0
    assert all(offset % 64 == 0 for offset in external_offsets(result).values())


def test_constant_and_inline_initializers_stay_as_they_are(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(build_constant_model(), source, save_as_external_data=True, location="m.data", size_threshold=100)
    original = onnx.load(source, load_external_data=False)
    assert [t.name for t in original.graph.initializer if t.data_location == TensorProto.EXTERNAL] == ["W"]
    delayed = delayed_copy(source)
    dst = tmp_path / "out" / "m.onnx"
    dst.parent.mkdir()
    undelay_initializers(delayed, dst, alignment=0)
    feeds = {"x": np.ones((8, 8), dtype=np.float32)}
    np.testing.assert_array_equal(run_onnxruntime(dst, feeds)[0], run_onnxruntime(source, feeds)[0])
    result = onnx.load(dst, load_external_data=False)
    inline = {t.name: t for t in result.graph.initializer if t.data_location != TensorProto.EXTERNAL}
    assert list(inline) == ["s"] and inline["s"].raw_data == original.graph.initializer[1].raw_data
    assert result.graph.node[0].op_type == "Constant"
    assert result.graph.node[0].attribute[0].t == original.graph.node[0].attribute[0].t


def test_existing_external_tensors_move_with_the_model(tmp_path: Path) -> None:
    """An initializer the converter keeps (a graph input's default) is copied too: the output stands alone."""
    model = build_mlp()
    model.graph.input.append(helper.make_tensor_value_info("b2", TensorProto.FLOAT, [4]))
    (tmp_path / "src").mkdir()
    source = save_external(model, tmp_path / "src" / "mlp.onnx")
    delayed = delayed_copy(source)
    assert delayed_nodes(onnx.load(delayed, load_external_data=False)) == 3
    dst = tmp_path / "mlp.onnx"
    undelay_initializers(delayed, dst)
    feeds = {"x": np.ones((3, 8), dtype=np.float32)}
    expected = run_onnxruntime(source, feeds)[0]
    os.rename(tmp_path / "src", tmp_path / "gone")  # nothing may still point at the source folder
    np.testing.assert_array_equal(run_onnxruntime(dst, feeds)[0], expected)


def test_spec_style_absolute_filenames_need_the_opt_in(tmp_path: Path) -> None:
    data = tmp_path / "tmp" / "onnx_light_backend_delayedinitializer_file.bin"
    data.parent.mkdir()
    data.write_bytes(np.array([9, 9, 1.5, -2], dtype="<f4").tobytes())
    node = helper.make_node(
        "DelayedInitializer",
        [],
        ["y"],
        domain="ai.rt",
        dtype=1,
        load_device="file",
        runtime_device="cpu",
        filename=str(data),
        offset=8,
    )
    node.attribute.insert(0, helper.make_attribute("shape", [2]))
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("ai.rt", 1)]
    (tmp_path / "model").mkdir()
    src = tmp_path / "model" / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION), src)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError, match=r"outside the source model's folder.*allow_outside_folder"):
        undelay_initializers(src, tmp_path / "model" / "out.onnx")
    assert sha256_of_tree(tmp_path) == before
    undelay_initializers(src, tmp_path / "model" / "out.onnx", allow_outside_folder=True)
    np.testing.assert_array_equal(run_onnxruntime(tmp_path / "model" / "out.onnx", {})[0], [1.5, -2])
    assert_no_temp_files(tmp_path / "model")


# ----------------------------------------------------------------------------------------------- refusals


@pytest.fixture
def delayed_mlp(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return delayed_copy(save_external(build_mlp(), tmp_path / "src" / "mlp.onnx"))


def rewrite_node(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(path, load_external_data=False)
    edit(next(n for n in model.graph.node if n.op_type == "DelayedInitializer"))
    onnx.save(model, path)


def set_attr(node: onnx.NodeProto, name: str, value: object) -> None:
    for index, attribute in enumerate(node.attribute):
        if attribute.name == name:
            node.attribute[index].CopyFrom(helper.make_attribute(name, value))


def _link_offset(node: onnx.NodeProto) -> None:
    for attribute in node.attribute:
        if attribute.name == "offset":
            attribute.ref_attr_name = "off"


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        (lambda n: set_attr(n, "filename", "../outside.bin"), UnsafeLocationError, r"'\.\.'"),
        (lambda n: set_attr(n, "filename", "/etc/hostname"), UnsafeLocationError, "outside the source model's folder"),
        (lambda n: set_attr(n, "offset", 10**6), ExternalDataError, "too short: needs"),
        (lambda n: set_attr(n, "filename", "absent.bin"), FileNotFoundError, "'absent.bin' does not exist"),
        (lambda n: set_attr(n, "runtime_device", "gpu"), ValueError, "runtime_device must be 'cpu'"),
        (lambda n: n.attribute.append(helper.make_attribute("offset", 4)), ValueError, "more than once"),
        (lambda n: n.input.append("x"), ValueError, "takes no inputs"),
        (_link_offset, ValueError, "function-linked"),
    ],
)
def test_bad_nodes_are_refused_before_writing(tmp_path: Path, delayed_mlp: Path, edit, error, message) -> None:
    rewrite_node(delayed_mlp, edit)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(error, match=message):
        undelay_initializers(delayed_mlp, tmp_path / "out.onnx")
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_symlinked_and_hard_linked_sources_are_refused(tmp_path: Path, delayed_mlp: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(bytes(4096))
    (delayed_mlp.parent / "link.bin").symlink_to(secret)
    os.link(secret, delayed_mlp.parent / "hard.bin")
    for name, message in (("link.bin", "symbolic link"), ("hard.bin", "2 hard links")):
        rewrite_node(delayed_mlp, lambda n, name=name: set_attr(n, "filename", name))
        before = sha256_of_tree(tmp_path)
        with pytest.raises(UnsafeLocationError, match=message):
            undelay_initializers(delayed_mlp, tmp_path / "out.onnx")
        assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("target", ["source-weights", "source-model", "weights-is-model", "directory"])
def test_destinations_that_would_destroy_a_source(tmp_path: Path, delayed_mlp: Path, target) -> None:
    src = delayed_mlp.parent
    (tmp_path / "out").mkdir()
    dst, weights = {
        "source-weights": (tmp_path / "out" / "m.onnx", src / "weights.data"),
        "source-model": (delayed_mlp, None),
        "weights-is-model": (tmp_path / "out" / "m.onnx", tmp_path / "out" / "m.onnx"),
        "directory": (tmp_path / "out", None),
    }[target]
    if target == "source-weights":
        os.symlink(src / "weights.data", tmp_path / "out" / "alias.data")
        weights = tmp_path / "out" / "alias.data"
    before = sha256_of_tree(tmp_path)
    with pytest.raises(DestinationConflictError):
        undelay_initializers(delayed_mlp, dst, weights)
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("kind", ["dotdot", "symlinked-folder"])
def test_weights_outside_the_destination_folder(tmp_path: Path, delayed_mlp: Path, kind) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "away").symlink_to(tmp_path / "elsewhere")
    weights = tmp_path / "w.data" if kind == "dotdot" else tmp_path / "out" / "away" / "w.data"
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError, match="outside the destination model's folder"):
        undelay_initializers(delayed_mlp, tmp_path / "out" / "m.onnx", weights)
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"alignment": 3}, "power of two"), ({"chunk_size": 0}, "chunk_size"), ({"durable": "yes"}, "durable")],
)
def test_bad_arguments(tmp_path: Path, delayed_mlp: Path, kwargs, message) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        undelay_initializers(delayed_mlp, tmp_path / "out.onnx", **kwargs)
    assert not (tmp_path / "out.onnx").exists()


def test_node_inside_a_model_function_is_refused(tmp_path: Path, delayed_mlp: Path) -> None:
    model = onnx.load(delayed_mlp, load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "DelayedInitializer")
    function = helper.make_function("local", "f", [], [node.output[0]], [node], model.opset_import)
    model.functions.append(function)
    onnx.save(model, delayed_mlp)
    with pytest.raises(ValueError, match=r"model function local::f.*inline the function"):
        undelay_initializers(delayed_mlp, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


# ------------------------------------------------------------------- functions, shadowing and size (issue 19)


def _delayed_node(output: str, offset: int, name: str = "") -> onnx.NodeProto:
    from onnx_light_ref.ops._schema import make_delayed_initializer_node

    return make_delayed_initializer_node(
        output, shape=[2], dtype=TensorProto.FLOAT, load_device="file", filename="w.bin", offset=offset, name=name
    )


def _float2(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])


def _light_model(graph: onnx.GraphProto, functions: list[onnx.FunctionProto] | None = None) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("ai.rt", 1)]
    if functions:
        opsets.append(helper.make_opsetid("local", 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, functions=functions or [])


def _nested_if(inner: onnx.GraphProto, depth: int, output: str) -> onnx.GraphProto:
    """``inner`` wrapped in ``depth`` levels of If (both branches the same graph), as the body of a graph."""
    graph = inner
    for level in range(depth):
        node = helper.make_node("If", ["c"], [output], then_branch=graph, else_branch=graph)
        graph = helper.make_graph([node], f"level{level}", [], [_float2(output)])
    return graph


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_node_in_a_subgraph_of_a_model_function_is_refused(tmp_path: Path, depth: int) -> None:
    """It was neither converted nor refused: undelay dropped the ai.rt opset and onnxruntime refused the output."""
    (tmp_path / "w.bin").write_bytes(np.array([1, 2], dtype="<f4").tobytes())
    branch = helper.make_graph(
        [_delayed_node("w", 0, name="deep"), helper.make_node("Add", ["x", "w"], ["r"])], "branch", [], [_float2("r")]
    )
    body = _nested_if(branch, depth, "r")
    function = helper.make_function(
        "local",
        "f",
        ["x", "c"],
        ["r"],
        list(body.node),
        [helper.make_opsetid("", OPSET), helper.make_opsetid("ai.rt", 1)],
    )
    graph = helper.make_graph(
        [helper.make_node("f", ["x", "c"], ["y"], domain="local")],
        "main",
        [_float2("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [_float2("y")],
    )
    onnx.save(_light_model(graph, [function]), tmp_path / "m.onnx")
    before = sha256_of_tree(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"^DelayedInitializer node 'deep' in subgraph 'branch' of model function local::f: a function has no "
        r"initializers",
    ):
        undelay_initializers(tmp_path / "m.onnx", tmp_path / "out.onnx")
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def _shadowing_light_model(tmp_path: Path, outer_kind: str) -> Path:
    """Main graph value ``w`` = [100, 100] (an initializer, an input or a node output); the If's branches each
    hold a DelayedInitializer whose output is also named ``w`` = [1, 1] and add it to ``x``: inside the branch the
    node's ``w`` wins in onnx's evaluator, an initializer ``w`` would not in onnxruntime."""
    (tmp_path / "w.bin").write_bytes(np.array([1, 1], dtype="<f4").tobytes())
    branch = helper.make_graph(
        [_delayed_node("w", 0, name="inner"), helper.make_node("Add", ["x", "w"], ["r"])], "branch", [], [_float2("r")]
    )
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)]
    inputs = [_float2("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    hundred = numpy_helper.from_array(np.full(2, 100, dtype=np.float32), "w")
    initializers = []
    if outer_kind == "initializer":
        initializers.append(hundred)
    elif outer_kind == "input":
        inputs.append(_float2("w"))
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=hundred))
    graph = helper.make_graph(nodes, "main", inputs, [_float2("y")], initializers)
    onnx.save(_light_model(graph), tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


@pytest.mark.parametrize("outer_kind", ["initializer", "input", "node-output"])
def test_subgraph_output_named_like_an_outer_value_is_refused(tmp_path: Path, outer_kind: str) -> None:
    """The light model computes x + 1; as a subgraph initializer onnxruntime computed x + 100 (reported success)."""
    from onnx_light_ref.ops import reference_evaluator

    model = _shadowing_light_model(tmp_path, outer_kind)
    feeds = {"x": np.zeros(2, dtype=np.float32), "c": np.array(True)}
    if outer_kind == "input":
        feeds["w"] = np.full(2, 100, dtype=np.float32)
    np.testing.assert_array_equal(reference_evaluator(model).run(None, feeds)[0], [1, 1])
    before = sha256_of_tree(tmp_path)
    with pytest.raises(
        ValueError, match=r"^DelayedInitializer node 'inner': its output 'w' in subgraph 'branch' is also a value of"
    ):
        undelay_initializers(model, tmp_path / "out.onnx")
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


@pytest.mark.parametrize("cond", [True, False])
def test_subgraph_nodes_at_every_depth_compute_what_onnxs_evaluator_computes(tmp_path: Path, cond: bool) -> None:
    """Main graph, an If branch and an If nested in it, each with DelayedInitializers of distinct names: the
    undelayed model in onnxruntime gives exactly the light model's outputs in onnx's ReferenceEvaluator."""
    from onnx_light_ref.ops import reference_evaluator

    values = np.array([1.5, -2.25, 3.0, 1e-3, -0.0, 7.0, 8.0, 9.5], dtype="<f4")
    (tmp_path / "w.bin").write_bytes(values.tobytes())
    inner = helper.make_graph(
        [_delayed_node("w_inner", 8), helper.make_node("Mul", ["w_main", "w_inner"], ["r"])],
        "inner",
        [],
        [_float2("r")],
    )
    other = helper.make_graph(
        [_delayed_node("w_other", 16), helper.make_node("Sub", ["x", "w_other"], ["r2"])], "other", [], [_float2("r2")]
    )
    middle = helper.make_graph(
        [
            _delayed_node("w_mid", 24),
            helper.make_node("If", ["c"], ["m"], then_branch=inner, else_branch=other),
            helper.make_node("Add", ["m", "w_mid"], ["out"]),
        ],
        "middle",
        [],
        [_float2("out")],
    )
    graph = helper.make_graph(
        [_delayed_node("w_main", 0), helper.make_node("If", ["c"], ["y"], then_branch=middle, else_branch=other)],
        "main",
        [_float2("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [_float2("y")],
    )
    onnx.save(_light_model(graph), tmp_path / "m.onnx")
    feeds = {"x": np.array([0.5, 4.0], dtype=np.float32), "c": np.array(cond)}
    expected = reference_evaluator(tmp_path / "m.onnx").run(None, feeds)
    undelay_initializers(tmp_path / "m.onnx", tmp_path / "out.onnx", alignment=16, durable=False)
    result = onnx.load(tmp_path / "out.onnx", load_external_data=False)
    assert delayed_nodes(result) == 0
    assert all(o.domain != "ai.rt" for o in result.opset_import)
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)
    got = run_onnxruntime(tmp_path / "out.onnx", feeds)
    assert got[0].tobytes() == expected[0].tobytes()


def test_many_nodes_in_one_graph_keep_their_order_and_bytes(tmp_path: Path) -> None:
    """3000 DelayedInitializers interleaved with the nodes using them (the removal rebuilds each graph once)."""
    count = 3000
    values = np.arange(2 * count, dtype="<f4")
    (tmp_path / "w.bin").write_bytes(values.tobytes())
    nodes = []
    previous = "x"
    for i in range(count):
        nodes.append(_delayed_node(f"w{i}", 8 * i))
        nodes.append(helper.make_node("Add", [previous, f"w{i}"], [f"s{i}"]))
        previous = f"s{i}"
    graph = helper.make_graph(nodes, "chain", [_float2("x")], [_float2(previous)])
    onnx.save(_light_model(graph), tmp_path / "m.onnx")
    undelay_initializers(tmp_path / "m.onnx", tmp_path / "out.onnx", alignment=0, durable=False)
    result = onnx.load(tmp_path / "out.onnx", load_external_data=False)
    assert [n.op_type for n in result.graph.node] == ["Add"] * count
    assert [t.name for t in result.graph.initializer] == [f"w{i}" for i in range(count)]
    x = np.array([0.25, -1.0], dtype=np.float32)
    expected = x + values.reshape(count, 2).sum(axis=0, dtype=np.float64).astype(np.float32)
    np.testing.assert_allclose(run_onnxruntime(tmp_path / "out.onnx", {"x": x})[0], expected, rtol=1e-6)


def _training_model(tmp_path: Path, training_output: str = "t") -> Path:
    """Main graph ``y = x + w`` (w: a delayed node at offset 0) and a training_info algorithm graph whose one node is
    a DelayedInitializer (offset 8) with a relative filename, as the issue's model: ``m/m.onnx`` and ``m/w.bin``."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.bin").write_bytes(np.array([1, 2, 3, 4], dtype="<f4").tobytes())
    graph = helper.make_graph(
        [_delayed_node("w", 0), helper.make_node("Add", ["x", "w"], ["y"])], "main", [_float2("x")], [_float2("y")]
    )
    model = _light_model(graph)
    training = model.training_info.add()
    algorithm = helper.make_graph(
        [_delayed_node(training_output, 8, name="step"), helper.make_node("Identity", [training_output], ["u"])],
        "algorithm",
        [],
        [_float2("u")],
    )
    training.algorithm.CopyFrom(algorithm)
    onnx.save(model, folder / "m.onnx")
    return folder / "m.onnx"


@pytest.mark.parametrize("cli", [False, True])
def test_training_graph_nodes_are_converted_into_inline_initializers(tmp_path: Path, cli: bool) -> None:
    """Copied unchanged, the node's relative filename would resolve against DST's folder (another file, or none);
    made external, onnx's loader would not read it back (it loads no training_info external data): inline."""
    from onnx_light_ref._cli import main

    src = _training_model(tmp_path)
    dst = tmp_path / "out" / "m.onnx"
    dst.parent.mkdir()
    if cli:
        assert main(["undelay", str(src), str(dst), "--no-progress"]) == 0
    else:
        undelay_initializers(src, dst, durable=False)
    result = onnx.load(dst, load_external_data=False)
    algorithm = result.training_info[0].algorithm
    assert [n.op_type for n in algorithm.node] == ["Identity"]
    assert [t.name for t in algorithm.initializer] == ["t"]
    assert not any(o.domain == "ai.rt" for o in result.opset_import)  # no ai.rt node left anywhere
    onnx.checker.check_model(str(dst), full_check=True)
    # The training tensor's bytes are in DST itself, where onnx.load reads them.
    tensor = onnx.load(dst).training_info[0].algorithm.initializer[0]
    assert tensor.data_location != onnx.TensorProto.EXTERNAL
    np.testing.assert_array_equal(numpy_helper.to_array(tensor), [3, 4])
    x = np.array([0.5, -1.0], dtype=np.float32)
    np.testing.assert_array_equal(run_onnxruntime(dst, {"x": x})[0], x + np.array([1, 2], dtype=np.float32))


def test_a_training_node_named_like_a_main_graph_value_is_refused(tmp_path: Path) -> None:
    """The algorithm graph runs combined with the main graph: its initializer would be a second ``w``."""
    src = _training_model(tmp_path, training_output="w")
    dst = tmp_path / "out" / "m.onnx"
    dst.parent.mkdir()
    before = sha256_of_tree(tmp_path)
    with pytest.raises(ValueError, match=r"node 'step' \(training_info\[0\]\.algorithm\): its output 'w'"):
        undelay_initializers(src, dst, durable=False)
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)
