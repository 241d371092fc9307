"""Other models that use a writer's file, for rule 1 of the writer contract, and what they compute.

Each builder writes a real model that reads the first 16 bytes of ``target`` as a float32 ``[4]`` tensor, in one of
the ways a model can reach a file: beside it (``sibling``, ``sibling-upper-case``: ``variant.ONNX``), from an
ancestor folder (``parent-folder``: ``top/top.onnx`` with location ``a/b/<name>``), or through an
``ai.rt::DelayedInitializer`` node's ``filename`` (``delayed-initializer``, what ``delay_initializers`` writes).
:func:`computes` says what a sharer computes now, with onnxruntime (or the package's evaluator for the op
onnxruntime does not know).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.ops import reference_evaluator
from onnx_light_ref.ops._schema import make_delayed_initializer_node
from tests.checks import dead_pid, run_onnxruntime
from tests.models import IR_VERSION, OPSET, identity_model, write_model
from tests.wire_writer import encode_varint, field_key

__all__ = [
    "NOT_MODELS",
    "SHARERS",
    "TEST_FIELD_BUDGET",
    "UNREADABLE",
    "bridge_name",
    "computes",
    "grown",
    "make_not_a_model",
    "make_sharer",
    "make_unreadable",
    "shared_bytes",
    "too_deep",
    "too_large",
]

SHARERS = ["sibling", "sibling-upper-case", "parent-folder", "delayed-initializer"]

UNREADABLE = ["too-large", "too-large-in-parent-folder"]
"""``.onnx`` files near a writer's file whose references cannot be read: they may use any file in their reach
(:func:`make_unreadable`)."""

NOT_MODELS = ["truncated", "truncated-in-parent-folder", "malformed-group"]
"""``.onnx`` files near a writer's file that protobuf refuses: ``onnx.load`` refuses them too, so they load no file
(:func:`make_not_a_model`)."""


def shared_bytes() -> bytes:
    """What a shared file holds before the writer runs: 16 float32 values, the sharer reads the first four."""
    return np.arange(16, dtype=np.float32).tobytes() * 2


def external_model(location: str, name: str = "s") -> onnx.ModelProto:
    """A model returning the first 16 bytes of ``location`` as a float32 [4] tensor ``out_<name>``."""
    tensor = numpy_helper.from_array(np.zeros(4, dtype=np.float32), name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        tensor.external_data.add(key=key, value=value)
    return identity_model([tensor])


def delayed_model(filename: str) -> onnx.ModelProto:
    node = make_delayed_initializer_node(
        "s", shape=[4], dtype=TensorProto.FLOAT, load_device="file", filename=filename, offset=0
    )
    graph = helper.make_graph([node], "light", [], [helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])])
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("ai.rt", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def make_sharer(kind: str, target: Path) -> Path:
    """Write the ``kind`` sharer of ``target`` (module docstring); returns its path."""
    if kind == "sibling":
        return write_model(target.parent / "other.onnx", external_model(target.name))
    if kind == "sibling-upper-case":
        return write_model(target.parent / "variant.ONNX", external_model(target.name))
    if kind == "parent-folder":
        top = target.parent.parent.parent
        return write_model(top / "top.onnx", external_model(os.path.relpath(target, top)))
    if kind == "delayed-initializer":
        return write_model(target.parent / "light.onnx", delayed_model(target.name))
    raise ValueError(kind)


def too_deep(levels: int = 104) -> bytes:
    """A second ``graph`` of a ModelProto (protobuf merges it into the first) whose subgraphs nest a
    ``DelayedInitializer`` node ``levels`` messages below the model: past 100, protobuf's limit, ``onnx.load`` and
    onnxruntime refuse the file, and so does the reference scan (it is no model)."""
    content = field_key(1, 2) + _length_prefixed(field_key(4, 2) + _length_prefixed(b"DelayedInitializer"))
    for _ in range((levels - 2) // 3):  # node, attribute, g: three levels each
        content = field_key(1, 2) + _length_prefixed(
            field_key(5, 2) + _length_prefixed(field_key(6, 2) + _length_prefixed(content))
        )
    return field_key(7, 2) + _length_prefixed(content)


def _length_prefixed(content: bytes) -> bytes:
    return encode_varint(len(content)) + content


TEST_FIELD_BUDGET = 5_000
"""The reference scan's field budget in the contract tests (``tests/contract/conftest.py``): a model of
:func:`too_large` passes it, as a model of millions of nodes passes the real one."""


def too_large(location: str) -> onnx.ModelProto:
    """A model using ``location`` whose graph has more fields than :data:`TEST_FIELD_BUDGET`: a model onnx loads,
    but too large for the reference scan to read (it then may use any file in its reach)."""
    return grown(external_model(location))


def grown(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with more fields than :data:`TEST_FIELD_BUDGET` (empty initializers nothing uses)."""
    model.graph.initializer.extend(onnx.TensorProto(name=f"unused{i}") for i in range(TEST_FIELD_BUDGET + 100))
    return model


def make_unreadable(kind: str, target: Path) -> Path:
    """Write the ``kind`` model near ``target`` whose references cannot be read (:data:`UNREADABLE`): a real model
    using ``target`` (beside it, or two folders up), too large for the scan's budget; returns its path."""
    top = target.parent.parent.parent if kind == "too-large-in-parent-folder" else target.parent
    if kind not in UNREADABLE:
        raise ValueError(kind)
    path = top / ("top.onnx" if top != target.parent else "other.onnx")
    path.write_bytes(too_large(os.path.relpath(target, top)).SerializeToString())
    return path


def make_not_a_model(kind: str, target: Path) -> Path:
    """Write the ``kind`` file protobuf refuses near ``target`` (:data:`NOT_MODELS`): a real model using ``target``,
    cut in half (beside it, or two folders up), or whole but with an unclosed group after its graph; returns its
    path."""
    if kind == "truncated":
        data = external_model(target.name).SerializeToString()
        path = target.parent / "other.onnx"
        path.write_bytes(data[: len(data) // 2])
    elif kind == "truncated-in-parent-folder":
        top = target.parent.parent.parent
        data = external_model(os.path.relpath(target, top)).SerializeToString()
        path = top / "top.onnx"
        path.write_bytes(data[: len(data) // 2])
    elif kind == "malformed-group":
        path = target.parent / "other.onnx"
        path.write_bytes(external_model(target.name).SerializeToString() + b"\xbb\x3e")  # start group of field 999
    else:
        raise ValueError(kind)
    return path


def computes(model: Path) -> np.ndarray:
    """What ``model`` computes now: onnxruntime, or the package's evaluator for a DelayedInitializer model."""
    parsed = onnx.load(str(model), load_external_data=False)
    if any(node.domain == "ai.rt" for node in parsed.graph.node):
        return np.asarray(reference_evaluator(str(model)).run(None, {})[0])
    return np.asarray(run_onnxruntime(model, {})[0])


def bridge_name(final_name: str) -> str:
    """A bridge file name (a temp name of ``publish``'s pattern, on which a killed run's model stands) of
    ``final_name`` whose writer's pid is dead."""
    from onnx_light_ref.io._write import publish

    pid = dead_pid()
    name = f"{publish._TEMP_PREFIX}{publish._name_tag(final_name)}~{pid}~{'0' * 16}{publish._TEMP_SUFFIX}"
    assert (match := re.fullmatch(publish._ANY_OWN_NAME, name)) and match.group(3) == publish._TEMP_SUFFIX
    return name
