"""Re-align a model's external weights into one file, every tensor at a multiple of ``alignment``.

Two executions of one plan:

* :func:`align_external_data_streaming` copies byte ranges file-to-file through the copy engine (in-kernel when
  possible); Python never holds weight bytes beyond one ``chunk_size`` buffer, and only in the last fallback.
* :func:`align_external_data_in_memory` reads every external tensor into memory first, then writes them: the naive
  approach, kept as a user-facing function and as the oracle for tests and benchmarks.

Both share :func:`plan_alignment` (walk, validate every location and range, refuse destinations that are sources,
compute every offset), so their outputs are byte-identical by construction. Each public function reads plan → copy →
publish: nothing is written before the plan is complete, and outputs are published as one
:class:`~onnx_light_ref.io.publish.OutputTransaction` (weights first, ``.onnx`` last). This module never modifies a
source file.
"""

from __future__ import annotations

import logging
import os
from array import array
from dataclasses import dataclass, field

import onnx

from onnx_light_ref.errors import DestinationConflictError, ExternalDataError, UnsafeLocationError
from onnx_light_ref.io.alignment import align_up, validate_alignment
from onnx_light_ref.io.arguments import PathLike, check_bool, check_int
from onnx_light_ref.io.copy_engine import CopyRange, ProgressCallback, RangeCopier, open_source
from onnx_light_ref.io.entries import is_external, write_entries
from onnx_light_ref.io.locations import (
    ExternalRef,
    FileIdentity,
    LocationResolver,
    check_location_syntax,
    check_not_hard_linked,
    file_identity,
    parse_external_data,
)
from onnx_light_ref.io.model_file import load_model_metadata, serialize_model
from onnx_light_ref.io.posix import pread_exact
from onnx_light_ref.io.publish import OutputTransaction
from onnx_light_ref.io.results import AlignResult
from onnx_light_ref.io.walker import iter_tensors

