"""Re-align a model's weights into aligned external data files: one streaming pass for every layout.

Two executions of one plan (:func:`~onnx_light_ref.io.plan.align_plan.plan_alignment`):

* :func:`align_external_data_streaming` copies byte ranges file-to-file through the copy engine (in-kernel when
  possible), inline payloads included (copied straight out of the source ``.onnx``); Python never holds weight bytes
  beyond one ``chunk_size`` buffer, except typed-field tensors and inline payloads too short to be stripped, which
  are small and written from memory.
* :func:`align_external_data_in_memory` reads every payload into memory first, then writes them: the naive
  approach, kept as a user-facing function and as the oracle for tests and benchmarks.

Layouts (``docs/align.md``): ``alignment`` with ``align_threshold`` (only large tensors aligned), ``max_shard_size``
(``W``, ``W.1``, ``W.2``... never splitting a tensor; other names with ``shard_names``), ``dedup`` (byte-identical
tensors stored once) and ``size_threshold`` (inline tensors of at least that many bytes externalized). With
``weights_format="safetensors"`` every weights file is a safetensors file whose header (small, from memory) is
written at offset 0 before its payloads are copied the same way (``docs/safetensors.md``).
Each public function reads plan → check → reserve space → copy → publish: nothing is written before the plan is
complete and the writer contract (:mod:`~onnx_light_ref.io.write.contract`: destinations, other models' files, where
tensors may sit, what the destination owns) accepted it, a too-small disk fails before the first byte, the contract
is checked again under the folder lock right before the first move, and every weights file and the ``.onnx`` are
published as one :class:`~onnx_light_ref.io.write.publish.OutputTransaction` (weights first, ``.onnx`` last). This
module never modifies a source file, and never serializes a model that still holds a payload placeholder.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io.arguments import PathLike, check_bool, check_int
from onnx_light_ref.io.plan.align_plan import (
    SITE_INLINE,
    SITE_KEPT,
    AlignPlan,
    LayoutOptions,
    Mode,
    Shard,
    WeightsFormat,
    check_layout_options,
    plan_alignment,
)
from onnx_light_ref.io.plan.shard_names import ShardNames
from onnx_light_ref.io.posix import pread_exact
from onnx_light_ref.io.read.entries import write_entries
from onnx_light_ref.io.read.locations import TYPED_VALUE_FIELDS, FileIdentity
from onnx_light_ref.io.read.model_file import serialize_model
from onnx_light_ref.io.read.walker import iter_tensors
from onnx_light_ref.io.results import AlignResult, summarize_names
from onnx_light_ref.io.write.contract import (
    PlannedFile,
    PlannedModel,
    ShardSet,
    WriteOptions,
    WritePlan,
    check_plan,
    recheck_plan,
)
from onnx_light_ref.io.write.copy_engine import (
    CopyMethod,
    CopyRange,
    CopyStats,
    ProgressCallback,
    RangeCopier,
    open_source,
)
from onnx_light_ref.io.write.publish import OutputTransaction, StagedFile
from onnx_light_ref.io.write.space import SpaceRequest, reserve_space_for_all

__all__ = [
    "AlignPlan",
    "AlignResult",
    "align_external_data_in_memory",
    "align_external_data_streaming",
    "copy_streaming",
    "plan_alignment",
    "rewrite_entries",
    "warn_unaligned",
    "write_plan",
]

logger = logging.getLogger(__name__)

_BUFFER_METHOD: CopyMethod = "pread_pwrite"  # bytes written from a Python buffer are reported under the buffered method


def rewrite_entries(plan: AlignPlan) -> None:
    """Point every moved tensor of ``plan.model`` at its new place (``checksum`` kept, other keys dropped, inline
    data cleared), in memory; ``align_models`` rewrites each member with it.

    The plan keeps columns, not tensors: the moved tensors are found again by walking the model, which planning
    left as it was, in the same order (``plan.sites`` has one byte per tensor of that walk).
    """
    sites = iter(plan.sites)
    move = 0
    for site in iter_tensors(plan.model):
        kind = next(sites, None)
        if kind is None:
            raise AssertionError("the model has more tensors than when it was planned; nothing published.")
        tensor = site.tensor
        if kind != SITE_INLINE and plan.stripped is not None and plan.stripped.payload(tensor) is not None:
            # A placeholder left in the output would be read as the tensor's data by every loader: never publish one.
            raise AssertionError(f"tensor {site.label!r} still holds a payload placeholder; nothing published.")
        if kind == SITE_KEPT:
            continue
        if kind == SITE_INLINE:
            tensor.ClearField("raw_data")
            for name in TYPED_VALUE_FIELDS:
                tensor.ClearField(name)
        shard = plan.shards[plan.move_shards[move]]
        write_entries(
            tensor, shard.location, plan.move_offsets[move], plan.move_lengths[move], plan.checksums.get(move)
        )
        move += 1
    if next(sites, None) is not None or move != plan.tensors:
        raise AssertionError("the model has fewer tensors than when it was planned; nothing published.")


class _Progress:
    """One ``progress(done, total)`` over every shard, fed by per-shard counts."""

    def __init__(self, callback: ProgressCallback | None, total: int) -> None:
        self.callback = callback
        self.total = total
        self.base = 0

    def shard(self) -> ProgressCallback | None:
        if self.callback is None:
            return None
        base, callback, total = self.base, self.callback, self.total
        return lambda done, _shard_total: callback(base + done, total)

    def advance(self, count: int) -> None:
        self.base += count
        if self.callback is not None and count:
            self.callback(self.base, self.total)


def _stage_all(
    plan: AlignPlan, outputs: OutputTransaction, chunk_size: int, durable: bool, *, clones: bool
) -> list[StagedFile]:
    """Create every weights file and reserve its space before the first byte is written anywhere.

    ``clones``: the ranges go through the copy engine, which may clone (reflink) block-aligned ones: those need no
    free space. Written from memory, every byte needs space.
    """
    staged: list[StagedFile] = []
    requests: list[SpaceRequest] = []
    for shard in plan.shards:
        weights = outputs.stage(shard.path)
        assert weights.fd is not None
        clone_bytes = 0
        if clones and shard.ranges:
            with RangeCopier(weights.fd, chunk_size, durable=durable) as probe:
                clone_bytes = probe.plan_clone_bytes(shard.ranges)
        staged.append(weights)
        requests.append(SpaceRequest(weights.fd, shard.size, shard.path, clone_bytes))
    # All files of the job checked together per filesystem, so a too-small disk reports the whole job's bytes.
    reserve_space_for_all(requests)
    return staged


def _add_stats(total: CopyStats, stats: CopyStats) -> None:
    for method, count in stats.bytes_by_method.items():
        total.bytes_by_method[method] = total.bytes_by_method.get(method, 0) + count
    total.clone_eligible_bytes += stats.clone_eligible_bytes
    total.writeback_requests += stats.writeback_requests


def _write_from_memory(weights: StagedFile, shard: Shard, stats: CopyStats, progress: _Progress) -> None:
    for offset, data in shard.writes:
        weights.write_all(data, offset)
        stats.bytes_by_method[_BUFFER_METHOD] = stats.bytes_by_method.get(_BUFFER_METHOD, 0) + len(data)
        progress.advance(len(data))


def copy_streaming(
    plan: AlignPlan, outputs: OutputTransaction, chunk_size: int, durable: bool, progress: ProgressCallback | None
) -> CopyStats:
    """Stage every weights file of ``plan`` in ``outputs``, reserve its space (all files together, before the first
    byte), copy its ranges file to file through the copy engine (reflinks kept, at most ``chunk_size`` bytes per
    call) and write its in-memory payloads; return how the bytes moved. ``align_models`` copies a family's shared
    weights files with it too."""
    stats = CopyStats()
    tracker = _Progress(progress, plan.payload_bytes)
    for shard, weights in zip(plan.shards, _stage_all(plan, outputs, chunk_size, durable, clones=True), strict=True):
        assert weights.fd is not None
        if shard.header:
            weights.write_all(shard.header, 0)
        if shard.ranges:
            with RangeCopier(weights.fd, chunk_size, durable=durable) as copier:
                moved = copier.copy(shard.ranges, tracker.shard())
            tracker.base += moved
            _add_stats(stats, copier.stats)
        _write_from_memory(weights, shard, stats, tracker)
        weights.set_size(shard.size)
    return stats


def _read_all(plan: AlignPlan) -> list[list[bytearray]]:
    """Every range's bytes, shard by shard; each source opened once and checked to be the very file validated."""
    fds: dict[str, int] = {}
    payloads: list[list[bytearray]] = []
    try:
        for shard in plan.shards:
            payloads.append([])
            for item in shard.ranges:
                if item.src_path not in fds:
                    fds[item.src_path] = open_source(item)
                payloads[-1].append(_read_range(fds[item.src_path], item))
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
    plan: AlignPlan,
    payloads: list[list[bytearray]],
    outputs: OutputTransaction,
    durable: bool,
    progress: ProgressCallback | None,
) -> CopyStats:
    """Stage every weights file, reserve its space and write every payload read by :func:`_read_all` at its place."""
    stats = CopyStats()
    tracker = _Progress(progress, plan.payload_bytes)
    for shard, weights, shard_payloads in zip(
        plan.shards, _stage_all(plan, outputs, 1, durable, clones=False), payloads, strict=True
    ):
        writes: list[tuple[int, bytes | bytearray]] = [
            (item.dst_offset, payload) for item, payload in zip(shard.ranges, shard_payloads, strict=True)
        ]
        if shard.header:
            weights.write_all(shard.header, 0)
        for offset, data in sorted([*writes, *shard.writes], key=lambda pair: pair[0]):
            weights.write_all(data, offset)
            stats.bytes_by_method[_BUFFER_METHOD] = stats.bytes_by_method.get(_BUFFER_METHOD, 0) + len(data)
            tracker.advance(len(data))
        weights.set_size(shard.size)
    return stats


