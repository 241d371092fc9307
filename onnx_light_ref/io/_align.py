"""Re-align a model's weights into aligned external data files: one streaming pass for every layout.

Two executions of one plan (:func:`~onnx_light_ref.io._plan.align_plan.plan_alignment`):

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
Each public function validates its arguments, builds the plan and hands it, as the writer contract's
:class:`~onnx_light_ref.io._write.contract.WritePlan`, to :func:`~onnx_light_ref.io._write.execute.execute` (every
rule checked before the first byte, space reserved, bytes copied, every weights file and the ``.onnx`` published as
one transaction). This module never writes a file itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from onnx_light_ref.io._arguments import ArgumentTypeError, PathLike, check_bool, check_int
from onnx_light_ref.io._plan.align_plan import (
    AlignPlan,
    Mode,
    WeightsFormat,
    check_layout_options,
    plan_alignment,
)
from onnx_light_ref.io._plan.shard_names import ShardNames
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._results import AlignResult, record_removed, summarize_names
from onnx_light_ref.io._transformers_js import model_counts, plan_config_update
from onnx_light_ref.io._write.contract import PlannedFile, PlannedModel, ShardSet, WriteOptions, WritePlan
from onnx_light_ref.io._write.copy_engine import CopyStats, ProgressCallback
from onnx_light_ref.io._write.execute import DEFAULT_CHUNK_SIZE, execute

logger = logging.getLogger(__name__)


def write_plan(
    plans: Sequence[AlignPlan],
    options: WriteOptions,
    writer: str = "align",
    rename_hint: str = "another name (dst_weights_path / --weights)",
) -> WritePlan:
    """Aligner plans as the writer contract's :class:`~onnx_light_ref.io._write.contract.WritePlan`: every plan's
    model with its sites (one for the aligners; several for ``align_models``, whose members share the weights files
    of the first), every weights file with its content (header, ranges, bytes) and the index, every source."""
    first = plans[0]
    safetensors = first.weights_format == "safetensors"
    shard_set = ShardSet(first.weights_base, first.shard_names, safetensors)
    files = [
        PlannedFile(
            shard.path,
            "weights",
            shard.size,
            shard.header,
            shard.ranges,
            shard.writes,
            len(shard.header),
            shard_set,
            "safetensors" if safetensors else "raw",
        )
        for shard in first.shards
    ]
    if first.index is not None:  # a sharded safetensors set's index.json, in the same transaction
        index_path, index_bytes = first.index
        files.append(
            PlannedFile(
                index_path, "index", len(index_bytes), writes=[(0, index_bytes)], shard_set=shard_set, format="json"
            )
        )
    models = [
        PlannedModel(
            plan.dst_onnx_path,
            plan.model,
            plan.site_columns(),
            plan.size_threshold,
            plan.policy,
            placeholders=plan.stripped,
        )
        for plan in plans
    ]
    reads: dict[FileIdentity, str] = {}
    for plan in plans:
        reads.update(plan.source_paths)
    return WritePlan(writer, models, files, options, reads, rename_hint=rename_hint)


def aligned_result(plan: AlignPlan, stats: CopyStats, config_file: str | None = None) -> AlignResult:
    """The :class:`~onnx_light_ref.io._results.AlignResult` of an executed plan (``config_file``: the config it
    updated)."""
    bytes_by_method: dict[str, int] = {method: count for method, count in stats.bytes_by_method.items() if count}
    return AlignResult(
        plan.total_size,
        tensors=plan.tensors,
        payload_bytes=plan.payload_bytes,
        weights_files=tuple(plan.weights_paths),
        copy_methods=frozenset(bytes_by_method),
        deduplicated_tensors=plan.deduplicated_tensors,
        deduplicated_bytes=plan.deduplicated_bytes,
        externalized_tensors=plan.externalized_tensors,
        bytes_by_method=bytes_by_method,
        clone_eligible_bytes=stats.clone_eligible_bytes,
        stale_weights_files=tuple(plan.stale_weights_files),
        weights_format=plan.weights_format,
        index_file=plan.index[0] if plan.index is not None else None,
        unaligned_tensors=tuple(plan.unaligned_tensors),
        kept_inline_reasons=plan.kept_inline,
        kept_inline_names={reason: tuple(names) for reason, names in plan.kept_inline_names.items()},
        config_file=config_file,
    )


def check_config_path(update_config: object) -> str | None:
    """``update_config`` as an absolute path (None: no config to update)."""
    if update_config is None:
        return None
    if not isinstance(update_config, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"update_config must be a path to a config.json, got {type(update_config).__name__} {update_config!r}."
        )
    return os.path.abspath(os.fspath(update_config))


def add_config_update(contract: WritePlan, config_path: str, counts: dict[str, int]) -> None:
    """Add the updated ``config.json`` to ``contract`` (a planned file of the same transaction, re-read under the
    folder lock); ``counts``: each model's ``use_external_data_format`` by file name."""
    folder = os.path.dirname(contract.model_paths[0])
    update = plan_config_update(config_path, counts, folder, contract.writer)
    contract.files.append(update.planned)
    contract.source_checks.append(update.check)
    logger.info("%s: transformers.js_config.use_external_data_format = %s", config_path, update.value)