__all__ = [
    "AlignPlan",
    "AlignResult",
    "Placements",
    "align_external_data_in_memory",
    "align_external_data_streaming",
    "plan_alignment",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placements:
    """Where every external tensor goes, in :func:`iter_tensors` order: one pair of int64 per tensor.

    Columns rather than one object per tensor, so that the plan stays small next to the parsed model (docs/align.md,
    "Design notes"). The tensors themselves are found again by walking the (unchanged) model in the same order.
    """

    dst_offsets: array[int] = field(default_factory=lambda: array("q"))
    lengths: array[int] = field(default_factory=lambda: array("q"))
    checksums: dict[int, str] = field(default_factory=dict)  # index -> checksum, for the few tensors that have one

    def append(self, dst_offset: int, length: int, checksum: str | None) -> None:
        if checksum is not None:
            self.checksums[len(self.dst_offsets)] = checksum
        self.dst_offsets.append(dst_offset)
        self.lengths.append(length)

    def __len__(self) -> int:
        return len(self.dst_offsets)


@dataclass(frozen=True)
class AlignPlan:
    """Everything decided before the first byte is written."""

    model: onnx.ModelProto
    dst_onnx_path: str
    dst_weights_path: str
    location: str  # dst_weights_path relative to the .onnx folder, as stored in the model
    placements: Placements
    ranges: list[CopyRange]  # unique source ranges, in destination order
    total_size: int  # destination weights file size (end of the last tensor, no trailing padding)

    @property
    def payload_bytes(self) -> int:
        return sum(r.length for r in self.ranges)


def plan_alignment(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
) -> AlignPlan:
    """Validate arguments, parse the source metadata, check every external reference, and lay out the output.

    Raises before anything is written: ``ValueError`` (arguments), :class:`InvalidModelError`,
    :class:`ExternalDataError` subclasses or ``FileNotFoundError`` (references), :class:`DestinationConflictError`.
    """
    step = validate_alignment(alignment)
    src_onnx = os.path.abspath(os.fspath(src_onnx_path))
    dst_onnx = os.path.abspath(os.fspath(dst_onnx_path))
    dst_weights = os.path.abspath(os.fspath(dst_weights_path) if dst_weights_path is not None else dst_onnx + ".data")
    location = _destination_location(dst_onnx, dst_weights)

    model = load_model_metadata(src_onnx)
    resolver = LocationResolver(os.path.dirname(src_onnx))
    destinations = _Destinations.of(src_onnx, dst_onnx, dst_weights)
    placements = Placements()
    ranges: list[CopyRange] = []
    files: dict[FileIdentity, tuple[int, FileIdentity]] = {}  # one index (and one identity object) per source file
    seen: dict[int, int] = {}  # packed (file, offset, length) -> destination offset: identical ranges are stored once
    cursor = total = 0
    for site in iter_tensors(model):
        if not is_external(site.tensor):
            continue
        # Each reference is checked and reduced to its placement right away, never kept (docs/align.md).
        ref = parse_external_data(site.tensor, resolver, label=site.label)
        destinations.check(ref)
        check_not_hard_linked(ref)
        file_index, identity = files.setdefault(ref.identity, (len(files), ref.identity))
        key = (file_index << 128) | (ref.offset << 64) | ref.length  # offset and length are < 2**63 (checked)
        dst_offset = seen.get(key)
        if dst_offset is None:
            dst_offset = align_up(cursor, step)
            seen[key] = dst_offset
            ranges.append(CopyRange(ref.path, ref.offset, dst_offset, ref.length, identity))
            cursor = dst_offset + ref.length
            # A zero-length tensor still gets an aligned offset; the file is extended so no offset points past it.
            total = max(total, cursor)
        placements.append(dst_offset, ref.length, ref.checksum)
    return AlignPlan(model, dst_onnx, dst_weights, location, placements, ranges, total)


def _destination_location(dst_onnx: str, dst_weights: str) -> str:
    location = os.path.relpath(dst_weights, os.path.dirname(dst_onnx)).replace(os.sep, "/")
    try:
        check_location_syntax(location, tensor_name="<destination>")
    except UnsafeLocationError:
        raise UnsafeLocationError(
            f"dst_weights_path {dst_weights!r} must be inside the folder of dst_onnx_path {dst_onnx!r}: loaders refuse "
            f"locations with '..' or absolute paths (it would be stored as {location!r})."
        ) from None
    if ".." in location:
        # onnx's loader refuses any location containing "..", even inside a name such as "w..1.bin": such a model
        # would be written fine and then be unloadable.
        raise UnsafeLocationError(
            f"dst_weights_path {dst_weights!r} would be stored as location {location!r}, which contains '..'; "
            "onnx refuses to load such locations. Choose a weights file name without '..'."
        )
    return location


@dataclass(frozen=True)
class _Destinations:
    """The destination files as they exist before the run, to refuse writing over anything we read."""

    onnx_path: str
    weights_path: str
    onnx_id: FileIdentity | None
    weights_id: FileIdentity | None

    @classmethod
    def of(cls, src_onnx: str, dst_onnx: str, dst_weights: str) -> _Destinations:
        if dst_weights == dst_onnx:
            raise DestinationConflictError(f"dst_weights_path and dst_onnx_path are the same file {dst_onnx!r}.")
        weights_id = file_identity(dst_weights)
        if weights_id is not None and weights_id == file_identity(src_onnx):
            raise DestinationConflictError(
                f"dst_weights_path {dst_weights!r} is the source model file {src_onnx!r}; pass another "
                "dst_weights_path."
            )
        return cls(dst_onnx, dst_weights, file_identity(dst_onnx), weights_id)

    def check(self, ref: ExternalRef) -> None:
        """Refuse a destination that is (or is a link of) the source file of ``ref``."""
        if self.weights_id is not None and self.weights_id == ref.identity:
            raise DestinationConflictError(
                f"dst_weights_path {self.weights_path!r} is the source weights file {ref.path!r} of tensor "
                f"{ref.tensor_name!r} (same file or a hard link of it): writing it would destroy the source. "
                "Pass another dst_weights_path."
            )
        if self.onnx_id is not None and self.onnx_id == ref.identity:
            raise DestinationConflictError(
                f"dst_onnx_path {self.onnx_path!r} is the source weights file {ref.path!r} of tensor "
                f"{ref.tensor_name!r}."
            )


def _rewrite_entries(plan: AlignPlan) -> None:
    """Point every external tensor of the plan's model at its new place (``checksum`` kept, other keys dropped)."""
    placements = plan.placements
    tensors = (site.tensor for site in iter_tensors(plan.model) if is_external(site.tensor))
    for index, tensor in enumerate(tensors):
        write_entries(
            tensor,
            plan.location,
            placements.dst_offsets[index],
            placements.lengths[index],
            placements.checksums.get(index),
        )


def _copy_streaming(
    plan: AlignPlan, outputs: OutputTransaction, chunk_size: int, progress: ProgressCallback | None
) -> frozenset[str]:
    """Stage the weights file and copy every range into it file-to-file; return the copy methods used."""
    if not plan.placements:
        return frozenset()
    weights = outputs.stage(plan.dst_weights_path)
    assert weights.fd is not None
    with RangeCopier(weights.fd, chunk_size) as copier:
        copier.copy(plan.ranges, progress)
    weights.set_size(plan.total_size)
    return frozenset(copier.used_methods)


def _read_all(ranges: list[CopyRange]) -> list[bytearray]:
    """Every range's bytes, each source opened once and checked to be the very file that was validated."""
    fds: dict[str, int] = {}
    payloads = []
    try:
        for item in ranges:
            if item.src_path not in fds:
                fds[item.src_path] = open_source(item)
            payloads.append(_read_range(fds[item.src_path], item))
    finally:
        for fd in fds.values():
            os.close(fd)
    return payloads


def _read_range(fd: int, item: CopyRange) -> bytearray:
    payload = bytearray(item.length)  # kept as is: bytes(payload) would hold a second copy for a moment
    got = pread_exact(fd, memoryview(payload), item.src_offset)
    if got < item.length:
        raise ExternalDataError(
            f"source file {item.src_path!r} ended at offset {item.src_offset + got} while "
            f"{item.length - got} more bytes were expected; was it truncated while being read?"
        )
    return payload


def _write_payloads(
    plan: AlignPlan, payloads: list[bytearray], outputs: OutputTransaction, progress: ProgressCallback | None
) -> frozenset[str]:
    """Stage the weights file and write every payload read by :func:`_read_all` at its place."""
    if not plan.placements:
        return frozenset()
    weights = outputs.stage(plan.dst_weights_path)
    done = 0
    for item, payload in zip(plan.ranges, payloads, strict=True):
        weights.write_all(payload, item.dst_offset)
        done += item.length
        if progress is not None:
            progress(done, plan.payload_bytes)
    weights.set_size(plan.total_size)
    return frozenset({"pread_pwrite"}) if plan.ranges else frozenset()


def _publish(plan: AlignPlan, outputs: OutputTransaction, copy_methods: frozenset[str]) -> AlignResult:
    """Rewrite the entries, then publish the staged weights and the ``.onnx`` as one transaction."""
    _rewrite_entries(plan)
    outputs.publish(plan.dst_onnx_path, serialize_model(plan.model))
    result = AlignResult(
        plan.total_size,
        tensors=len(plan.placements),
        payload_bytes=plan.payload_bytes,
        weights_files=[plan.dst_weights_path] if plan.placements else [],
        copy_methods=copy_methods,
    )
    logger.info(
        "wrote %s (%d tensors, %d bytes, %d padding) and %s",
        plan.dst_weights_path,
        result.tensors,
        result,
        result.padding,
        plan.dst_onnx_path,
    )
    return result


def align_external_data_streaming(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    chunk_size: int = 4 * 1024 * 1024,
    *,
    progress: ProgressCallback | None = None,
    durable: bool = True,
) -> AlignResult:
    """Copy every external tensor of ``src_onnx_path`` into one weights file at ``alignment``-multiple offsets.

    Weight bytes go file-to-file through the kernel (``copy_file_range``, then ``sendfile``, then a bounded
    ``preadv``/``pwrite`` loop), at most ``chunk_size`` bytes per call, so memory stays bounded whatever the model
    size. Inline tensors stay inline. Identical source ranges are stored once. Every reference is validated before
    the first byte is written; the weights file and then the ``.onnx`` appear atomically, or neither changes.

    Args:
        src_onnx_path: the model to re-align. Only this ``.onnx`` is parsed (``load_external_data=False``); its
            external files are read, never modified.
        dst_onnx_path: the model to write. May equal ``src_onnx_path`` (the source is replaced atomically, after
            its weights were copied). Its folder must exist.
        dst_weights_path: the weights file to write; default ``<dst_onnx_path>.data``. It must be inside the folder
            of ``dst_onnx_path`` (stored as a relative ``location`` without ``..``) and must not be a source file.
        alignment: every tensor offset is a multiple of it: a power of two, or 0/1 for packed (no padding).
        chunk_size: at most this many bytes per system call (an int >= 1); also the size of the one buffer of the
            read/write fallback.
        progress: called as ``progress(done_bytes, total_bytes)`` while bytes move.
        durable: fsync the outputs and their folder before and after publishing (default). ``False`` skips every
            fsync (outputs still appear atomically, with the same bytes) for scratch copies and benchmarks.

    Returns:
        An :class:`~onnx_light_ref.io.results.AlignResult`: an ``int`` equal to the weights file size, padding
        included (0, and no weights file, when no tensor is external), which also carries the tensor count, payload
        bytes, padding, weights files written and copy methods used.

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type).
        InvalidModelError: ``src_onnx_path`` is not an ONNX model, or the result cannot be serialized.
        ExternalDataError: a malformed or out-of-bounds reference (``UnsafeLocationError`` for a location outside the
            model's folder or a hard-linked file, ``DestinationConflictError`` for a destination that is a source).
        FileNotFoundError: the source model, a referenced file or the destination folder does not exist.
        OSError: the copy or the publication failed (e.g. ENOSPC); the destinations are then unchanged.
    """
    check_int("chunk_size", chunk_size, minimum=1)
    check_bool("durable", durable)
    plan = plan_alignment(src_onnx_path, dst_onnx_path, dst_weights_path, alignment)
    with OutputTransaction(durable=durable) as outputs:
        copy_methods = _copy_streaming(plan, outputs, chunk_size, progress)
        return _publish(plan, outputs, copy_methods)


def align_external_data_in_memory(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    *,
    progress: ProgressCallback | None = None,
    durable: bool = True,
) -> AlignResult:
    """Same result as :func:`align_external_data_streaming`, but every weight is read into memory first.

    This is what ``onnx.load(..., load_external_data=True)`` followed by an aligned save costs: peak memory grows
    with the weights. Useful when the weights are small, and as the byte-for-byte oracle of the streaming version.

    Args:
        src_onnx_path: the model to re-align. Only this ``.onnx`` is parsed (``load_external_data=False``); its
            external files are read, never modified.
        dst_onnx_path: the model to write. May equal ``src_onnx_path`` (the source is replaced atomically, after
            its weights were read). Its folder must exist.
        dst_weights_path: the weights file to write; default ``<dst_onnx_path>.data``. It must be inside the folder
            of ``dst_onnx_path`` (stored as a relative ``location`` without ``..``) and must not be a source file.
        alignment: every tensor offset is a multiple of it: a power of two, or 0/1 for packed (no padding).
        progress: called as ``progress(done_bytes, total_bytes)`` while bytes are written.
        durable: fsync the outputs and their folder (default); ``False`` skips every fsync, same bytes.

    Returns:
        An :class:`~onnx_light_ref.io.results.AlignResult`, as :func:`align_external_data_streaming` returns
        (``copy_methods`` is ``{"pread_pwrite"}`` when bytes moved).

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type).
        InvalidModelError: ``src_onnx_path`` is not an ONNX model, or the result cannot be serialized.
        ExternalDataError: a malformed or out-of-bounds reference, a source truncated while read, an unsafe
            location (``UnsafeLocationError``) or a destination that is a source (``DestinationConflictError``).
        FileNotFoundError: the source model, a referenced file or the destination folder does not exist.
        OSError: reading or publishing failed; the destinations are then unchanged.
    """
    check_bool("durable", durable)
    plan = plan_alignment(src_onnx_path, dst_onnx_path, dst_weights_path, alignment)
    payloads = _read_all(plan.ranges)
    with OutputTransaction(durable=durable) as outputs:
        copy_methods = _write_payloads(plan, payloads, outputs, progress)
        return _publish(plan, outputs, copy_methods)
