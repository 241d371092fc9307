"""The writer contract: every writer describes what it will write as one :class:`WritePlan`, checked here.

A writer (both aligners in every format and shard scheme, the shared saver, ``undelay``, ``link``, ``run
--output-dir``; a multi-model writer the same way, with several destination models) fills a :class:`WritePlan`
before its first byte: its destination ``.onnx`` files (:class:`PlannedModel`, with every tensor site and where its
bytes will live), every file it creates or replaces (:class:`PlannedFile`, with its role), the files it reads
(``sources``) and points into without writing (``referenced``: a checkpoint), and the caller's options
(:class:`WriteOptions`). :func:`check_plan` runs every rule on it before anything is written;
:func:`recheck_plan` runs again what can change meanwhile, under the destination folders' lock, right before the
first move (writers pass it as the publisher's ``before_commit``). No writer decides any of these in its own body:

* destinations (:mod:`~onnx_light_ref.io.write.destinations`): each file a model points into is inside the model's
  real folder and reached through no symlink; no output is a source, another output, a directory, or a name longer
  than its folder allows;
* rule 1, never silently change what another model computes (:mod:`~onnx_light_ref.io.read.sharing`): an existing
  file about to be replaced that another model (in its folder or any ancestor folder, any case of ``.onnx``, through
  ``external_data`` or ``DelayedInitializer`` filenames) references is refused (``SharedWeightsError``) unless
  ``replace_shared``; and every file such a model references is returned by :func:`recheck_plan`, so that the
  publication never deletes it;
* rule 2, a tensor is external only where onnx loads it back and sits where every loader reads it
  (:mod:`~onnx_light_ref.io.plan.sites`): every site the plan externalizes is one :meth:`SitePolicy.decide
  <onnx_light_ref.io.plan.sites.SitePolicy.decide>` allows, and every placed site passes
  :func:`~onnx_light_ref.io.plan.sites.may_sit` (a writer violating it is a bug: ``AssertionError``, nothing written);
* rule 3, replace only what the destination owns (:mod:`~onnx_light_ref.io.write.ownership`): any other existing
  file is refused, all of them named at once (``ExistingFileError``), unless ``overwrite``; a file rule 1 found
  users for is rule 1's alone (``replace_shared`` is the caller's word on it);
* rule 4, format limits: every safetensors file the plan writes has a header the ``safetensors`` library opens
  (:data:`~onnx_light_ref.io.read.safetensors_header.MAX_HEADER_SIZE`; the layout refuses earlier while planning,
  this re-checks what every writer will write), plus a writer's own :attr:`WritePlan.format_checks`;
* rule 5, report what happened: the publisher's (:mod:`~onnx_light_ref.io.write.publish`), with the identities
  :func:`recheck_plan` returns.

This module stats, lists folders and parses ``.onnx`` metadata; it never writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import onnx

from onnx_light_ref.errors import ExistingFileError, SafetensorsError, SharedWeightsError
from onnx_light_ref.io.plan.sites import (
    SITE_EXTERNALIZED,
    SITE_INLINE,
    SITE_KEPT,
    SITE_MOVED,
    SiteColumns,
    SitePolicy,
    placement_problem,
)
from onnx_light_ref.io.read.delayed_names import DELAYED_OP_TYPE
from onnx_light_ref.io.read.locations import FileIdentity
from onnx_light_ref.io.read.safetensors_header import MAX_HEADER_SIZE, SIZE_PREFIX
from onnx_light_ref.io.read.sharing import ModelReference, SharingScan, UnreadableModel, scan_users
from onnx_light_ref.io.read.walker import iter_tensors
from onnx_light_ref.io.write.destinations import DestinationKey, check_output_files, weights_location
from onnx_light_ref.io.write.ownership import Ownership, ReferenceCache, ShardSet

__all__ = [
    "SITE_EXTERNALIZED",
    "SITE_INLINE",
    "SITE_KEPT",
    "SITE_MOVED",
    "FileRole",
    "PlannedFile",
    "PlannedModel",
    "ReferencedFile",
    "ShardSet",
    "SiteColumns",
    "WriteOptions",
    "WritePlan",
    "check_plan",
    "location_for",
    "recheck_plan",
]

FileRole = Literal["model", "weights", "index", "array"]
"""What a written file is: a destination ``.onnx``, a weights file, a safetensors set's index, a ``run`` output."""


