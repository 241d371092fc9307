"""A ``.onnx`` over protobuf's 2 GiB limit with its weights inline, written as a sparse file for tests.

protobuf cannot write or read such a file; protobuf-free writers (onnx-light) produce them. Built with
:mod:`tests.wire_writer`: each large payload is a hole (no disk block, no memory), and a few real bytes (a marker
naming the tensor, different in each marked tensor) are written into some holes so that a reader looking at the
wrong offsets sees other bytes. A whole model costs a few KiB of real disk blocks.

Import it as ``tests.large_inline``. It never writes outside the path it is given.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.wire_writer import Hole, write_model

__all__ = [
    "COUNT",
    "FIRST_LARGE",
    "GRAPH",
    "LENGTH",
    "MARKED",
    "large_inline_model",
    "large_name",
    "real_bytes",
    "write_large_inline_model",
]

COUNT = 1025
"""Large inline tensors: with :data:`LENGTH` bytes each, the file is just over 2 GiB."""

# Each tensor's few header bytes land in a disk block of their own (4 KiB per tensor), and an aligned copy made with
# dedup stores each distinct tensor once (real blocks): 2 MiB tensors keep both costs at a few MiB.
LENGTH = 2**21 + 3
"""Bytes (UINT8 elements) of each large tensor: not a multiple of any chunk size."""

FIRST_LARGE = 2
"""Walker index of the first large tensor: two small ones come first (one in raw_data, one in float_data)."""

GRAPH = "large"

MARKED = (0, COUNT - 1)
"""Large tensors given real bytes: their markers, at :data:`_MARK_AT`."""

_MARK_AT = (0, 517, LENGTH - 11)


def large_name(index: int) -> str:
    return f"w{index:04d}"


def _marker(index: int) -> bytes:
    return f"tensor {index:04d}".encode()  # 11 bytes


def large_inline_model() -> onnx.ModelProto:
    """The model, its large initializers without data (the writer gives them their payloads)."""
    small = numpy_helper.from_array(np.arange(4, dtype=np.float32), "small")  # 16 bytes: below the wire placeholder
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [3], [1.5, -2.0, 0.25])  # float_data, not raw_data
    large = [TensorProto(name=large_name(i), data_type=TensorProto.UINT8, dims=[LENGTH]) for i in range(COUNT)]
    graph = helper.make_graph(
        [helper.make_node("Add", ["small", "x"], ["y"])],
        GRAPH,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[small, typed, *large],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def write_large_inline_model(
    path: Path, *, flip: tuple[int, int] | None = None, model: onnx.ModelProto | None = None
) -> dict[str, tuple[int, int]]:
    """Write the model to ``path`` (sparse) and return each large tensor's ``(offset, length)`` in the file.

    Args:
        path: the new ``.onnx`` file.
        flip: ``(tensor index, byte offset in its payload)`` of a byte set to 0x01 (it is 0x00 in the plain model):
            the same model with a one-byte difference.
        model: a variant of :func:`large_inline_model` (e.g. with other dims) instead of it.
    """
    model = model if model is not None else large_inline_model()
    offsets = write_model(path, model, {large_name(i): Hole(LENGTH) for i in range(COUNT)})
    with open(path, "r+b") as f:
        for index in MARKED:
            for at in _MARK_AT:
                f.seek(offsets[large_name(index)][0] + at)
                f.write(_marker(index))
        if flip is not None:
            index, at = flip
            f.seek(offsets[large_name(index)][0] + at)
            f.write(b"\x01")
    return offsets


def real_bytes(folder: Path) -> int:
    """Bytes of disk blocks the files of ``folder`` use (holes cost nothing)."""
    return sum(os.stat(entry).st_blocks * 512 for entry in folder.iterdir() if entry.is_file())
