"""Plan a re-alignment: which tensors move, where each distinct payload lands, and what each output file holds.

:func:`plan_alignment` is shared by the streaming and the in-memory aligner (:mod:`onnx_light_ref.io.align`), so their
outputs are byte-identical by construction. It validates every argument, parses the source ``.onnx`` (without its
large inline payloads when the streaming aligner externalizes inline tensors), walks every tensor in
:func:`~onnx_light_ref.io.walker.iter_tensors` order, validates every external reference, picks the inline tensors
to externalize (``size_threshold``), merges identical payloads (identical source ranges always; identical bytes with
``dedup``), places them with :class:`~onnx_light_ref.io.placement.ShardedLayout` (``alignment``,
``align_threshold``, ``max_shard_size``) and checks that no output is a source.

The only bytes this module reads are those :func:`~onnx_light_ref.io.dedup.find_duplicates` compares (two chunk
buffers) and typed-field tensors converted to raw bytes (small; see ``docs/align.md``). It never writes a file and
never modifies a source.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import onnx
from onnx import numpy_helper

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io.alignment import validate_alignment
from onnx_light_ref.io.arguments import PathLike, check_bool, check_int, check_optional_int
from onnx_light_ref.io.copy_engine import CopyRange, open_source
from onnx_light_ref.io.dedup import BlobSource, find_duplicates
from onnx_light_ref.io.destinations import check_outputs, weights_location
from onnx_light_ref.io.entries import is_external
from onnx_light_ref.io.locations import (
    ExternalRef,
    FileIdentity,
    LocationResolver,
    check_not_hard_linked,
    expected_nbytes,
    file_identity,
    parse_external_data,
)
from onnx_light_ref.io.model_file import load_model_metadata
from onnx_light_ref.io.placement import ShardedLayout, shard_path
from onnx_light_ref.io.walker import iter_tensors
from onnx_light_ref.io.wire import StrippedModel, load_model_stripped

__all__ = ["AlignPlan", "Move", "Shard", "check_layout_options", "plan_alignment"]

logger = logging.getLogger(__name__)

Mode = Literal["streaming", "in_memory"]

# Typed fields a TensorProto may carry its values in; cleared when the tensor moves out.
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
_NEVER_EXTERNAL = (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING)

_DEDUP_CHUNK = 1024 * 1024  # find_duplicates' two buffers when the caller gives no chunk size


@dataclass(frozen=True, slots=True)
class Move:
    """One tensor of the output model that points at external data: where, and what it was."""

    tensor: onnx.TensorProto  # the live proto in the plan's model
    shard: int
    offset: int
    length: int
    checksum: str | None  # kept from the source entry (external tensors only)
    was_inline: bool  # True when the tensor is externalized by this run


@dataclass
class Shard:
    """One destination weights file: its path, the location stored in the model, its size and its content."""

    path: str
    location: str
    size: int = 0
    ranges: list[CopyRange] = field(default_factory=list)  # file-to-file copies (offsets in this file)
    writes: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, bytes) written from memory

    @property
    def payload_bytes(self) -> int:
        return sum(r.length for r in self.ranges) + sum(len(data) for _, data in self.writes)


@dataclass
class AlignPlan:
    """Everything decided before the first byte is written."""

    model: onnx.ModelProto
    stripped: StrippedModel | None  # the stripped parse (streaming with size_threshold), to find placeholders
    dst_onnx_path: str
    shards: list[Shard]
    moves: list[Move]
    deduplicated_tensors: int = 0  # tensors sharing bytes stored for an earlier tensor
    deduplicated_bytes: int = 0  # bytes those tensors would have taken

    @property
    def total_size(self) -> int:
        """Bytes of every weights file together, padding included."""
        return sum(shard.size for shard in self.shards)

    @property
    def payload_bytes(self) -> int:
        """Distinct tensor bytes written (``total_size - payload_bytes`` is padding)."""
        return sum(shard.payload_bytes for shard in self.shards)

    @property
    def weights_paths(self) -> list[str]:
        return [shard.path for shard in self.shards]

    @property
    def externalized_tensors(self) -> int:
        return sum(1 for move in self.moves if move.was_inline)


def check_layout_options(
    align_threshold: object, max_shard_size: object, dedup: object, size_threshold: object, durable: object
) -> tuple[int, int | None, bool, int | None]:
    """Validate the keyword options shared by both aligners; return them typed.

    Raises:
        ValueError: a negative or zero value where it is not allowed (``ArgumentTypeError``, also a ``TypeError``,
            for a wrong type).
    """
    threshold = check_int("align_threshold", align_threshold)
    shard_cap = check_optional_int("max_shard_size", max_shard_size, minimum=1)
    check_bool("dedup", dedup)
    inline_threshold = check_optional_int("size_threshold", size_threshold)
    check_bool("durable", durable)
    return threshold, shard_cap, bool(dedup), inline_threshold


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A payload some tensor points at: a range of a file, or bytes in memory."""

    length: int
    path: str = ""
    offset: int = 0
    identity: FileIdentity | None = None
    data: bytes | None = None
    key: tuple[int, int, int] | None = None  # (file index, offset, length): equal keys are the same bytes
    label: str = ""


