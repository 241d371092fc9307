"""Align a family of models into one folder over one set of weights files, each distinct payload stored once.

Exporters write families that hold the same weights under different names: a decoder and a decoder-with-past, an
encoder-decoder pair sharing embeddings, task heads over one backbone. :func:`align_models` writes
``<folder>/<basename of each source>`` and one set of aligned (optionally sharded, safetensors) weights files that
every member points into: each distinct payload once, found by comparing bytes as ``dedup=True`` does inside one
model (tensor names and owning model do not matter).

It reads validate → plan → execute, like the aligner it is built from: :mod:`~onnx_light_ref.io._plan.family_plan`
walks every source (metadata only) and lays the payloads out with the aligner's own planning functions; the family
is one :class:`~onnx_light_ref.io._write.contract.WritePlan` of the writer contract (every member with its sites, the
shared weights set, every source), whose names are checked by :func:`~onnx_light_ref.io._write.contract.check_names`
before any weight byte is read, then handed to :func:`~onnx_light_ref.io._write.execute.execute` (every rule checked
on the whole plan before the first byte and again under the folder lock right before the first move; bytes copied
file to file through the copy engine, reflinks kept, memory bounded by one chunk; the weights files and every member
published as one transaction). This module decides no rule itself (only the members' names: two sources with one
basename would be one output), never modifies a source file and never deletes a file it did not create.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable, Mapping

import onnx

from onnx_light_ref.io._align import add_config_update, check_config_path, removed_after, warn_unaligned, write_plan
from onnx_light_ref.io._arguments import (
    ArgumentTypeError,
    PathLike,
    WeightsFormat,
    check_bool,
    check_int,
    check_weights_file,
)
from onnx_light_ref.io._plan.align_plan import LayoutOptions, check_layout_options
from onnx_light_ref.io._plan.family_plan import FamilyPlan, default_family_weights, lay_out_family, walk_family
from onnx_light_ref.io._plan.member_names import member_sources
from onnx_light_ref.io._plan.shard_names import ShardNames
from onnx_light_ref.io._plan.sites import SITE_INLINE, iter_sites
from onnx_light_ref.io._read.sharing import model_references, scan_users
from onnx_light_ref.io._results import FamilyMember, FamilyResult, SharedTensor, record_removed, summarize_names
from onnx_light_ref.io._transformers_js import model_counts
from onnx_light_ref.io._write.contract import PlannedFile, ShardSet, WriteOptions, check_names
from onnx_light_ref.io._write.copy_engine import CopyStats, ProgressCallback
from onnx_light_ref.io._write.execute import execute
from onnx_light_ref.io._write.ownership import ReferenceCache
from onnx_light_ref.io._write.publish import is_publisher_file

logger = logging.getLogger(__name__)

_DEFAULT_CHUNK = 4 * 1024 * 1024  # as the streaming aligner: bytes per copy call, and each dedup compare buffer
_WRITER = "align_models"
_RENAME_HINT = "another weights name (weights_name / --weights) or another folder"
_SHARED_SET_HINT = (
    "a set of weights files shared by several members cannot be loaded by count: write each member with align "
    "(its own files), or name the weights after the one member holding external tensors (weights_name / --weights)"
)


def align_models(
    src_onnx_paths: Iterable[PathLike | tuple[PathLike, str]] | Mapping[PathLike, str],
    dst_folder: PathLike,
    *,
    weights_name: PathLike | None = None,
    alignment: int = 4096,
    align_threshold: int = 0,
    max_shard_size: int | None = None,
    shard_names: ShardNames = None,
    weights_format: WeightsFormat = "onnx",
    size_threshold: int | None = None,
    durable: bool = True,
    progress: ProgressCallback | None = None,
    allow_outside_folder: bool = False,
    replace_shared: bool = False,
    overwrite: bool = False,
    chunk_size: int = _DEFAULT_CHUNK,
    delete_stale: bool = False,
    update_config: PathLike | None = None,
) -> FamilyResult:
    """Write a family of models into ``dst_folder`` over one set of weights files, each distinct payload once.

    Each source becomes ``<dst_folder>/<its name>`` (its file name, or the name it is given); all of them point into
    the same aligned weights files, which hold every distinct payload of the family once: payloads are compared byte
    for byte (equal lengths, then samples, digests and the bytes themselves, as ``dedup=True`` does inside one
    model), whatever the tensors' names and whichever member owns them. Sources may live in different folders and
    share nothing on disk. Weight bytes go file to file through the kernel (reflinks kept), never through memory
    beyond one ``chunk_size`` buffer; every check passes and free space is reserved before the first byte is
    written.

    The family is one transaction: the weights files, then every member, are published under the folder's lock;
    a process killed at any system call leaves every member loadable and computing its previous or its new values;
    a failure that raises an ``OSError`` leaves every member as it was, and one that leaves a member new is a
    ``PublishedWithErrorsError`` saying which members are new. Every rule of the writer contract applies
    (``docs/safety.md#glossary``). Re-running over the same folder with the same member names replaces the family as
    a whole, also when the new weights files take names the previous members read: no member ever reads new bytes
    through old offsets (``docs/align_models.md#one-transaction-for-the-family``).

    Args:
        src_onnx_paths: the members' source models (at least one), each a path (the member keeps its file name) or
            a ``(path, name)`` pair naming the member (every exporter writes ``model.onnx``:
            ``[("a/model.onnx", "decoder_model.onnx"), ("b/model.onnx", "decoder_with_past_model.onnx")]``), or a
            mapping ``{path: name}``. No two members with one name. Their files are read, never modified.
        dst_folder: the folder to write; it must exist. A source inside it that the run would replace is refused.
        weights_name: the (first) weights file, relative to ``dst_folder`` (or an absolute path inside it);
            default ``weights.data`` (``weights.onnx_data`` with ``shard_names="transformers.js"``,
            ``model.safetensors`` for safetensors). Shards are named from it as for the aligners.
        alignment: tensor offsets are multiples of it: a power of two, or 0/1 for packed (no padding).
        align_threshold: only payloads of at least this many bytes start aligned; smaller ones are packed. 0
            (default) aligns every payload.
        max_shard_size: at most this many bytes per weights file (a payload is never split). None: one file.
        shard_names: how the weights files are named: None (``W``, ``W.1``...), ``"hf"`` or ``"transformers.js"``.
        weights_format: ``"onnx"`` (raw files, default) or ``"safetensors"`` (each distinct payload under the name
            of its first tensor; a name another payload already took becomes ``<member file name>/<name>``).
        size_threshold: None (default) keeps inline tensors inline; an int moves every inline tensor of at least
            that many bytes that onnx's loader reads back into the shared weights (keep it at 1024 or more so that
            shape tensors stay inline: onnxruntime cannot read them from external data).
        durable: fsync every output and the folder (default); ``False``: same bytes, same atomic moves, no fsync.
        progress: called as ``progress(done_bytes, total_bytes)`` while bytes move.
        allow_outside_folder: follow symbolic links in the sources' data paths (trusted layouts only).
        replace_shared: replace an existing weights file even when another model references it (a ``.onnx``, in
            any case, of its folder or of an ancestor folder, that is not a member, through external data or
            ``DelayedInitializer`` filenames): that model then computes with the new bytes. False (default) refuses
            with ``SharedWeightsError`` naming the other models.
        overwrite: replace existing files the family does not own (anything but the members' ``.onnx``, the files
            their previous versions reference, files named after a member or like shards of the weights set, and
            what a killed run's journal names). False (default) refuses with ``ExistingFileError`` naming them.
        chunk_size: at most this many bytes per system call (an int >= 1); also each of the two buffers dedup
            compares with.
        delete_stale: once the family is published, delete the files of the folder no model uses any more
            (``stale_weights_files``: an earlier layout's shards, files the previous members referenced), through
            the writer contract's guard: a file another model uses (or may), one the family does not own or one
            this job reads is kept, with a warning naming why. The deleted ones are ``result.removed_files``;
            nothing is deleted when the run is refused or fails before its commit.
        update_config: a transformers.js ``config.json`` (it must exist): each member's exact
            ``use_external_data_format`` is stored in its ``transformers.js_config`` under the member's file name,
            in the same transaction (as for :func:`~onnx_light_ref.align_external_data_streaming`).
            transformers.js fetches a model's external data from files named after that model, so one set of
            weights files serves at most one member (named ``<member>_data...``: ``weights_name`` and
            ``shard_names="transformers.js"``) plus members without external tensors (count 0); any other family
            is refused with ``ValueError`` before anything is written.

    Returns:
        A :class:`~onnx_light_ref.FamilyResult`: an ``int`` equal to the bytes of all weights files
        (padding included) carrying each member's path and tensors, the weights files, the unique bytes, the bytes
        saved against storing each member separately, the shared tensors, the stale files left in the folder and,
        with ``delete_stale``, those deleted (``removed_files``).

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type), no source,
            more than 100 files with ``shard_names="transformers.js"``, ``update_config`` for members transformers.js
            cannot load by count. ``ConfigFileError`` (a ``ValueError``): the config cannot be updated (see the
            aligners).
        InvalidModelError: a source is not an ONNX model, or a result cannot be serialized.
        ExternalDataError: a malformed or out-of-bounds reference in a source (``UnsafeLocationError`` for an
            unsafe location or hard-linked source file; ``SafetensorsError`` for keys or data types safetensors
            refuses); ``DestinationConflictError`` for two sources with one basename, an output that is a source
            (a source inside ``dst_folder`` that the run would replace), another output, a directory or a name too
            long; ``ExistingFileError`` for existing files the family does not own, without ``overwrite``;
            ``SharedWeightsError`` for a weights file another model (not a member) uses, without
            ``replace_shared``, named in the message.
        FileNotFoundError: a source, a referenced file or ``dst_folder`` does not exist.
        OSError: the copy or the publication failed while no member is published (``ENOSPC`` before the first
            byte when the disk is too small; with ``durable``, an fsync error such as EIO): every member is its
            previous version.
        PublishedWithErrorsError: some or every member is published (``published_models``; ``previous_models``
            are still previous, each loadable), but a step after a commit failed: the fsync that makes it durable,
            removing the previous versions, or a move that could not be undone (no ``RENAME_EXCHANGE``). Its
            ``result`` is the ``FamilyResult``. Never an ``OSError``: see ``docs/durability.md``.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``model.onnx`` and its variant
        ``new_head.onnx`` (another head, the same 6 other weights) over one weights file:

        >>> import os
        >>> from onnx_light_ref import align_models
        >>> os.mkdir("family")
        >>> result = align_models([("model.onnx", "model.onnx"), ("new_head.onnx", "variant.onnx")], "family")
        >>> sorted(os.listdir("family")), result.saved_bytes
        (['model.onnx', 'variant.onnx', 'weights.data'], 993216)
    """
    sources, names = member_sources(src_onnx_paths)
    options = WriteOptions(
        check_bool("replace_shared", replace_shared),
        check_bool("overwrite", overwrite),
        check_bool("allow_outside_folder", allow_outside_folder),
    )
    check_int("chunk_size", chunk_size, minimum=1)
    check_bool("delete_stale", delete_stale)
    config_path = check_config_path(update_config)
    layout = check_layout_options(
        align_threshold,
        max_shard_size,
        False,
        size_threshold,
        durable,
        weights_format=weights_format,
        shard_names=shard_names,
    )
    folder = _destination_folder(dst_folder)
    weights = _weights_path(folder, weights_name, layout)
    plan = walk_family(
        sources,
        folder,
        weights,
        alignment=alignment,
        layout=layout,
        allow_outside_folder=allow_outside_folder,
        names=names,
    )
    parsed = _check_names(plan, options)  # the writer contract on the names known, before any weight byte is read
    lay_out_family(plan, chunk_size)
    contract = write_plan(plan.members, options, _WRITER, _RENAME_HINT)
    contract.parsed = parsed  # the previous members, parsed once while they do not change
    stale = _stale_files(plan)
    if delete_stale:
        contract.removals = stale
    if config_path is not None:
        files = [shard.path for shard in plan.shards]
        members = [
            (path, files if walk.moved else []) for path, walk in zip(plan.destinations, plan.walks, strict=True)
        ]
        add_config_update(contract, config_path, model_counts(members, _WRITER, _SHARED_SET_HINT))
    result = execute(
        contract,
        lambda stats: _result(plan, stats, stale, config_path),
        durable=durable,
        chunk_size=chunk_size,
        progress=progress,
    )
    record_removed(result, removed_after(contract))
    _log(result, delete_stale)
    return result


# ----------------------------------------------------------------------------------------------- arguments


def _destination_folder(dst_folder: object) -> str:
    if not isinstance(dst_folder, (str, os.PathLike)):
        raise ArgumentTypeError(f"dst_folder must be a path, got {type(dst_folder).__name__} {dst_folder!r}.")
    folder = os.path.abspath(os.fspath(dst_folder))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            errno.ENOENT, f"destination folder does not exist (or is not a folder): {folder!r}", folder
        )
    return folder


def _weights_path(folder: str, weights_name: object, layout: LayoutOptions) -> str:
    if weights_name is None:
        return os.path.join(folder, default_family_weights(layout.weights_format, layout.shard_names))
    if not isinstance(weights_name, (str, os.PathLike)):
        raise ArgumentTypeError(f"weights_name must be a path, got {type(weights_name).__name__} {weights_name!r}.")
    return check_weights_file("weights_name", os.path.join(folder, os.fspath(weights_name)))


# ---------------------------------------------------------------------------------------------------- checks


def _check_names(plan: FamilyPlan, options: WriteOptions) -> ReferenceCache:
    """The writer contract on what is known before the layout: every member's ``.onnx`` and the first weights file
    (the only names known before the payloads are compared and placed); the complete plan is checked again."""
    safetensors = plan.layout.weights_format == "safetensors"
    shard_set = ShardSet(plan.weights_base, plan.layout.shard_names, safetensors)
    weights = [PlannedFile(plan.weights_base, "weights", 0, shard_set=shard_set)]
    return check_names(_WRITER, plan.destinations, weights, dict(plan.source_files), options, _RENAME_HINT)


# -------------------------------------------------------------------------------------------------- results


def _stale_files(plan: FamilyPlan) -> list[str]:
    """Files of the folder that no model will use once the family is published (never deleted; the result names
    them): every scheme's leftovers of the shared weights set and of each member's own names (the layout's), and
    the files the members' previous versions reference that this run does not write and no other model uses (nor
    may use: a ``.onnx`` that cannot be read counts as using every file in its reach)."""
    written = {*plan.weights_outputs, *plan.destinations}
    previous: set[str] = set()
    for destination in plan.destinations:
        for reference in model_references(destination).values():
            path = os.path.normpath(os.path.join(os.path.dirname(destination), reference.location))
            # The publisher's own hidden files (a killed run's bridges) are its to sweep, not the user's to delete.
            if path not in written and not is_publisher_file(os.path.basename(path)) and os.path.isfile(path):
                previous.add(path)
    used: set[str] = set()
    if previous:
        scan = scan_users(previous, exclude=plan.destinations)
        used = {*scan.users, *scan.unreadable}  # a model that cannot be read may use any file in its reach
    return sorted({*plan.stale_weights_files, *(path for path in previous if path not in used)})


def _result(plan: FamilyPlan, stats: CopyStats, stale: list[str], config_file: str | None) -> FamilyResult:
    placement = plan.placement
    assert placement is not None
    owners: dict[int, set[int]] = {}
    for index in range(len(plan.walks)):
        for payload in plan.member_range(index):
            owners.setdefault(plan.first[payload], set()).add(index)
    shared = {payload for payload, members in owners.items() if len(members) > 1}
    users: dict[int, list[tuple[str, str]]] = {payload: [] for payload in sorted(shared)}
    members = []
    for index, (walk, member) in enumerate(zip(plan.walks, plan.members, strict=True)):
        labels = _moved_labels(walk.model, walk.sites)
        span = plan.member_range(index)
        for payload, label in zip(span, labels, strict=True):
            if plan.first[payload] in shared:
                users[plan.first[payload]].append((member.dst_onnx_path, label))
        distinct = {plan.first[payload] for payload in span}
        members.append(
            FamilyMember(
                walk.src_onnx,
                member.dst_onnx_path,
                walk.moved,
                sum(plan.payloads.lengths[payload] for payload in distinct),
                sum(1 for payload in span if plan.first[payload] in shared),
                walk.externalized,
                dict(walk.kept_inline),
                {reason: tuple(names) for reason, names in walk.kept_inline_names.items()},
            )
        )
    shared_tensors = [
        SharedTensor(
            plan.shards[placement.shards[payload]].path,
            placement.offsets[payload],
            plan.payloads.lengths[payload],
            tuple(found),
        )
        for payload, found in users.items()
    ]
    kept: dict[str, int] = {}
    for walk in plan.walks:
        for reason, count in walk.kept_inline.items():
            kept[reason] = kept.get(reason, 0) + count
    bytes_by_method: dict[str, int] = {method: count for method, count in stats.bytes_by_method.items() if count}
    return FamilyResult(
        plan.total_size,
        members=tuple(members),
        weights_files=tuple(shard.path for shard in plan.shards),
        unique_bytes=plan.unique_bytes,
        separate_bytes=sum(plan.separate_bytes(index) for index in range(len(plan.walks))),
        shared_tensors=tuple(shared_tensors),
        tensors=len(plan.payloads),
        deduplicated_tensors=placement.deduplicated_tensors,
        deduplicated_bytes=placement.deduplicated_bytes,
        externalized_tensors=sum(walk.externalized for walk in plan.walks),
        copy_methods=frozenset(bytes_by_method),
        bytes_by_method=bytes_by_method,
        clone_eligible_bytes=stats.clone_eligible_bytes,
        stale_weights_files=tuple(path for path in stale if os.path.lexists(path)),
        weights_format=plan.layout.weights_format,
        index_file=plan.index[0] if plan.index is not None else None,
        unaligned_tensors=tuple(placement.unaligned),
        kept_inline_reasons=kept,
        config_file=config_file,
    )


def _moved_labels(model: onnx.ModelProto, sites: bytearray) -> list[str]:
    """The label of every moved site of ``model`` (tensors, then ``DelayedInitializer`` nodes), in walk order."""
    return [site.label for site, kind in zip(iter_sites(model), sites, strict=True) if kind != SITE_INLINE]


def _log(result: FamilyResult, delete_stale: bool) -> None:
    logger.info(
        "wrote %d member(s) over %d weights file(s) %s: %d bytes (%d unique, %d saved against separate copies, "
        "%d shared tensors)",
        len(result.members),
        len(result.weights_files),
        ", ".join(result.weights_files),
        result,
        result.unique_bytes,
        result.saved_bytes,
        len(result.shared_tensors),
    )
    warn_unaligned(result.unaligned_tensors)
    if result.removed_files:
        logger.info("removed %d earlier file(s): %s", len(result.removed_files), summarize_names(result.removed_files))
    if result.stale_weights_files and not delete_stale:  # with it, the contract warned about each one it kept
        logger.warning(
            "%d file(s) of the folder are used by no model any more (an earlier run's), not deleted: %s",
            len(result.stale_weights_files),
            summarize_names(result.stale_weights_files),
        )