@dataclass(frozen=True, slots=True)
class PlannedFile:
    """A file the plan creates or replaces.

    ``size``: its final size when known before writing (weights files), for rule 2's placement checks;
    ``data_start``: the first byte a tensor may use (a safetensors header's length); ``shard_set``: the weights set
    it belongs to (rule 3 recognizes that set's leftovers); ``format``: ``"onnx"``, ``"raw"``, ``"safetensors"``,
    ``"json"`` or ``"npy"`` (rule 4's checks select by it).
    """

    path: str
    role: FileRole
    size: int | None = None
    data_start: int = 0
    shard_set: ShardSet | None = None
    format: str = "raw"


@dataclass(frozen=True, slots=True)
class ReferencedFile:
    """A file a destination model will point into that the plan does not write (a checkpoint file)."""

    path: str
    size: int | None = None
    data_start: int = 0


@dataclass
class PlannedModel:
    """A destination ``.onnx``: its path, the model that will be written (walked for rule 2, in the order of
    :attr:`sites`) and the writer's ``size_threshold`` for the sites it externalizes; ``policy``: the
    :class:`~onnx_light_ref.io.plan.sites.SitePolicy` the writer decided with, if it has one (its analysis of the
    model is reused, its decisions are taken again)."""

    path: str
    proto: onnx.ModelProto | None = None
    sites: SiteColumns | None = None
    size_threshold: int | None = None
    policy: SitePolicy | None = None


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """The caller's opt-ins: replace files other models use (rule 1), replace files the destination does not own
    (rule 3), follow symbolic links in the sources' data paths."""

    replace_shared: bool = False
    overwrite: bool = False
    allow_outside_folder: bool = False


@dataclass
class WritePlan:
    """What one write will do, complete before its first byte (module docstring).

    ``sources`` are the files the job reads, by identity (the outputs must be none of them), ``source_names`` the
    names it will read that do not exist yet (an unchecked reused reference): no output may land there either.
    ``rename_hint`` names the writer's way to choose another output name in messages (``dst_weights_path /
    --weights``, ``--output-dir``...). ``source_checks`` re-validate sources under the lock (``link``'s checkpoint
    unchanged); ``format_checks`` are rule 4's checks, run by :func:`check_plan`. ``protected`` is set by each check:
    identities of every file another visible model references.
    """

    writer: str
    models: list[PlannedModel]
    files: list[PlannedFile]
    sources: dict[FileIdentity, str] = field(default_factory=dict)
    source_names: dict[DestinationKey, str] = field(default_factory=dict)
    options: WriteOptions = field(default_factory=WriteOptions)
    referenced: list[ReferencedFile] = field(default_factory=list)
    rename_hint: str = "another name"
    source_checks: list[Callable[[], None]] = field(default_factory=list)
    format_checks: list[Callable[[WritePlan], None]] = field(default_factory=list)
    protected: frozenset[FileIdentity] = frozenset()
    parsed: ReferenceCache = field(default_factory=dict, repr=False)  # destination models parsed by the checks

    @property
    def model_paths(self) -> list[str]:
        return [model.path for model in self.models]


def location_for(dst_onnx: str, path: str) -> str:
    """The ``location`` a destination model stores for ``path`` (the one rule: inside its real folder, through no
    symlink, a name every loader accepts); see :func:`~onnx_light_ref.io.write.destinations.weights_location`."""
    return weights_location(dst_onnx, path)


def check_plan(plan: WritePlan) -> None:
    """Run every rule of the contract on ``plan`` before anything is written (module docstring).

    Args:
        plan: the complete plan; :attr:`WritePlan.protected` is set.

    Raises:
        UnsafeLocationError: a file a model points into is outside its folder or reached through a symlink.
        FileNotFoundError: the folder of an output does not exist.
        DestinationConflictError: an output is a source, another output, a directory, or a name too long.
        SharedWeightsError: an existing output another model references (without ``replace_shared``).
        ExistingFileError: existing outputs the destination does not own (without ``overwrite``).
        AssertionError: a writer placed a tensor where rule 2 forbids it (a bug; nothing written).
        SafetensorsError: a safetensors file's header above the library's limit (rule 4).
        Exception: what a writer's own rule 4 check raises.
    """
    _check_locations(plan)
    check_output_files([f.path for f in plan.files], plan.sources, plan.source_names)
    for model in plan.models:
        _check_sites(plan, model)
    _check_format_limits(plan)
    for check in plan.format_checks:
        check(plan)
    plan.protected = _check_replacements(plan)


