"""The test suite's one module for building real ONNX models (and their external data files).

Import as ``from tests.models import ...`` (``tests`` is a package; pytest and the subprocess children put the
repository root on ``sys.path``). Checks on what a run left behind live in :mod:`tests.checks`.

* :func:`identity_model`: a runnable model returning each initializer through an Identity node, from arrays
  (raw or typed fields) or from ready TensorProtos (e.g. hand-made EXTERNAL ones);
* :func:`save_external` / :func:`make_external_model`: external data written by onnx's own writer;
* :func:`externalize` / :func:`write_external_model` / :func:`external_tensor`: external data placed by hand (gaps,
  several files, checksums, exact entries, tensors onnx's writer does not handle such as sparse ones);
* :func:`write_model`: serialize a proto as it is (``onnx.save`` would touch external data);
* :func:`make_model`: a graph as a model of the suite's :data:`IR_VERSION` and :data:`OPSET`;
* :func:`build_control_flow_model`, :func:`build_shadowing_model`, :func:`build_training_model` and their feeds.

The aligners' zoo of model shapes (one model per case, built on these) lives in :mod:`tests.zoo`.

Every builder writes real files only under the folder or path it is given (normally under ``tmp_path``); nothing
here calls the code under test.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

__all__ = [
    "IR_VERSION",
    "OPSET",
    "TRAINING_WEIGHTS",
    "build_control_flow_model",
    "build_shadowing_model",
    "build_training_model",
    "control_flow_feeds",
    "external_tensor",
    "externalize",
    "identity_model",
    "make_external_model",
    "make_model",
    "mlp_model",
    "save_external",
    "shadowing_feeds",
    "training_feeds",
    "value_info",
    "write_external_model",
    "write_model",
]

# onnxruntime 1.32 reads IR 10 models; opset 18 has every op the tests use (If, Loop, Constant, Identity, Add).
IR_VERSION = 10
OPSET = 18
TRAINING_WEIGHTS = "train.bin"


def value_info(name: str, elem: int, shape: Sequence[int | str | None] | None) -> onnx.ValueInfoProto:
    """A tensor value info (short form of ``helper.make_tensor_value_info``)."""
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(
    graph: onnx.GraphProto,
    *,
    domains: Mapping[str, int] | None = None,
    functions: Iterable[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    """``graph`` as a model of :data:`IR_VERSION` importing the default domain at :data:`OPSET`.

    Args:
        graph: the main graph.
        domains: further operator set imports, version by domain (e.g. the domain of local ``functions``).
        functions: model-local functions.

    Returns:
        The model (nothing is written).
    """
    opsets = [helper.make_opsetid("", OPSET)]
    opsets.extend(helper.make_opsetid(domain, version) for domain, version in (domains or {}).items())
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions), ir_version=IR_VERSION)


def identity_model(
    tensors: Mapping[str, np.ndarray] | Iterable[onnx.TensorProto],
    *,
    typed_inline: Iterable[str] = (),
    name: str = "identity",
) -> onnx.ModelProto:
    """A runnable model whose initializers are ``tensors``; each is returned by Identity node ``id_<n>`` as ``out_<n>``.

    Args:
        tensors: arrays by name (stored in ``raw_data``), or TensorProtos used as they are (external or not).
        typed_inline: names of arrays stored in the typed ``*_data`` fields instead, which onnx never moves to
            external data.
        name: the graph's name.

    Returns:
        The model (nothing is written).
    """
    if isinstance(tensors, Mapping):
        typed = set(typed_inline)
        initializers = []
        for tensor_name, array in tensors.items():
            if tensor_name in typed:
                data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
                initializers.append(helper.make_tensor(tensor_name, data_type, array.shape, array.flatten().tolist()))
            else:
                initializers.append(numpy_helper.from_array(array, tensor_name))
    else:
        initializers = list(tensors)
    nodes = [helper.make_node("Identity", [t.name], [f"out_{t.name}"], name=f"id_{t.name}") for t in initializers]
    outputs = [value_info(f"out_{t.name}", t.data_type, list(t.dims)) for t in initializers]
    return make_model(helper.make_graph(nodes, name, [], outputs, initializer=initializers))


def write_model(path: str | os.PathLike[str], model: onnx.ModelProto) -> Path:
    """Serialize ``model`` to ``path`` as it is (never touching any external data, unlike ``onnx.save``)."""
    path = Path(path)
    path.write_bytes(model.SerializeToString())
    return path


def save_external(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    location: str = "weights.data",
    *,
    size_threshold: int = 0,
    convert_attribute: bool = False,
) -> Path:
    """Save ``model`` at ``path`` with onnx's own writer: every raw tensor of ``size_threshold`` bytes or more goes to
    ``location``, back to back as onnx writes them (attribute tensors too with ``convert_attribute``). Returns the
    ``.onnx`` path."""
    path = Path(path)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=size_threshold,
        convert_attribute=convert_attribute,
    )
    return path


def make_external_model(
    folder: str | os.PathLike[str],
    tensors: Mapping[str, np.ndarray],
    *,
    name: str = "model.onnx",
    location: str | None = None,
    size_threshold: int = 0,
    typed_inline: Iterable[str] = (),
) -> Path:
    """Save an :func:`identity_model` of ``tensors`` as ``<folder>/<name>`` with :func:`save_external`.

    ``location`` defaults to ``<name>.data``. Returns the ``.onnx`` path.
    """
    model = identity_model(tensors, typed_inline=typed_inline)
    return save_external(model, Path(folder) / name, location or f"{name}.data", size_threshold=size_threshold)


def external_tensor(
    name: str, array: np.ndarray, entries: Iterable[tuple[str, str]], *, keep_raw: bool = False
) -> onnx.TensorProto:
    """A TensorProto with ``array``'s dims and dtype, marked EXTERNAL with exactly ``entries`` (in that order).

    ``keep_raw`` leaves the inline ``raw_data`` in place as well (a tensor both inline and external). No file is
    written: the entries may point anywhere.
    """
    tensor = numpy_helper.from_array(array, name)
    if not keep_raw:
        tensor.ClearField("raw_data")
    for key, value in entries:
        entry = tensor.external_data.add()
        entry.key = key
        entry.value = value
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def externalize(
    tensors: Iterable[onnx.TensorProto],
    folder: str | os.PathLike[str],
    location_for: str | Callable[[onnx.TensorProto], str],
    *,
    gap: bytes = b"",
    checksum: bool = False,
) -> None:
    """Append each tensor's ``raw_data`` to its data file and turn it into an EXTERNAL reference (in place).

    ``location_for`` is one location or a function of the tensor (to spread tensors over several files). ``gap``
    bytes are written before each payload so that a copier that takes the wrong range is caught. With ``checksum``,
    a ``checksum`` entry (sha1 of the payload) is recorded as some writers do. Entries are written in the order
    ``location``, ``offset``, ``length`` (``checksum``).
    """
    for tensor in tensors:
        location = location_for if isinstance(location_for, str) else location_for(tensor)
        payload = tensor.raw_data
        path = Path(folder) / location
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as data_file:
            data_file.write(gap)
            offset = data_file.tell()
            data_file.write(payload)
        set_external_data(
            tensor,
            location,
            offset=offset,
            length=len(payload),
            checksum=hashlib.sha1(payload).hexdigest() if checksum else None,
        )
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL


def write_external_model(
    folder: str | os.PathLike[str],
    arrays: Mapping[str, np.ndarray],
    *,
    name: str = "model.onnx",
    location: str | None = None,
    gap: int = 3,
    inline: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write ``<folder>/<name>``, an :func:`identity_model` whose ``arrays`` live back to back, ``gap`` junk bytes
    apart, in one fresh data file ``location`` (default ``<name>.data``), placed by :func:`externalize`.

    The junk gaps make a copier that takes the wrong range produce wrong bytes. ``inline`` tensors stay in the proto.
    Returns the ``.onnx`` path.
    """
    folder = Path(folder)
    location = location or f"{name}.data"
    (folder / location).write_bytes(b"")
    tensors = [numpy_helper.from_array(array, tensor_name) for tensor_name, array in arrays.items()]
    externalize(tensors, folder, location, gap=b"\xa5" * gap)
    tensors.extend(numpy_helper.from_array(array, tensor_name) for tensor_name, array in (inline or {}).items())
    return write_model(folder / name, identity_model(tensors))


