"""Save a model variant that shares weights with a model already on disk, writing only the new weights.

A tensor that is already EXTERNAL is *reused*: its ``external_data`` entries go verbatim into the new ``.onnx`` and
no byte of its file is read or written. A tensor carrying inline ``raw_data`` that the writer contract's rule 2 lets
move (:mod:`~onnx_light_ref.io._plan.sites`: at least ``size_threshold`` bytes, loaded back by onnx, not a shape
tensor) is *new*: its bytes go to one secondary weights file at ``alignment``-multiple offsets and its proto is
pointed there.

Guarantees: every check (reused references resolvable, no tensor both inline and external, then the writer contract
of :mod:`~onnx_light_ref.io._write.contract` on the whole plan: the secondary file is not a reused file, not used by
another model, owned by the destination) happens before the first byte is written, and the contract again under the
folder lock before the first move (with the reused files: one replaced or truncated meanwhile stops the save,
nothing published); files are published as one
:class:`~onnx_light_ref.io._write.publish.OutputTransaction` (weights, then ``.onnx``); the caller's model is mutated
only once everything is written. If publication fails after the mutation and before the commit, the new tensors are
restored from the weights file, so on such an error the model is exactly as it was (and the transaction undoes the
weights rename when the ``.onnx`` rename fails); after the commit the model stays as published. The new weights are
never copied as a whole in memory: each tensor's bytes are written, then released. This module never writes to a
reused file.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field

import onnx

from onnx_light_ref.errors import DanglingReferenceError, ExternalDataError
from onnx_light_ref.io._arguments import ArgumentTypeError, PathLike, check_bool, check_int
from onnx_light_ref.io._plan.placement import Placement, ShardedLayout
from onnx_light_ref.io._plan.sites import SITE_EXTERNALIZED, SITE_INLINE, SITE_KEPT, SiteColumns, SitePolicy
from onnx_light_ref.io._read.alignment import validate_alignment
from onnx_light_ref.io._read.delayed_nodes import DelayedResolver, DelayedSite, iter_delayed
from onnx_light_ref.io._read.entries import is_external, parse_entry_int, read_entries
from onnx_light_ref.io._read.locations import (
    FileIdentity,
    LocationResolver,
    check_external_structure,
    check_location_syntax,
    expected_nbytes,
    file_identity,
    parse_external_data,
    typed_value_fields,
)
from onnx_light_ref.io._read.model_file import check_model_strings
from onnx_light_ref.io._read.walker import TensorSite, iter_tensors
from onnx_light_ref.io._results import SaveResult
from onnx_light_ref.io._write.contract import (
    LazyPayload,
    PlannedFile,
    PlannedModel,
    ReferencedFile,
    ShardSet,
    WriteOptions,
    WritePlan,
)
from onnx_light_ref.io._write.copy_engine import ProgressCallback
from onnx_light_ref.io._write.execute import execute

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _NewTensor:
    """A tensor whose inline bytes move to the secondary file."""

    site: TensorSite
    offset: int
    length: int


@dataclass(frozen=True)
class _SavePlan:
    dst_onnx: str
    secondary_path: str
    location: str
    new: list[_NewTensor]
    reused: int
    total_size: int
    kept_inline: dict[str, int] = field(default_factory=dict)  # by reason: see io/_plan/sites.py
    contract: WritePlan | None = None

    @property
    def payload_bytes(self) -> int:
        return sum(item.length for item in self.new)


def save_model_with_shared_external_data(
    model: onnx.ModelProto,
    dst_onnx_path: PathLike,
    alignment: int = 4096,
    *,
    location: str | None = None,
    size_threshold: int = 1024,
    progress: ProgressCallback | None = None,
    check_references: bool = True,
    durable: bool = True,
    allow_outside_folder: bool = False,
    replace_shared: bool = False,
    overwrite: bool = False,
) -> SaveResult:
    """Save ``model`` to ``dst_onnx_path``, writing only its inline tensors to a secondary weights file.

    EXTERNAL tensors are reused as they are (no byte of their files is read or written); each inline ``raw_data``
    tensor of at least ``size_threshold`` bytes moves to the secondary file at an ``alignment``-multiple offset.
    Every check happens before the first byte is written; the secondary file and then the ``.onnx`` appear
    atomically. ``model`` is mutated in place (new tensors become EXTERNAL) only after every file is written, and is
    restored if publication fails before the commit.

    Args:
        model: the variant to save; its EXTERNAL tensors must resolve from the destination folder.
        dst_onnx_path: the ``.onnx`` to write; its folder must exist.
        alignment: every new tensor offset is a multiple of it: a power of two, or 0/1 for packed.
        location: the secondary file's name relative to the destination folder (default ``<dst name>.data``); it
            must not be a reused file nor the ``.onnx``.
        size_threshold: tensors with fewer bytes stay inline (an int >= 0). The default, 1024, is onnx's own
            writer's: small tensors such as a Reshape ``shape`` stay inline, where onnxruntime needs them to infer
            shapes (it refuses to parse them from external data). ``0`` moves every inline ``raw_data`` tensor out.
            Tensors stored in typed fields (``float_data``...) always stay inline; so do tensors onnx's loader would
            not read back from external data (sparse tensors, function default attributes, ``training_info``) and
            shape tensors whatever their size (``docs/safety.md#glossary``, "kept inline"), counted in the
            result's ``kept_inline_tensors``.
        progress: called as ``progress(done_bytes, total_bytes)`` while new bytes are written.
        check_references: require every reused reference to resolve from the destination folder (inside it, file
            present, range within the file). ``False`` lets a reused file be missing (it may be written later) and
            writes such references as they are, but their syntax is checked either way (relative, no ``..``, strict
            numbers, known keys), and a reused file that exists must pass the loader rule all the same (no symlink,
            one hard link, range within the file).
        durable: fsync the outputs and their folder (default); ``False`` skips every fsync, same bytes.
        allow_outside_folder: with ``check_references``, follow symbolic links in the reused references' data
            paths (a trusted layout). Default: a reused file reached through a symbolic link dangles, as onnx's
            loader would refuse it.
        replace_shared: replace an existing secondary file even when another model references it (a ``.onnx`` of
            its folder or an ancestor folder, through external data or ``DelayedInitializer`` filenames); False
            (default) refuses with ``SharedWeightsError`` naming the other models.
        overwrite: replace an existing secondary file the destination does not own (not referenced by the
            previous ``dst_onnx_path``, not named after it); False (default) refuses with ``ExistingFileError``.

    Returns:
        A :class:`~onnx_light_ref.SaveResult`: an ``int`` equal to the secondary file size, padding
        included (0, and no file created, when nothing is new), which also carries the new and reused tensor
        counts, payload bytes, padding and the weights files written.

    Raises:
        TypeError: ``model`` is not an ``onnx.ModelProto``.
        ValueError: an invalid argument (``ArgumentTypeError``, also a ``TypeError``, for a wrong type).
        DanglingReferenceError: a reused reference does not resolve from the destination (with
            ``check_references``), or names a file that exists but breaks the loader rule (either way); or a reused
            file was replaced, truncated or removed between the plan and the publication (re-checked under the
            folder lock; nothing is published, ``model`` is unchanged).
        DestinationConflictError: the secondary file is the ``.onnx``, a reused file (also through a hard link) or
            where an unchecked reused reference lands, a directory, or a name too long; ``SharedWeightsError``: it
            exists and another model references it (without ``replace_shared``); ``ExistingFileError``: it exists
            and the destination does not own it (without ``overwrite``).
        ExternalDataError: a tensor both inline and EXTERNAL, an unsafe ``location`` (``UnsafeLocationError``),
            ``raw_data`` whose size disagrees with dims and data type, a new tensor holding both ``raw_data`` and
            typed values (``float_data``...).
        InvalidModelError: a string field (a tensor name, a location...) is not UTF-8; the model cannot be
            serialized (over protobuf's 2 GiB limit).
        FileNotFoundError: the destination folder does not exist.
        OSError: writing or publishing failed before the commit (with ``durable``, an fsync error such as EIO); the
            destination is then the previous model and ``model`` is unchanged.
        PublishedWithErrorsError: the variant is published (its ``result`` attribute is the ``SaveResult``) and
            ``model`` points at the new secondary file as on success, but a step after the commit failed: the fsync
            that makes it durable, or removing the previous versions (see ``docs/durability.md``).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, a variant of ``model.onnx`` with a new
        head bias, loaded without its weights:

        >>> import numpy as np, onnx
        >>> from onnx_light_ref import save_model_with_shared_external_data
        >>> model = onnx.load("model.onnx", load_external_data=False)
        >>> model.graph.initializer[7].CopyFrom(onnx.numpy_helper.from_array(np.zeros(16, np.float32), "head.bias"))
        >>> int(save_model_with_shared_external_data(model, "variant.onnx", size_threshold=0))  # the 64 new bytes
        64
        >>> [(entry.key, entry.value) for entry in model.graph.initializer[0].external_data][0]  # W0: shared
        ('location', 'model.onnx.data')
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto, got {type(model).__name__}.")
    step = validate_alignment(alignment)
    check_int("size_threshold", size_threshold)
    check_bool("check_references", check_references)
    check_bool("durable", durable)
    options = WriteOptions(
        check_bool("replace_shared", replace_shared),
        check_bool("overwrite", overwrite),
        check_bool("allow_outside_folder", allow_outside_folder),
    )
    check_model_strings(model)  # a name protobuf hands back as bytes would fail far from here, or be written out
    plan = _plan(
        model,
        os.path.abspath(os.fspath(dst_onnx_path)),
        location,
        step,
        size_threshold,
        check_references,
        options,
    )
    if plan.new and not plan.reused:
        _warn_nothing_shared(plan)
    result = SaveResult(
        plan.total_size,
        new_tensors=len(plan.new),
        reused_tensors=plan.reused,
        payload_bytes=plan.payload_bytes,
        weights_files=(plan.secondary_path,) if plan.new else (),
        kept_inline_reasons=plan.kept_inline,
    )
    assert plan.contract is not None
    execute(plan.contract, lambda _stats: result, durable=durable, progress=progress)
    logger.info(
        "saved %s: %d reused tensors, %d new tensors in %s (%d bytes)",
        plan.dst_onnx,
        plan.reused,
        len(plan.new),
        plan.location,
        plan.total_size,
    )
    return result


def _warn_nothing_shared(plan: _SavePlan) -> None:
    """Log that the save is a full copy: the model has no external tensor left to reuse.

    The usual slip is a model loaded with its weights (``onnx.load(path)`` reads every external tensor into memory
    and drops its reference); the save then succeeds and silently writes every byte again.
    """
    logger.warning(
        "nothing is shared: no tensor of the model is external, so all %d of them (%d bytes) are written to %s. A "
        "model loaded with its weights has no reference left to reuse: load the base model with "
        "onnx.load(path, load_external_data=False) so its tensors keep pointing at their files.",
        len(plan.new),
        plan.payload_bytes,
        plan.secondary_path,
    )


def _plan(
    model: onnx.ModelProto,
    dst_onnx: str,
    location: str | None,
    step: int,
    size_threshold: int,
    check_references: bool,
    options: WriteOptions,
) -> _SavePlan:
    """Classify every tensor, lay out the new ones, and hand the plan to the writer contract; writes nothing."""
    dst_dir = os.path.dirname(dst_onnx)
    if location is None:
        location = os.path.basename(dst_onnx) + ".data"
    elif not isinstance(location, str):
        raise ArgumentTypeError(f"location must be a str or None, got {type(location).__name__}.")
    # The rule every reader applies (onnx refuses any '..', a trailing '/' or '/.' names a folder...).
    check_location_syntax(location, tensor_name="<secondary weights file>")
    secondary_path = os.path.join(dst_dir, location)

    resolver = LocationResolver(dst_dir, allow_outside_folder=options.allow_outside_folder)
    policy = SitePolicy(model, size_threshold)
    reused = _Reused()
    new: list[_NewTensor] = []
    sites = SiteColumns()
    kept_inline: dict[str, int] = {}
    layout = ShardedLayout(step)  # every new blob aligned; a zero-length one at the end of the file (placement.py)
    placed: list[Placement] = []
    for site in iter_tensors(model):
        tensor = site.tensor
        if is_external(tensor):
            _check_reused(site, resolver, check_references, reused)
            sites.record(site, SITE_KEPT)
            continue
        decision = policy.decide(site, _raw_length(tensor, site.label) if tensor.HasField("raw_data") else None)
        if not decision.external:  # rule 2 of the writer contract: the one decision
            if decision.reason is not None:
                kept_inline[decision.reason] = kept_inline.get(decision.reason, 0) + 1
            sites.record(site, SITE_INLINE)
            continue
        length = _raw_length(tensor, site.label)
        _check_raw_only(tensor, site.label)
        placed.append(layout.place(length))
        new.append(_NewTensor(site, 0, length))
        sites.record(site, SITE_EXTERNALIZED)
    delayed: DelayedResolver | None = None
    for node in iter_delayed(model):  # a node reads a file as a reused tensor does: kept, checked the same way
        delayed = delayed or DelayedResolver(resolver.folder)
        _check_reused_node(node, delayed, check_references, reused)
        sites.record(node, SITE_KEPT)
    for item, where in zip(new, placed, strict=True):  # once all are placed: the end of the file is known
        item.offset = where.offset
        sites.place(secondary_path, item.offset, item.length)
    total = layout.total_size if new else 0
    files = []
    if new:
        writes = [(item.offset, _new_bytes(item)) for item in new]
        files.append(PlannedFile(secondary_path, "weights", total, writes=writes, shard_set=ShardSet(secondary_path)))
    contract = WritePlan(
        "save_model_with_shared_external_data",
        [PlannedModel(dst_onnx, model, sites, size_threshold, policy, restore=True)],
        files,
        options,
        referenced=_referenced(reused, dst_dir),
        rename_hint="another name (location=)",
    )
    # Checked now, and again under the folder lock right before the first move: a reused file another process
    # replaced or truncated meanwhile must stop the save, not leave the variant pointing at other bytes.
    contract.source_checks.append(
        functools.partial(_check_reused_unchanged, reused.seen, dst_dir, options.allow_outside_folder)
    )
    return _SavePlan(
        dst_onnx,
        secondary_path,
        location,
        new,
        reused.count,
        total,
        kept_inline,
        contract,
    )


@dataclass
class _Reused:
    """What the reused references point at: each location once, with the first tensor reading it, and the files
    the plan checked there (re-checked under the folder lock)."""

    count: int = 0
    locations: dict[str, str] = field(default_factory=dict)  # location -> first tensor (or node) reading it
    seen: dict[str, _SeenFile] = field(default_factory=dict)  # location -> the file the plan checked there


def _referenced(reused: _Reused, dst_dir: str) -> list[ReferencedFile]:
    """Every file the variant reads, for the writer contract: no output may be one, or land where one is read."""
    found = []
    for location, tensor in reused.locations.items():
        path = os.path.normpath(os.path.join(dst_dir, location))
        try:
            identity = file_identity(path)
        except OSError:  # e.g. a location through a regular file: unchecked references are written as they are
            identity = None
        seen = reused.seen.get(location)
        found.append(
            ReferencedFile(
                path,
                seen.size if seen is not None else None,
                identity=identity,
                exists=identity is not None,
                why=(
                    f"the file {location!r} that reused tensor {tensor!r} points to"
                    if identity is not None
                    else f"reused tensor {tensor!r} (location {location!r}) points from {dst_dir!r}"
                ),
            )
        )
    return found


def _check_reused_node(site: DelayedSite, resolver: DelayedResolver, check_references: bool, reused: _Reused) -> None:
    """A ``DelayedInitializer`` node of the variant reads its file from the destination folder, as a reused tensor
    does: the same checks (with ``check_references``, the file is there and holds the range)."""
    reused.count += 1
    if site.filename is None:
        raise DanglingReferenceError(
            f"{site.label!r} ({site.where}): its filename is missing or function-linked, so the file it reads cannot "
            "be checked from the destination; nothing was written."
        )
    if check_references or os.path.lexists(os.path.join(resolver.folder.path, site.filename)):
        try:
            file, _, _ = resolver.read_range(site)
        except (ExternalDataError, OSError) as exc:
            raise DanglingReferenceError(
                f"{site.label!r} would read a file that does not resolve from {resolver.folder.path!r}: {exc} Save "
                "the variant in the folder of the model that owns its weights, or pass check_references=False."
            ) from exc
        if not os.path.isabs(site.filename):
            reused.seen.setdefault(site.filename, _SeenFile(site.label, file.identity, file.size))
    reused.locations.setdefault(site.filename, site.label)


@dataclass(frozen=True, slots=True)
class _SeenFile:
    """A reused file as the plan saw it: re-checked under the folder lock right before the commit."""

    tensor: str
    identity: FileIdentity
    size: int


def _check_reused_unchanged(seen: dict[str, _SeenFile], dst_dir: str, allow_outside_folder: bool) -> None:
    """Refuse to publish when a reused file is no longer the one the plan checked: replaced (another device or
    inode), truncated (smaller than it was), gone, or now refused by the loader rule. The variant would point at
    other bytes, or at none; it is the writer contract's ``source_checks``, run under the folder lock."""
    if not seen:
        return
    resolver = LocationResolver(dst_dir, allow_outside_folder=allow_outside_folder)
    try:
        for location, then in seen.items():
            try:
                st = resolver.folder.stat_file(location, tensor_name=then.tensor, check_links=False)
            except (ExternalDataError, OSError) as exc:
                raise DanglingReferenceError(
                    f"reused tensor {then.tensor!r}: its file {location!r} changed after the save was planned "
                    f"({exc}); the variant would dangle: nothing was published."
                ) from exc
            now = FileIdentity(st.st_dev, st.st_ino)
            if now != then.identity or st.st_size < then.size:
                raise DanglingReferenceError(
                    f"reused tensor {then.tensor!r}: its file {location!r} was replaced or truncated after the save "
                    f"was planned (device/inode {then.identity.device}/{then.identity.inode}, {then.size} bytes "
                    f"then; {now.device}/{now.inode}, {st.st_size} bytes now); the variant would point at other "
                    "bytes: nothing was published."
                )
    finally:
        resolver.close()


def _raw_length(tensor: onnx.TensorProto, label: str) -> int:
    """Byte size of the inline data without copying it: protobuf hands out a new copy on every ``raw_data`` access
    (5 ms for 8 MiB). dims x dtype give it; :func:`_write_new_tensors` checks it against the bytes it writes."""
    expected = expected_nbytes(tensor, label=label)
    return expected if expected is not None else len(tensor.raw_data)


def _check_raw_only(tensor: onnx.TensorProto, label: str) -> None:
    """Refuse a new tensor that also holds typed values: moving its raw_data out would leave an EXTERNAL tensor with
    inline values, which onnx's checker, onnxruntime and every reader here refuse (and onnx's checker already refuses
    the inline tensor: one value field only)."""
    typed = typed_value_fields(tensor)
    if typed:
        raise ExternalDataError(
            f"tensor {label!r} holds its values twice, in raw_data and in {', '.join(typed)}: onnx allows one value "
            "field only. Clear one of them before saving; nothing was written."
        )


def _check_reused(site: TensorSite, resolver: LocationResolver, check_references: bool, reused: _Reused) -> None:
    """Validate one reused reference; with ``check_references=False`` only its file is allowed to be absent.

    The entries are read and checked by the same rules either way (known keys, UTF-8, strict numbers, the location
    syntax): a reference written as it is must still be one that onnx and onnxruntime load.
    """
    tensor = site.tensor
    reused.count += 1
    check_external_structure(tensor, label=site.label)
    dst_dir = resolver.base_dir
    location = ""
    if not check_references:
        entries = read_entries(tensor, label=site.label)
        location_text = entries.get("location")
        if location_text is None:
            raise ExternalDataError(f"reused tensor {site.label!r} has no external_data 'location'.")
        location = check_location_syntax(location_text, tensor_name=site.label)
        for key in ("offset", "length"):
            text = entries.get(key)
            if text is not None:
                parse_entry_int(text, label=site.label, key=key)
        expected_nbytes(tensor, label=site.label)  # negative dims: no size, whatever the file holds
    if check_references:
        try:
            ref = parse_external_data(tensor, resolver, label=site.label)
        except (ExternalDataError, OSError) as exc:  # OSError: also a location through a file (NotADirectoryError)
            raise DanglingReferenceError(
                f"reused tensor {site.label!r} would dangle from {dst_dir!r}: {exc} Save the variant in the folder of "
                "the model that owns its weights (locations must be relative, without '..'), or pass "
                "check_references=False to write the reference as it is."
            ) from exc
        location = ref.location
        if location not in reused.seen:
            reused.seen[location] = _SeenFile(site.label, ref.identity, ref.file_size)
    elif os.path.lexists(os.path.join(dst_dir, location)):
        _check_existing_unchecked(site.label, location, resolver)
    reused.locations.setdefault(location, site.label)
    if location not in reused.seen:
        path = os.path.join(dst_dir, location)
        with contextlib.suppress(OSError):
            st = os.stat(path)
            reused.seen[location] = _SeenFile(site.label, FileIdentity(st.st_dev, st.st_ino), st.st_size)


def _check_existing_unchecked(label: str, location: str, resolver: LocationResolver) -> None:
    """A reused file that exists passes the loader rule even with ``check_references=False`` (only missing files
    are allowed then): a symlink there, e.g. to the variant's own future secondary file, is followed by onnxruntime,
    which would read the new weights for the reused tensor, while onnx refuses the model."""
    try:
        resolver.folder.stat_file(location, tensor_name=label)
    except (ExternalDataError, OSError) as exc:  # UnsafeLocationError is an ExternalDataError
        raise DanglingReferenceError(
            f"reused tensor {label!r}: its location {location!r} names a file that exists in {resolver.base_dir!r} "
            f"but that loaders refuse or read otherwise ({exc}); with check_references=False only a file that is not "
            "there yet may be written as it is. Nothing was written."
        ) from exc


def _new_bytes(item: _NewTensor) -> LazyPayload:
    """The inline bytes of a new tensor, read from the proto when they are written (protobuf copies ``raw_data``
    on every access: one copy per tensor, released after its write)."""

    def read() -> bytes:
        raw = item.site.tensor.raw_data
        if len(raw) != item.length:
            raise ExternalDataError(
                f"tensor {item.site.label!r}: raw_data holds {len(raw)} bytes but dims "
                f"{list(item.site.tensor.dims)} and its data type need {item.length}; nothing was published."
            )
        return raw

    return LazyPayload(item.length, read)
