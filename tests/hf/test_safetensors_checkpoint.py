"""``align --format safetensors`` writes a checkpoint without holes: every named main-graph initializer is a key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors import safe_open

from onnx_light_ref import align_external_data_streaming, verify_checkpoint, verify_models
from onnx_light_ref.io._plan.checkpoint_policy import UNNAMED
from tests.cli_runner import run_cli
from tests.hf.fixtures import copy_fixture, evaluate, run_ort


def test_the_small_biases_the_exporter_kept_inline_are_keys_of_the_file(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    source, dst = folder / "dynamo" / "model.onnx", folder / "out" / "model.onnx"
    dst.parent.mkdir()
    result = align_external_data_streaming(source, dst, weights_format="safetensors", durable=False)
    with safe_open(str(folder / "out" / "model.safetensors"), framework="numpy") as opened:
        keys = set(opened.keys())
    assert "model.layers.0.self_attn.k_proj.bias" in keys  # 32 bytes, inline in the export
    assert result.kept_inline_tensors == 0
    held = verify_checkpoint(dst, folder / "out" / "model.safetensors")
    assert held.missing_keys == () and held.extra_weights == ()
    assert verify_checkpoint(dst, folder / "checkpoint").holds  # every key of the save_pretrained checkpoint
    assert verify_models(source, dst).equal
    onnx.checker.check_model(str(dst), full_check=True)
    for got, want in zip(evaluate(dst), evaluate(source), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_unnamed_constant_stays_in_the_onnx_instead_of_refusing_the_run(tmp_path: Path) -> None:
    table = np.arange(512, dtype=np.float32)  # 2 KiB, like the legacy export's rotary Constant
    weight = numpy_helper.from_array(np.ones(512, dtype=np.float32), "w")
    shape = numpy_helper.from_array(np.array([16, 32], dtype=np.int64), "shape")  # a shape tensor: stays too
    constant = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(table, ""))
    graph = helper.make_graph(
        [constant, helper.make_node("Add", ["c", "w"], ["s"]), helper.make_node("Reshape", ["s", "shape"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])],
        [weight, shape],
    )
    source = tmp_path / "src.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(source))
    done = run_cli(
        "align", str(source), str(tmp_path / "m.onnx"), "--format", "safetensors", "--size-threshold", "1K",
        "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    constant_label = "<unnamed attribute in graph 'g' / node '#0' (Constant) / value>"
    assert "2 left in the .onnx" in done.stdout
    assert (
        f"note: 2 tensor(s) stay in the .onnx, not in the weights files: {UNNAMED}: {constant_label}; "
        "shape tensor: shape\n" in done.stdout
    )
    with safe_open(str(tmp_path / "m.safetensors"), framework="numpy") as opened:
        assert list(opened.keys()) == ["w"]
    assert verify_models(source, tmp_path / "m.onnx").equal
    np.testing.assert_array_equal(run_ort(tmp_path / "m.onnx")[0], (table + 1).reshape(16, 32))


def test_the_result_names_every_tensor_the_checkpoint_does_not_hold(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    source = folder / "dynamo" / "model.onnx"
    graph_model = onnx.load(str(source), load_external_data=False)
    shapes = [node.input[1] for node in graph_model.graph.node if node.op_type == "Reshape"]
    dst = folder / "dynamo" / "st.onnx"
    result = align_external_data_streaming(source, dst, weights_format="safetensors", durable=False)
    initializers = {init.name for init in graph_model.graph.initializer}
    kept_shapes = set(result.kept_inline_names.get("shape tensor", ()))
    assert kept_shapes <= set(shapes) and kept_shapes == {name for name in shapes if name in initializers}
    assert result.kept_inline_reasons == {reason: len(names) for reason, names in result.kept_inline_names.items()}
    with safe_open(str(folder / "dynamo" / "st.safetensors"), framework="numpy") as opened:
        assert not set(opened.keys()) & kept_shapes  # what the result names is what the checkpoint lacks
