"""Generate the benchmark models: real ``.onnx`` files whose weights live in external data files.

Every model is sized from one total (``ONNX_LIGHT_REF_BENCH_SIZE``: ``tiny`` for the test run, ``1G`` / ``4G`` for
real runs) and written without ever building a weight-sized array: data files are a random block written again and
again, and the ``external_data`` entries (location, offset, length) are set by hand. This module must never hold
more than one block of weight bytes in memory, so that generating 4 GiB costs seconds and no RAM.

Shapes (at ``1G``; every count and size scales with the total):

* ``large``: 64 tensors of 16 MiB in one data file;
* ``small``: 8192 tensors of 64 KiB (512 MiB, as the issue states it) spread over 4 data files.

Source tensors sit at *unaligned* offsets (a 64-byte gap before each one, like a small header), so re-aligning at
4096 really moves every tensor and no two tensors can be merged into one copy.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = [
    "ENV_SIZE",
    "GIB",
    "KIB",
    "MIB",
    "AlignModel",
    "DelayedModel",
    "MlpModel",
    "make_align_model",
    "make_delayed_model",
    "make_mlp_model",
    "parse_size",
    "scaled",
]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

ENV_SIZE = "ONNX_LIGHT_REF_BENCH_SIZE"

# "tiny" keeps the whole suite (about thirty fresh child processes) within seconds inside the normal test run.
_TINY_TOTAL = 4 * MIB
# The reference total every proportion in the issue is stated for (64 x 16 MiB, 8 MiB new, 256 MiB, 512 MiB).
_REFERENCE_TOTAL = GIB
# Gap before every source tensor: 64 bytes puts each one off any page boundary.
_SOURCE_GAP = 64
# One random block, written repeatedly; 4 MiB keeps generation to a few large write() calls per GiB.
_BLOCK_BYTES = 4 * MIB
# onnx/onnxruntime of this era read IR 10; opset 18 has MatMul, Add, Identity.
_IR_VERSION = 10
_OPSET = 18


def parse_size(text: str) -> int:
    """``tiny`` or a number with an optional binary suffix (``512M``, ``1G``, ``4GiB``) -> bytes."""
    value = text.strip()
    if value.lower() == "tiny":
        return _TINY_TOTAL
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?", value, flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"{ENV_SIZE} must be 'tiny' or a size such as 512M, 1G, 4G; got {text!r}.")
    unit = {"": 1, "K": KIB, "M": MIB, "G": GIB}[match.group(2).upper()]
    return int(float(match.group(1)) * unit)


def scaled(total: int, bytes_at_reference: int, *, minimum: int = 4 * KIB) -> int:
    """``bytes_at_reference`` (a size the issue states for 1 GiB) scaled to ``total``, a multiple of 4 KiB."""
    value = bytes_at_reference * total // _REFERENCE_TOTAL
    return max(minimum, value // (4 * KIB) * (4 * KIB))


@dataclass(frozen=True)
class AlignModel:
    """A generated model for the re-alignment and shared-save benchmarks."""

    shape: str
    onnx_path: str
    data_paths: list[str]
    tensor_count: int
    tensor_bytes: int

    @property
    def payload_bytes(self) -> int:
        return self.tensor_count * self.tensor_bytes

    @property
    def data_bytes(self) -> int:
        """Size of all source data files together (payload plus the 64-byte gaps)."""
        return sum(os.path.getsize(p) for p in self.data_paths)


@dataclass(frozen=True)
class DelayedModel:
    """One raw float32 tensor in a data file, and one ``DelayedInitializer`` model per ``load_device``."""

    data_path: str
    offset: int
    count: int
    onnx_paths: dict[str, str]  # load_device -> model path

    @property
    def nbytes(self) -> int:
        return self.count * 4


@dataclass(frozen=True)
class MlpModel:
    """``Y = (...((X @ W0 + b0) @ W1 + b1)...)`` with every W and b external."""

    onnx_path: str
    width: int
    layers: int
    weight_bytes: int


def _random_block(float_values: bool) -> bytes:
    """A block of random bytes; ``float_values`` makes them finite, small float32 numbers (no NaN, no denormal)."""
    if not float_values:
        return os.urandom(_BLOCK_BYTES)
    rng = np.random.default_rng(0)
    return (rng.standard_normal(_BLOCK_BYTES // 4, dtype=np.float32) * np.float32(0.02)).tobytes()


def _write_repeated(path: str, size: int, block: bytes, phase: int = 0) -> None:
    """Fill ``path`` with ``size`` bytes of ``block`` repeated, starting ``phase`` bytes into the block."""
    doubled = memoryview(block + block)  # any window of len(block) starting in the first copy
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        start = phase % len(block)
        while written < size:
            piece = doubled[start : start + min(len(block), size - written)]
            while piece:
                moved = os.write(fd, piece)
                piece = piece[moved:]
                written += moved
    finally:
        os.close(fd)


def _external_tensor(name: str, dims: list[int], location: str, offset: int, length: int) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key = key
        entry.value = value
    return tensor


def _save_proto(model: onnx.ModelProto, path: str) -> None:
    with open(path, "wb") as out:
        out.write(model.SerializeToString())


def _identity_model(initializers: list[TensorProto]) -> onnx.ModelProto:
    """A valid model carrying ``initializers``; the graph itself (Y = Identity(X)) does not read them."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "bench",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
        initializer=initializers,
    )
    return helper.make_model(graph, ir_version=_IR_VERSION, opset_imports=[helper.make_opsetid("", _OPSET)])


