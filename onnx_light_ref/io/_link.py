"""Link an ONNX model to an existing safetensors checkpoint: matching tensors point at its bytes, none copied.

:func:`link_external_data` reads the checkpoint's header(s) as hostile input
(:mod:`~onnx_light_ref.io._read.safetensors_header`: size caps, overflow, overlaps, holes, duplicate keys), then walks
the model: a tensor whose (mapped) name is a checkpoint key with the same data type *and* shape (byte size alone is not
enough) gets ``external_data`` pointing into the checkpoint file (``offset`` = the data section's start + the
tensor's begin); every other external tensor, and every inline one of at least ``size_threshold`` bytes, is written
to the model's own weights file, copied file to file by the copy engine (inline ones from memory). The checkpoint
must resolve inside the destination model's folder under the location rule (relative, no ``..``, no symlink unless
``allow_outside_folder``, one hard link), since loaders read external data only there: the index and every checkpoint
file are read through that folder's descriptor (:class:`~onnx_light_ref.io._read.folder.ModelFolder`), held from the
plan to the publication, and each checkpoint file's device, inode and size are checked again right before the ``.onnx``
is published (a checkpoint replaced meanwhile: typed error, nothing published). Nothing is written before every check
has passed; the weights file and the ``.onnx`` are published as one
:class:`~onnx_light_ref.io._write.publish.OutputTransaction`.

This module never writes to the checkpoint (a destination that is a checkpoint file is refused), never reads a
checkpoint tensor's bytes, and never modifies the caller's ``ModelProto`` (it works on a copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import onnx

from onnx_light_ref.errors import ExternalDataError, SafetensorsError, UnsafeLocationError
from onnx_light_ref.io._align import removed_after
from onnx_light_ref.io._arguments import PathLike, check_bool, check_int, check_weights_file
from onnx_light_ref.io._checkpoint_pairing import LinkPairingOptions, pair_for_link
from onnx_light_ref.io._plan.name_map import check_name_map, check_name_map_targets
from onnx_light_ref.io._plan.placement import Placement, ShardedLayout
from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._plan.shard_names import stale_candidates
from onnx_light_ref.io._plan.sites import (
    SITE_EXTERNALIZED,
    SITE_INLINE,
    SITE_KEPT,
    SITE_MOVED,
    SiteColumns,
    SitePolicy,
    may_sit,
)
from onnx_light_ref.io._read.alignment import validate_alignment
from onnx_light_ref.io._read.delayed_nodes import DelayedResolver, iter_delayed
from onnx_light_ref.io._read.dtype_sizes import packed_nbytes
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.folder import ModelFolder
from onnx_light_ref.io._read.locations import (
    FileIdentity,
    LocationResolver,
    check_not_hard_linked,
    expected_nbytes,
    file_identity,
    parse_external_data,
)
from onnx_light_ref.io._read.model_file import load_model_metadata, open_model_folder
from onnx_light_ref.io._read.safetensors_header import (
    SafetensorsEntry,
    is_packed,
    read_header,
    require_covered,
    safetensors_dtype,
)
from onnx_light_ref.io._read.sharing import file_key
from onnx_light_ref.io._read.walker import TensorSite, iter_tensors
from onnx_light_ref.io._results import LinkResult, record_removed, summarize_names
from onnx_light_ref.io._write.contract import (
    Payload,
    PlannedFile,
    PlannedModel,
    ReferencedFile,
    ShardSet,
    WriteOptions,
    WritePlan,
    location_for,
)
from onnx_light_ref.io._write.copy_engine import CopyStats, ProgressCallback
from onnx_light_ref.io._write.execute import execute

logger = logging.getLogger(__name__)

# An index.json lists names and file names only: a larger one is not a checkpoint index.
_MAX_INDEX_SIZE = 64 * 1024 * 1024
_DEFAULT_SIZE_THRESHOLD = 1024  # onnx.save's default: smaller inline tensors stay in the .onnx


@dataclass(frozen=True, slots=True)
class CheckpointFile:
    """One checkpoint file as its header was parsed: its location in the destination folder and what it was then."""

    location: str
    path: str  # the destination folder's path joined with the location: for messages, never reopened by it
    identity: FileIdentity
    size: int


@dataclass(frozen=True, slots=True)
class CheckpointTensor:
    """One checkpoint key: the file's location (relative to the destination folder) and the tensor's header entry."""

    location: str
    path: str
    data_start: int
    entry: SafetensorsEntry
    file: CheckpointFile


def read_checkpoint(
    checkpoint: PathLike, dst_onnx: str, *, folder: ModelFolder | None = None, allow_outside_folder: bool = False
) -> dict[str, CheckpointTensor]:
    """Every tensor of a ``.safetensors`` file or of a sharded set's ``*.safetensors.index.json``, by key.

    The index and every checkpoint file are opened relative to the destination folder's descriptor
    (:class:`~onnx_light_ref.io._read.folder.ModelFolder`), never by an absolute path: a folder or file swapped for a
    symbolic link cannot redirect the read.

    Args:
        checkpoint: the ``.safetensors`` file, or the index naming the shard files (relative to its folder).
        dst_onnx: the destination model: every checkpoint file must resolve inside its folder.
        folder: the destination folder, already held (opened and closed here otherwise).
        allow_outside_folder: when ``folder`` is not given: follow symbolic links (the Hugging Face cache).

    Returns:
        Key -> :class:`CheckpointTensor`.

    Raises:
        SafetensorsError: a malformed header or index (hostile input), a key in two files, an index naming a key its
            file lacks.
        UnsafeLocationError: a checkpoint file outside ``dst_folder``, through a symlink, or hard-linked.
        FileNotFoundError: a checkpoint file does not exist.
    """
    dst = os.path.abspath(os.fspath(dst_onnx))
    if folder is None:
        with ModelFolder.open(os.path.dirname(dst), allow_outside_folder=allow_outside_folder) as held:
            return read_checkpoint(checkpoint, dst, folder=held)
    path = os.path.abspath(os.fspath(checkpoint))
    files = _read_index(path, dst, folder) if path.endswith(".json") else {os.path.basename(path): None}
    base = os.path.dirname(path)
    tensors: dict[str, CheckpointTensor] = {}
    for name in sorted({os.path.join(base, f) for f in files}):
        for key, tensor in _read_file(name, dst, folder).items():
            if key in tensors:
                raise SafetensorsError(
                    f"checkpoint key {key!r} is in both {tensors[key].path!r} and {tensor.path!r}; which one to link "
                    "is ambiguous."
                )
            tensors[key] = tensor
    for file, keys in files.items():
        for key in keys or ():
            if key not in tensors or tensors[key].path != os.path.join(base, file):
                raise SafetensorsError(f"checkpoint index {path!r} maps {key!r} to {file!r}, whose header lacks it.")
    return tensors


def _location(path: str, dst_onnx: str, what: str) -> str:
    """``path``'s location relative to the destination folder (by name: the folder then opens it, confined)."""
    try:
        return location_for(dst_onnx, path)
    except UnsafeLocationError as exc:
        raise UnsafeLocationError(
            f"{what} {path!r} cannot be linked from {dst_onnx!r}: loaders read external data only inside the "
            f"model's folder ({exc})"
        ) from None


