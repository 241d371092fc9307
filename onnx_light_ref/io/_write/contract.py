"""The writer contract: every writer describes what it will write as one :class:`WritePlan`, checked here.

A writer (both aligners in every format and shard scheme, ``align_models``, the shared saver, ``link``,
``undelay``, ``run --output-dir``, ``generate-tests``) validates its arguments, builds a :class:`WritePlan` and hands
it to :func:`~onnx_light_ref.io._write.execute.execute`, the one code path that writes: the plan is the transaction.
A plan lists the destination models (:class:`PlannedModel`: the ``.onnx`` to write, the model, and every site of it
with where its bytes live; the ``.onnx`` itself is always an output), every other file it creates or replaces with
its whole content (:class:`PlannedFile`), the files its models point into without writing them
(:class:`ReferencedFile`: a checkpoint, a base model's weights) and the caller's options (:class:`WriteOptions`).
What the rules need is derived from the plan, never filled in by a writer: the outputs are the models' paths and the
planned files, the sources every copied range and referenced file. :func:`check_plan` runs every rule before
anything is written; :func:`recheck_plan` runs again what can change meanwhile, under the destination folders' lock,
right before the first move. No writer decides any of these in its own body:

* destinations (:mod:`~onnx_light_ref.io._plan.destinations`): each file a model points into is inside the model's
  real folder and reached through no symlink; no output is a source, another output, a directory, or a name longer
  than its folder allows;
* rule 1, never silently change what another model computes (:mod:`~onnx_light_ref.io._read.sharing`): an existing
  file about to be replaced that another model (in its folder or any ancestor folder, any case of ``.onnx``, through
  ``external_data`` or ``DelayedInitializer`` filenames) references is refused (``SharedWeightsError``) unless
  ``replace_shared``; and every file such a model references is returned by :func:`recheck_plan`, so that the
  publication never deletes it;
* rule 2, every reference of a written model is a site of its plan, is external only where onnx loads it back and
  sits where every loader reads it (:mod:`~onnx_light_ref.io._plan.sites`): the model's tensors and its
  ``DelayedInitializer`` nodes are walked and must match the plan's sites one for one, each site recorded with the
  very site it describes (a plan that drifted from the walk is refused); every site the plan
  externalizes is one :meth:`SitePolicy.decide <onnx_light_ref.io._plan.sites.SitePolicy.decide>` allows, every
  placed site passes :func:`~onnx_light_ref.io._plan.sites.may_sit` in a planned or referenced file, and every
  reference the plan keeps names a planned or referenced file from the destination's folder (a writer violating it
  is a bug: :class:`WriterContractError`, an ``AssertionError``, nothing written);
* rule 3, replace only what the destination owns (:mod:`~onnx_light_ref.io._write.ownership`, or the very file a
  writer showed is its own: :attr:`PlannedFile.replaces`): any other existing file is refused, all of them named at
  once (``ExistingFileError``), unless ``overwrite``; a file rule 1 found
  users for is rule 1's alone (``replace_shared`` is the caller's word on it);
* rule 4, format limits: every safetensors file the plan writes has a header the ``safetensors`` library opens
  (:data:`~onnx_light_ref.io._read.safetensors_header.MAX_HEADER_SIZE`; the layout refuses earlier while planning,
  this re-checks what every writer will write), plus a writer's own :attr:`WritePlan.format_checks`;
* rule 5, report what happened: the publisher's (:mod:`~onnx_light_ref.io._write.publish`), with the identities
  :func:`recheck_plan` returns.

See ``docs/safety.md`` for the rules in a user's words. This module stats, lists folders and parses ``.onnx``
metadata; it never writes.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import onnx

from onnx_light_ref.errors import ExistingFileError, SafetensorsError, SharedWeightsError
from onnx_light_ref.io._plan.destinations import DestinationKey, check_output_files, weights_location
from onnx_light_ref.io._plan.ranges import CopyRange, range_sources, ranges_total
from onnx_light_ref.io._plan.sites import (
    SITE_EXTERNALIZED,
    SITE_INLINE,
    SITE_KEPT,
    SITE_MOVED,
    ReferenceSite,
    SiteColumns,
    SitePolicy,
    all_may_sit,
    iter_sites,
    may_sit,
    placement_problem,
    site_mark,
)
from onnx_light_ref.io._read.delayed_names import DELAYED_OP_TYPE
from onnx_light_ref.io._read.delayed_nodes import DelayedSite
from onnx_light_ref.io._read.entries import is_external, last_value
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._read.safetensors_header import MAX_HEADER_SIZE, SIZE_PREFIX
from onnx_light_ref.io._read.sharing import ModelReference, SharingScan, UnreadableModel, file_key, scan_users
from onnx_light_ref.io._read.walker import TensorSite, describe_place
from onnx_light_ref.io._read.wire import StrippedModel
from onnx_light_ref.io._write.ownership import Ownership, ReferenceCache, ShardSet


class WriterContractError(AssertionError):
    """A writer's plan breaks rule 2 of the writer contract (``docs/safety.md``): a reference of the model has no
    site, the sites drifted from the model's walk (another order, a model changed after planning), a site is placed
    where no loader reads it, or externalized where rule 2 keeps it inline. A bug in the writer, never in the
    model: an ``AssertionError``, and nothing was written."""


logger = logging.getLogger(__name__)

FileRole = Literal["model", "weights", "index", "array", "data"]
"""What a written file is: a destination ``.onnx`` (always derived from :attr:`WritePlan.models`), a weights file, a
safetensors set's index, a ``run`` output, or another data file (a conformance case's inputs)."""


@dataclass(frozen=True, slots=True)
class LazyPayload:
    """``length`` bytes that ``read()`` returns when they are written (a tensor's ``raw_data``, which protobuf copies
    on each access: read once, written, released)."""

    length: int
    read: Callable[[], bytes]


Payload = bytes | bytearray | memoryview | LazyPayload
"""Bytes a planned file holds that are written from memory."""


@dataclass(frozen=True, slots=True)
class PlannedFile:
    """A file the plan creates or replaces, and its whole content.

    ``size``: its final size (gaps read as zeros); ``header``: bytes at offset 0 (a safetensors header);
    ``ranges``: byte ranges of source files copied into it, file to file; ``writes``: ``(offset, payload)`` written
    from memory; ``data_start``: the first byte a tensor may use (a safetensors header's length); ``shard_set``:
    the weights set it belongs to (rule 3 recognizes that set's leftovers); ``format``: ``"raw"``,
    ``"safetensors"``, ``"json"`` or ``"npy"`` (rule 4's checks select by it); ``replaces``: the identity of the
    existing file at ``path`` that the writer showed to be its own to replace (its evidence: a file ``run`` recorded
    writing, the ``config.json`` the caller asked to update): rule 3 owns that very file, never another one put at
    the name since (a writer re-checks content that can change in place with a source check).
    """

    path: str
    role: FileRole
    size: int
    header: bytes = b""
    ranges: Sequence[CopyRange] = ()
    writes: Sequence[tuple[int, Payload]] = ()
    data_start: int = 0
    shard_set: ShardSet | None = None
    format: str = "raw"
    replaces: FileIdentity | None = None

    @property
    def payload_bytes(self) -> int:
        """Bytes copied or written into it (the header and gaps excluded)."""
        return ranges_total(self.ranges) + sum(payload_length(data) for _, data in self.writes)


def payload_length(data: Payload) -> int:
    """The number of bytes ``data`` writes."""
    return data.length if isinstance(data, LazyPayload) else len(data)


@dataclass(frozen=True, slots=True)
class ReferencedFile:
    """A file a destination model will point into that the plan does not write (a checkpoint, a base model's
    weights): its path, size when known and first usable byte; ``exists=False`` for a name the model reads that
    is not there yet (the shared saver's unchecked references), which no output may take."""

    path: str
    size: int | None = None
    data_start: int = 0
    identity: FileIdentity | None = None
    exists: bool = True
    why: str = ""  # how messages name it ("the file 'w.bin' that reused tensor 'W' points to")
    location: str | None = None  # what a model stores for it, when the writer resolved it (a checkpoint's)


@dataclass
class PlannedModel:
    """A destination ``.onnx`` and the model written there, with one site per reference of it.

    ``sites`` (:class:`~onnx_light_ref.io._plan.sites.SiteColumns`) follows
    :func:`~onnx_light_ref.io._plan.sites.iter_sites` over ``proto``: every tensor, then every
    ``DelayedInitializer`` node. The executor points each placed site at its place (entries, or the node's
    ``filename``/``offset``), so a model's references are written from its sites only. ``size_threshold`` and
    ``policy``: the writer's rule 2 decision for the sites it externalizes (its analysis of the model is reused,
    its decisions are taken again). ``placeholders``: the wire reader's stripped parse, when the model may still
    hold payload placeholders (none may be published). ``restore``: the proto is the caller's; on failure, the
    tensors this write externalized get their bytes back.
    """

    path: str
    proto: onnx.ModelProto
    sites: SiteColumns
    size_threshold: int | None = None
    policy: SitePolicy | None = None
    placeholders: StrippedModel | None = None
    restore: bool = False


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

    ``reads`` names the files the job reads besides the copied ranges and the referenced files (the source
    ``.onnx``, a checkpoint's index, ``run``'s inputs), by identity: no output may be one of them.
    ``rename_hint`` names the writer's way to choose another output name in messages (``dst_weights_path /
    --weights``, ``--output-dir``...). ``source_checks`` re-validate sources under the lock (``link``'s checkpoint
    unchanged); ``format_checks`` are rule 4's checks, run by :func:`check_plan`. ``protected`` is set by each check:
    identities of every file another visible model references.
    """

    writer: str
    models: list[PlannedModel]
    files: list[PlannedFile]
    options: WriteOptions = field(default_factory=WriteOptions)
    reads: dict[FileIdentity, str] = field(default_factory=dict)
    referenced: list[ReferencedFile] = field(default_factory=list)
    rename_hint: str = "another name"
    source_checks: list[Callable[[], None]] = field(default_factory=list)
    format_checks: list[Callable[[WritePlan], None]] = field(default_factory=list)
    removals: list[str] = field(default_factory=list)
    protected: frozenset[FileIdentity] = frozenset()
    removable: dict[str, FileIdentity] = field(default_factory=dict)
    parsed: ReferenceCache = field(default_factory=dict, repr=False)  # destination models parsed by the checks

    @property
    def model_paths(self) -> list[str]:
        return [model.path for model in self.models]

    @property
    def outputs(self) -> list[PlannedFile]:
        """Every file the plan publishes: each model's ``.onnx`` (always), then the planned files."""
        return [PlannedFile(model.path, "model", 0, format="onnx") for model in self.models] + self.files

    @property
    def sources(self) -> dict[FileIdentity, str]:
        """Every file the job reads, by identity: what no output may be, and what no sweep may remove."""
        found = dict(self.reads)
        for planned in self.files:
            for path, identity in range_sources(planned.ranges):
                if identity is not None:
                    found.setdefault(identity, path)
        for referenced in self.referenced:
            if referenced.identity is not None:
                found.setdefault(referenced.identity, referenced.why or referenced.path)
        return found


def location_for(dst_onnx: str, path: str) -> str:
    """The ``location`` a destination model stores for ``path`` (the one rule: inside its real folder, through no
    symlink, a name every loader accepts); see :func:`~onnx_light_ref.io._plan.destinations.weights_location`."""
    return weights_location(dst_onnx, path)


def check_plan(plan: WritePlan) -> list[list[ReferenceSite]]:
    """Run every rule of the contract on ``plan`` before anything is written (module docstring).

    Args:
        plan: the complete plan; :attr:`WritePlan.protected` is set.

    Returns:
        Each model's placed sites, walked (:func:`check_sites`).

    Raises:
        UnsafeLocationError: a file a model points into is outside its folder or reached through a symlink.
        FileNotFoundError: the folder of an output does not exist.
        DestinationConflictError: an output is a source, another output, a directory, or a name too long.
        SharedWeightsError: an existing output another model references (without ``replace_shared``).
        ExistingFileError: existing outputs the destination does not own (without ``overwrite``).
        WriterContractError: a writer's plan misses a site, or places a tensor where rule 2 forbids it (a bug; nothing
            written).
        SafetensorsError: a safetensors file's header above the library's limit (rule 4).
        Exception: what a writer's own rule 4 check raises.
    """
    _check_locations(plan)
    check_output_files([f.path for f in plan.outputs], _outputs_may_not_be(plan), _source_names(plan))
    walks = [check_sites(plan, model) for model in plan.models]
    _check_format_limits(plan)
    for check in plan.format_checks:
        check(plan)
    plan.protected = _check_replacements(plan)
    plan.removable = _removable(plan)
    return walks


def check_names(
    writer: str,
    models: Sequence[str],
    files: Sequence[PlannedFile],
    sources: dict[FileIdentity, str],
    options: WriteOptions,
    rename_hint: str,
) -> ReferenceCache:
    """The rules that depend on names only (destinations, rules 1 and 3), for a writer that knows its outputs' names
    before the costly part of its plan (``align_models`` before it reads payloads to compare them): a refusal comes
    before any weight byte is read. The complete plan is checked again by :func:`check_plan`.

    Returns:
        The destination models parsed (a cache the complete plan reuses while they do not change).
    """
    plan = WritePlan(writer, [], list(files), options, dict(sources), rename_hint=rename_hint)
    outputs = [PlannedFile(path, "model", 0, format="onnx") for path in models] + list(files)
    check_output_files([f.path for f in outputs], plan.sources)
    _check_replacements(plan, outputs, models)
    return plan.parsed


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
    check_output_files([f.path for f in plan.outputs], _outputs_may_not_be(plan), _source_names(plan))
    for check in plan.source_checks:
        check()
    plan.protected = _check_replacements(plan)
    plan.removable = _removable(plan)
    return plan.protected


# ------------------------------------------------------------------------------------------------ the rules


def _check_locations(plan: WritePlan) -> None:
    """Every weights file and index a model points into (or sits beside) is where its loaders read it."""
    for model in plan.models:
        for planned in plan.files:
            if planned.role in ("weights", "index"):
                location_for(model.path, planned.path)


def _outputs_may_not_be(plan: WritePlan) -> dict[FileIdentity, str]:
    """The sources no output may be: every one, except a destination ``.onnx`` whose bytes are only copied out of it
    (a model re-aligned in place: its inline payloads are copied before it is replaced; any other output at its name
    is two outputs in one file, refused as such). What the writer says it reads (:attr:`WritePlan.reads`) and the
    files the written models point into are never outputs."""
    sources = plan.sources
    stated = set(plan.reads) | {ref.identity for ref in plan.referenced}
    for path in plan.model_paths:
        identity = file_key(path)
        if isinstance(identity, FileIdentity) and identity not in stated:
            sources.pop(identity, None)
    return sources


def _source_names(plan: WritePlan) -> dict[DestinationKey, str]:
    """Where the names the models will read but that do not exist yet land: no output may take one."""
    from onnx_light_ref.io._plan.destinations import destination_key

    names: dict[DestinationKey, str] = {}
    for referenced in plan.referenced:
        key = destination_key(referenced.path) if not referenced.exists else None
        if key is not None:
            names[key] = referenced.why or f"a model reads {referenced.path!r}, which is not there yet"
    return names


_PLACED = (SITE_MOVED, SITE_EXTERNALIZED)


def check_sites(plan: WritePlan, model: PlannedModel) -> list[ReferenceSite]:
    """Rule 2 over one model: its references match its sites one for one (each site recorded with the very site
    of the model's walk it describes: :func:`~onnx_light_ref.io._plan.sites.site_mark`), what was externalized may
    be, every placed range sits where it may, and every kept reference names a planned or referenced file.

    One walk of the model; what depends on a file (its size, whether the plan writes or checked it) is looked up
    once per file, not per site.

    Returns:
        The model's placed sites, walked, in order (the executor points them).

    Raises:
        WriterContractError: the plan and the model disagree, or a site breaks rule 2 (a writer bug; nothing
            written).
    """
    sites = model.sites
    kinds, marks = sites.kinds, sites.marks
    if len(marks) != len(kinds):
        raise WriterContractError(
            f"{plan.writer}: {model.path!r}: {len(kinds)} sites planned, {len(marks)} recorded with the site of the "
            "model they describe: a site recorded without its walk cannot be checked against the model; nothing "
            "written."
        )
    policy = model.policy
    if SITE_EXTERNALIZED in kinds and (
        policy is None or policy.model is not model.proto or policy.size_threshold != model.size_threshold
    ):
        policy = SitePolicy(model.proto, model.size_threshold)
    places = _Places(plan, sites)
    kept = _KeptReferences(plan, model)
    placed: list[ReferenceSite] = []
    walk = list(iter_sites(model.proto))
    walked, count = len(walk), len(kinds)
    # The marks compared in one go (a column each); the sites before the first drifted one are checked as they come.
    now = array("q", map(site_mark, walk))
    common = checked = min(walked, count)
    if now != marks:  # the first site whose mark differs drifted (none: only the counts differ)
        checked = next((index for index in range(common) if now[index] != marks[index]), common)
    drift = walk[checked] if checked < common else None
    for index in range(checked):
        site, kind = walk[index], kinds[index]
        if kind in _PLACED:
            if len(placed) >= sites.placed:
                continue  # reported below: more placed sites than places
            if not places.fit:
                places.check(site, len(placed), sites)
            if kind == SITE_EXTERNALIZED and policy is not None and isinstance(site, TensorSite):
                decision = policy.decide(site, sites.lengths[len(placed)])
                if not decision.external:
                    raise WriterContractError(
                        f"{plan.writer}: tensor {site.label!r} was made external although rule 2 keeps it inline "
                        f"({decision.reason or 'below the size threshold'}); nothing written."
                    )
            placed.append(site)
            if isinstance(site, TensorSite):
                continue  # nothing of its kind to check: a placed tensor holds what the executor points it at
        _check_site_kind(plan, model, site, kind)
        if kind == SITE_KEPT:
            kept.check(site)
    if walked != count:
        raise WriterContractError(
            f"{plan.writer}: {model.path!r} has {walked} references (tensors and {DELAYED_OP_TYPE} nodes), its "
            f"plan {count} sites: every reference must be a site of the plan; nothing written."
        )
    if drift is not None:
        raise WriterContractError(
            f"{plan.writer}: {model.path!r}: the plan's sites drifted from the model's walk at "
            f"{_describe_site(drift)}: the site recorded there is another one (recorded in another order, or the "
            "model changed after planning), so a place would go to the wrong tensor; nothing written."
        )
    if len(placed) != sites.placed:
        raise WriterContractError(
            f"{model.path!r}: {sites.placed} placed sites planned, {len(placed)} found; nothing written."
        )
    return placed


def _describe_site(site: ReferenceSite) -> str:
    if isinstance(site, DelayedSite):
        return f"{DELAYED_OP_TYPE} node {site.label!r} ({site.where})"
    return f"tensor {site.label!r} ({describe_place(site.place)})"


class _Places:
    """What rule 2 needs of each file a model's placed sites point into, looked up once per file: whether the plan
    writes or checked it, its size and first usable byte."""

    def __init__(self, plan: WritePlan, sites: SiteColumns) -> None:
        self.plan = plan
        files = {os.path.normpath(f.path): (f.size, f.data_start) for f in plan.files}
        files.update({os.path.normpath(f.path): (f.size, f.data_start) for f in plan.referenced if f.size is not None})
        known = set(files) | {os.path.normpath(f.path) for f in plan.referenced}
        self.targets = targets = sites.targets
        self.facts = [(os.path.normpath(t) in known, *files.get(os.path.normpath(t), (None, 0))) for t in targets]
        # Every placed site checked at once; only when one fails are they checked one by one, to name the first.
        self.fit = all(fact[0] for fact in self.facts) and all_may_sit(
            sites, [fact[1] for fact in self.facts], [fact[2] for fact in self.facts]
        )

    def check(self, site: ReferenceSite, placed: int, sites: SiteColumns) -> None:
        target = sites.target[placed]
        known, size, data_start = self.facts[target]
        if not known:
            raise WriterContractError(
                f"{self.plan.writer}: {site.label!r} is placed in {self.targets[target]!r}, which the plan neither "
                "writes nor references; nothing written."
            )
        if size is None:
            return
        offset, length = sites.offsets[placed], sites.lengths[placed]
        if not may_sit(offset, length, size, data_start=data_start):
            problem = placement_problem(offset, length, size, data_start=data_start)
            raise WriterContractError(
                f"{self.plan.writer}: {site.label!r} in {self.targets[target]!r}: {problem}; nothing written."
            )


class _KeptReferences:
    """Rule 2 for kept references: each names a file the plan writes or checked (looked up once per name)."""

    def __init__(self, plan: WritePlan, model: PlannedModel) -> None:
        self.plan = plan
        self.model = model
        self.folder = os.path.dirname(os.path.abspath(model.path))
        self.known = {os.path.normpath(f.path) for f in plan.files}
        self.known.update(os.path.normpath(f.path) for f in plan.referenced)
        self.known_ids = {f.identity for f in plan.referenced if f.identity is not None}
        self.vouched: set[str | bytes] = set()

    def check(self, site: ReferenceSite) -> None:
        if isinstance(site, DelayedSite):
            name: str | bytes | None = site.filename
        else:
            name = last_value(site.tensor, "location")
        if not name or name in self.vouched:
            return
        named = os.path.normpath(os.path.join(self.folder, name if isinstance(name, str) else os.fsdecode(name)))
        if named not in self.known and file_key(named) not in self.known_ids:
            raise WriterContractError(
                f"{self.plan.writer}: {site.label!r} of {self.model.path!r} would read {named!r}, which the plan "
                "neither writes nor checked as a referenced file: the model would read a file its writer cannot "
                "vouch for; nothing written."
            )
        self.vouched.add(name)


def _check_site_kind(plan: WritePlan, model: PlannedModel, site: ReferenceSite, kind: int) -> None:
    """A site's kind agrees with what the model holds there; no payload placeholder is left in an inline one."""
    if isinstance(site, DelayedSite):
        if kind not in (SITE_KEPT, SITE_MOVED):
            raise WriterContractError(f"{plan.writer}: {DELAYED_OP_TYPE} node {site.label!r} planned as kind {kind}.")
        return
    external = is_external(site.tensor)
    if kind == SITE_INLINE and external:
        raise WriterContractError(
            f"{plan.writer}: tensor {site.label!r} is external but planned inline; nothing written."
        )
    if kind == SITE_KEPT and not external:
        raise WriterContractError(
            f"{plan.writer}: tensor {site.label!r} is inline but planned as kept; nothing written."
        )
    placeholders = model.placeholders
    if kind in (SITE_INLINE, SITE_KEPT) and placeholders is not None and placeholders.payload(site.tensor) is not None:
        # A placeholder left in the output would be read as the tensor's data by every loader: never publish one.
        raise WriterContractError(f"tensor {site.label!r} still holds a payload placeholder; nothing published.")


def _removable(plan: WritePlan) -> dict[str, FileIdentity]:
    """The files of :attr:`WritePlan.removals` that may go once the models are published: regular files the
    destination owns (rule 3), that no other model can reach and reference (rule 1) and that the job does not read
    or write. The others are kept, with a warning naming why."""
    if not plan.removals:
        return {}
    outputs = {os.path.normpath(os.path.abspath(f.path)) for f in plan.outputs}
    candidates = {}
    for path in dict.fromkeys(os.path.normpath(os.path.abspath(p)) for p in plan.removals):
        identity = file_key(path)
        if path in outputs or not isinstance(identity, FileIdentity) or os.path.islink(path):
            continue
        candidates[path] = identity
    scan = scan_users(list(candidates), exclude=plan.model_paths)
    ownership = Ownership(plan.model_paths, plan.parsed)
    shard_set = next((f.shard_set for f in plan.files if f.shard_set is not None), None)
    removable = {}
    for path, identity in candidates.items():
        why = None
        if identity in plan.sources:
            why = "this job reads it"
        elif path in scan.users or path in scan.unreadable:
            why = "another model uses it (or may: it cannot be read)"
        elif not ownership.owns(path, shard_set):
            why = "the destination does not own it"
        if why is None:
            removable[path] = identity
        else:
            logger.warning("%s: kept the earlier file %s (%s)", plan.writer, path, why)
    return removable


def _check_replacements(
    plan: WritePlan, outputs: Sequence[PlannedFile] | None = None, models: Sequence[str] | None = None
) -> frozenset[FileIdentity]:
    """Rules 1 and 3 on every output that exists now; returns what other models reference."""
    outputs = plan.outputs if outputs is None else outputs
    models = plan.model_paths if models is None else models
    existing = [f for f in outputs if os.path.lexists(f.path)]
    # Every output's folder is scanned (not only those of existing outputs): what the models there reference is
    # what the publication must never delete.
    scan = scan_users([f.path for f in outputs], exclude=models)
    destinations = {os.path.normpath(os.path.abspath(path)) for path in models}
    shared = {path: users for path, users in scan.users.items() if path not in destinations}
    # "Cannot parse" is not "references nothing": a .onnx that cannot be read may use any file in its reach.
    unreadable = {path: found for path, found in scan.unreadable.items() if path not in destinations}
    if (shared or unreadable) and not plan.options.replace_shared:
        raise SharedWeightsError(_shared_message(plan, shared, unreadable))
    _check_owned(plan, existing, scan, models)
    return scan.referenced


def _check_owned(plan: WritePlan, existing: Sequence[PlannedFile], scan: SharingScan, models: Sequence[str]) -> None:
    if plan.options.overwrite or not existing:
        return
    ownership = Ownership(models, plan.parsed)
    foreign = []
    for planned in existing:
        path = os.path.normpath(os.path.abspath(planned.path))
        if path in scan.users:
            continue  # rule 1's: the caller passed replace_shared for it
        if planned.replaces is not None and file_key(path) == planned.replaces:
            continue  # the writer's evidence: this very file is its own
        owned = ownership.owns_model(path) if planned.role == "model" else ownership.owns(path, planned.shard_set)
        if not owned:
            foreign.append(planned)
    if foreign:
        raise ExistingFileError(_foreign_message(plan, foreign, ownership, models))


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


def _foreign_message(
    plan: WritePlan, foreign: Sequence[PlannedFile], ownership: Ownership, model_paths: Sequence[str]
) -> str:
    models = ", ".join(repr(path) for path in model_paths)
    lines = []
    for planned in foreign:
        if planned.role == "model":
            lines.append(f"destination {planned.path!r} exists and is not an ONNX model (nor named *.onnx)")
        elif planned.role in ("array", "data"):
            lines.append(f"output file {planned.path!r} exists")
        elif models:
            unreadable = ownership.unreadable()
            if unreadable:
                previous = (
                    f"{', '.join(model.describe() for model in unreadable)}, so what it references is unknown "
                    "(move it away, or repair it, to let the writer see what it owns)"
                )
            elif any(ownership.is_model(p) for p in model_paths):
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
