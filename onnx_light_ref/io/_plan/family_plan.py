"""Plan a family: the weights of several models laid out once, in one set of files of one destination folder.

Two steps, so that the writer can refuse a bad destination before any weight byte is read:

* :func:`walk_family` walks every source with :func:`~onnx_light_ref.io._plan.align_plan.walk_source` into one set of
  payload columns and one source-file table (sources may live in different folders and share nothing), and names
  the outputs: ``<folder>/<basename of each source>`` and the base weights file;
* :func:`lay_out_family` finds the byte-identical payloads across all members (as ``dedup=True`` does inside one
  model: equal lengths, samples, digests, then the bytes compared; names and owners do not matter), places each
  distinct payload once (:func:`~onnx_light_ref.io._plan.align_plan.place_payloads`: alignment, ``align_threshold``,
  ``max_shard_size``, or a safetensors layout), names the files (:mod:`~onnx_light_ref.io._plan.shard_names`) and gives
  each member an :class:`~onnx_light_ref.io._plan.align_plan.AlignPlan` view: its own model, sites and columns, the
  family's shards, so the aligner's entry rewriting and copy engine serve it unchanged.

safetensors keys are the names of the distinct payloads' first tensors; a name that two distinct payloads carry (two
members holding different bytes under one name, common with exporters' ``onnx::MatMul_123`` names) is neither's key:
each becomes ``<member file name>/<name>``, so every key stays unique and names only its own tensor's bytes (what
every reader checks). Payloads share a key only when their dtype and dims are equal too.

Which inline tensors move out (``size_threshold``) is rule 2 of the writer contract, decided per site by
:meth:`~onnx_light_ref.io._plan.sites.SitePolicy.decide` inside the walk. This module checks nothing about
destinations (the writer contract does, on the :class:`~onnx_light_ref.io._write.contract.WritePlan` the writer
fills from this plan, before the first byte and under the folder lock), never writes a file and never modifies a
source; the only bytes it reads are those dedup compares (two chunk buffers), the few typed-field tensors the walk
converts, and the inline payloads rule 2 keeps inline (restored from the ``.onnx``).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from onnx_light_ref.io._plan.align_plan import (
    AlignPlan,
    LayoutOptions,
    PayloadColumns,
    PayloadPlacement,
    Shard,
    SourceTable,
    SourceWalk,
    build_shards,
    place_payloads,
    representatives,
    safetensors_index,
    stale_shards,
    walk_source,
)
from onnx_light_ref.io._plan.safetensors_layout import SafetensorsTensor
from onnx_light_ref.io._plan.shard_names import shard_paths
from onnx_light_ref.io._read.alignment import validate_alignment
from onnx_light_ref.io._read.locations import FileIdentity, check_not_hard_linked, file_identity


def default_family_weights(weights_format: str, scheme: str | None) -> str:
    """The weights file name of a family when the caller names none (relative to the destination folder).

    No member owns the shared files, so none of their names is used: ``weights.data`` (shards ``weights.data.1``...;
    ``weights-00001-of-0000N.data`` with ``"hf"``), ``weights.onnx_data`` with ``"transformers.js"``
    (``weights.onnx_data_1``...), and ``model.safetensors`` for safetensors, the name its loaders look for.
    """
    if weights_format == "safetensors":
        return "model.safetensors"
    if scheme == "transformers.js":
        return "weights.onnx_data"
    return "weights.data"


@dataclass
class FamilyPlan:
    """Everything decided before the first byte of a family is written (filled by :func:`walk_family`, then by
    :func:`lay_out_family`).

    ``walks[i]`` is member ``i`` walked from ``sources[i]`` into the shared ``table`` and ``payloads``; it is
    published at ``destinations[i]``. After the layout, ``members[i]`` is its :class:`AlignPlan` view (the family's
    ``shards``, its own columns), ``first[j]`` the payload whose bytes payload ``j`` shares (itself when it is the
    first) and ``keys[j]`` the safetensors key of distinct payload ``j``.
    """

    dst_folder: str
    weights_base: str
    sources: list[str]
    destinations: list[str]
    walks: list[SourceWalk]
    table: SourceTable
    payloads: PayloadColumns
    layout: LayoutOptions
    step: int
    source_files: dict[FileIdentity, str]  # every file the job reads: data files and every source .onnx
    first: array[int] = field(default_factory=lambda: array("q"))
    placement: PayloadPlacement | None = None
    shards: list[Shard] = field(default_factory=list)
    index: tuple[str, bytes] | None = None  # a sharded safetensors set's index.json: path and content
    members: list[AlignPlan] = field(default_factory=list)
    stale_weights_files: list[str] = field(default_factory=list)
    keys: dict[int, str] = field(default_factory=dict)

    @property
    def laid_out(self) -> bool:
        return self.placement is not None

    @property
    def weights_outputs(self) -> list[str]:
        """The weights files (and index) the run writes; before the layout, only the base weights path."""
        if not self.laid_out:
            return [self.weights_base]
        return [shard.path for shard in self.shards] + ([self.index[0]] if self.index is not None else [])

    @property
    def keep(self) -> frozenset[FileIdentity]:
        """Identities of every file this job reads: a temp-file sweep never removes them."""
        return frozenset(self.source_files)

    @property
    def total_size(self) -> int:
        """Bytes of every weights file together, padding included."""
        return sum(shard.size for shard in self.shards)

    @property
    def unique_bytes(self) -> int:
        """Distinct payload bytes written (each stored once for the whole family)."""
        return sum(shard.payload_bytes for shard in self.shards)

    def member_range(self, index: int) -> range:
        """The payload indices of member ``index``'s moved tensors, in its walk order."""
        walk = self.walks[index]
        return range(walk.start, walk.start + walk.moved)

    def separate_bytes(self, index: int) -> int:
        """Payload bytes member ``index`` would store aligned alone (identical source ranges once, as ``align``)."""
        seen: set[int] = set()
        total = 0
        for payload in self.member_range(index):
            key = self.payloads.key(payload)
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            total += self.payloads.lengths[payload]
        return total