def write_plan(
    plans: Sequence[AlignPlan],
    options: WriteOptions,
    writer: str = "align",
    rename_hint: str = "another name (dst_weights_path / --weights)",
) -> WritePlan:
    """Aligner plans as the writer contract's :class:`~onnx_light_ref.io.write.contract.WritePlan`: every plan's
    ``.onnx`` with its sites (one for the aligners; several for ``align_models``, whose members share the weights
    files of the first), every weights file (size, header, shard set) and the index, every source."""
    first = plans[0]
    safetensors = first.weights_format == "safetensors"
    shard_set = ShardSet(first.weights_base, first.shard_names, safetensors)
    files = [PlannedFile(plan.dst_onnx_path, "model", format="onnx") for plan in plans]
    files += [
        PlannedFile(
            shard.path,
            "weights",
            shard.size,
            len(shard.header),
            shard_set,
            "safetensors" if safetensors else "raw",
        )
        for shard in first.shards
    ]
    if first.index is not None:
        files.append(PlannedFile(first.index[0], "index", len(first.index[1]), shard_set=shard_set, format="json"))
    models = [
        PlannedModel(plan.dst_onnx_path, plan.model, plan.site_columns(), plan.size_threshold, plan.policy)
        for plan in plans
    ]
    sources: dict[FileIdentity, str] = {}
    for plan in plans:
        sources.update(plan.source_paths)
    return WritePlan(writer, models, files, sources, options=options, rename_hint=rename_hint)