def plan_alignment(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    *,
    align_threshold: int = 0,
    max_shard_size: int | None = None,
    dedup: bool = False,
    size_threshold: int | None = None,
    mode: Mode = "streaming",
    chunk_size: int = _DEDUP_CHUNK,
) -> AlignPlan:
    """Validate arguments, parse the source metadata, check every reference and lay out every output file.

    Args:
        src_onnx_path, dst_onnx_path, dst_weights_path, alignment, align_threshold, max_shard_size, dedup,
            size_threshold: as documented on :func:`~onnx_light_ref.io.align.align_external_data_streaming`.
        mode: ``"streaming"`` parses the ``.onnx`` without inline payloads of ``size_threshold`` bytes or more (they
            are copied out of the file); ``"in_memory"`` parses it whole (they are written from memory). The plan
            places the same bytes at the same offsets either way.
        chunk_size: size of each of the two buffers used to compare candidate duplicates.

    Returns:
        The :class:`AlignPlan`; nothing was written.

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError`` for a wrong type).
        InvalidModelError: ``src_onnx_path`` is not an ONNX model.
        ExternalDataError: a malformed or out-of-bounds reference, an inline tensor whose data does not match its
            dims and data type; ``UnsafeLocationError`` for an unsafe location or hard-linked source,
            ``DestinationConflictError`` for an output that is a source or another output.
        FileNotFoundError: the source model or a referenced file does not exist.
    """
    step = validate_alignment(alignment)
    threshold, shard_cap, dedup, inline_threshold = check_layout_options(
        align_threshold, max_shard_size, dedup, size_threshold, True
    )
    check_int("chunk_size", chunk_size, minimum=1)
    src_onnx = os.path.abspath(os.fspath(src_onnx_path))
    dst_onnx = os.path.abspath(os.fspath(dst_onnx_path))
    dst_weights = os.path.abspath(os.fspath(dst_weights_path) if dst_weights_path is not None else dst_onnx + ".data")
    _weights_location(dst_onnx, dst_weights)  # refuse a bad destination before reading anything

    model, stripped, onnx_identity = _load(src_onnx, inline_threshold, mode)
    resolver = LocationResolver(os.path.dirname(src_onnx))
    files: dict[FileIdentity, int] = {}  # one index per source file, for range keys
    refs: dict[FileIdentity, ExternalRef] = {}  # the first reference to each data file, for the hard-link check
    candidates: list[_Candidate] = []
    pending: list[tuple[onnx.TensorProto, int, str | None, bool]] = []  # tensor, candidate, checksum, was_inline
    for site in iter_tensors(model):
        tensor = site.tensor
        if is_external(tensor):
            # Each reference is checked and reduced to a candidate right away, never kept (docs/align.md).
            ref = parse_external_data(tensor, resolver, label=site.label)
            refs.setdefault(ref.identity, ref)
            index = files.setdefault(ref.identity, len(files))
            candidates.append(
                _Candidate(ref.length, ref.path, ref.offset, ref.identity, None, (index, ref.offset, ref.length))
            )
            pending.append((tensor, len(candidates) - 1, ref.checksum, False))
            continue
        if inline_threshold is None:
            continue
        candidate = _inline_candidate(
            site.tensor, site.label, inline_threshold, stripped, src_onnx, onnx_identity, files
        )
        if candidate is not None:
            candidates.append(candidate)
            pending.append((tensor, len(candidates) - 1, None, True))

    sources = {identity: ref.path for identity, ref in refs.items()}
    src_identity = onnx_identity or file_identity(src_onnx)
    if src_identity is not None and src_identity != file_identity(dst_onnx):
        # The source .onnx may be the destination .onnx (replaced atomically once its payloads were copied), but
        # no weights file may overwrite it.
        sources[src_identity] = src_onnx
    # The base weights path first (the layout is not known yet), so that "destination is a source" is reported
    # before any hard-link refusal of the same file and before any byte is read for dedup.
    check_outputs(dst_onnx, [dst_weights], sources)
    for ref in refs.values():
        check_not_hard_linked(ref)

    first = _representatives(candidates, dedup, chunk_size)
    layout = ShardedLayout(step, threshold, shard_cap)
    placed: dict[int, tuple[int, int]] = {}  # representative candidate -> (shard, offset)
    shards: list[Shard] = []
    for index, candidate in enumerate(candidates):
        if first[index] != index:
            continue
        where = layout.place(candidate.length)
        placed[index] = (where.shard, where.offset)
        while len(shards) <= where.shard:
            path = shard_path(dst_weights, len(shards))
            shards.append(Shard(path, _weights_location(dst_onnx, path)))
        shard = shards[where.shard]
        if candidate.data is not None:
            if candidate.length:
                shard.writes.append((where.offset, candidate.data))
        elif candidate.length:
            shard.ranges.append(
                CopyRange(candidate.path, candidate.offset, where.offset, candidate.length, candidate.identity)
            )
    for shard, size in zip(shards, layout.sizes, strict=True):
        shard.size = size

    moves: list[Move] = []
    deduplicated_tensors = deduplicated_bytes = 0
    seen: set[int] = set()
    for tensor, index, checksum, was_inline in pending:
        representative = first[index]
        if representative in seen:
            deduplicated_tensors += 1
            deduplicated_bytes += candidates[index].length
        seen.add(representative)
        shard_index, offset = placed[representative]
        moves.append(Move(tensor, shard_index, offset, candidates[index].length, checksum, was_inline))
    if len(shards) > 1:
        check_outputs(dst_onnx, [s.path for s in shards], sources)
    return AlignPlan(model, stripped, dst_onnx, shards, moves, deduplicated_tensors, deduplicated_bytes)


