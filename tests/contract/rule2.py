"""Rule 2's scene for every writer: a model holding each kind of tensor the rule keeps inline, and the checks.

The model (:func:`rule2_model`): ``r = Reshape(MatMul(x, W), shape)`` (``shape``: a 16-byte int64 shape tensor),
``e = Identity(empty)`` (a zero-length tensor), ``f = local.addt(r)`` (a model-local function adding its default
attribute tensor ``t``), and a ``training_info`` initialization graph holding ``train_w``. Only ``W`` may become
external: ``shape`` (onnx's checker and onnxruntime read it at load time), ``t`` and ``train_w`` (``onnx.load`` does
not read them back) and ``empty`` (nothing to point at) stay inline, or, when a source already had one external, it
sits where every loader reads it (a zero-length one at the end of its file).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import safetensors.numpy as st_numpy
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.ops import delay_initializers
from tests.contract.writers import Scene, Writer
from tests.models import IR_VERSION, OPSET, externalize, write_model

__all__ = ["check_output", "expected_outputs", "prepare", "rule2_model", "rule2_tensors"]

RNG = np.random.default_rng(2)
W = RNG.standard_normal((8, 8)).astype(np.float32)
SHAPE = np.array([4, 4], dtype=np.int64)
T = RNG.standard_normal((4, 4)).astype(np.float32)
TRAIN_W = RNG.standard_normal(16).astype(np.float32)
EMPTY = np.zeros(0, dtype=np.float32)
X = np.ones((2, 8), dtype=np.float32)


def rule2_tensors() -> dict[str, np.ndarray]:
    """The model's tensors by name (the keys a checkpoint holding all of them uses)."""
    return {"W": W, "shape": SHAPE, "t": T, "train_w": TRAIN_W, "empty": EMPTY}


def rule2_model(
    external: tuple[str, ...] = (), folder: Path | None = None, *, with_function: bool = True
) -> onnx.ModelProto:
    """The model of the module docstring; the initializers named in ``external`` are written to
    ``folder/model.onnx.data`` (in that order) and referenced from there. ``with_function=False`` leaves out the
    local function (``delay_initializers`` inlines functions, and onnx's inliner drops a default attribute)."""
    initializers = [
        numpy_helper.from_array(value, name) for name, value in (("W", W), ("shape", SHAPE), ("empty", EMPTY))
    ]
    if external:
        assert folder is not None
        by_name = {tensor.name: tensor for tensor in initializers}
        externalize([by_name[name] for name in external], folder, "model.onnx.data")
    constant = helper.make_node("Constant", [], ["c"])
    constant.attribute.append(onnx.AttributeProto(name="value", ref_attr_name="t", type=onnx.AttributeProto.TENSOR))
    function = helper.make_function(
        "local",
        "addt",
        ["a"],
        ["b"],
        [constant, helper.make_node("Add", ["a", "c"], ["b"])],
        [helper.make_opsetid("", OPSET)],
    )
    function.attribute_proto.append(helper.make_attribute("t", numpy_helper.from_array(T, "t")))
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"]),
        helper.make_node("Reshape", ["mm", "shape"], ["r"]),
        helper.make_node("Identity", ["empty"], ["e"]),
    ]
    if with_function:
        nodes.append(helper.make_node("addt", ["r"], ["f"], domain="local"))
    outputs = [
        helper.make_tensor_value_info("r", TensorProto.FLOAT, [4, 4]),
        helper.make_tensor_value_info("e", TensorProto.FLOAT, [0]),
        helper.make_tensor_value_info("f", TensorProto.FLOAT, [4, 4]),
    ][: 3 if with_function else 2]
    graph = helper.make_graph(
        nodes, "rule2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])], outputs, initializers
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("local", 1)],
        ir_version=IR_VERSION,
        functions=[function] if with_function else [],
    )
    training = onnx.TrainingInfoProto()
    training.initialization.CopyFrom(
        helper.make_graph([], "init", [], [], [numpy_helper.from_array(TRAIN_W, "train_w")])
    )
    model.training_info.append(training)
    return model


def expected_outputs(*, with_function: bool = True) -> list[np.ndarray]:
    r = (X @ W).reshape(4, 4)
    return [r, EMPTY, r + T][: 3 if with_function else 2]


def prepare(scene: Scene, writer: Writer) -> dict[str, Any]:
    """Write the writer's rule-2 source into ``scene`` (replacing its usual one); return the options to call it
    with (a size threshold of 1 byte: every tensor rule 2 allows moves out)."""
    if "align" in writer.tags:
        for stale in scene.src.iterdir():
            stale.unlink()
        onnx.save(rule2_model(), scene.src / "model.onnx")
        return {"size_threshold": 1}
    if "shared-save" in writer.tags:
        onnx.save(rule2_model(), scene.src / "inline.onnx")
        return {"size_threshold": 1}
    if "link" in writer.tags:
        for stale in scene.src.iterdir():
            stale.unlink()
        write_model(scene.src / "model.onnx", rule2_model(("W", "empty"), scene.src))
        st_numpy.save_file(rule2_tensors(), str(scene.out / "ck.safetensors"))
        return {"size_threshold": 1}
    if "undelay" in writer.tags:
        for stale in scene.src.iterdir():
            stale.unlink()
        write_model(scene.src / "model.onnx", rule2_model(("W", "shape"), scene.src, with_function=False))
        onnx.save(delay_initializers(scene.src / "model.onnx"), scene.src / "delayed.onnx")
        return {}
    raise AssertionError(f"no rule-2 scene for {writer.name}")


def check_output(dst: Path) -> None:
    """What every loader needs of the written model (module docstring)."""
    onnx.checker.check_model(str(dst), full_check=True)
    loaded = onnx.load(str(dst))  # loads what onnx's loader reads back: nothing may stay EXTERNAL after it
    left = [site.label for site in iter_tensors(loaded) if site.tensor.data_location == TensorProto.EXTERNAL]
    assert left == [], f"tensors onnx's loader leaves EXTERNAL: {left}"
    model = onnx.load(str(dst), load_external_data=False)
    for site in iter_tensors(model):
        tensor = site.tensor
        if tensor.name in ("shape", "t", "train_w"):
            assert tensor.data_location != TensorProto.EXTERNAL, f"{tensor.name} must stay inline"
        if tensor.data_location == TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            offset, length = int(entries.get("offset", 0)), int(entries["length"])
            size = os.path.getsize(dst.parent / entries["location"])
            if length == 0:
                assert offset == size, f"{tensor.name}: a zero-length tensor at {offset} of a {size}-byte file"
            assert offset + length <= size