def _publish(plan: AlignPlan, contract: WritePlan, outputs: OutputTransaction, stats: CopyStats) -> AlignResult:
    """Rewrite the entries, then publish the staged weights and the ``.onnx`` as one transaction (the contract
    re-checked under the folder lock right before the first move)."""
    rewrite_entries(plan)
    if plan.index is not None:  # a sharded safetensors set's index.json, in the same transaction
        index_path, index_bytes = plan.index
        staged = outputs.stage(index_path)
        staged.write_all(index_bytes, 0)
        staged.set_size(len(index_bytes))
    bytes_by_method: dict[str, int] = {method: count for method, count in stats.bytes_by_method.items() if count}
    result = AlignResult(
        plan.total_size,
        tensors=plan.tensors,
        payload_bytes=plan.payload_bytes,
        weights_files=plan.weights_paths,
        copy_methods=bytes_by_method,
        deduplicated_tensors=plan.deduplicated_tensors,
        deduplicated_bytes=plan.deduplicated_bytes,
        externalized_tensors=plan.externalized_tensors,
        bytes_by_method=bytes_by_method,
        clone_eligible_bytes=stats.clone_eligible_bytes,
        stale_weights_files=plan.stale_weights_files,
        weights_format=plan.weights_format,
        index_file=plan.index[0] if plan.index is not None else None,
        unaligned_tensors=plan.unaligned_tensors,
        kept_inline_reasons=plan.kept_inline,
    )
    outputs.publish(
        plan.dst_onnx_path,
        serialize_model(plan.model),
        before_commit=lambda: recheck_plan(contract),
        result=result,
        weights_set=plan.weights_base or None,
    )
    logger.info(
        "wrote %d weights file(s) %s (%d tensors, %d externalized, %d deduplicated, %d bytes, %d padding) and %s",
        len(result.weights_files),
        ", ".join(result.weights_files),
        result.tensors,
        result.externalized_tensors,
        result.deduplicated_tensors,
        result,
        result.padding,
        plan.dst_onnx_path,
    )
    warn_unaligned(result.unaligned_tensors)
    if result.stale_weights_files:
        # Not ours to delete: another model may use them. Naming them is the least we owe the user.
        logger.warning(
            "%s does not reference %d file(s) left by an earlier run at this destination, not deleted: %s",
            plan.dst_onnx_path,
            len(result.stale_weights_files),
            ", ".join(result.stale_weights_files),
        )
    return result