def mlp_model(weights: Mapping[str, np.ndarray], *, batch: int | None = None, name: str = "mlp") -> onnx.ModelProto:
    """``x -> MatMul + Add (+ Relu between layers) -> y``, one layer per ``(weight, bias)`` pair of ``weights``.

    Args:
        weights: float32 arrays in layer order: weight ``(in, out)`` then bias ``(out,)``, under any names.
        batch: the batch dimension of ``x`` and ``y`` (None: dynamic).
        name: the graph's name.

    Returns:
        The model, every weight an inline initializer (nothing is written).
    """
    items = list(weights.items())
    layers = list(zip(items[0::2], items[1::2], strict=True))
    nodes = []
    current = "x"
    for index, ((weight, _), (bias, _)) in enumerate(layers):
        last = index == len(layers) - 1
        summed = "y" if last else f"z{index}"
        nodes.append(helper.make_node("MatMul", [current, weight], [f"mm{index}"]))
        nodes.append(helper.make_node("Add", [f"mm{index}", bias], [summed]))
        if not last:
            current = f"h{index}"
            nodes.append(helper.make_node("Relu", [summed], [current]))
    graph = helper.make_graph(
        nodes,
        name,
        [value_info("x", TensorProto.FLOAT, [batch, layers[0][0][1].shape[0]])],
        [value_info("y", TensorProto.FLOAT, [batch, layers[-1][0][1].shape[1]])],
        [numpy_helper.from_array(array, tensor_name) for tensor_name, array in items],
    )
    return make_model(graph)


