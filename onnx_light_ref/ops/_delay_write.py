"""``delay`` as a writer: a model's external initializers as ``ai.rt::DelayedInitializer`` nodes, written to a file.

:func:`~onnx_light_ref.ops._convert.delay_initializers` returns a proto; :func:`write_delayed_model` writes one
through the writer contract like every writer (validate → plan → :func:`~onnx_light_ref.io._write.execute.execute`).
It copies no weight byte: the destination's nodes (and the external initializers it keeps) read the source's data
files where they are, so each is a *kept* site of the plan and each data file a referenced file. A ``filename`` is
relative to the folder of the model that holds it, and the kernel confines it to that folder (no ``..``), as onnx's
loader confines ``location``; so every reference is rewritten relative to DST.onnx's folder, and a data file
DST.onnx could not reach (outside its folder, or through a symbolic link) is refused naming the node and the file,
before anything is written. Writing DST.onnx in SRC.onnx's folder (or a folder above it) always works; to put it
elsewhere, move the weights with ``align`` first. DST.onnx may be SRC.onnx (the model is parsed whole first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import onnx

from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.io._arguments import PathLike, check_bool
from onnx_light_ref.io._plan.sites import SITE_INLINE, SITE_KEPT, SiteColumns, iter_sites
from onnx_light_ref.io._read.delayed_nodes import DelayedResolver, DelayedSite
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.folder import ModelFolder
from onnx_light_ref.io._read.locations import FileIdentity, LocationResolver, parse_external_data
from onnx_light_ref.io._read.model_file import open_model_folder
from onnx_light_ref.io._write.contract import (
    PlannedModel,
    ReferencedFile,
    WriteOptions,
    WritePlan,
    location_for,
)
from onnx_light_ref.io._write.execute import execute
from onnx_light_ref.ops._convert import check_load_device, convert_planned, plan_delayed_initializers

_WRITER = "delay"


@dataclass(frozen=True)
class DelayResult:
    """What :func:`~onnx_light_ref.ops.write_delayed_model` wrote.

    Attributes:
        path: the ``.onnx`` written (absolute).
        delayed_tensors: initializers now ``DelayedInitializer`` nodes.
        delayed_bytes: the bytes those nodes read (from the source's data files, none copied).
        data_files: the files the written model reads (absolute), sorted.
        kept: initializers left as they were, by reason (``"graph input default"``, ``"below min_size"``,
            ``"data type"``, ``"named like an outer value"``), their names.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> import os
        >>> from onnx_light_ref.ops import write_delayed_model
        >>> result = write_delayed_model("model.onnx", "delayed.onnx", min_size=100)
        >>> result.delayed_tensors, result.delayed_bytes, result.kept
        (7, 1014720, {'below min_size': ('head.bias',)})
        >>> [os.path.basename(path) for path in result.data_files]
        ['model.onnx.data']
    """

    path: str
    delayed_tensors: int
    delayed_bytes: int
    data_files: tuple[str, ...]
    kept: dict[str, tuple[str, ...]] = field(default_factory=dict)


def write_delayed_model(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    load_device: str = "file",
    *,
    min_size: int = 0,
    portable: bool = False,
    durable: bool = True,
    replace_shared: bool = False,
    overwrite: bool = False,
) -> DelayResult:
    """Write ``dst_onnx_path``: ``src_onnx_path`` with its external initializers as ``DelayedInitializer`` nodes.

    The conversion is :func:`~onnx_light_ref.delay_initializers`'s (same nodes, same initializers kept); no weight
    byte is read or copied: the nodes read the source's data files where they are, named relative to DST.onnx's
    folder, which must reach them (write DST.onnx in SRC.onnx's folder or a folder above it; to put it elsewhere, move
    the weights with ``align`` first). Every rule of the writer contract applies (``docs/safety.md#glossary``); the
    ``.onnx`` appears atomically (fsynced with ``durable``), or nothing changes. The command line's ``delay``.

    Args:
        src_onnx_path: the model to convert (parsed without its weights; never modified, unless it is the
            destination).
        dst_onnx_path: the model to write; its folder must exist and reach every data file of the source (the
            source's folder, or a folder above it).
        load_device: ``"file"`` (each weight read at every run) or ``"cpu"`` (read once when the evaluator is built).
        min_size: initializers smaller than this many bytes stay initializers.
        portable: convert only the 14 element types onnx-light's C++ runtime reads (``delay_initializers``).
        durable: fsync the ``.onnx`` and its folder (default); ``False``: same bytes, atomic rename, no fsync.
        replace_shared: replace ``dst_onnx_path`` even when another model references it as a data file.
        overwrite: replace a ``dst_onnx_path`` that is not an ONNX model (nor named ``*.onnx``).

    Returns:
        A :class:`DelayResult`.

    Raises:
        ValueError: an invalid ``load_device`` or ``min_size``; an ``ai.rt`` opset import of another version.
        TypeError: ``portable`` (or another flag) is not a bool.
        UnsafeLocationError: a source reference escaping its folder; a data file DST.onnx's folder does not reach
            (named with the node or tensor reading it).
        ExternalDataError: a malformed or out-of-bounds reference in the source.
        FileNotFoundError: the source, one of its data files or the destination folder does not exist.
        DestinationConflictError, SharedWeightsError, ExistingFileError: the writer contract's refusals (nothing
            written).
        OSError: the publication failed before the commit (nothing published).
        PublishedWithErrorsError: DST.onnx is published, but a step after the commit failed.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> import onnx
        >>> from onnx_light_ref.ops import write_delayed_model
        >>> result = write_delayed_model("model.onnx", "delayed.onnx", load_device="cpu")
        >>> result.delayed_tensors, result.delayed_bytes
        (8, 1014784)
        >>> [node.op_type for node in onnx.load("delayed.onnx").graph.node][:2]
        ['DelayedInitializer', 'DelayedInitializer']
    """
    check_load_device(load_device)
    options = WriteOptions(check_bool("replace_shared", replace_shared), check_bool("overwrite", overwrite))
    check_bool("durable", durable)
    src = os.path.abspath(os.fspath(src_onnx_path))
    dst = os.path.abspath(os.fspath(dst_onnx_path))
    with open_model_folder(src) as folder:
        plan = plan_delayed_initializers(src, base_dir=folder, min_size=min_size, portable=portable)
        model = convert_planned(plan, load_device)
        sites, referenced = _relocate(model, folder, dst)
        contract = WritePlan(
            _WRITER,
            [PlannedModel(dst, model, sites)],
            [],
            options,
            referenced=list(referenced.values()),
            rename_hint="another DST.onnx",
        )
        kept = {
            reason: tuple(names)
            for reason, names in (
                ("graph input default", plan.kept_shadowed),
                ("below min_size", plan.kept_small),
                ("data type", plan.kept_dtype),
                ("named like an outer value", plan.kept_shadowing),
            )
            if names
        }
        result = DelayResult(
            dst,
            len(plan.delayed),
            sum(item.ref.length for item in plan.delayed),
            tuple(sorted(referenced)),
            kept,
        )
        return execute(contract, lambda _stats: result, durable=durable)


def _relocate(model: onnx.ModelProto, folder: ModelFolder, dst: str) -> tuple[SiteColumns, dict[str, ReferencedFile]]:
    """Point every reference of ``model`` (its external tensors, its ``DelayedInitializer`` nodes) at its file
    relative to DST.onnx's folder; return the sites (kept or inline) and the files they read."""
    tensors = LocationResolver(folder)
    nodes = DelayedResolver(folder)
    sites = SiteColumns()
    referenced: dict[str, ReferencedFile] = {}
    for site in iter_sites(model):
        if isinstance(site, DelayedSite):
            file, _, _ = nodes.read_range(site)
            what = f"DelayedInitializer node {site.label!r}"
            site.point_at(_location(dst, file.path, what), site.offset)
            path, size, identity = file.path, file.size, file.identity
        elif is_external(site.tensor):
            ref = parse_external_data(site.tensor, tensors, label=site.label)
            location = _location(dst, ref.path, f"external initializer {site.label!r}")
            for entry in site.tensor.external_data:
                if entry.key == "location":
                    entry.value = location
            stat = ref.file_stat
            path, size, identity = ref.path, stat.st_size, FileIdentity(stat.st_dev, stat.st_ino)
        else:
            sites.record(site, SITE_INLINE)
            continue
        sites.record(site, SITE_KEPT)
        referenced.setdefault(path, ReferencedFile(path, size, identity=identity, why=f"the file {path!r} it reads"))
    return sites, referenced


def _location(dst: str, path: str, what: str) -> str:
    """``path`` as DST.onnx names it, or a refusal naming the node or tensor that reads it."""
    try:
        return location_for(dst, path)
    except UnsafeLocationError:
        raise UnsafeLocationError(
            f"{_WRITER}: {what} reads {path!r}, which {dst!r} cannot reach: a DelayedInitializer filename (like an "
            "external data location) is relative to its model's folder and may not leave it or go through a "
            "symbolic link. Write DST.onnx in the source's folder or a folder above it, or move the weights with "
            "align first; nothing was written."
        ) from None
