"""Models read by ``ai.rt::DelayedInitializer`` nodes, for ``inspect`` (``tests/test_cli_inspect_delayed.py``) and the
``--json`` corpus (``tests/json/corpus.py``): one node per case a reader can meet.

Every builder writes only under the folder it is given.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import safetensors.numpy as st_numpy
from onnx import AttributeProto, TensorProto
from onnx import helper as oh

from onnx_light_ref.ops import delay_initializers
from tests.models import OPSET, make_external_model
from tests.ops.kernel_support import delayed_node

__all__ = ["EXPECTED", "broken_delayed_model", "converted_delayed_model"]

# What inspect finds for each node of broken_delayed_model (by output name): the status, and a fragment of the message.
EXPECTED: dict[str, tuple[str, str]] = {
    "ok": ("shared (3)", ""),  # the same range as "twin" and the external tensor "ext"
    "twin": ("shared (3)", ""),
    "overlapped": ("overlap", "partially overlaps [200, +16 bytes) of 'overlapping'"),
    "overlapping": ("overlap", "partially overlaps [192, +16 bytes) of 'overlapped'"),
    "absolute_inside": ("ok", ""),
    "past_end": ("out of bounds", "too short: needs 1064 bytes (64 bytes at offset 1000), has 256 bytes"),
    "gone": ("missing file", "node 'node_gone': file 'gone.bin' does not exist in the model's folder"),
    "escaping": ("unsafe location", "relative filename '../outside.bin' must stay inside the folder"),
    "absolute_outside": ("unsafe location", "allow_outside_folder=True (CLI: --allow-outside-folder)"),
    "hard": ("hard-linked", "has 2 hard links"),
    "soft": ("unsafe location", "node 'node_soft': file 's.bin' ("),
    "gpu": ("invalid", "load_device must be 'cpu' or 'file', got 'gpu'"),
    "strings": ("invalid", "dtype 8 (STRING) has no fixed byte size"),
    "extra": ("invalid", "attribute 'length' is not an attribute of DelayedInitializer"),
    "empty": ("ok", ""),  # reads zero bytes: no file is opened
    "mismatch": ("header mismatch", "mismatch"),
    "linked": ("linked", "known per call only"),
}


def converted_delayed_model(folder: Path) -> Path:
    """An external-data model converted by ``delay_initializers``: every node reads a valid range."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones(8, dtype=np.float32)}
    source = make_external_model(folder, weights, name="source.onnx")
    path = folder / "light.onnx"
    onnx.save(delay_initializers(source), str(path))
    return path


def _node(output: str, filename: str, **kwargs: object) -> onnx.NodeProto:
    return delayed_node(filename, output=output, name=f"node_{output}", **kwargs)  # type: ignore[arg-type]


def _linked_function() -> onnx.FunctionProto:
    """A model function whose DelayedInitializer takes its filename from the function's attribute."""
    node = _node("linked", "unused")
    (filename,) = [a for a in node.attribute if a.name == "filename"]
    filename.Clear()
    filename.name, filename.type, filename.ref_attr_name = "filename", AttributeProto.STRING, "weights"
    opsets = [oh.make_opsetid("", OPSET), oh.make_opsetid("ai.rt", 1)]
    return oh.make_function("local", "Load", [], ["linked"], [node], opsets, ["weights"])


def broken_delayed_model(folder: Path) -> Path:
    """``broken.onnx``: one DelayedInitializer node per case of :data:`EXPECTED`, beside an external tensor."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "w.bin").write_bytes(bytes(range(256)))
    (folder / "h.bin").write_bytes(bytes(64))
    os.link(folder / "h.bin", folder / "h-again.bin")
    (folder / "target.bin").write_bytes(bytes(64))
    os.symlink("target.bin", folder / "s.bin")
    (folder.parent / "outside.bin").write_bytes(bytes(64))
    st_numpy.save_file({"mismatch": np.zeros(4, np.int32)}, str(folder / "w.safetensors"))
    extra = _node("extra", "w.bin")
    extra.attribute.append(oh.make_attribute("length", 16))
    nodes = [
        _node("ok", "w.bin", shape=(4,)),
        _node("twin", "w.bin", shape=(4,)),
        _node("overlapped", "w.bin", offset=192),
        _node("overlapping", "w.bin", offset=200),
        _node("absolute_inside", str(folder / "w.bin"), offset=64),
        _node("past_end", "w.bin", shape=(16,), offset=1000),
        _node("gone", "gone.bin"),
        _node("escaping", "../outside.bin"),
        _node("absolute_outside", str(folder.parent / "outside.bin")),
        _node("hard", "h.bin"),
        _node("soft", "s.bin"),
        _node("gpu", "w.bin", load_device="gpu"),
        _node("strings", "w.bin", dtype=TensorProto.STRING),
        extra,
        _node("empty", "gone.bin", shape=(0,)),
        _node("mismatch", "w.safetensors", offset=8 + _header_length(folder / "w.safetensors")),
        oh.make_node("Load", [], ["from_function"], domain="local", weights="w.bin"),
    ]
    external = oh.make_tensor("ext", TensorProto.FLOAT, [4], vals=np.zeros(4, np.float32).tobytes(), raw=True)
    external.ClearField("raw_data")
    external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "16")):
        external.external_data.add(key=key, value=value)
    outputs = [oh.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in nodes]
    graph = oh.make_graph([*nodes, oh.make_node("Identity", ["ext"], ["ext_out"])], "g", [], outputs, [external])
    opsets = [oh.make_opsetid("", OPSET), oh.make_opsetid("ai.rt", 1), oh.make_opsetid("local", 1)]
    model = oh.make_model(graph, opset_imports=opsets, functions=[_linked_function()])
    path = folder / "broken.onnx"
    onnx.save_model(model, str(path))
    return path


def _header_length(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[:8], "little")