def _read_index(path: str, dst_onnx: str, folder: ModelFolder) -> dict[str, list[str] | None]:
    """Shard file name -> keys the index maps to it, from ``{"weight_map": {key: file}}``."""
    location = _location(path, dst_onnx, "checkpoint index")
    with folder.open_file(location, subject=f"checkpoint index {path!r}") as opened:
        if opened.size > _MAX_INDEX_SIZE:
            raise SafetensorsError(
                f"checkpoint index {path!r} holds {opened.size} bytes, above the {_MAX_INDEX_SIZE} limit."
            )
        text = _read_all(opened.fd, opened.size)
    try:
        document = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SafetensorsError(f"checkpoint index {path!r} is not a UTF-8 JSON index: {exc}") from None
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
        raise SafetensorsError(f"checkpoint index {path!r} has no 'weight_map' object of file names.")
    files: dict[str, list[str] | None] = {}
    for key, file in weight_map.items():
        files.setdefault(file, []).append(key)  # type: ignore[union-attr]
    return files


def _read_all(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (fewer if it shrank: the JSON parser then reports it)."""
    chunks: list[bytes] = []
    done = 0
    while done < size:
        chunk = os.pread(fd, size - done, done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _read_file(path: str, dst_onnx: str, folder: ModelFolder) -> dict[str, CheckpointTensor]:
    location = _location(path, dst_onnx, "checkpoint")
    with folder.open_file(location, subject=f"checkpoint file {path!r}") as opened:
        header = read_header(opened.fd, path, opened.size)
        file = CheckpointFile(location, path, opened.identity, opened.size)
    require_covered(header)
    return {
        key: CheckpointTensor(location, path, header.data_start, entry, file) for key, entry in header.entries.items()
    }


def _check_unchanged(files: Collection[CheckpointFile], folder: ModelFolder) -> None:
    """Refuse to publish when a checkpoint file is no longer the one whose header was parsed (device, inode, size)."""
    for file in files:
        try:
            with folder.open_file(file.location, subject=f"checkpoint file {file.path!r}") as opened:
                now = (opened.identity, opened.size)
        except (OSError, ExternalDataError) as exc:
            raise ExternalDataError(
                f"checkpoint file {file.path!r} changed after its header was read ({exc}); nothing was published."
            ) from exc
        if now != (file.identity, file.size):
            raise ExternalDataError(
                f"checkpoint file {file.path!r} was replaced or resized after its header was read (device/inode "
                f"{file.identity.device}/{file.identity.inode}, {file.size} bytes then; {now[0].device}/"
                f"{now[0].inode}, {now[1]} bytes now); the model would point at other bytes: nothing was published."
            )


def _matches(tensor: onnx.TensorProto, entry: SafetensorsEntry) -> bool:
    """Same data type and shape (a packed sub-byte tensor: U8 of exactly its packed bytes)."""
    data_type = tensor.data_type
    if safetensors_dtype(data_type) != entry.dtype:
        return False
    dims = tuple(tensor.dims)
    if not is_packed(data_type):  # the stored shape is the dims (never negative: a safetensors shape is not)
        return dims == entry.shape and packed_nbytes(data_type, math.prod(dims)) == entry.nbytes
    nbytes = expected_nbytes(tensor)
    return nbytes is not None and nbytes == entry.nbytes and (nbytes,) == entry.shape


@dataclass
class _LinkPlan:
    """Everything ``link`` decided before writing: what it links, what it copies where, and the contract's plan."""

    proto: onnx.ModelProto
    links: list[tuple[onnx.TensorProto, CheckpointTensor]]
    copies: list[tuple[onnx.TensorProto | None, CopyRange | bytes, Placement]]
    size: int
    mismatched: list[str]
    kept_inline: dict[str, int]
    stale: list[str]
    contract: WritePlan


def link_external_data(
    model: onnx.ModelProto | PathLike,
    checkpoint: PathLike,
    dst_onnx_path: PathLike,
    *,
    name_map: Mapping[str, str] | None = None,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    size_threshold: int = _DEFAULT_SIZE_THRESHOLD,
    chunk_size: int = 4 * 1024 * 1024,
    durable: bool = True,
    progress: ProgressCallback | None = None,
    allow_outside_folder: bool = False,
    replace_shared: bool = False,
    overwrite: bool = False,
    map_by_content: bool = False,
    transpose: bool = False,
    align_threshold: int = 0,
    delete_stale: bool = False,
) -> LinkResult:
    """Write ``dst_onnx_path`` so that every tensor found in ``checkpoint`` points at the checkpoint's bytes.

    One copy of the weights then serves safetensors loaders (PyTorch, the hub) and ONNX runtimes. A tensor is linked
    when its name (through ``name_map`` when given) is a checkpoint key with the same data type and the same shape,
    and it may be external data (an inline tensor: at least ``size_threshold`` bytes, where onnx's loader reads it
    back, not a shape tensor such as a ``Reshape`` ``shape``: ``docs/safety.md#glossary``, "kept inline"; a
    zero-length one only where its bytes would sit at the end of its file); no byte of it is copied. Every other
    external tensor, and every inline tensor that may move, goes to the model's own weights file (at
    ``alignment``-multiple offsets), copied file to file. A name found with another type or shape is not linked
    (counted in ``mismatched_tensors``, logged). ``verify_models(original, linked)`` proves the result holds the
    original tensors. Every rule of the writer contract (``docs/safety.md#glossary``) is checked before anything is
    written and again, under the folder lock, right before the ``.onnx`` is published.

    Args:
        model: the model: a path to a ``.onnx`` (its external data resolved from its folder) or a ``ModelProto``
            (never modified; external references resolved from the destination folder).
        checkpoint: a ``.safetensors`` file or a sharded set's ``*.safetensors.index.json``, inside the folder of
            ``dst_onnx_path``.
        dst_onnx_path: the model to write; its folder must exist.
        name_map: model tensor name -> checkpoint key, for names that differ (others are looked up as they are).
            Refused (``ValueError``, nothing written) when a name is no tensor of the model, a key is not in the
            checkpoint, or two model tensors would read one key (``docs/safetensors.md``).
        dst_weights_path: the model's own weights file; default ``<dst_onnx_path>.data``.
        alignment: offsets of the tensors written to the model's weights file: a power of two, or 0/1 for packed.
        size_threshold: inline tensors with fewer raw bytes stay inline, linked or not.
        chunk_size: at most this many bytes per copy system call.
        durable: fsync outputs and their folder (default); ``False`` skips every fsync.
        progress: called as ``progress(done_bytes, total_bytes)`` while the written tensors' bytes move.
        allow_outside_folder: trust the layout: follow symbolic links to the checkpoint and the model's data files
            (the Hugging Face cache: ``snapshots/<rev>/model.safetensors`` -> ``../../blobs/<sha>``). onnx's loader
            refuses such a link (onnxruntime follows it); refused by default.
        replace_shared: replace the model's own weights file even when another model references it (a ``.onnx``
            of its folder or an ancestor folder, through external data or ``DelayedInitializer`` filenames).
        overwrite: replace an existing file the destination does not own (anything but ``dst_onnx_path``, the files
            its previous version references and the files named after it).
        map_by_content: pair the tensors that names (and ``name_map``) leave by their bytes: a key of the same
            data type, shape and bytes (a streaming hash, then a byte comparison), for tied and renamed weights; also
            finds tensors that are a key's 2-D transpose (see ``transpose``). Reads the candidates' bytes once;
            ``result.pairings`` lists every pairing (``link --write-map`` writes them as a name map).
        transpose: with ``map_by_content``, replace each main-graph initializer found to be a key's transpose (of at
            least ``size_threshold`` bytes) by a ``Transpose`` node over an initializer linked to that key: an
            optimized export (torch's ``optimize=True``) then stores no weight twice. The outputs are bit-identical;
            runtimes compute the transpose when the session is created (``docs/safetensors.md`` measures it).
        align_threshold: tensors written to the model's weights file with fewer bytes are packed (no alignment
            padding); default 0: every one aligned. Linked tensors keep the checkpoint's offsets:
            ``result.unaligned_linked`` counts those of at least this size not at a multiple of ``alignment``.
        delete_stale: once the model is published, delete the files an earlier run left at this destination that
            it no longer references (``stale_weights_files``: its ``DST.onnx.data`` when every tensor is now linked),
            through the writer contract's guard (a file another model uses, or the destination does not own, is
            kept, with a warning naming why); the deleted ones are ``result.removed_files``.

    Returns:
        A :class:`~onnx_light_ref.LinkResult`: an ``int``, the bytes of the model's weights file
        (0 when every external tensor was linked), with ``linked_tensors``, ``linked_bytes``, ``written_tensors``,
        ``written_bytes``, ``mismatched_tensors``, ``checkpoint_files``, ``weights_files``,
        ``stale_weights_files`` (e.g. the ``DST.onnx.data`` an earlier run wrote, when nothing is written to it now),
        ``kept_inline_reasons``, ``pairings``, ``transposed_tensors``, ``transpose_candidates``,
        ``unaligned_linked`` and ``removed_files``.

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type), or a
            ``name_map`` that does not fit the model and the checkpoint.
        SafetensorsError: a malformed checkpoint header or index (hostile input refused before anything is written).
        UnsafeLocationError: the checkpoint is outside the destination folder, through a symlink (without
            ``allow_outside_folder``), or hard-linked; the weights file is outside the destination's folder.
        DestinationConflictError: an output is a checkpoint file, the checkpoint's index or a source, a directory,
            or a name too long; ``SharedWeightsError``: the weights file exists and another model references it
            (without ``replace_shared``); ``ExistingFileError``: an output exists and the destination does not own
            it (without ``overwrite``), e.g. ``dst_onnx_path`` naming a file that is not an ONNX model.
        ExternalDataError: a malformed or out-of-bounds reference in the model; a checkpoint file replaced or
            resized between its header's parse and the publication (nothing published).
        FileNotFoundError: the model, the checkpoint or a referenced file does not exist.
        OSError: the copy or the publication failed before the commit (with ``durable``, an fsync error such as
            EIO); the destination is then the previous model.
        PublishedWithErrorsError: the linked model is published (its ``result`` attribute is the ``LinkResult``),
            but a step after the commit failed: the fsync that makes it durable, or removing the previous versions
            (see ``docs/durability.md``).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, with a safetensors copy of the weights
        as the checkpoint:

        >>> from onnx_light_ref import align_external_data_streaming, link_external_data, verify_models
        >>> _ = align_external_data_streaming("model.onnx", "checkpoint.onnx", weights_format="safetensors")
        >>> result = link_external_data("model.onnx", "checkpoint.safetensors", "linked.onnx")
        >>> result.linked_tensors, int(result)  # every weight linked, none copied
        (8, 0)
        >>> verify_models("model.onnx", "linked.onnx").equal
        True
    """
    step = validate_alignment(alignment)
    threshold = check_int("size_threshold", size_threshold)
    check_int("chunk_size", chunk_size, minimum=1)
    check_bool("durable", durable)
    check_bool("delete_stale", delete_stale)
    pairing_options = LinkPairingOptions(
        check_bool("map_by_content", map_by_content),
        check_bool("transpose", transpose),
        threshold,
        chunk_size,
        check_int("align_threshold", align_threshold),
    )
    options = WriteOptions(
        check_bool("replace_shared", replace_shared),
        check_bool("overwrite", overwrite),
        check_bool("allow_outside_folder", allow_outside_folder),
    )
    mapping = check_name_map(name_map)
    dst_onnx = os.path.abspath(os.fspath(dst_onnx_path))
    dst_weights = (
        check_weights_file("dst_weights_path", dst_weights_path) if dst_weights_path is not None else dst_onnx + ".data"
    )
    location_for(dst_onnx, dst_weights)  # refuse a bad destination before reading anything
    # Held from the plan to the publication: every checkpoint read goes through it, and the re-check before the
    # commit opens the same names in the same folder.
    with contextlib.ExitStack() as held:
        dst_folder = held.enter_context(
            ModelFolder.open(os.path.dirname(dst_onnx), allow_outside_folder=options.allow_outside_folder)
        )
        checkpoint_path = os.path.abspath(os.fspath(checkpoint))
        checkpoint_tensors = read_checkpoint(checkpoint_path, dst_onnx, folder=dst_folder)
        if isinstance(model, onnx.ModelProto):
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
            src_folder, src = dst_folder, None
        else:
            src = os.path.abspath(os.fspath(model))
            src_folder = held.enter_context(open_model_folder(src, allow_outside_folder=options.allow_outside_folder))
            proto = load_model_metadata(src, folder=src_folder)
        check_name_map_targets(mapping, iter_tensors(proto), checkpoint_tensors)
        paired = pair_for_link(
            proto, LocationResolver(src_folder), checkpoint_tensors, dst_folder, mapping, pairing_options
        )
        mapping = paired.mapping
        plan = _plan_link(
            proto,
            src,
            LocationResolver(src_folder),
            checkpoint_path,
            checkpoint_tensors,
            mapping,
            (dst_onnx, dst_weights),
            (step, pairing_options.align_threshold),
            threshold,
            options,
        )
        plan.contract.source_checks.append(lambda: _check_unchanged(_checkpoint_files(checkpoint_tensors), dst_folder))
        if delete_stale:
            plan.contract.removals = list(plan.stale)
        if plan.copies and not plan.links:
            _warn_nothing_linked(dst_weights, [(t, item) for t, item, _ in plan.copies], checkpoint_tensors, mapping)
        checkpoint_names = sorted({found.path for found in checkpoint_tensors.values()})
        facts = paired.facts([found for _, found in plan.links], step, pairing_options.align_threshold)
        result = _write(plan, dst_weights, chunk_size, durable, progress, checkpoint_names, facts)
    record_removed(result, removed_after(plan.contract))
    _log(result, dst_onnx, delete_stale)
    return result


def _plan_link(
    proto: onnx.ModelProto,
    src: str | None,
    resolver: LocationResolver,
    checkpoint_path: str,
    checkpoint_tensors: Mapping[str, CheckpointTensor],
    mapping: Mapping[str, str],
    dst: tuple[str, str],
    alignment: tuple[int, int],
    threshold: int,
    options: WriteOptions,
) -> _LinkPlan:
    """Walk the model once: link, copy or keep each tensor (rule 2 deciding), lay the copies out; writes nothing."""
    dst_onnx, dst_weights = dst
    sources = _sources(src, dst_onnx, checkpoint_path, checkpoint_tensors)
    policy = SitePolicy(proto, threshold)
    links: list[tuple[onnx.TensorProto, CheckpointTensor]] = []
    copies: list[tuple[onnx.TensorProto | None, CopyRange | bytes]] = []
    mismatched: list[str] = []
    kept_inline: dict[str, int] = {}
    sites = SiteColumns()
    order: list[tuple[bool, int]] = []  # per placed site: linked (else copied), index into links or copies
    for site in iter_tensors(proto):
        tensor = site.tensor
        external = is_external(tensor)
        if site.sparse is not None:  # onnx's loader never loads sparse tensors' external data: left as they are
            sites.record(site, SITE_KEPT if external else SITE_INLINE)
            continue
        key = mapping.get(tensor.name, tensor.name)
        found = checkpoint_tensors.get(key) if key else None
        if found is not None and not _matches(tensor, found.entry):
            mismatched.append(site.label)
        elif found is not None and _linkable(site, found, policy, external):
            links.append((tensor, found))
            sites.record(site, SITE_MOVED if external else SITE_EXTERNALIZED)
            order.append((True, len(links) - 1))
            continue
        if external:
            ref = parse_external_data(tensor, resolver, label=site.label)
            check_not_hard_linked(ref)
            sources[ref.identity] = ref.path
            copies.append(
                (tensor, CopyRange(ref.path, ref.offset, 0, ref.length, ref.identity, ref.folder, ref.location))
            )
            sites.record(site, SITE_MOVED)
            order.append((False, len(copies) - 1))
            continue
        data = tensor.raw_data if tensor.HasField("raw_data") else None  # protobuf copies the bytes on each access
        decision = policy.decide(site, len(data) if data is not None else None)  # rule 2: the one decision
        if not decision.external:
            if decision.reason is not None:
                kept_inline[decision.reason] = kept_inline.get(decision.reason, 0) + 1
            sites.record(site, SITE_INLINE)
            continue
        assert data is not None
        if len(data) != expected_nbytes(tensor, label=site.label):
            raise ExternalDataError(
                f"tensor {site.label!r}: inline raw_data holds {len(data)} bytes, which its dims "
                f"{list(tensor.dims)} and data type do not match; refusing to write it."
            )
        copies.append((tensor, data))
        sites.record(site, SITE_EXTERNALIZED)
        order.append((False, len(copies) - 1))
    delayed = DelayedResolver(resolver.folder)
    for node in iter_delayed(proto):  # a node reads a range of a file: copied into the weights like a tensor's
        file, offset, length = delayed.read_range(node)
        sources[file.identity] = file.path
        copies.append((None, CopyRange(file.path, offset, 0, length, file.identity, file.folder, file.location)))
        sites.record(node, SITE_MOVED)
        order.append((False, len(copies) - 1))
    layout = ShardedLayout(*alignment)  # copies aligned from align_threshold on; zero-length ones at the end
    placed = [(tensor, item, layout.place(_length(item))) for tensor, item in copies]
    size = layout.total_size if copies else 0
    for linked, index in order:  # read once every copy is placed: a zero-length one's offset is the file's end
        if linked:
            found = links[index][1]
            sites.place(found.path, found.data_start + found.entry.begin, found.entry.nbytes)
        else:
            sites.place(dst_weights, placed[index][2].offset, _length(placed[index][1]))
    files = []
    if copies:
        shard_set = ShardSet(dst_weights)
        ranges = [
            dataclasses.replace(item, dst_offset=where.offset)
            for _, item, where in placed
            if isinstance(item, CopyRange) and item.length
        ]
        writes: list[tuple[int, Payload]] = [(at.offset, item) for _, item, at in placed if isinstance(item, bytes)]
        files.append(PlannedFile(dst_weights, "weights", size, ranges=ranges, writes=writes, shard_set=shard_set))
    contract = WritePlan(
        "link",
        [PlannedModel(dst_onnx, proto, sites, threshold, policy)],
        files,
        options,
        sources,
        referenced=[
            ReferencedFile(file.path, file.size, data_start, file.identity, location=file.location)
            for file, data_start in {(t.file, t.data_start) for t in checkpoint_tensors.values()}
        ],
        rename_hint="another name (dst_weights_path)",
    )
    stale = [
        path
        for path in stale_candidates(dst_onnx, dst_weights, [dst_weights] if copies else [])
        if file_key(path) not in sources
    ]
    return _LinkPlan(proto, links, placed, size, mismatched, kept_inline, stale, contract)


def _linkable(site: TensorSite, found: CheckpointTensor, policy: SitePolicy, external: bool) -> bool:
    """Rule 2 for a tensor that matches a checkpoint key: an inline one must be allowed to become external, and its
    bytes must sit where every loader reads them (a zero-length one only at the end of its file)."""
    if not external and not policy.decide(site, found.entry.nbytes).external:
        return False
    return may_sit(
        found.data_start + found.entry.begin, found.entry.nbytes, found.file.size, data_start=found.data_start
    )


def _sources(
    src: str | None, dst_onnx: str, checkpoint_path: str, checkpoint_tensors: Mapping[str, CheckpointTensor]
) -> dict[FileIdentity, str]:
    """The files ``link`` reads: the source ``.onnx`` (it may be replaced by the destination ``.onnx``, never by the
    weights file), the checkpoint's index and every checkpoint file."""
    sources: dict[FileIdentity, str] = {}
    if src is not None:
        src_identity = file_identity(src)
        if src_identity is not None and src_identity != file_identity(dst_onnx):
            sources[src_identity] = src
    with contextlib.suppress(OSError):
        index_identity = file_identity(checkpoint_path)
        if index_identity is not None:
            sources[index_identity] = checkpoint_path
    for file in _checkpoint_files(checkpoint_tensors):
        sources[file.identity] = file.path
    return sources


def _checkpoint_files(checkpoint_tensors: Mapping[str, CheckpointTensor]) -> list[CheckpointFile]:
    return list({tensor.file.location: tensor.file for tensor in checkpoint_tensors.values()}.values())


def _write(
    plan: _LinkPlan,
    dst_weights: str,
    chunk_size: int,
    durable: bool,
    progress: ProgressCallback | None,
    checkpoint_names: list[str],
    facts: Mapping[str, object],
) -> LinkResult:
    """Execute the plan: copy the written tensors, point every tensor at its place, publish (re-checked under the
    lock). The result is built before the publication, so that a failure after the commit still carries it."""

    def result(stats: CopyStats) -> LinkResult:
        return LinkResult(
            plan.size,
            linked_tensors=len(plan.links),
            linked_bytes=sum(found.entry.nbytes for _, found in plan.links),
            written_tensors=len(plan.copies),
            written_bytes=sum(stats.bytes_by_method.values()),
            mismatched_tensors=tuple(plan.mismatched),
            checkpoint_files=tuple(checkpoint_names),
            weights_files=(dst_weights,) if plan.copies else (),
            stale_weights_files=tuple(plan.stale),
            kept_inline_reasons=plan.kept_inline,
            **facts,  # type: ignore[arg-type]
        )

    return execute(plan.contract, result, durable=durable, chunk_size=chunk_size, progress=progress)


def _log(result: LinkResult, dst_onnx: str, delete_stale: bool) -> None:
    if result.mismatched_tensors:
        logger.warning(
            "%d tensor(s) named like a checkpoint key but of another data type or shape were written, not linked: %s",
            len(result.mismatched_tensors),
            ", ".join(result.mismatched_tensors),
        )
    if result.removed_files:
        logger.info("removed %d earlier file(s): %s", len(result.removed_files), ", ".join(result.removed_files))
    if result.stale_weights_files and not delete_stale:  # with it, the contract warned about each one it kept
        logger.warning(
            "%s does not reference %d file(s) left by an earlier run at this destination, not deleted: %s",
            dst_onnx,
            len(result.stale_weights_files),
            ", ".join(result.stale_weights_files),
        )
    logger.info(
        "linked %d tensor(s) (%d bytes) to the checkpoint, wrote %d tensor(s) (%d bytes) and %s",
        result.linked_tensors,
        result.linked_bytes,
        result.written_tensors,
        result.written_bytes,
        dst_onnx,
    )


def _warn_nothing_linked(
    dst_weights: str,
    copies: list[tuple[onnx.TensorProto | None, CopyRange | bytes]],
    checkpoint: Mapping[str, CheckpointTensor],
    mapping: Mapping[str, str],
) -> None:
    """Log that the link is a full copy: no tensor matched a checkpoint key, so every one is written.

    The usual cause is names that differ (``W0`` vs ``model.layers.0.w``); the call still succeeds (a full copy is a
    valid model), but it silently cost the whole checkpoint's size. A few names of each side help write the map.
    """
    logger.warning(
        "no tensor was linked: none of the model's names%s is a checkpoint key with the same data type and shape, "
        "so %s holds a full copy of the weights (%d tensors, %d bytes). Map the model's names to the checkpoint's "
        "keys with name_map= (command line: --map names.json). Model tensors: %s; checkpoint keys: %s.",
        " (through name_map)" if mapping else "",
        dst_weights,
        len(copies),
        sum(_length(item) for _, item in copies),
        summarize_names([tensor.name for tensor, _ in copies if tensor is not None]),
        summarize_names(sorted(checkpoint)),
    )


def _length(item: CopyRange | bytes) -> int:
    return len(item) if isinstance(item, bytes) else item.length