def warn_unaligned(unaligned: Sequence[str]) -> None:
    """Log the safetensors keys of at least ``align_threshold`` bytes that could not start aligned (a warning)."""
    if unaligned:
        logger.warning(
            "%d tensor(s) of at least align_threshold bytes could not start aligned in the safetensors data "
            "section (it must be covered without holes): %s",
            len(unaligned),
            summarize_names(unaligned),  # 199 names on one line were unreadable; all are on the result
        )


def _align(
    mode: Mode,
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None,
    alignment: int,
    layout: LayoutOptions,
    chunk_size: int | None,
    durable: bool,
    progress: ProgressCallback | None,
    allow_outside_folder: bool = False,
    replace_shared: bool = False,
    overwrite: bool = False,
) -> AlignResult:
    """Plan, then execute the plan in ``mode`` (read everything first when ``in_memory``), then publish.

    ``chunk_size`` is None only in memory (dedup then compares through 1 MiB buffers).

    The transaction never sweeps away a file this job reads (``keep``): a source may be named like a dead writer's
    temp file of a destination.
    """
    options = WriteOptions(
        check_bool("replace_shared", replace_shared),
        check_bool("overwrite", overwrite),
        check_bool("allow_outside_folder", allow_outside_folder),
    )
    plan = plan_alignment(
        src_onnx_path,
        dst_onnx_path,
        dst_weights_path,
        alignment,
        mode=mode,
        chunk_size=chunk_size,
        align_threshold=layout.align_threshold,
        max_shard_size=layout.max_shard_size,
        dedup=layout.dedup,
        size_threshold=layout.size_threshold,
        allow_outside_folder=allow_outside_folder,
        weights_format=layout.weights_format,
        shard_names=layout.shard_names,
    )
    contract = write_plan([plan], options, f"align ({mode.replace('_', '-')})")
    check_plan(contract)  # every rule of the writer contract, before the first byte
    payloads = _read_all(plan) if mode == "in_memory" else None
    with OutputTransaction(durable=durable, keep=plan.sources) as outputs:
        if payloads is None:
            assert chunk_size is not None
            stats = copy_streaming(plan, outputs, chunk_size, durable, progress)
        else:
            stats = _write_payloads(plan, payloads, outputs, durable, progress)
        return _publish(plan, contract, outputs, stats)