def build_control_flow_model() -> onnx.ModelProto:
    """MatMul/Add/Mul in the main graph, an If and a Loop whose bodies have their own initializers and use outer ones.

    ``B`` is used by four nodes (main graph, else branch, loop body): one initializer shared by several nodes.
    """
    rng = np.random.default_rng(0)
    W = numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W")
    B = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    T = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "T")
    L = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "L")
    f24 = [2, 4]
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["y", "T"], ["t"])], "then", [], [value_info("t", TensorProto.FLOAT, f24)], [T]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Sub", ["y2", "B"], ["e"])], "else", [], [value_info("e", TensorProto.FLOAT, f24)]
    )
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v", "L"], ["v1"]),
            helper.make_node("Add", ["v1", "B"], ["v_out"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [
            value_info("i", TensorProto.INT64, []),
            value_info("c", TensorProto.BOOL, []),
            value_info("v", TensorProto.FLOAT, f24),
        ],
        [value_info("c_out", TensorProto.BOOL, []), value_info("v_out", TensorProto.FLOAT, f24)],
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
            value_info("x", TensorProto.FLOAT, [2, 3]),
            value_info("cond", TensorProto.BOOL, []),
            value_info("trip", TensorProto.INT64, []),
        ],
        [value_info("z", TensorProto.FLOAT, f24), value_info("looped", TensorProto.FLOAT, f24)],
        [W, B],
    )
    return make_model(graph)


def control_flow_feeds(cond: bool) -> dict[str, np.ndarray]:
    """Inputs of :func:`build_control_flow_model` taking the ``cond`` branch of its If."""
    return {
        "x": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        "cond": np.array(cond),
        "trip": np.array(3, dtype=np.int64),
    }


def build_shadowing_model() -> onnx.ModelProto:
    """Subgraph initializers named like outer values (legal for initializers, not for node outputs).

    Main graph: initializers ``W`` and ``B``. The first If's then-branch has its own ``W``; the second If's then-branch
    returns its own ``W`` directly as its output. The Loop body has its own ``B`` and a nested If whose then-branch
    uses the body's ``B`` and whose else-branch shadows ``B`` a third time. Every shadowing tensor holds different
    values, so an evaluator resolving a name in the wrong scope computes something else.
    """

    def tensor(name: str, start: float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.arange(start, start + 4, dtype=np.float32), name)

    def float4(name: str) -> onnx.ValueInfoProto:
        return value_info(name, TensorProto.FLOAT, [4])

    then_w = helper.make_graph(
        [helper.make_node("Add", ["y", "W"], ["t"])], "then_w", [], [float4("t")], [tensor("W", 10)]
    )
    else_w = helper.make_graph([helper.make_node("Sub", ["y", "W"], ["e"])], "else_w", [], [float4("e")])
    then_direct = helper.make_graph([], "then_direct", [], [float4("W")], [tensor("W", 20)])
    else_direct = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["w_out"])], "else_direct", [], [float4("w_out")]
    )
    inner_then = helper.make_graph([helper.make_node("Mul", ["v1", "B"], ["tb"])], "inner_then", [], [float4("tb")])
    inner_else = helper.make_graph(
        [helper.make_node("Sub", ["v1", "B"], ["eb"])], "inner_else", [], [float4("eb")], [tensor("B", 40)]
    )
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v", "B"], ["v1"]),
            helper.make_node("If", ["flip"], ["v2"], then_branch=inner_then, else_branch=inner_else),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [value_info("i", TensorProto.INT64, []), value_info("c", TensorProto.BOOL, []), float4("v")],
        [value_info("c_out", TensorProto.BOOL, []), float4("v2")],
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
            float4("x"),
            value_info("cond", TensorProto.BOOL, []),
            value_info("flip", TensorProto.BOOL, []),
            value_info("trip", TensorProto.INT64, []),
        ],
        [float4("z"), float4("z2"), float4("looped")],
        [tensor("W", 0), tensor("B", 1)],
    )
    return make_model(graph)