def _check_format_limits(plan: WritePlan) -> None:
    """Rule 4: a safetensors file's header (``data_start``: its 8-byte size and the header) within the library's
    limit, so that nothing is written that ``safetensors`` refuses to open."""
    for planned in plan.files:
        if planned.format != "safetensors":
            continue
        header = planned.data_start - SIZE_PREFIX
        if not 0 < header <= MAX_HEADER_SIZE:
            raise SafetensorsError(
                f"{plan.writer}: safetensors file {planned.path!r} would have a {header:,}-byte header; the "
                f"safetensors library opens headers of 1 to {MAX_HEADER_SIZE:,} bytes; nothing was written."
            )


def recheck_plan(plan: WritePlan) -> frozenset[FileIdentity]:
    """Re-run, under the destination folders' lock, what can change between the plan and the first move.

    The outputs' names (a folder or a file that appeared there), the sources (:attr:`WritePlan.source_checks`),
    rule 1 (a variant saved meanwhile by another process) and rule 3 (the destination ``.onnx`` replaced meanwhile).

    Args:
        plan: the plan :func:`check_plan` accepted.

    Returns:
        The identities of every file another visible model references: the publication never deletes them.

    Raises:
        The errors of :func:`check_plan` (rules 2 and 4 are not re-run: they depend on the plan alone).
    """
    check_output_files([f.path for f in plan.files], plan.sources, plan.source_names)
    for check in plan.source_checks:
        check()
    plan.protected = _check_replacements(plan)
    return plan.protected


# ------------------------------------------------------------------------------------------------ the rules


def _check_locations(plan: WritePlan) -> None:
    """Every weights file and index a model points into (or sits beside) is where its loaders read it."""
    for model in plan.models:
        for planned in plan.files:
            if planned.role in ("weights", "index"):
                location_for(model.path, planned.path)


def _check_sites(plan: WritePlan, model: PlannedModel) -> None:
    """Rule 2 over one model's sites: what was externalized may be, and every placed range sits where it may."""
    sites = model.sites
    if sites is None:
        return
    bounds = {os.path.normpath(f.path): (f.size, f.data_start) for f in plan.files if f.size is not None}
    bounds.update({os.path.normpath(f.path): (f.size, f.data_start) for f in plan.referenced if f.size is not None})
    walk: Iterator[object] | None = None
    policy = None
    if model.proto is not None and SITE_EXTERNALIZED in sites.kinds:
        policy = model.policy
        if policy is None or policy.model is not model.proto or policy.size_threshold != model.size_threshold:
            policy = SitePolicy(model.proto, model.size_threshold)
        walk = iter_tensors(model.proto)
    placed = 0
    for kind in sites.kinds:
        site = next(walk, None) if walk is not None else None
        if walk is not None and site is None:
            raise AssertionError(f"{model.path!r}: the model has fewer tensors than its plan; nothing written.")
        if kind not in (SITE_MOVED, SITE_EXTERNALIZED):
            continue
        path, offset, length = sites.place_of(placed)
        placed += 1
        label = getattr(getattr(site, "tensor", None), "name", "") or f"tensor #{placed}"
        size, data_start = bounds.get(os.path.normpath(path), (None, 0))
        problem = placement_problem(offset, length, size, data_start=data_start) if size is not None else None
        if problem is not None:
            raise AssertionError(f"{plan.writer}: tensor {label!r} in {path!r}: {problem}; nothing written.")
        if kind == SITE_EXTERNALIZED and policy is not None:
            decision = policy.decide(site, length)  # type: ignore[arg-type]
            if not decision.external:
                raise AssertionError(
                    f"{plan.writer}: tensor {label!r} was made external although rule 2 keeps it inline "
                    f"({decision.reason or 'below the size threshold'}); nothing written."
                )
    if walk is not None and next(walk, None) is not None:
        raise AssertionError(f"{model.path!r}: the model has more tensors than its plan; nothing written.")
    if placed != sites.placed:
        raise AssertionError(f"{model.path!r}: {sites.placed} placed sites planned, {placed} found; nothing written.")