def _load(
    src_onnx: str, inline_threshold: int | None, mode: Mode
) -> tuple[onnx.ModelProto, StrippedModel | None, FileIdentity | None]:
    """Parse the source: stripped of its inline payloads when they are to be copied out of the file."""
    if inline_threshold is None or mode == "in_memory":
        return load_model_metadata(src_onnx), None, None
    before = file_identity(src_onnx)
    stripped = load_model_stripped(src_onnx, min_length=inline_threshold)
    after = file_identity(src_onnx)
    if before is None or before != after:
        raise ExternalDataError(f"source model {src_onnx!r} was replaced while it was being parsed; nothing written.")
    return stripped.model, stripped, after


def _inline_candidate(
    tensor: onnx.TensorProto,
    label: str,
    inline_threshold: int,
    stripped: StrippedModel | None,
    src_onnx: str,
    onnx_identity: FileIdentity | None,
    files: dict[FileIdentity, int],
) -> _Candidate | None:
    """The payload of an inline tensor to externalize, or None when it stays inline."""
    if tensor.data_type in _NEVER_EXTERNAL:
        return None
    expected = expected_nbytes(tensor)
    if expected is None:  # an unknown data type: its size cannot be checked, leave it as it is
        return None
    payload = stripped.payload(tensor) if stripped is not None else None
    if payload is not None:
        length = payload.length
    elif tensor.HasField("raw_data"):
        length = len(tensor.raw_data)
    else:
        length = expected
    # A tensor without data has nothing to move (and size_threshold=0 would otherwise move every empty tensor).
    if length == 0 or length < inline_threshold:
        return None
    if length != expected:
        raise ExternalDataError(
            f"tensor {label!r}: inline raw_data holds {length} bytes but its dims {list(tensor.dims)} and data type "
            f"{_dtype_name(tensor.data_type)} need {expected} bytes; refusing to externalize a malformed tensor."
        )
    if payload is not None:
        assert onnx_identity is not None
        index = files.setdefault(onnx_identity, len(files))
        return _Candidate(length, src_onnx, payload.offset, onnx_identity, None, (index, payload.offset, length), label)
    if tensor.HasField("raw_data"):
        return _Candidate(length, data=tensor.raw_data, label=label)
    return _Candidate(length, data=_typed_bytes(tensor, label, expected), label=label)


