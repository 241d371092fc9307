"""The one way from a plan to disk: every writer hands its :class:`~onnx_light_ref.io._write.contract.WritePlan` to
:func:`execute`, the only code that stages, fills and publishes files.

1. Check every rule of the writer contract on the plan (:func:`~onnx_light_ref.io._write.contract.check_plan`):
   nothing is written before it passed.
2. Stage every planned file under a temp name in its folder, reserve the space of all of them together (a disk too
   small fails before the first byte), fill each one (its header, its ranges copied file to file through the copy
   engine, its bytes from memory) and give it its final size.
3. Point every placed site of every planned model at its place (``external_data`` entries; a
   ``DelayedInitializer`` node's ``filename`` and ``offset``) and serialize it: a model's references are written from
   its plan's sites only.
4. Publish every file as one transaction (:mod:`~onnx_light_ref.io._write.publish`): the models' ``.onnx`` files last,
   the contract re-checked under the destination folders' lock right before the first move.

A file the plan does not list cannot be written, a model the plan lists is always published with its ``.onnx``, and
a reference the plan has no site for stops the write (``AssertionError``, nothing written). On any failure before
the commit every temp file is removed and the destinations are as they were; a model that belongs to the caller
(:attr:`~onnx_light_ref.io._write.contract.PlannedModel.restore`) gets back the bytes of the tensors this write
externalized.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import onnx

from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._plan.ranges import read_range as read_copy_range
from onnx_light_ref.io._plan.sites import SITE_EXTERNALIZED, SITE_MOVED, ReferenceSite
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._read.delayed_nodes import DelayedSite
from onnx_light_ref.io._read.locations import TYPED_VALUE_FIELDS
from onnx_light_ref.io._read.sharing import reading_references
from onnx_light_ref.io._write.contract import (
    LazyPayload,
    Payload,
    PlannedFile,
    PlannedModel,
    WritePlan,
    check_plan,
    location_for,
    recheck_plan,
)
from onnx_light_ref.io._write.copy_engine import CopyMethod, CopyStats, ProgressCallback, RangeCopier
from onnx_light_ref.io._write.publish import OutputTransaction, StagedFile, serialize_model
from onnx_light_ref.io._write.space import SpaceRequest, reserve_space_for_all

DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
"""The copy engine's default: the most bytes one system call moves, and its one fallback buffer."""

_BUFFER_METHOD: CopyMethod = "pread_pwrite"  # bytes written from a Python buffer are reported under the buffered method
_WRITE_SLICE = 8 * 1024 * 1024  # bytes of a buffer handed to one pwrite
_PLACED = (SITE_MOVED, SITE_EXTERNALIZED)

Result = TypeVar("Result")


# Cleared on every tensor a write places: its inline bytes (raw_data, typed fields) are in its file now.
_VALUE_FIELDS = ("raw_data", *TYPED_VALUE_FIELDS)


def write_entries(
    tensor: onnx.TensorProto, location: str, offset: int, length: int, checksum: str | None = None
) -> None:
    """Point ``tensor`` at ``length`` bytes of ``location`` at ``offset`` (canonical entries) and mark it EXTERNAL.

    Inline data is not touched here: callers moving a tensor out clear ``raw_data`` (and typed fields) themselves.
    """
    offset_text, length_text = str(offset), str(length)
    entries = tensor.external_data
    # Unrolled, without lists, generators or zips: per tensor of a 100,000-tensor model, they cost more than the
    # entries themselves (twice as long). Each wrapper is built once (protobuf builds a new one on each access).
    if len(entries) == (3 if checksum is None else 4):
        first, second, third = entries[0], entries[1], entries[2]
        fourth = entries[3] if checksum is not None else None
        if (
            first.key == "location"
            and second.key == "offset"
            and third.key == "length"
            and (fourth is None or fourth.key == "checksum")
        ):
            # An equal value is not stored again (the arena keeps every string stored).
            if first.value != location:
                first.value = location
            if second.value != offset_text:
                second.value = offset_text
            if third.value != length_text:
                third.value = length_text
            if fourth is not None and fourth.value != checksum:
                fourth.value = checksum
            tensor.data_location = onnx.TensorProto.EXTERNAL
            return
    del entries[:]
    entries.add(key="location", value=location)
    entries.add(key="offset", value=offset_text)
    entries.add(key="length", value=length_text)
    if checksum is not None:
        entries.add(key="checksum", value=checksum)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def execute(
    plan: WritePlan,
    result: Callable[[CopyStats], Result],
    *,
    durable: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    progress: ProgressCallback | None = None,
    in_memory: bool = False,
) -> Result:
    """Check ``plan``, write every file it lists and publish them as one transaction (module docstring).

    Args:
        plan: the writer's complete plan.
        result: builds the writer's return value from how the bytes moved; called before the publication, so that a
            :class:`~onnx_light_ref.errors.PublishedWithErrorsError` carries it.
        durable: fsync every file and folder (default); ``False``: the same bytes and atomic moves, no fsync.
        chunk_size: the most bytes one copy call moves (and the size of the copy engine's one fallback buffer).
        progress: called as ``progress(done_bytes, total_bytes)`` while bytes are written.
        in_memory: read every copied range into memory before writing anything (the in-memory aligner: the naive
            approach, and the oracle of the streaming one: the same bytes at the same places).

    Returns:
        What ``result`` returned.

    Raises:
        The errors of :func:`~onnx_light_ref.io._write.contract.check_plan` (nothing written), of the copy and of the
        publication (``OSError`` before the commit: the destinations are as they were;
        ``PublishedWithErrorsError`` after it).
    """
    with reading_references():  # each nearby model read once for the whole write (its checks and publication)
        return _execute(plan, result, durable, chunk_size, progress, in_memory)