def _check_replacements(plan: WritePlan) -> frozenset[FileIdentity]:
    """Rules 1 and 3 on every output that exists now; returns what other models reference."""
    existing = [f for f in plan.files if os.path.lexists(f.path)]
    # Every output's folder is scanned (not only those of existing outputs): what the models there reference is
    # what the publication must never delete.
    scan = scan_users([f.path for f in plan.files], exclude=plan.model_paths)
    models = {os.path.normpath(os.path.abspath(path)) for path in plan.model_paths}
    shared = {path: users for path, users in scan.users.items() if path not in models}
    # "Cannot parse" is not "references nothing": a .onnx that cannot be read may use any file in its reach.
    unreadable = {path: found for path, found in scan.unreadable.items() if path not in models}
    if (shared or unreadable) and not plan.options.replace_shared:
        raise SharedWeightsError(_shared_message(plan, shared, unreadable))
    _check_owned(plan, existing, scan)
    return scan.referenced


def _check_owned(plan: WritePlan, existing: Sequence[PlannedFile], scan: SharingScan) -> None:
    if plan.options.overwrite or not existing:
        return
    ownership = Ownership(plan.model_paths, plan.parsed)
    foreign = []
    for planned in existing:
        path = os.path.normpath(os.path.abspath(planned.path))
        if path in scan.users:
            continue  # rule 1's: the caller passed replace_shared for it
        owned = ownership.owns_model(path) if planned.role == "model" else ownership.owns(path, planned.shard_set)
        if not owned:
            foreign.append(planned)
    if foreign:
        raise ExistingFileError(_foreign_message(plan, foreign, ownership))


# ---------------------------------------------------------------------------------------------- the messages


def _shared_message(
    plan: WritePlan, users: dict[str, list[ModelReference]], unreadable: dict[str, list[UnreadableModel]]
) -> str:
    parts = []
    for path, references in users.items():
        named = ", ".join(_describe_user(r) for r in references)
        parts.append(f"file {path!r} is used by {named}")
    for path, models in unreadable.items():
        parts.append(f"file {path!r} may be used by {', '.join(model.describe() for model in models)}")
    why = "replacing it would silently change what those models compute"
    if unreadable:
        why += (
            "; a .onnx that cannot be read may still be a model someone loads (a copy still running, a file another "
            "tool reads), so it counts as using every file of its folder and below: move it away (or repair it) to "
            "let the writer check what it uses"
        )
    return (
        f"{plan.writer}: " + "; ".join(parts) + f": {why}. Write under {plan.rename_hint}, or pass "
        "replace_shared=True (--replace-shared) to replace it anyway; nothing was written."
    )


def _describe_user(reference: ModelReference) -> str:
    what = f"{DELAYED_OP_TYPE} node" if reference.via == "delayed_initializer" else "tensor"
    plural = "s" if reference.tensors != 1 else ""
    return f"{reference.model!r} ({reference.tensors} {what}{plural}, e.g. {reference.tensor!r})"


def _foreign_message(plan: WritePlan, foreign: Sequence[PlannedFile], ownership: Ownership) -> str:
    models = ", ".join(repr(path) for path in plan.model_paths)
    lines = []
    for planned in foreign:
        if planned.role == "model":
            lines.append(f"destination {planned.path!r} exists and is not an ONNX model (nor named *.onnx)")
        elif planned.role == "array":
            lines.append(f"output file {planned.path!r} exists")
        elif models:
            unreadable = ownership.unreadable()
            if unreadable:
                previous = (
                    f"{', '.join(model.describe() for model in unreadable)}, so what it references is unknown "
                    "(move it away, or repair it, to let the writer see what it owns)"
                )
            elif any(ownership.is_model(p) for p in plan.model_paths):
                previous = "the destination model(s) do not reference it"
            else:
                previous = "the destination model(s) do not exist"
            lines.append(
                f"{planned.role} file {planned.path!r} exists and is not an output of {models} ({previous}, and it "
                "is not named after them)"
            )
        else:
            lines.append(f"file {planned.path!r} exists")
    return (
        f"{plan.writer}: " + "; ".join(lines) + ": replacing it would destroy a file this writer did not write (a "
        f"checkpoint, another tool's data, your own file). Write under {plan.rename_hint}, or pass overwrite=True "
        "(--overwrite) to replace it; nothing was written."
    )