def make_align_model(folder: str | os.PathLike[str], shape: str, total: int) -> AlignModel:
    """Write ``model.onnx`` and its data files into ``folder`` (created); ``shape`` is ``large`` or ``small``."""
    if shape == "large":
        count, files = 64, 1
        tensor_bytes = max(4 * KIB, total // count // (4 * KIB) * (4 * KIB))
    elif shape == "small":
        # The tensor size is what makes per-tensor overhead visible, so it stays 64 KiB and the count scales.
        count, files, tensor_bytes = max(16, total // (128 * KIB)), 4, 64 * KIB
    else:
        raise ValueError(f"shape must be 'large' or 'small', got {shape!r}.")
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    block = _random_block(float_values=False)

    initializers: list[TensorProto] = []
    data_paths: list[str] = []
    per_file = math.ceil(count / files)
    for file_index in range(files):
        location = f"weights-{file_index}.data"
        indices = range(file_index * per_file, min(count, (file_index + 1) * per_file))
        offset = 0
        for index in indices:
            offset += _SOURCE_GAP
            dims = [tensor_bytes // 4]
            initializers.append(_external_tensor(f"w{index:05d}", dims, location, offset, tensor_bytes))
            offset += tensor_bytes
        path = os.path.join(folder, location)
        _write_repeated(path, offset, block, phase=file_index * 4099)
        data_paths.append(path)
    onnx_path = os.path.join(folder, "model.onnx")
    _save_proto(_identity_model(initializers), onnx_path)
    return AlignModel(shape, onnx_path, data_paths, count, tensor_bytes)


def make_delayed_model(folder: str | os.PathLike[str], nbytes: int) -> DelayedModel:
    """A float32 tensor of ``nbytes`` at offset 4096 of ``delayed.data``; one model per ``load_device``."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    offset, count = 4096, nbytes // 4
    data_path = os.path.join(folder, "delayed.data")
    _write_repeated(data_path, offset + count * 4, _random_block(float_values=True))
    onnx_paths: dict[str, str] = {}
    for load_device in ("file", "cpu"):
        node = helper.make_node(
            "DelayedInitializer",
            [],
            ["Y"],
            domain="ai.rt",
            shape=[count],
            dtype=TensorProto.FLOAT,
            load_device=load_device,
            runtime_device="cpu",
            filename="delayed.data",  # relative: the benchmark binds the op to this folder
            offset=offset,
        )
        graph = helper.make_graph(
            [node], "delayed", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [count])]
        )
        model = helper.make_model(
            graph,
            ir_version=_IR_VERSION,
            opset_imports=[helper.make_opsetid("", _OPSET), helper.make_opsetid("ai.rt", 1)],
        )
        onnx_paths[load_device] = os.path.join(folder, f"delayed-{load_device}.onnx")
        _save_proto(model, onnx_paths[load_device])
    return DelayedModel(data_path, offset, count, onnx_paths)


def make_mlp_model(folder: str | os.PathLike[str], weight_bytes: int, layers: int = 32) -> MlpModel:
    """An MLP chain of ``layers`` MatMul + Add with about ``weight_bytes`` of external float32 weights."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    width = max(16, math.isqrt(weight_bytes // layers // 4) // 16 * 16)
    matrix, bias = width * width * 4, width * 4
    location = "mlp.data"
    initializers: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    offset, previous = 0, "X"
    for layer in range(layers):
        for name, dims, length in ((f"W{layer}", [width, width], matrix), (f"b{layer}", [width], bias)):
            initializers.append(_external_tensor(name, dims, location, offset, length))
            offset = (offset + length + 4095) // 4096 * 4096
        out = "Y" if layer == layers - 1 else f"h{layer}"
        nodes.append(helper.make_node("MatMul", [previous, f"W{layer}"], [f"m{layer}"]))
        nodes.append(helper.make_node("Add", [f"m{layer}", f"b{layer}"], [out]))
        previous = out
    _write_repeated(os.path.join(folder, location), offset, _random_block(float_values=True))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, width])],
        initializer=initializers,
    )
    model = helper.make_model(graph, ir_version=_IR_VERSION, opset_imports=[helper.make_opsetid("", _OPSET)])
    onnx_path = os.path.join(folder, "mlp.onnx")
    _save_proto(model, onnx_path)
    return MlpModel(onnx_path, width, layers, layers * (matrix + bias))


def _main() -> None:  # pragma: no cover - manual check: python -m benchmarks.models DIR SIZE
    import sys
    import time

    folder, total = Path(sys.argv[1]), parse_size(sys.argv[2] if len(sys.argv) > 2 else "tiny")
    for shape in ("large", "small"):
        start = time.perf_counter()
        model = make_align_model(folder / shape, shape, total)
        elapsed = time.perf_counter() - start
        print(
            f"{shape}: {model.tensor_count} x {model.tensor_bytes} B in {len(model.data_paths)} files, {elapsed:.2f} s"
        )


if __name__ == "__main__":  # pragma: no cover
    _main()