def _execute(
    plan: WritePlan,
    result: Callable[[CopyStats], Result],
    durable: bool,
    chunk_size: int,
    progress: ProgressCallback | None,
    in_memory: bool,
) -> Result:
    walks = check_plan(plan)
    payloads = _read_ranges(plan.files) if in_memory else None
    with OutputTransaction(durable=durable, keep=frozenset(plan.sources)) as outputs:
        stats, staged = _fill(plan.files, outputs, chunk_size, durable, payloads, progress)
        value = result(stats)
        pointed: list[_Pointed] = []
        try:
            referenced = {ref.path: ref.location for ref in plan.referenced if ref.location is not None}
            models = [
                (model.path, _finish(model, placed, referenced, pointed))
                for model, placed in zip(plan.models, walks, strict=True)
            ]
            outputs.publish(
                models,
                before_commit=lambda: recheck_plan(plan),
                result=value,
                journal=_journal(plan),
                removals=lambda: plan.removable,
            )
        except BaseException:
            if not outputs.committed:
                _restore(pointed, {planned.path: stage for planned, stage in zip(plan.files, staged, strict=True)})
            raise
    return value


# --------------------------------------------------------------------------------------------------- filling


class _Progress:
    """One ``progress(done, total)`` over every file, fed by per-file counts."""

    def __init__(self, callback: ProgressCallback | None, total: int) -> None:
        self.callback = callback
        self.total = total
        self.base = 0

    def file(self) -> ProgressCallback | None:
        if self.callback is None:
            return None
        base, callback, total = self.base, self.callback, self.total
        return lambda done, _file_total: callback(base + done, total)

    def advance(self, count: int) -> None:
        self.base += count
        if self.callback is not None and count:
            self.callback(self.base, self.total)


def _fill(
    files: Sequence[PlannedFile],
    outputs: OutputTransaction,
    chunk_size: int,
    durable: bool,
    payloads: list[list[bytes | bytearray]] | None,
    progress: ProgressCallback | None,
) -> tuple[CopyStats, list[StagedFile]]:
    """Stage every file, reserve the space of all of them (before the first byte), then write each one."""
    stats = CopyStats()
    staged = _stage_all(files, outputs, chunk_size, durable, clones=payloads is None)
    tracker = _Progress(progress, sum(planned.payload_bytes for planned in files))
    for index, (planned, stage) in enumerate(zip(files, staged, strict=True)):
        assert stage.fd is not None
        if planned.header:
            stage.write_all(planned.header, 0)
        writes: list[tuple[int, Payload]] = list(planned.writes)
        if payloads is not None:
            writes += [(item.dst_offset, data) for item, data in zip(planned.ranges, payloads[index], strict=True)]
            writes.sort(key=lambda pair: pair[0])
        elif planned.ranges:
            with RangeCopier(stage.fd, chunk_size, durable=durable) as copier:
                tracker.base += copier.copy(planned.ranges, tracker.file())
            _add_stats(stats, copier.stats)
        for offset, data in writes:
            buffer = memoryview(data.read() if isinstance(data, LazyPayload) else data)
            for start in range(0, len(buffer), _WRITE_SLICE):  # progress moves smoothly on large payloads
                piece = buffer[start : start + _WRITE_SLICE]
                stage.write_all(piece, offset + start)
                tracker.advance(len(piece))
            stats.bytes_by_method[_BUFFER_METHOD] = stats.bytes_by_method.get(_BUFFER_METHOD, 0) + len(buffer)
            del buffer
        stage.set_size(planned.size)
    return stats, staged


def _stage_all(
    files: Sequence[PlannedFile], outputs: OutputTransaction, chunk_size: int, durable: bool, *, clones: bool
) -> list[StagedFile]:
    """Create every file and reserve its space before the first byte is written anywhere.

    ``clones``: the ranges go through the copy engine, which may clone (reflink) block-aligned ones: those need no
    free space. Written from memory, every byte needs space.
    """
    staged: list[StagedFile] = []
    requests: list[SpaceRequest] = []
    for planned in files:
        stage = outputs.stage(planned.path)
        assert stage.fd is not None
        clone_bytes = 0
        if clones and planned.ranges:
            with RangeCopier(stage.fd, chunk_size, durable=durable) as probe:
                clone_bytes = probe.plan_clone_bytes(planned.ranges)
        staged.append(stage)
        requests.append(SpaceRequest(stage.fd, planned.size, planned.path, clone_bytes))
    # All files of the job checked together per filesystem, so a too-small disk reports the whole job's bytes.
    reserve_space_for_all(requests)
    return staged