def walk_family(
    src_onnx_paths: Sequence[str],
    dst_folder: str,
    weights_path: str,
    *,
    alignment: int,
    layout: LayoutOptions,
    allow_outside_folder: bool,
    names: Sequence[str] | None = None,
) -> FamilyPlan:
    """Walk every source (metadata only) into one set of columns and name every output; nothing is laid out yet.

    Args:
        src_onnx_paths: the members' sources (absolute paths).
        dst_folder: the destination folder (absolute).
        weights_path: the (first) weights file (absolute).
        alignment: as for the aligners (validated here).
        layout: the validated layout options (``dedup`` is ignored: a family always stores each payload once).
        allow_outside_folder: follow symbolic links in the sources' data paths.
        names: the members' file names in ``dst_folder`` (default: each source's file name).

    Returns:
        The :class:`FamilyPlan`, walked; nothing was written and no weight byte was read.

    Raises:
        ValueError: an invalid alignment.
        InvalidModelError, ExternalDataError, FileNotFoundError: as
            :func:`~onnx_light_ref.io._plan.align_plan.walk_source` raises for a source.
    """
    step = validate_alignment(alignment)
    table = SourceTable()
    payloads = PayloadColumns()
    safetensors = layout.weights_format == "safetensors"
    walks = [
        walk_source(
            src,
            mode="streaming",
            inline_threshold=layout.size_threshold,
            allow_outside_folder=allow_outside_folder,
            safetensors=safetensors,
            table=table,
            payloads=payloads,
        )
        for src in src_onnx_paths
    ]
    source_files: dict[FileIdentity, str] = {}
    for walk in walks:
        source_files.update(walk.sources())
        # Every source .onnx counts, even one at its own destination: the family refuses to replace a source.
        identity = walk.onnx_identity or file_identity(walk.src_onnx)
        if identity is not None:
            source_files.setdefault(identity, walk.src_onnx)
    names = names if names is not None else [os.path.basename(src) for src in src_onnx_paths]
    destinations = [os.path.join(dst_folder, name) for name in names]
    return FamilyPlan(
        dst_folder, weights_path, list(src_onnx_paths), destinations, walks, table, payloads, layout, step, source_files
    )


def lay_out_family(plan: FamilyPlan, chunk_size: int) -> None:
    """Find the shared payloads, place each distinct one once, name the files and build each member's view.

    Args:
        plan: a plan from :func:`walk_family` whose destinations were checked.
        chunk_size: size of each of the two buffers candidate duplicates are compared with.

    Raises:
        UnsafeLocationError: a source data file with several hard links (checked before any byte is read).
        ExternalDataError: a source changed (shorter) since it was validated.
        SafetensorsError: safetensors keys that are empty, or data types safetensors cannot store.
        ValueError: more files than ``shard_names="transformers.js"`` allows.
    """
    for walk in plan.walks:
        for ref in walk.refs.values():
            check_not_hard_linked(ref)
    layout = plan.layout
    safetensors = layout.weights_format == "safetensors"
    plan.first = representatives(plan.table.files, plan.payloads, True, chunk_size)
    named: list[SafetensorsTensor] = []
    if safetensors:
        named = [tensor for walk in plan.walks for tensor in walk.named]
        plan.first = _typed_representatives(plan.first, named)
        _family_keys(plan, named)
    placement = place_payloads(
        plan.payloads.lengths,
        plan.first,
        named,
        plan.step,
        layout.align_threshold,
        layout.max_shard_size,
        safetensors=safetensors,
    )
    plan.placement = placement
    anchor = plan.destinations[0]  # every member is in the folder: one location per weights file serves them all
    paths = shard_paths(plan.weights_base, len(placement.sizes), layout.shard_names)
    plan.shards = build_shards(paths, anchor, plan.table.files, placement, plan.payloads, plan.first)
    if safetensors:
        distinct = [index for index in range(len(plan.payloads)) if plan.first[index] == index]
        plan.index = safetensors_index(
            anchor,
            plan.weights_base,
            plan.shards,
            [named[index] for index in distinct],
            array("i", (placement.shards[index] for index in distinct)),
        )
    plan.members = [_member_plan(plan, index) for index in range(len(plan.walks))]
    written = [*plan.weights_outputs, *plan.destinations]
    stale: set[str] = set()
    for destination in plan.destinations:  # every scheme's leftovers of the shared set and of each member's names
        stale.update(stale_shards(destination, plan.weights_base, written, set(plan.source_files)))
    plan.stale_weights_files = sorted(stale)


