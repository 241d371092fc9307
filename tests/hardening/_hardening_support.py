"""Builders and checks shared by the hardening tests (and importable by their child processes).

Standalone on purpose: child processes started with ``sys.executable`` and hypothesis examples (which cannot use
function-scoped fixtures) need these without pytest's fixture machinery. Everything writes real files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = [
    "IR_VERSION",
    "OPSET",
    "external_tensor",
    "identity_model",
    "snapshot_tree",
    "temp_files_under",
    "write_external_model",
    "write_model",
]

# onnxruntime 1.32 reads IR 10 models; opset 18 has every op used here (Identity, If).
IR_VERSION = 10
OPSET = 18


def external_tensor(
    name: str, array: np.ndarray, entries: Iterable[tuple[str, str]], *, keep_raw: bool = False
) -> onnx.TensorProto:
    """A TensorProto with ``array``'s dims and dtype, marked EXTERNAL with exactly ``entries`` (in that order).

    ``keep_raw`` leaves the inline ``raw_data`` in place as well (a tensor both inline and external).
    """
    tensor = numpy_helper.from_array(array, name)
    if not keep_raw:
        tensor.ClearField("raw_data")
    for key, value in entries:
        entry = tensor.external_data.add()
        entry.key = key
        entry.value = value
    tensor.data_location = onnx.TensorProto.EXTERNAL
    return tensor


def identity_model(initializers: Iterable[onnx.TensorProto], *, name: str = "hardening") -> onnx.ModelProto:
    """A runnable model returning every initializer through an Identity node named ``id_<name>``."""
    initializers = list(initializers)
    nodes = [helper.make_node("Identity", [t.name], [f"out_{t.name}"], name=f"id_{t.name}") for t in initializers]
    outputs = [helper.make_tensor_value_info(f"out_{t.name}", t.data_type, list(t.dims)) for t in initializers]
    graph = helper.make_graph(nodes, name, [], outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def write_model(path: str | os.PathLike[str], model: onnx.ModelProto) -> Path:
    """Serialize ``model`` to ``path`` as it is (never touching any external data, unlike ``onnx.save``)."""
    path = Path(path)
    path.write_bytes(model.SerializeToString())
    return path


def write_external_model(
    folder: str | os.PathLike[str],
    arrays: Mapping[str, np.ndarray],
    *,
    name: str = "model.onnx",
    location: str | None = None,
    gap: int = 3,
    inline: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write ``<folder>/<name>`` whose ``arrays`` live back to back (``gap`` junk bytes apart) in one data file.

    The junk gaps make a copier that takes the wrong range produce wrong bytes. ``inline`` tensors stay in the proto.
    Returns the ``.onnx`` path.
    """
    folder = Path(folder)
    location = location or f"{name}.data"
    tensors = []
    with open(folder / location, "wb") as data_file:
        for tensor_name, array in arrays.items():
            data_file.write(b"\xa5" * gap)
            payload = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
            offset = data_file.tell()
            data_file.write(payload)
            entries = [("location", location), ("offset", str(offset)), ("length", str(len(payload)))]
            tensors.append(external_tensor(tensor_name, array, entries))
    tensors.extend(numpy_helper.from_array(array, tensor_name) for tensor_name, array in (inline or {}).items())
    return write_model(folder / name, identity_model(tensors))


def snapshot_tree(folder: str | os.PathLike[str]) -> dict[str, str]:
    """``{relative path: sha256 or 'symlink -> target' or kind}`` of everything under ``folder`` (no link followed)."""
    snapshot: dict[str, str] = {}
    root = os.fspath(folder)
    for current, dirs, files in os.walk(root):
        for entry in sorted(dirs + files):
            path = os.path.join(current, entry)
            relative = os.path.relpath(path, root)
            if os.path.islink(path):
                snapshot[relative] = f"symlink -> {os.readlink(path)}"
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    snapshot[relative] = hashlib.sha256(handle.read()).hexdigest()
            elif os.path.isdir(path):
                snapshot[relative] = "dir"
            else:
                snapshot[relative] = "special"
    return snapshot


def temp_files_under(folder: str | os.PathLike[str]) -> list[str]:
    """Staged temp files (``.<name>.<pid>.<random>.tmp``) anywhere under ``folder``."""
    found = []
    for current, _dirs, files in os.walk(os.fspath(folder)):
        found.extend(os.path.join(current, f) for f in files if f.startswith(".") and f.endswith(".tmp"))
    return sorted(found)