def _add_stats(total: CopyStats, stats: CopyStats) -> None:
    for method, count in stats.bytes_by_method.items():
        total.bytes_by_method[method] = total.bytes_by_method.get(method, 0) + count
    total.clone_eligible_bytes += stats.clone_eligible_bytes
    total.writeback_requests += stats.writeback_requests


def _read_ranges(files: Sequence[PlannedFile]) -> list[list[bytes | bytearray]]:
    """Every range's bytes, file by file; each source opened once and checked to be the very file validated."""
    from onnx_light_ref.io._plan.ranges import open_source

    fds: dict[str, int] = {}
    payloads: list[list[bytes | bytearray]] = []
    try:
        for planned in files:
            payloads.append([])
            for item in planned.ranges:
                if item.src_path not in fds:
                    fds[item.src_path] = open_source(item)
                payloads[-1].append(_read_range(fds[item.src_path], item))
    finally:
        for fd in fds.values():
            os.close(fd)
    return payloads


def _read_range(fd: int, item: CopyRange) -> bytearray:
    from onnx_light_ref.errors import ExternalDataError

    payload = bytearray(item.length)  # kept as is: bytes(payload) would hold a second copy for a moment
    got = pread_exact(fd, memoryview(payload), item.src_offset)
    if got < item.length:
        raise ExternalDataError(
            f"source file {item.src_path!r} ended at offset {item.src_offset + got} while "
            f"{item.length - got} more bytes were expected; was it truncated while being read?"
        )
    return payload


# --------------------------------------------------------------------------------------------------- models


@dataclass
class _Pointed:
    """A tensor this write externalized in a caller's model, and what gives it its bytes back."""

    tensor: onnx.TensorProto
    entries: list[onnx.StringStringEntryProto]
    data_location: onnx.TensorProto.DataLocation | None
    path: str
    offset: int
    length: int


def _finish(
    model: PlannedModel, placed: Sequence[ReferenceSite], locations: dict[str, str], pointed: list[_Pointed]
) -> bytes:
    """Point every placed site of ``model`` (as :func:`check_sites` walked them, in order) at its place, then
    serialize it (``locations``: what the writer resolved for the referenced files it points into)."""
    sites = model.sites
    # Once per file, not per tensor (100,000 tensors: 18 s when it was per tensor).
    where = [locations.get(path) or location_for(model.path, path) for path in sites.targets]
    checksums = sites.checksums
    # The caller's model gets back the bytes of the tensors this write externalized if the write fails.
    restore = [kind == SITE_EXTERNALIZED for kind in sites.kinds if kind in _PLACED] if model.restore else None
    columns = zip(placed, sites.target, sites.offsets, sites.lengths, strict=True)
    for index, (site, target, offset, length) in enumerate(columns):
        location = where[target]
        if isinstance(site, DelayedSite):
            site.point_at(location, offset)
            continue
        tensor = site.tensor
        if restore is not None and restore[index]:
            saved = [onnx.StringStringEntryProto(key=e.key, value=e.value) for e in tensor.external_data]
            kept = tensor.data_location if tensor.HasField("data_location") else None
            pointed.append(_Pointed(tensor, saved, kept, sites.targets[target], offset, length))
        clear = tensor.ClearField  # bound once: half the cost of seven lookups
        for name in _VALUE_FIELDS:
            clear(name)
        write_entries(tensor, location, offset, length, checksums.get(index) if checksums else None)
    return serialize_model(model.proto)


def _restore(pointed: Sequence[_Pointed], staged: dict[str, StagedFile]) -> None:
    """Give each externalized tensor of a caller's model its bytes back, read from the (complete) staged file."""
    for item in pointed:
        stage = staged[item.path]
        data = read_copy_range(CopyRange(stage.temp_path, item.offset, 0, item.length))
        item.tensor.raw_data = data
        del item.tensor.external_data[:]
        item.tensor.external_data.extend(item.entries)
        if item.data_location is None:
            item.tensor.ClearField("data_location")
        else:
            item.tensor.data_location = item.data_location


def _journal(plan: WritePlan) -> str | None:
    """The weights set a publication journals (``publish``'s journal): when a weights file is not named after a
    destination model, a run killed after moving its name in and before any model referenced it leaves a file only
    the journal says is the set's own."""
    from onnx_light_ref.io._plan.shard_names import is_named_after_model

    models = [os.path.normpath(os.path.abspath(path)) for path in plan.model_paths]
    weights = [planned for planned in plan.files if planned.role in ("weights", "index")]
    if all(
        any(is_named_after_model(os.path.normpath(os.path.abspath(p.path)), model) for model in models) for p in weights
    ):
        return None
    first = weights[0]
    return os.path.abspath(first.shard_set.base if first.shard_set is not None else first.path)