def align_external_data_streaming(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    chunk_size: int = 4 * 1024 * 1024,
    *,
    align_threshold: int = 0,
    max_shard_size: int | None = None,
    dedup: bool = False,
    size_threshold: int | None = None,
    durable: bool = True,
    progress: ProgressCallback | None = None,
    allow_outside_folder: bool = False,
    weights_format: WeightsFormat = "onnx",
    shard_names: ShardNames = None,
    replace_shared: bool = False,
    overwrite: bool = False,
) -> AlignResult:
    """Copy the weights of ``src_onnx_path`` into aligned external data files, without loading them.

    Weight bytes go file-to-file through the kernel (``copy_file_range``, then ``sendfile``, then a bounded
    ``preadv``/``pwrite`` loop), at most ``chunk_size`` bytes per call, so memory stays bounded whatever the model
    size. With ``size_threshold``, inline payloads are located in the ``.onnx`` by reading its wire format and copied
    out of it the same way (only typed-field tensors and payloads of at most 32 bytes are written from memory).
    Every reference is validated, the layout computed and free space reserved before the first byte is written; the
    weights files and then the ``.onnx`` appear atomically, or none changes.

    Args:
        src_onnx_path: the model to re-align. Its external files (and, with ``size_threshold``, the ``.onnx``
            itself) are read, never modified.
        dst_onnx_path: the model to write. May equal ``src_onnx_path`` (the source is replaced atomically, after
            its weights were copied). Its folder must exist.
        dst_weights_path: the (first) weights file to write; default ``<dst_onnx_path>.data``. It must be inside the
            folder of ``dst_onnx_path`` (stored as a relative ``location`` without ``..``) and must not be a source.
        alignment: tensor offsets are multiples of it: a power of two, or 0/1 for packed (no padding).
        chunk_size: at most this many bytes per system call (an int >= 1); also the size of the one buffer of the
            read/write fallback and of each of the two buffers ``dedup`` compares with.
        align_threshold: only tensors of at least this many bytes start at a multiple of ``alignment``; smaller ones
            are packed at the next free byte. 0 (default) aligns every tensor.
        max_shard_size: at most this many bytes per weights file (``W``, ``W.1``, ``W.2``...; offsets restart at 0
            in each). A tensor is never split: one larger than the cap gets a file of its own. None: one file.
        dedup: store byte-identical tensors once, whatever their names or sources (decided on the bytes: a digest
            picks candidates of equal length, a byte comparison confirms). Identical source ranges are stored once
            even without it.
        size_threshold: None (default) keeps inline tensors inline. An int: every inline tensor anywhere in the
            model holding at least that many bytes (and at least one) becomes external too, placed like the others
            in walker order, where onnx's loader reads it back (initializers and node attribute tensors of the main
            graph, its subgraphs and functions' nodes). STRING tensors stay inline; so do sparse tensors, function
            default attributes and ``training_info`` tensors (``onnx.load`` would leave them EXTERNAL) and shape
            tensors (a ``Reshape`` ``shape``...: onnx's checker and onnxruntime read them at load time), counted in
            ``kept_inline_tensors`` (rule 2 of ``docs/safety.md``). Typed-field tensors (``float_data``...) are
            converted to little-endian raw bytes in memory.
        durable: fsync the outputs and their folder before and after publishing (default). ``False`` skips every
            fsync (outputs still appear atomically, with the same bytes) for scratch copies and benchmarks.
        progress: called as ``progress(done_bytes, total_bytes)`` while bytes move.
        allow_outside_folder: trust the source's layout: follow symbolic links in its data paths (the Hugging Face
            cache, whose weights are symlinks into ``../../blobs/``). Default: refuse what onnx's loader refuses
            (any symbolic link in a data path, inside or outside the folder; see ``docs/safety.md``).
        weights_format: ``"onnx"`` (default): raw weights files. ``"safetensors"``: every weights file is a valid
            safetensors file (keys are the tensor names, which must be unique and non-empty; header padded so the
            data section starts aligned; tensors ordered so that as many as possible of those of at least
            ``align_threshold`` bytes start aligned, the others counted in ``unaligned_tensors`` and logged) and
            the ``.onnx`` points into them. Default weights path ``<dst without .onnx>.safetensors``; with
            ``max_shard_size``, ``model-00001-of-0000N.safetensors`` files plus ``model.safetensors.index.json``,
            published in the same transaction. ``dedup=True`` is refused (the format forbids shared bytes).
            See ``docs/safetensors.md``.
        shard_names: how weights files are named (:mod:`onnx_light_ref.io.plan.shard_names`): None (ours: ``W``,
            ``W.1``...; ``"hf"`` for safetensors), ``"hf"`` (``model-00001-of-0000N.data``) or
            ``"transformers.js"`` (``model.onnx_data``, ``model.onnx_data_1``...; at most 100 files).
        replace_shared: replace an existing weights file even when another model references it (a ``.onnx``, in
            any case, of its folder or of an ancestor folder, through external data or ``DelayedInitializer``
            filenames): that model then computes with the new bytes. False (default) refuses with
            ``SharedWeightsError`` naming the other models.
        overwrite: replace existing files the destination does not own (anything but the ``.onnx``, the files the
            previous ``.onnx`` references and its own leftovers: e.g. a PyTorch ``model.safetensors`` where the
            safetensors weights would go). False (default) refuses with ``ExistingFileError`` naming them.

    Returns:
        An :class:`~onnx_light_ref.io.results.AlignResult`: an ``int`` equal to the bytes of all weights files,
        padding included (0, and no weights file, when no tensor is external), which also carries the tensor
        counts, payload bytes, padding, weights files, dedup and externalization counts, how bytes moved, and
        the files named like further shards that an earlier run left at the destination (``stale_weights_files``:
        not referenced by the new ``.onnx``, never deleted; also logged as a warning).

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type), an option
            the format refuses, more than 100 files with ``shard_names="transformers.js"``.
        SafetensorsError: (an ``ExternalDataError``) with ``weights_format="safetensors"``, tensors without a
            name or sharing one, or whose data type safetensors cannot store (all listed; nothing written).
        InvalidModelError: ``src_onnx_path`` is not an ONNX model (a truncated or malformed one names the byte
            offset), or the result cannot be serialized.
        ExternalDataError: a malformed or out-of-bounds reference, an inline tensor whose data does not match its
            dims (``UnsafeLocationError`` for a location outside the model's folder or a hard-linked file,
            ``DestinationConflictError`` for a destination that is a source, another destination or a directory,
            or a name too long; ``SharedWeightsError`` for a weights file another model uses, without
            ``replace_shared``; ``ExistingFileError`` for an existing file the destination does not own, without
            ``overwrite``).
        FileNotFoundError: the source model, a referenced file or the destination folder does not exist.
        OSError: the copy or the publication failed before the commit (``ENOSPC`` before the first byte when the
            disk is too small; with ``durable``, an fsync error such as EIO); the destination is then the previous
            model, nothing is published.
        PublishedWithErrorsError: the new model is published (it loads, its ``result`` attribute is the
            ``AlignResult``), but a step after the commit failed: the fsync that makes it durable, or removing the
            previous versions (hidden files a later run sweeps). Never an ``OSError``: see ``docs/durability.md``.
    """
    check_int("chunk_size", chunk_size, minimum=1)
    layout = check_layout_options(
        align_threshold,
        max_shard_size,
        dedup,
        size_threshold,
        durable,
        weights_format=weights_format,
        shard_names=shard_names,
    )
    return _align(
        "streaming",
        src_onnx_path,
        dst_onnx_path,
        dst_weights_path,
        alignment,
        layout,
        chunk_size,
        durable,
        progress,
        allow_outside_folder,
        replace_shared,
        overwrite,
    )