def _typed_representatives(first: array[int], named: list[SafetensorsTensor]) -> array[int]:
    """``first`` where a payload shares a key only with payloads of its own dtype and dims, as well as its bytes.

    A safetensors key has one dtype and shape, and every reader checks a reference against its key
    (:func:`~onnx_light_ref.io._read.safetensors_refs.check_reference`): equal bytes under another type (a float
    tensor and an int tensor of zeros) are stored under a key of their own (keys may not overlap).
    """
    typed: array[int] = array("q", first)
    seen: dict[tuple[int, int, tuple[int, ...]], int] = {}
    for index, tensor in enumerate(named):
        typed[index] = seen.setdefault((first[index], tensor.data_type, tuple(tensor.dims)), index)
    return typed


def _family_keys(plan: FamilyPlan, named: list[SafetensorsTensor]) -> None:
    """Give each distinct payload of ``named`` (one entry per payload) a unique key, in place.

    A payload's key is the name of its first tensor when every tensor of that name, in every member, is that
    payload: a key named like a tensor is then that tensor's bytes in each member, as every reader checks. A name
    that two distinct payloads carry (two members holding different bytes under one name) is no payload's key:
    each becomes ``<member file name>/<name>`` (``#2``, ``#3``... if needed), so keys stay unique too.
    """
    owner = [index for index, walk in enumerate(plan.walks) for _ in range(walk.moved)]
    payloads_named: dict[str, set[int]] = {}
    for index, tensor in enumerate(named):
        payloads_named.setdefault(tensor.name, set()).add(plan.first[index])
    taken: set[str] = set(payloads_named)  # a qualified key never takes another tensor's name
    for index, tensor in enumerate(named):
        if plan.first[index] != index or not tensor.name:
            continue  # a duplicate has no key of its own; an empty name is refused by the layout
        key = tensor.name
        if len(payloads_named[key]) > 1:
            prefix = os.path.basename(plan.destinations[owner[index]])
            key = f"{prefix}/{tensor.name}"
            suffix = 2
            while key in taken:
                key = f"{prefix}/{tensor.name}#{suffix}"
                suffix += 1
            named[index] = SafetensorsTensor(key, tensor.label, tensor.data_type, tensor.dims, tensor.length)
            taken.add(key)
        plan.keys[index] = key


def _member_plan(plan: FamilyPlan, index: int) -> AlignPlan:
    """Member ``index`` as an :class:`AlignPlan`: its model and columns, the family's shared weights files."""
    walk = plan.walks[index]
    placement = plan.placement
    assert placement is not None
    span = plan.member_range(index)
    start, stop = span.start, span.stop
    return AlignPlan(
        model=walk.model,
        stripped=walk.stripped,
        dst_onnx_path=plan.destinations[index],
        shards=plan.shards,
        files=plan.table.files,
        sites=walk.sites,
        marks=walk.marks,
        move_shards=placement.shards[start:stop],
        move_offsets=placement.offsets[start:stop],
        move_lengths=plan.payloads.lengths[start:stop],
        checksums=walk.checksums,
        externalized_tensors=walk.externalized,
        deduplicated_tensors=sum(1 for payload in span if plan.first[payload] != payload),
        deduplicated_bytes=sum(plan.payloads.lengths[p] for p in span if plan.first[p] != p),
        sources=plan.keep,
        weights_format=plan.layout.weights_format,
        index=plan.index,
        unaligned_tensors=[],
        kept_inline=walk.kept_inline,
        kept_inline_names=walk.kept_inline_names,
        weights_base=plan.weights_base,
        shard_names=plan.layout.shard_names,
        size_threshold=plan.layout.size_threshold,
        source_paths=plan.source_files,
        policy=walk.policy,
    )
