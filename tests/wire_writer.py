"""A hand-made protobuf wire-format writer for ``.onnx`` files: tests and benchmarks build files protobuf cannot.

protobuf refuses to serialize a message over 2 GiB, yet protobuf-free writers (onnx-light) produce such ``.onnx``
files with the weights inline. This module writes them without holding the payloads: a model is a list of
*segments*, each either ``bytes`` (metadata, serialized by protobuf itself) or a :class:`Hole` (``length`` zero
bytes left as a hole in a sparse file, so a 3 GiB payload costs no disk blocks and no memory). Protobuf messages are
concatenations of fields, and a repeated or embedded field may be split anywhere: the writer serializes each message
without its large tensors, then appends those tensors' fields by hand with their real length prefixes.

It also exposes the wire primitives (:func:`encode_varint` with non-minimal encodings, :func:`field_key` with any
wire type) so that tests can craft malformed files byte by byte.

Import it as ``tests.wire_writer`` (tests and benchmarks alike, from the repository root). It never writes outside
the path it is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx

__all__ = [
    "LEN",
    "VARINT",
    "Hole",
    "Segment",
    "encode_varint",
    "field_key",
    "len_field",
    "model_segments",
    "segments_length",
    "tensor_segments",
    "write_model",
    "write_segments",
]

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5

# Field numbers from onnx.proto used to splice large initializers into a serialized model.
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9


@dataclass(frozen=True)
class Hole:
    """``length`` zero bytes, written as a hole (a seek) rather than as data."""

    length: int


Segment = bytes | Hole


def encode_varint(value: int, *, min_bytes: int = 1) -> bytes:
    """The protobuf varint of ``value`` (>= 0), padded with continuation bytes to at least ``min_bytes`` bytes.

    Padding gives the non-minimal encodings protobuf accepts (up to 10 bytes) and the over-long ones it refuses.
    """
    if value < 0:
        raise ValueError(f"varints encode non-negative ints here, got {value}.")
    out = bytearray()
    while value > 0x7F or len(out) + 1 < min_bytes:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_key(number: int, wire_type: int) -> bytes:
    """The tag of field ``number`` with ``wire_type`` (any value 0-7, valid or not)."""
    return encode_varint((number << 3) | wire_type)


def segments_length(segments: Iterable[Segment]) -> int:
    """Total bytes the segments occupy in the file."""
    return sum(s.length if isinstance(s, Hole) else len(s) for s in segments)


def len_field(number: int, content: Sequence[Segment]) -> list[Segment]:
    """A length-delimited field (embedded message, bytes) whose content is ``content``."""
    return [field_key(number, LEN) + encode_varint(segments_length(content)), *content]


def tensor_segments(tensor: onnx.TensorProto, payload: bytes | Hole) -> list[Segment]:
    """``tensor``'s encoding with ``payload`` as its ``raw_data`` (the tensor's own ``raw_data`` must be empty)."""
    if tensor.raw_data:
        raise ValueError(f"tensor {tensor.name!r} already has raw_data; give its payload separately.")
    head = tensor.SerializeToString() + field_key(_TENSOR_RAW_DATA, LEN) + encode_varint(segments_length([payload]))
    return [head, payload]


def model_segments(
    model: onnx.ModelProto, payloads: Mapping[str, bytes | Hole]
) -> tuple[list[Segment], dict[str, int]]:
    """Encode ``model`` with each main-graph initializer named in ``payloads`` holding that payload as raw_data.

    The initializers named in ``payloads`` must have no raw_data of their own; the others are serialized by protobuf
    as they are. Returns the segments and, for each name, the index of its payload segment (see
    :func:`write_segments`).
    """
    missing = set(payloads) - {t.name for t in model.graph.initializer}
    if missing:
        raise ValueError(f"no main-graph initializer named {sorted(missing)}.")
    rest = onnx.ModelProto()
    rest.CopyFrom(model)
    rest.ClearField("graph")
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    del graph.initializer[:]
    graph_content: list[Segment] = [graph.SerializeToString()]
    payload_positions: dict[str, int] = {}
    for tensor in model.graph.initializer:
        if tensor.name not in payloads:
            graph_content.extend(len_field(_GRAPH_INITIALIZER, [tensor.SerializeToString()]))
            continue
        field = len_field(_GRAPH_INITIALIZER, tensor_segments(tensor, payloads[tensor.name]))
        payload_positions[tensor.name] = len(graph_content) + len(field) - 1
        graph_content.extend(field)
    segments: list[Segment] = [rest.SerializeToString()]
    graph_field = len_field(_MODEL_GRAPH, graph_content)
    offset = len(segments) + 1  # the graph's key and length come first
    segments.extend(graph_field)
    return segments, {name: offset + index for name, index in payload_positions.items()}


def write_segments(path: str | os.PathLike[str], segments: Sequence[Segment]) -> list[int]:
    """Write ``segments`` to a new file at ``path`` (holes seeked over); return each segment's byte offset."""
    offsets = []
    position = 0
    with open(path, "wb") as f:
        for segment in segments:
            offsets.append(position)
            if isinstance(segment, Hole):
                f.seek(segment.length, os.SEEK_CUR)
                position += segment.length
            else:
                f.write(segment)
                position += len(segment)
        f.truncate(position)  # a trailing hole is only a seek: give the file its full size
    return offsets


def write_model(
    path: str | os.PathLike[str], model: onnx.ModelProto, payloads: Mapping[str, bytes | Hole]
) -> dict[str, tuple[int, int]]:
    """Write ``model`` with the given initializer payloads (see :func:`model_segments`) to ``path``.

    Returns, for each name in ``payloads``, the ``(offset, length)`` of its raw_data bytes in the file: benchmarks
    fill holes with real data there, tests compare them with what the reader found.
    """
    segments, positions = model_segments(model, payloads)
    offsets = write_segments(path, segments)
    return {name: (offsets[i], segments_length([segments[i]])) for name, i in positions.items()}
