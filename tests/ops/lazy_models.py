"""Models with external weights shared by the lazy-evaluation tests (convert, evaluate).

Import as ``from lazy_models import ...`` (pytest puts this folder on ``sys.path``; ``tests/`` is not a package).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "IR_VERSION",
    "OPSET",
    "TRAINING_WEIGHTS",
    "build_control_flow_model",
    "build_shadowing_model",
    "build_training_model",
    "control_flow_feeds",
    "run_onnxruntime",
    "save_external",
    "shadowing_feeds",
    "training_feeds",
    "value_info",
]

OPSET = 18
IR_VERSION = 10


def value_info(name: str, elem: int, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


_vi = value_info


def build_control_flow_model() -> onnx.ModelProto:
    """MatMul/Add/Mul in the main graph, an If and a Loop whose bodies have their own initializers and use outer ones.

    ``B`` is used by four nodes (main graph, else branch, loop body): one initializer shared by several nodes.
    """
    rng = np.random.default_rng(0)
    W = numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W")
    B = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    T = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "T")
    L = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "L")
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["y", "T"], ["t"])], "then", [], [_vi("t", TensorProto.FLOAT, [2, 4])], [T]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Sub", ["y2", "B"], ["e"])], "else", [], [_vi("e", TensorProto.FLOAT, [2, 4])]
    )
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v", "L"], ["v1"]),
            helper.make_node("Add", ["v1", "B"], ["v_out"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [
            _vi("i", TensorProto.INT64, []),
            _vi("c", TensorProto.BOOL, []),
            _vi("v", TensorProto.FLOAT, [2, 4]),
        ],
        [_vi("c_out", TensorProto.BOOL, []), _vi("v_out", TensorProto.FLOAT, [2, 4])],
        [L],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["m"]),
            helper.make_node("Add", ["m", "B"], ["y"]),
            helper.make_node("Mul", ["y", "B"], ["y2"]),
            helper.make_node("If", ["cond"], ["z"], then_branch=then_branch, else_branch=else_branch),
            # onnx's reference Loop runs zero iterations when the optional condition is omitted: pass it.
            helper.make_node(
                "Constant", [], ["keep_going"], value=helper.make_tensor("k", TensorProto.BOOL, [], [True])
            ),
            helper.make_node("Loop", ["trip", "keep_going", "y"], ["looped"], body=body),
        ],
        "control_flow",
        [
            _vi("x", TensorProto.FLOAT, [2, 3]),
            _vi("cond", TensorProto.BOOL, []),
            _vi("trip", TensorProto.INT64, []),
        ],
        [_vi("z", TensorProto.FLOAT, [2, 4]), _vi("looped", TensorProto.FLOAT, [2, 4])],
        [W, B],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def build_shadowing_model() -> onnx.ModelProto:
    """Subgraph initializers named like outer values (legal for initializers, not for node outputs).

    Main graph: initializers ``W`` and ``B``. The first If's then-branch has its own ``W``; the second If's then-branch
    returns its own ``W`` directly as its output. The Loop body has its own ``B`` and a nested If whose then-branch
    uses the body's ``B`` and whose else-branch shadows ``B`` a third time. Every shadowing tensor holds different
    values, so an evaluator resolving a name in the wrong scope computes something else.
    """

    def tensor(name: str, start: float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.arange(start, start + 4, dtype=np.float32), name)

    f4 = [4]
    then_w = helper.make_graph(
        [helper.make_node("Add", ["y", "W"], ["t"])], "then_w", [], [_vi("t", TensorProto.FLOAT, f4)], [tensor("W", 10)]
    )
    else_w = helper.make_graph(
        [helper.make_node("Sub", ["y", "W"], ["e"])], "else_w", [], [_vi("e", TensorProto.FLOAT, f4)]
    )
    then_direct = helper.make_graph([], "then_direct", [], [_vi("W", TensorProto.FLOAT, f4)], [tensor("W", 20)])
    else_direct = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["w_out"])], "else_direct", [], [_vi("w_out", TensorProto.FLOAT, f4)]
    )
    inner_then = helper.make_graph(
        [helper.make_node("Mul", ["v1", "B"], ["tb"])], "inner_then", [], [_vi("tb", TensorProto.FLOAT, f4)]
    )
    inner_else = helper.make_graph(
        [helper.make_node("Sub", ["v1", "B"], ["eb"])],
        "inner_else",
        [],
        [_vi("eb", TensorProto.FLOAT, f4)],
        [tensor("B", 40)],
    )
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v", "B"], ["v1"]),
            helper.make_node("If", ["flip"], ["v2"], then_branch=inner_then, else_branch=inner_else),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("c", TensorProto.BOOL, []), _vi("v", TensorProto.FLOAT, f4)],
        [_vi("c_out", TensorProto.BOOL, []), _vi("v2", TensorProto.FLOAT, f4)],
        [tensor("B", 30)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "W"], ["y"]),
            helper.make_node("Mul", ["y", "B"], ["yb"]),
            helper.make_node("If", ["cond"], ["z"], then_branch=then_w, else_branch=else_w),
            helper.make_node("If", ["cond"], ["z2"], then_branch=then_direct, else_branch=else_direct),
            helper.make_node(
                "Constant", [], ["keep_going"], value=helper.make_tensor("k", TensorProto.BOOL, [], [True])
            ),
            helper.make_node("Loop", ["trip", "keep_going", "yb"], ["looped"], body=body),
        ],
        "shadowing",
        [
            _vi("x", TensorProto.FLOAT, f4),
            _vi("cond", TensorProto.BOOL, []),
            _vi("flip", TensorProto.BOOL, []),
            _vi("trip", TensorProto.INT64, []),
        ],
        [_vi("z", TensorProto.FLOAT, f4), _vi("z2", TensorProto.FLOAT, f4), _vi("looped", TensorProto.FLOAT, f4)],
        [tensor("W", 0), tensor("B", 1)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def shadowing_feeds(cond: bool, flip: bool) -> dict[str, np.ndarray]:
    return {
        "x": np.linspace(-1, 1, 4, dtype=np.float32),
        "cond": np.array(cond),
        "flip": np.array(flip),
        "trip": np.array(2, dtype=np.int64),
    }


def save_external(model: onnx.ModelProto, path: Path, location: str = "weights.data") -> Path:
    """Save with onnx's own writer, every tensor external."""
    onnx.save_model(model, str(path), save_as_external_data=True, location=location, size_threshold=0)
    return path