def shadowing_feeds(cond: bool, flip: bool) -> dict[str, np.ndarray]:
    """Inputs of :func:`build_shadowing_model` choosing both Ifs' branches (``cond``) and the nested one (``flip``)."""
    return {
        "x": np.linspace(-1, 1, 4, dtype=np.float32),
        "cond": np.array(cond),
        "flip": np.array(flip),
        "trip": np.array(2, dtype=np.int64),
    }


def build_training_model(folder: Path) -> tuple[Path, dict[str, bytes]]:
    """A model with ``training_info`` whose graphs hold their own external initializers, saved in ``folder``.

    Inference: ``y = x @ W + B`` (``W``, ``B`` external in ``weights.data``, written by onnx). Training: an
    initialization graph producing ``W`` from its initializer ``W0`` and an algorithm graph computing
    ``W - lr * G`` from its initializers ``lr`` and ``G``; ``W0``, ``lr`` and ``G`` live in ``train.bin``
    (onnx's writer never externalizes training graphs, so they are placed by :func:`externalize`).

    Returns:
        The model path and the training tensors' serialized protos (external entries included) by name, as saved.
    """
    rng = np.random.default_rng(7)
    W = numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W")
    B = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])],
        "inference",
        [value_info("x", TensorProto.FLOAT, [2, 3])],
        [value_info("y", TensorProto.FLOAT, [2, 4])],
        [W, B],
    )
    training_arrays = {
        "W0": rng.standard_normal((3, 4)).astype(np.float32),
        "lr": np.array([0.01], dtype=np.float32),
        "G": rng.standard_normal((3, 4)).astype(np.float32),
    }
    protos = {name: numpy_helper.from_array(array, name) for name, array in training_arrays.items()}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAINING_WEIGHTS).write_bytes(b"")
    externalize(protos.values(), folder, TRAINING_WEIGHTS)
    initialization = helper.make_graph(
        [helper.make_node("Identity", ["W0"], ["W_init"])],
        "initialization",
        [],
        [value_info("W_init", TensorProto.FLOAT, [3, 4])],
        [protos["W0"]],
    )
    algorithm = helper.make_graph(
        [helper.make_node("Mul", ["lr", "G"], ["step"]), helper.make_node("Sub", ["W", "step"], ["W_new"])],
        "algorithm",
        [],
        [value_info("W_new", TensorProto.FLOAT, [3, 4])],
        [protos["lr"], protos["G"]],
    )
    training = onnx.TrainingInfoProto()
    training.initialization.CopyFrom(initialization)
    training.algorithm.CopyFrom(algorithm)
    training.initialization_binding.add(key="W", value="W_init")
    training.update_binding.add(key="W", value="W_new")
    model = make_model(graph)
    model.training_info.append(training)
    path = save_external(model, folder / "model.onnx")
    entries = {
        tensor.name: tensor.SerializeToString()
        for info in onnx.load_model(str(path), load_external_data=False).training_info
        for tensor in (*info.initialization.initializer, *info.algorithm.initializer)
    }
    return path, entries


def training_feeds() -> dict[str, np.ndarray]:
    """Inputs of :func:`build_training_model`'s inference graph."""
    return {"x": np.arange(6, dtype=np.float32).reshape(2, 3) / 5}
