"""Generate the benchmark models: real ``.onnx`` files whose weights live in external data files.

Every model is sized from one total (``ONNX_LIGHT_REF_BENCH_SIZE``: ``tiny`` for the test run, ``1G`` / ``4G`` for
real runs) and written without ever building a weight-sized array: data files are a random block written again and
again, and the ``external_data`` entries (location, offset, length) are set by hand. This module must never hold
more than one block of weight bytes in memory, so that generating 4 GiB costs seconds and no RAM.

Shapes (at ``1G``; every count and size scales with the total):

* ``large``: 64 tensors of 16 MiB in one data file;
* ``small``: 8192 tensors of 64 KiB (512 MiB, as the issue states it) spread over 4 data files.

Source tensors sit at *unaligned* offsets (a 64-byte gap before each one, like a small header), so re-aligning at
4096 really moves every tensor and no two tensors can be merged into one copy (``gap=0`` gives an already aligned
model instead, for the reflink benchmark).

Models of the layout and inline benchmarks (issues 11 and 12):

* :func:`make_dedup_model`: the ``large`` shape where a fraction of the tensors repeat earlier ones byte for byte,
  each copy stored again in the data file (as exporters store tied weights);
* :func:`make_aligned_copy`: the same tensors as a generated model, rewritten at 4096-aligned offsets by
  ``copy_file_range`` (a second, distinct model with equal tensors, for ``verify``);
* :func:`make_inline_model`: one ``.onnx`` with every weight inline as ``raw_data``, written by the hand-made
  wire-format writer of ``tests/wire_writer.py`` (payloads filled with data, or left as holes of a sparse file so a
  model over protobuf's 2 GiB limit costs no disk and no memory to generate).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = [
    "ANCESTOR_KINDS",
    "ENV_SIZE",
    "GIB",
    "KIB",
    "MIB",
    "AlignModel",
    "DedupModel",
    "DelayedModel",
    "InlineModel",
    "MlpModel",
    "TypedModel",
    "make_align_model",
    "make_aligned_copy",
    "make_ancestor_model",
    "make_dedup_model",
    "make_delayed_model",
    "make_inline_model",
    "make_metadata_model",
    "make_mlp_model",
    "make_packed_model",
    "make_typed_model",
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
class DedupModel(AlignModel):
    """An :class:`AlignModel` where some tensors repeat earlier ones; ``unique_count`` distinct contents."""

    unique_count: int

    @property
    def unique_bytes(self) -> int:
        return self.unique_count * self.tensor_bytes


@dataclass(frozen=True)
class InlineModel:
    """A single-file model: ``tensor_count`` weights of ``tensor_bytes`` inline, plus one 16-byte inline shape."""

    onnx_path: str
    tensor_count: int
    tensor_bytes: int
    ranges: list[tuple[int, int]]  # (offset, length) of each weight's raw_data bytes inside the .onnx
    holes: bool  # payloads left as holes (zeros, no disk blocks) rather than filled with data

    @property
    def payload_bytes(self) -> int:
        return self.tensor_count * self.tensor_bytes

    @property
    def file_bytes(self) -> int:
        return os.path.getsize(self.onnx_path)


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


def _fill_range(fd: int, offset: int, length: int, block: bytes, phase: int) -> None:
    """Write ``length`` bytes of ``block`` repeated, starting ``phase`` bytes into it, at ``offset`` of ``fd``."""
    doubled = memoryview(block + block)
    start = phase % len(block)
    done = 0
    while done < length:
        piece = doubled[start : start + min(len(block), length - done)]
        while piece:
            moved = os.pwrite(fd, piece, offset + done)
            piece = piece[moved:]
            done += moved


def _external_tensor(
    name: str, dims: list[int], location: str, offset: int, length: int, data_type: int = TensorProto.FLOAT
) -> TensorProto:
    tensor = TensorProto(name=name, data_type=data_type, dims=dims, data_location=TensorProto.EXTERNAL)
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


def make_align_model(folder: str | os.PathLike[str], shape: str, total: int, *, gap: int = _SOURCE_GAP) -> AlignModel:
    """Write ``model.onnx`` and its data files into ``folder`` (created); ``shape`` is ``large`` or ``small``.

    ``gap`` bytes precede every tensor in its data file: 64 (default) leaves every tensor unaligned; 0 with the
    ``large`` shape gives tensors already at 4096-aligned offsets (the layout the aligner would write).
    """
    if shape == "large":
        files = 1
        count, tensor_bytes = _large_layout(total)
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
            offset += gap
            dims = [tensor_bytes // 4]
            initializers.append(_external_tensor(f"w{index:05d}", dims, location, offset, tensor_bytes))
            offset += tensor_bytes
        path = os.path.join(folder, location)
        _write_repeated(path, offset, block, phase=file_index * 4099)
        data_paths.append(path)
    onnx_path = os.path.join(folder, "model.onnx")
    _save_proto(_identity_model(initializers), onnx_path)
    return AlignModel(shape, onnx_path, data_paths, count, tensor_bytes)


def _large_layout(total: int) -> tuple[int, int]:
    count = 64
    return count, max(4 * KIB, total // count // (4 * KIB) * (4 * KIB))


def make_dedup_model(folder: str | os.PathLike[str], total: int, duplicate_fraction: float) -> DedupModel:
    """The ``large`` shape (64 tensors, one data file, 64-byte gaps) where ``duplicate_fraction`` of the tensors
    (spread evenly) repeat an earlier distinct tensor byte for byte, stored again in the data file."""
    count, tensor_bytes = _large_layout(total)
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    block = _random_block(float_values=False)
    location = "weights-0.data"
    path = os.path.join(folder, location)
    initializers: list[TensorProto] = []
    phases: list[int] = []  # the content of each distinct tensor: a window of the block at this phase
    offset = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for index in range(count):
            offset += _SOURCE_GAP
            is_duplicate = bool(phases) and int((index + 1) * duplicate_fraction) > int(index * duplicate_fraction)
            if is_duplicate:
                phase = phases[(index * 7) % len(phases)]  # some earlier distinct tensor
            else:
                phase = len(phases) * 65_537  # distinct windows of a random block: distinct contents
                phases.append(phase)
            _fill_range(fd, offset, tensor_bytes, block, phase)
            initializers.append(_external_tensor(f"w{index:05d}", [tensor_bytes // 4], location, offset, tensor_bytes))
            offset += tensor_bytes
    finally:
        os.close(fd)
    onnx_path = os.path.join(folder, "model.onnx")
    _save_proto(_identity_model(initializers), onnx_path)
    return DedupModel("dedup", onnx_path, [path], count, tensor_bytes, unique_count=len(phases))


def make_aligned_copy(model: AlignModel, folder: str | os.PathLike[str], alignment: int = 4096) -> AlignModel:
    """A second model with ``model``'s tensors (same names, dims, bytes) at ``alignment``-multiple offsets of one
    data file, copied file to file with ``copy_file_range`` (no weight bytes in memory)."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    source = onnx.load(model.onnx_path, load_external_data=False)
    source_folder = os.path.dirname(model.onnx_path)
    location = "aligned.data"
    path = os.path.join(folder, location)
    initializers: list[TensorProto] = []
    fds: dict[str, int] = {}
    dst = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    cursor = 0
    try:
        for tensor in source.graph.initializer:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            src_path = os.path.join(source_folder, entries["location"])
            if src_path not in fds:
                fds[src_path] = os.open(src_path, os.O_RDONLY)
            offset, length = int(entries["offset"]), int(entries["length"])
            cursor = -(-cursor // alignment) * alignment
            done = 0
            while done < length:
                moved = os.copy_file_range(fds[src_path], dst, length - done, offset + done, cursor + done)
                if moved == 0:
                    raise OSError(f"{src_path} ended early")
                done += moved
            initializers.append(_external_tensor(tensor.name, list(tensor.dims), location, cursor, length))
            cursor += length
    finally:
        os.close(dst)
        for fd in fds.values():
            os.close(fd)
    onnx_path = os.path.join(folder, "aligned.onnx")
    _save_proto(_identity_model(initializers), onnx_path)
    return AlignModel(f"{model.shape}-aligned", onnx_path, [path], model.tensor_count, model.tensor_bytes)


def _wire_writer() -> ModuleType:
    """``tests/wire_writer.py``, the hand-made protobuf writer shared with the tests (``tests`` is a package beside
    ``benchmarks``: the repository root that makes ``benchmarks`` importable makes it importable too)."""
    from tests import wire_writer

    return wire_writer


def make_inline_model(
    folder: str | os.PathLike[str], count: int, tensor_bytes: int, *, holes: bool = False
) -> InlineModel:
    """One ``model.onnx`` holding ``count`` float32 weights of ``tensor_bytes`` inline (``raw_data``), plus a
    16-byte int64 shape tensor (stays inline under any sensible ``size_threshold``).

    Written field by field by the wire-format writer, so the file may exceed protobuf's 2 GiB limit. With
    ``holes`` the payloads stay holes of a sparse file (zeros: no disk, no time); otherwise each is filled with a
    distinct window of a random block (no two tensors equal), one block in memory at a time.
    """
    wire = _wire_writer()
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    weights = [
        TensorProto(name=f"w{index:05d}", data_type=TensorProto.FLOAT, dims=[tensor_bytes // 4])
        for index in range(count)
    ]
    shape = TensorProto(
        name="shape", data_type=TensorProto.INT64, dims=[2], raw_data=np.array([1, -1], "<i8").tobytes()
    )
    model = _identity_model([shape, *weights])
    onnx_path = os.path.join(folder, "model.onnx")
    located = wire.write_model(onnx_path, model, {t.name: wire.Hole(tensor_bytes) for t in weights})
    ranges = [located[t.name] for t in weights]
    if not holes:
        block = _random_block(float_values=True)
        fd = os.open(onnx_path, os.O_WRONLY)
        try:
            for index, (offset, length) in enumerate(ranges):
                _fill_range(fd, offset, length, block, index * 65_540)  # float-aligned windows
        finally:
            os.close(fd)
    return InlineModel(onnx_path, count, tensor_bytes, ranges, holes)


ANCESTOR_KINDS = ("raw_data", "doc_string", "float_data", "string_data")
"""What holds the bulk of :func:`make_ancestor_model`'s file: one payload, the model's doc string, packed floats, or
strings of 64 KiB each."""


def make_ancestor_model(path: str | os.PathLike[str], kind: str, size: int) -> str:
    """A valid ``.onnx`` of about ``size`` bytes whose bulk one kind of field holds (:data:`ANCESTOR_KINDS`), for the
    guard's benchmark: the model a writer finds in a folder above its destination (issue 38). Its one external
    tensor reads ``elsewhere.bin``, a file no benchmark writes. The bulk is holes of a sparse file: generated in
    milliseconds, no disk used (``string_data``: one 5-byte header every 64 KiB)."""
    wire = _wire_writer()
    path = os.fspath(path)
    bulk = size - 4096
    tensor = _external_tensor("used", [4], "elsewhere.bin", 0, 16)
    model = _identity_model([tensor])
    segments: list[Any] = [model.SerializeToString()]
    if kind == "doc_string":
        segments += wire.len_field(6, [wire.Hole(bulk)])  # ModelProto.doc_string
    else:
        head = TensorProto(name="bulk", dims=[1]).SerializeToString()
        if kind == "raw_data":
            body = wire.len_field(9, [wire.Hole(bulk)])
        elif kind == "float_data":
            body = wire.len_field(4, [wire.Hole(bulk - bulk % 4)])  # packed floats, one field
        elif kind == "string_data":
            piece = 64 * KIB
            body = [segment for _ in range(bulk // (piece + 4)) for segment in wire.len_field(6, [wire.Hole(piece)])]
        else:
            raise ValueError(f"unknown kind {kind!r}; expected one of {ANCESTOR_KINDS}")
        segments += wire.len_field(7, wire.len_field(5, [head, *body]))  # a second graph: protobuf merges them
    wire.write_segments(path, segments)
    return path


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


@dataclass(frozen=True)
class ManyNodesModel:
    """``nodes`` small external tensors in one file: as initializers, and as the same DelayedInitializer nodes."""

    external_path: str  # initializers with external data (what delay_initializers reads)
    delayed_path: str  # one DelayedInitializer node per tensor (what undelay_initializers reads)
    nodes: int
    tensor_bytes: int


def make_many_nodes_model(folder: str | os.PathLike[str], nodes: int, tensor_bytes: int = 16) -> ManyNodesModel:
    """A graph whose one Concat uses ``nodes`` float32 tensors of ``tensor_bytes`` each, stored back to back.

    Issue 19: undelay was quadratic in the node count (16k nodes: 33.8 s, ``delay_initializers`` 0.8 s); the
    per-node work of both directions is what this model measures, the bytes are negligible.
    """
    from onnx_light_ref.ops._schema import make_delayed_initializer_node

    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    location = "nodes.data"
    count = tensor_bytes // 4
    _write_repeated(os.path.join(folder, location), nodes * tensor_bytes, _random_block(float_values=True))
    names = [f"w{i}" for i in range(nodes)]
    concat = helper.make_node("Concat", names, ["Y"], axis=0)
    output = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [nodes * count])
    initializers = [
        _external_tensor(name, [count], location, i * tensor_bytes, tensor_bytes) for i, name in enumerate(names)
    ]
    external = helper.make_model(
        helper.make_graph([concat], "many", [], [output], initializer=initializers),
        ir_version=_IR_VERSION,
        opset_imports=[helper.make_opsetid("", _OPSET)],
    )
    delayed_nodes = [
        make_delayed_initializer_node(
            name, shape=[count], dtype=TensorProto.FLOAT, load_device="file", filename=location, offset=i * tensor_bytes
        )
        for i, name in enumerate(names)
    ]
    delayed = helper.make_model(
        helper.make_graph([*delayed_nodes, concat], "many", [], [output]),
        ir_version=_IR_VERSION,
        opset_imports=[helper.make_opsetid("", _OPSET), helper.make_opsetid("ai.rt", 1)],
    )
    external_path, delayed_path = os.path.join(folder, "external.onnx"), os.path.join(folder, "delayed.onnx")
    _save_proto(external, external_path)
    _save_proto(delayed, delayed_path)
    return ManyNodesModel(external_path, delayed_path, nodes, tensor_bytes)


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


@dataclass(frozen=True)
class TypedModel:
    """``tensors`` external weights of one element type (bfloat16: an LLM checkpoint), each reduced by ReduceMax."""

    onnx_path: str
    data_type: int
    tensors: int
    weight_bytes: int


def _bfloat16_block() -> bytes:
    """Small finite bfloat16 values: the high halves of the float32 block (bfloat16 is float32's upper 16 bits)."""
    floats = np.frombuffer(_random_block(float_values=True), dtype="<u2")
    return floats[1::2].tobytes()


def make_typed_model(folder: str | os.PathLike[str], weight_bytes: int, tensors: int = 8) -> TypedModel:
    """``tensors`` bfloat16 matrices of about ``weight_bytes`` in total in ``typed.data``; ``M<i> = ReduceMax(W<i>)``.

    The graph reads every weight once and keeps only scalars, so a lazy run needs the weights and nothing more
    (onnx's evaluator keeps every intermediate until the run returns).
    """
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    width = max(16, math.isqrt(weight_bytes // tensors // 2) // 16 * 16)
    length, location = width * width * 2, "typed.data"
    initializers = [
        _external_tensor(f"W{i}", [width, width], location, i * length, length, TensorProto.BFLOAT16)
        for i in range(tensors)
    ]
    nodes = [helper.make_node("ReduceMax", [f"W{i}"], [f"M{i}"], keepdims=0) for i in range(tensors)]
    _write_repeated(os.path.join(folder, location), tensors * length, _bfloat16_block())
    graph = helper.make_graph(
        nodes,
        "typed",
        [],
        [helper.make_tensor_value_info(f"M{i}", TensorProto.BFLOAT16, []) for i in range(tensors)],
        initializer=initializers,
    )
    model = helper.make_model(graph, ir_version=_IR_VERSION, opset_imports=[helper.make_opsetid("", _OPSET)])
    onnx_path = os.path.join(folder, "typed.onnx")
    _save_proto(model, onnx_path)
    return TypedModel(onnx_path, TensorProto.BFLOAT16, tensors, tensors * length)


def make_packed_model(
    folder: str | os.PathLike[str], weight_bytes: int, data_type: int = TensorProto.INT4
) -> TypedModel:
    """One external weight ``W`` of a 4-bit type, ``weight_bytes`` packed bytes in ``packed.data`` (two elements per
    byte): the graph's output is ``W`` itself, so a run holds the unpacked weight (one byte per element) and nothing
    else. The issue-40 case: onnx 1.17 unpacked 4-bit types in Python, ~850 MiB per chunk."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    location = "packed.data"
    dims = [weight_bytes * 2]
    weights = _external_tensor("W", dims, location, 0, weight_bytes, data_type)
    _write_repeated(os.path.join(folder, location), weight_bytes, _random_block(float_values=False))
    graph = helper.make_graph(
        [], "packed", [], [helper.make_tensor_value_info("W", data_type, dims)], initializer=[weights]
    )
    model = helper.make_model(graph, ir_version=_IR_VERSION, opset_imports=[helper.make_opsetid("", 21)])
    onnx_path = os.path.join(folder, "packed.onnx")
    _save_proto(model, onnx_path)
    return TypedModel(onnx_path, data_type, 1, weight_bytes)


def make_metadata_model(folder: str | os.PathLike[str], count: int, tensor_bytes: int = 256) -> AlignModel:
    """``count`` external tensors of ``tensor_bytes`` each, back to back in one data file (as onnx's
    ``save_model(save_as_external_data=True)`` writes them): a model whose cost is its metadata (issue 43: a
    mixture-of-experts export carries ~90,000 tensors; 25.6 MB of bytes for 100,000 tensors of 256 bytes)."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    location = "weights-0.data"
    initializers = [
        _external_tensor(f"w{index:06d}", [tensor_bytes // 4], location, index * tensor_bytes, tensor_bytes)
        for index in range(count)
    ]
    path = os.path.join(folder, location)
    _write_repeated(path, count * tensor_bytes, _random_block(float_values=False))
    onnx_path = os.path.join(folder, "model.onnx")
    _save_proto(_identity_model(initializers), onnx_path)
    return AlignModel("metadata", onnx_path, [path], count, tensor_bytes)


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