def control_flow_feeds(cond: bool) -> dict[str, np.ndarray]:
    return {
        "x": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        "cond": np.array(cond),
        "trip": np.array(3, dtype=np.int64),
    }


def run_onnxruntime(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


TRAINING_WEIGHTS = "train.bin"


def build_training_model(folder: Path) -> tuple[Path, dict[str, bytes]]:
    """A model with ``training_info`` whose graphs hold their own external initializers, saved in ``folder``.

    Inference: ``y = x @ W + B`` (``W``, ``B`` external in ``weights.data``, written by onnx). Training: an
    initialization graph producing ``W`` from its initializer ``W0`` and an algorithm graph computing
    ``W - lr * G`` from its initializers ``lr`` and ``G``; ``W0``, ``lr`` and ``G`` live in ``train.bin``
    (onnx's writer never externalizes training graphs, so their entries are set here). Returns the model path and
    the training tensors' external entries by name, as written.
    """
    rng = np.random.default_rng(7)
    W = numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W")
    B = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])],
        "inference",
        [_vi("x", TensorProto.FLOAT, [2, 3])],
        [_vi("y", TensorProto.FLOAT, [2, 4])],
        [W, B],
    )
    training_tensors = {
        "W0": rng.standard_normal((3, 4)).astype(np.float32),
        "lr": np.array([0.01], dtype=np.float32),
        "G": rng.standard_normal((3, 4)).astype(np.float32),
    }
    blob = bytearray()
    protos: dict[str, TensorProto] = {}
    for name, array in training_tensors.items():
        tensor = numpy_helper.from_array(array, name)
        offset = len(blob)
        blob += tensor.raw_data
        onnx.external_data_helper.set_external_data(
            tensor, location=TRAINING_WEIGHTS, offset=offset, length=len(blob) - offset
        )
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        protos[name] = tensor
    initialization = helper.make_graph(
        [helper.make_node("Identity", ["W0"], ["W_init"])],
        "initialization",
        [],
        [_vi("W_init", TensorProto.FLOAT, [3, 4])],
        [protos["W0"]],
    )
    algorithm = helper.make_graph(
        [helper.make_node("Mul", ["lr", "G"], ["step"]), helper.make_node("Sub", ["W", "step"], ["W_new"])],
        "algorithm",
        [],
        [_vi("W_new", TensorProto.FLOAT, [3, 4])],
        [protos["lr"], protos["G"]],
    )
    training = onnx.TrainingInfoProto()
    training.initialization.CopyFrom(initialization)
    training.algorithm.CopyFrom(algorithm)
    training.initialization_binding.add(key="W", value="W_init")
    training.update_binding.add(key="W", value="W_new")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    model.training_info.append(training)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAINING_WEIGHTS).write_bytes(bytes(blob))
    path = save_external(model, folder / "model.onnx")
    entries = {
        tensor.name: tensor.SerializeToString()
        for info in onnx.load_model(str(path), load_external_data=False).training_info
        for tensor in (*info.initialization.initializer, *info.algorithm.initializer)
    }
    return path, entries


def training_feeds() -> dict[str, np.ndarray]:
    return {"x": np.arange(6, dtype=np.float32).reshape(2, 3) / 5}