def align_external_data_in_memory(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    *,
    align_threshold: int = 0,
    max_shard_size: int | None = None,
    dedup: bool = False,
    size_threshold: int | None = None,
    durable: bool = True,
    progress: ProgressCallback | None = None,
    allow_outside_folder: bool = False,
    weights_format: WeightsFormat = "onnx",
    shard_names: ShardNames = None,
    replace_shared: bool = False,
    overwrite: bool = False,
) -> AlignResult:
    """Same result as :func:`align_external_data_streaming`, but every payload is read into memory first.

    This is what ``onnx.load(..., load_external_data=True)`` followed by an aligned save costs: peak memory grows
    with the weights (the ``.onnx`` is parsed whole, inline payloads included). Useful when the weights are small,
    and as the byte-for-byte oracle of the streaming version: same options, same ``.onnx`` and weights bytes.

    Args:
        src_onnx_path: the model to re-align; its external files are read, never modified.
        dst_onnx_path: the model to write. May equal ``src_onnx_path``. Its folder must exist.
        dst_weights_path: the (first) weights file to write; default ``<dst_onnx_path>.data`` (see the streaming
            aligner).
        alignment: tensor offsets are multiples of it: a power of two, or 0/1 for packed (no padding).
        align_threshold: as for :func:`align_external_data_streaming`.
        max_shard_size: as for :func:`align_external_data_streaming`.
        dedup: as for :func:`align_external_data_streaming` (candidates are compared through two 1 MiB buffers).
        size_threshold: as for :func:`align_external_data_streaming`.
        durable: fsync the outputs and their folder (default); ``False`` skips every fsync, same bytes.
        progress: called as ``progress(done_bytes, total_bytes)`` while bytes are written.
        allow_outside_folder: as for :func:`align_external_data_streaming`.
        weights_format: as for :func:`align_external_data_streaming`.
        shard_names: as for :func:`align_external_data_streaming`.
        replace_shared: as for :func:`align_external_data_streaming`.
        overwrite: as for :func:`align_external_data_streaming`.

    Returns:
        An :class:`~onnx_light_ref.io.results.AlignResult`, as :func:`align_external_data_streaming` returns
        (``copy_methods`` is ``{"pread_pwrite"}`` when bytes moved).

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type).
        InvalidModelError: ``src_onnx_path`` is not an ONNX model, or the result cannot be serialized.
        ExternalDataError: as for :func:`align_external_data_streaming`, or a source truncated while read.
        FileNotFoundError: the source model, a referenced file or the destination folder does not exist.
        OSError: reading or publishing failed before the commit; the destination is then the previous model.
        PublishedWithErrorsError: as for :func:`align_external_data_streaming` (published; a later step failed).
    """
    layout = check_layout_options(
        align_threshold,
        max_shard_size,
        dedup,
        size_threshold,
        durable,
        weights_format=weights_format,
        shard_names=shard_names,
    )
    return _align(
        "in_memory",
        src_onnx_path,
        dst_onnx_path,
        dst_weights_path,
        alignment,
        layout,
        None,
        durable,
        progress,
        allow_outside_folder,
        replace_shared,
        overwrite,
    )
