"""Tensors in function default attributes and training graphs are aligned, and their copies are loadable.

Before the walker visited them, the aligned model kept their old locations (relative to the *destination* folder)
and pointed at files that were not there: onnxruntime ran the source and failed on the copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnx_light_ref.io import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io._read.walker import iter_tensors
from tests.checks import external_payload, sha256_of_tree
from tests.models import externalize

DEFAULT_VALUE = np.arange(8, dtype=np.float32)
TRAINING_VALUE = np.full(4, 7.0, dtype=np.float32)


def model_with_function_default_and_training_graph() -> onnx.ModelProto:
    """``y = x + c`` where ``c`` is the default ``value`` attribute of a local function; one training graph."""
    constant = onnx.NodeProto(op_type="Constant", output=["c"])
    constant.attribute.add(name="value", ref_attr_name="value", type=onnx.AttributeProto.TENSOR)
    function = helper.make_function(
        "ai.test",
        "AddDefault",
        ["X"],
        ["Y"],
        [constant, helper.make_node("Add", ["X", "c"], ["Y"])],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    function.attribute_proto.append(helper.make_attribute("value", numpy_helper.from_array(DEFAULT_VALUE, "c")))
    graph = helper.make_graph(
        [helper.make_node("AddDefault", ["x"], ["y"], domain="ai.test")],
        "main",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8])],
    )
    model = helper.make_model(
        graph,
        functions=[function],
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.test", 1)],
        ir_version=10,
    )
    training = model.training_info.add()
    training.initialization.CopyFrom(
        helper.make_graph([], "init", [], [], initializer=[numpy_helper.from_array(TRAINING_VALUE, "state")])
    )
    return model


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    model = model_with_function_default_and_training_graph()
    externalize([site.tensor for site in iter_tensors(model)], folder, "weights.bin", gap=b"\xee" * 3)
    path = folder / "model.onnx"
    onnx.save_model(model, str(path))
    return path


def run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.ones(8, dtype=np.float32)})[0]


@pytest.mark.parametrize("align", [align_external_data_streaming, align_external_data_in_memory])
def test_aligned_copy_points_at_files_that_exist_and_runs(tmp_path, source, align):
    before = sha256_of_tree(source.parent)
    destination = tmp_path / "dst" / "aligned.onnx"
    destination.parent.mkdir()

    align(source, destination, alignment=64)

    aligned = onnx.load_model(str(destination), load_external_data=False)
    sites = list(iter_tensors(aligned))
    assert [(site.scope, site.kind) for site in sites] == [
        ("function", "function_default"),
        ("training", "initializer"),
    ]
    for site in sites:
        entries = {entry.key: entry.value for entry in site.tensor.external_data}
        assert entries["location"] == "aligned.onnx.data"
        assert int(entries["offset"]) % 64 == 0
    assert external_payload(sites[0].tensor, destination.parent) == DEFAULT_VALUE.tobytes()
    assert external_payload(sites[1].tensor, destination.parent) == TRAINING_VALUE.tobytes()
    assert sorted(os.listdir(destination.parent)) == ["aligned.onnx", "aligned.onnx.data"]
    np.testing.assert_array_equal(run(destination), run(source))
    np.testing.assert_array_equal(run(destination), 1.0 + DEFAULT_VALUE)
    assert sha256_of_tree(source.parent) == before