def removed_after(plan: WritePlan) -> list[str]:
    """The files of ``plan.removals`` the publication deleted: those the contract let go under the folder lock
    (:attr:`WritePlan.removable`) that are gone now (one replaced since, by another identity, stayed)."""
    return [path for path in plan.removable if not os.path.lexists(path)]


def _log(plan: AlignPlan, result: AlignResult, delete_stale: bool) -> None:
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
    if result.removed_files:
        logger.info("removed %d earlier file(s): %s", len(result.removed_files), ", ".join(result.removed_files))
    if result.stale_weights_files and not delete_stale:  # with it, the contract warned about each one it kept
        # Not ours to delete unasked: another model may use them. Naming them is the least we owe the user.
        logger.warning(
            "%s does not reference %d file(s) left by an earlier run at this destination, not deleted: %s",
            plan.dst_onnx_path,
            len(result.stale_weights_files),
            ", ".join(result.stale_weights_files),
        )


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
    chunk_size: int | None,
    *,
    align_threshold: int,
    max_shard_size: int | None,
    dedup: bool,
    size_threshold: int | None,
    durable: bool,
    progress: ProgressCallback | None,
    allow_outside_folder: bool,
    weights_format: WeightsFormat,
    shard_names: ShardNames,
    replace_shared: bool,
    overwrite: bool,
    delete_stale: bool,
    update_config: PathLike | None,
) -> AlignResult:
    """Both aligners (each passes every parameter of its public signature by name): validate, plan, execute the
    plan in ``mode`` (read everything first when ``in_memory``), then publish.

    ``chunk_size`` is None in memory (dedup then compares through 1 MiB buffers).

    The transaction never sweeps away a file this job reads (``keep``): a source may be named like a dead writer's
    temp file of a destination.
    """
    if mode == "streaming":
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
    options = WriteOptions(
        check_bool("replace_shared", replace_shared),
        check_bool("overwrite", overwrite),
        check_bool("allow_outside_folder", allow_outside_folder),
    )
    check_bool("delete_stale", delete_stale)
    config_path = check_config_path(update_config)
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
    if delete_stale:
        contract.removals = list(plan.stale_weights_files)
    if config_path is not None:
        hint = "pass shard_names='transformers.js' (--shard-names transformers.js) and no other weights name"
        counts = model_counts([(plan.dst_onnx_path, plan.weights_paths)], contract.writer, hint)
        add_config_update(contract, config_path, counts)
    result = execute(
        contract,
        lambda stats: aligned_result(plan, stats, config_path),
        durable=durable,
        chunk_size=chunk_size or DEFAULT_CHUNK_SIZE,
        progress=progress,
        in_memory=mode == "in_memory",
    )
    record_removed(result, removed_after(contract))
    _log(plan, result, delete_stale)
    return result


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
    delete_stale: bool = False,
    update_config: PathLike | None = None,
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
        shard_names: how weights files are named (:mod:`onnx_light_ref.io._plan.shard_names`): None (ours: ``W``,
            ``W.1``...; ``"hf"`` for safetensors), ``"hf"`` (``model-00001-of-0000N.data``) or
            ``"transformers.js"`` (``model.onnx_data``, ``model.onnx_data_1``...; at most 100 files).
        replace_shared: replace an existing weights file even when another model references it (a ``.onnx``, in
            any case, of its folder or of an ancestor folder, through external data or ``DelayedInitializer``
            filenames): that model then computes with the new bytes. False (default) refuses with
            ``SharedWeightsError`` naming the other models.
        overwrite: replace existing files the destination does not own (anything but the ``.onnx``, the files the
            previous ``.onnx`` references and its own leftovers: e.g. a PyTorch ``model.safetensors`` where the
            safetensors weights would go). False (default) refuses with ``ExistingFileError`` naming them.
        delete_stale: once the new model is published, delete the files an earlier run left at this destination
            that it no longer references (``stale_weights_files``: ``W.3`` after a run with fewer shards), through
            the writer contract's guard: a file another model uses (or may: a ``.onnx`` near it cannot be read), one
            the destination does not own or one this job reads is kept, with a warning naming why. The deleted ones
            are ``result.removed_files``; nothing is deleted when the run is refused or fails before its commit.
        update_config: a transformers.js model's ``config.json`` (it must exist): the exact
            ``use_external_data_format`` the written model needs (its number of ``DST_data``, ``DST_data_1``...
            files) is stored in its ``transformers.js_config``, under the model's file name (``{"model.onnx": 3}``;
            ``docs/safetensors.md`` says how an existing entry changes); every other key keeps its place and value.
            The config is a file of the same transaction as the model and its weights. Needs the files named as
            transformers.js fetches them (``shard_names="transformers.js"``, default weights path); else
            ``ValueError`` before anything is written. ``result.config_file`` names it.

    Returns:
        An :class:`~onnx_light_ref.io._results.AlignResult`: an ``int`` equal to the bytes of all weights files,
        padding included (0, and no weights file, when no tensor is external), which also carries the tensor
        counts, payload bytes, padding, weights files, dedup and externalization counts, how bytes moved, and
        the files named like further shards that an earlier run left at the destination (``stale_weights_files``:
        not referenced by the new ``.onnx`` and still there; also logged as a warning) and, with ``delete_stale``,
        the ones deleted (``removed_files``).

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type), an option
            the format refuses, more than 100 files with ``shard_names="transformers.js"``, ``update_config`` with
            weights files transformers.js does not fetch by count.
        ConfigFileError: (a ``ValueError``) ``update_config`` names a file that is not a UTF-8 JSON object, or whose
            ``transformers.js_config`` has an entry of another type, or that changed while the run worked.
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

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``model.onnx`` (offsets multiples of 4096)
        packed, then sharded for a hub:

        >>> import os
        >>> from onnx_light_ref import align_external_data_streaming
        >>> int(align_external_data_streaming("model.onnx", "packed.onnx", alignment=0))
        1014784
        >>> result = align_external_data_streaming("model.onnx", "hub.onnx", max_shard_size=600_000, shard_names="hf")
        >>> [os.path.basename(path) for path in result.weights_files]
        ['hub-00001-of-00002.data', 'hub-00002-of-00002.data']
    """
    return _align("streaming", **locals())  # every parameter, by name (nothing else is local yet)


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
    delete_stale: bool = False,
    update_config: PathLike | None = None,
) -> AlignResult:
    """Same result as :func:`align_external_data_streaming`, but every payload is read into memory first.

    This is what ``onnx.load(..., load_external_data=True)`` followed by an aligned save costs: peak memory grows
    with the weights (the ``.onnx`` is parsed whole, inline payloads included). Useful when the weights are small,
    and as the byte-for-byte oracle of the streaming version: same options, same ``.onnx`` and weights bytes.

    Its parameters are :func:`align_external_data_streaming`'s without ``chunk_size``: the same names, defaults,
    checks and meaning, and the same bytes written. Only these differ:

    Args:
        dedup: candidates are compared through two 1 MiB buffers.
        progress: called as ``progress(done_bytes, total_bytes)`` while bytes are written (after every payload was
            read).

    Returns:
        An :class:`~onnx_light_ref.io._results.AlignResult`, as :func:`align_external_data_streaming` returns
        (``copy_methods`` is ``{"pread_pwrite"}`` when bytes moved).

    Raises:
        The exceptions of :func:`align_external_data_streaming`, for the same reasons; also ``ExternalDataError``
        for a source truncated while it was read.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, the same bytes as the streaming aligner:

        >>> from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming
        >>> result = align_external_data_in_memory("model.onnx", "in_memory.onnx", alignment=256)
        >>> _ = align_external_data_streaming("model.onnx", "streamed.onnx", alignment=256)
        >>> open("in_memory.onnx.data", "rb").read() == open("streamed.onnx.data", "rb").read()
        True
        >>> result.copy_methods
        frozenset({'pread_pwrite'})
    """
    return _align("in_memory", chunk_size=None, **locals())  # every parameter, by name (nothing else is local yet)