def _typed_bytes(tensor: onnx.TensorProto, label: str, expected: int) -> bytes:
    """Little-endian raw bytes of a tensor stored in typed fields (onnx's own conversion, sub-byte packing included).

    Holds the values twice for a moment (numpy array and bytes); typed fields hold small tensors in practice.
    """
    try:
        data = numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data
    except (ValueError, TypeError, KeyError) as exc:
        raise ExternalDataError(
            f"tensor {label!r}: its typed data does not fit its dims {list(tensor.dims)} and data type "
            f"{_dtype_name(tensor.data_type)}: {exc}"
        ) from exc
    if len(data) != expected:
        raise ExternalDataError(
            f"tensor {label!r}: its typed data gives {len(data)} bytes but its dims {list(tensor.dims)} and data "
            f"type {_dtype_name(tensor.data_type)} need {expected} bytes."
        )
    return data


def _dtype_name(data_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_string(data_type).removeprefix("TensorProto.")
    except (KeyError, ValueError):
        return f"unknown data type {data_type}"


def _representatives(candidates: Sequence[_Candidate], dedup: bool, chunk_size: int) -> list[int]:
    """For each candidate, the first candidate whose bytes it shares (itself when it is the first)."""
    if not dedup:
        first_of: dict[tuple[int, int, int], int] = {}
        return [first_of.setdefault(c.key, index) if c.key is not None else index for index, c in enumerate(candidates)]
    with _open_files(candidates) as fds:
        blobs = [
            BlobSource(c.length, data=c.data, key=c.key, label=f"tensor {c.label!r}")
            if c.data is not None
            else BlobSource(c.length, fds[c.path], c.offset, key=c.key, label=f"{c.path!r}")
            for c in candidates
        ]
        return find_duplicates(blobs, chunk_size)


@contextlib.contextmanager
def _open_files(candidates: Sequence[_Candidate]) -> Iterator[dict[str, int]]:
    """Open each source file once (refusing one swapped since validation) for the duplicate search."""
    fds: dict[str, int] = {}
    try:
        for c in candidates:
            if c.data is None and c.path not in fds:
                fds[c.path] = open_source(CopyRange(c.path, c.offset, 0, c.length, c.identity))
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def _weights_location(dst_onnx: str, dst_weights: str) -> str:
    return weights_location(dst_onnx, dst_weights)
