"""A real-shaped family of models, as exporters write them: a decoder and a decoder-with-past, exported separately.

Both hold the same weights under different names (the decoder's ``model.layers.0.weight`` is the other's
``onnx::MatMul_12``), in different folders, each with its own data file of the same name (``model.onnx_data``), so
nothing is shared on disk and a planner keyed by file names would be caught. Each member also has a tensor only it
holds, an inline ``Reshape`` shape tensor (16 bytes: onnxruntime cannot read it from external data), and an ``If``
whose branches and a ``Loop`` whose body have their own initializers (shared by the two members too).

:func:`write_family` writes the two sources with onnx's own writer; :func:`family_feeds` gives inputs for both;
:func:`outputs_of` runs a member in onnxruntime. Nothing here calls the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.checks import run_onnxruntime
from tests.models import make_model, save_external, value_info

__all__ = ["HIDDEN", "Family", "family_feeds", "family_weights", "outputs_of", "write_family"]

HIDDEN = 32  # 32 x 32 float32 = 4 KiB per matrix: larger than onnx's 1024-byte threshold, small enough to be quick


@dataclass(frozen=True)
class Family:
    """The two sources of a family and the folder holding their folders."""

    decoder: Path
    with_past: Path

    @property
    def sources(self) -> list[Path]:
        return [self.decoder, self.with_past]


def family_weights(seed: int) -> dict[str, np.ndarray]:
    """The weights both members hold (under their decoder names), plus each member's own tensor."""
    rng = np.random.default_rng(seed)

    def matrix() -> np.ndarray:
        return rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32)

    return {
        "model.layers.0.weight": matrix(),
        "model.layers.0.bias": rng.standard_normal(HIDDEN * 16, dtype=np.float32),  # 2 KiB, sliced to HIDDEN
        "model.layers.1.weight": matrix(),
        "then.bias": rng.standard_normal((2, HIDDEN * 8), dtype=np.float32),
        "loop.weight": matrix(),
        "lm_head.weight": matrix(),  # the decoder's own
        "past.proj": matrix(),  # the decoder-with-past's own
    }


# The decoder-with-past's names of the shared weights (an exporter's generated names).
_PAST_NAMES = {
    "model.layers.0.weight": "onnx::MatMul_12",
    "model.layers.0.bias": "onnx::Add_13",
    "model.layers.1.weight": "onnx::MatMul_14",
    "then.bias": "onnx::Add_15",
    "loop.weight": "onnx::MatMul_16",
}


def _member(weights: dict[str, np.ndarray], *, past: bool) -> onnx.ModelProto:
    """``x [2, HIDDEN]`` -> two layers -> If (then: + bias, else: - h) -> Loop (trip times @ W) -> head -> Reshape."""
    name = (lambda n: _PAST_NAMES.get(n, n)) if past else (lambda n: n)

    def init(key: str) -> onnx.TensorProto:
        return numpy_helper.from_array(weights[key], name(key))

    then_branch = helper.make_graph(
        [
            helper.make_node("Reshape", [name("then.bias"), "then_shape"], ["tb"]),
            helper.make_node("Slice", ["tb", "zero", "two", "zero"], ["tb2"]),
            helper.make_node("Slice", ["tb2", "zero", "hidden", "one"], ["tb3"]),
            helper.make_node("Add", ["h1", "tb3"], ["t"]),
        ],
        "then",
        [],
        [value_info("t", TensorProto.FLOAT, [2, HIDDEN])],
        [
            init("then.bias"),
            numpy_helper.from_array(np.array([2, HIDDEN * 8], np.int64), "then_shape"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
            numpy_helper.from_array(np.array([HIDDEN], np.int64), "hidden"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
        ],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["h1"], ["e"])], "else", [], [value_info("e", TensorProto.FLOAT, [2, HIDDEN])]
    )
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["v", name("loop.weight")], ["v1"]),
            helper.make_node("Tanh", ["v1"], ["v_out"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [
            value_info("i", TensorProto.INT64, []),
            value_info("c", TensorProto.BOOL, []),
            value_info("v", TensorProto.FLOAT, [2, HIDDEN]),
        ],
        [value_info("c_out", TensorProto.BOOL, []), value_info("v_out", TensorProto.FLOAT, [2, HIDDEN])],
        [init("loop.weight")],
    )
    own = "past.proj" if past else "lm_head.weight"
    nodes = [
        helper.make_node("MatMul", ["x", name("model.layers.0.weight")], ["m0"]),
        helper.make_node("Slice", [name("model.layers.0.bias"), "start", "stop"], ["b0"]),
        helper.make_node("Add", ["m0", "b0"], ["h0"]),
        helper.make_node("MatMul", ["h0", name("model.layers.1.weight")], ["h1"]),
        helper.make_node("If", ["cond"], ["z"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Constant", [], ["keep_going"], value=helper.make_tensor("k", TensorProto.BOOL, [], [True])),
        helper.make_node("Loop", ["trip", "keep_going", "z"], ["looped"], body=body),
        helper.make_node("MatMul", ["looped", own], ["logits"]),
        helper.make_node("Reshape", ["logits", "shape"], ["y"]),
    ]
    inputs = [
        value_info("x", TensorProto.FLOAT, [2, HIDDEN]),
        value_info("cond", TensorProto.BOOL, []),
        value_info("trip", TensorProto.INT64, []),
    ]
    initializers = [
        init("model.layers.0.weight"),
        init("model.layers.0.bias"),
        init("model.layers.1.weight"),
        init(own),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array([HIDDEN], np.int64), "stop"),
        numpy_helper.from_array(np.array([-1, HIDDEN // 2], np.int64), "shape"),  # inline: a shape tensor
    ]
    graph = helper.make_graph(
        nodes,
        "decoder_with_past" if past else "decoder",
        inputs,
        [value_info("y", TensorProto.FLOAT, [4, HIDDEN // 2])],
        initializers,
    )
    model = make_model(graph)
    onnx.checker.check_model(model, full_check=True)
    return model


def write_family(root: Path, seed: int = 0, *, size_threshold: int = 1024) -> Family:
    """``root/export_a/decoder_model.onnx`` and ``root/export_b/decoder_with_past_model.onnx``, each with its own
    ``model.onnx_data`` (tensors of at least ``size_threshold`` bytes; the others stay inline)."""
    weights = family_weights(seed)
    paths = []
    for folder, file_name, past in (
        ("export_a", "decoder_model.onnx", False),
        ("export_b", "decoder_with_past_model.onnx", True),
    ):
        (root / folder).mkdir(parents=True, exist_ok=True)
        paths.append(
            save_external(
                _member(weights, past=past), root / folder / file_name, "model.onnx_data", size_threshold=size_threshold
            )
        )
    return Family(*paths)


def family_feeds(cond: bool = True) -> dict[str, np.ndarray]:
    return {
        "x": np.linspace(-1, 1, 2 * HIDDEN, dtype=np.float32).reshape(2, HIDDEN),
        "cond": np.array(cond),
        "trip": np.array(2, dtype=np.int64),
    }


def outputs_of(model_path: Path, cond: bool = True) -> list[np.ndarray]:
    return run_onnxruntime(model_path, family_feeds(cond))
