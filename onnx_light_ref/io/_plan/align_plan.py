"""Plan a re-alignment: which tensors move, where each distinct payload lands, and what each output file holds.

:func:`plan_alignment` is shared by the streaming and the in-memory aligner (:mod:`onnx_light_ref.io._align`), so their
outputs are byte-identical by construction. It validates every argument, parses the source ``.onnx`` (without its
large inline payloads when the streaming aligner externalizes inline tensors), walks every tensor in
:func:`~onnx_light_ref.io._read.walker.iter_tensors` order, validates every external reference, picks the inline tensors
to externalize (``size_threshold``), merges identical payloads (identical source ranges always; identical bytes with
``dedup``), places them with :class:`~onnx_light_ref.io._plan.placement.ShardedLayout` (``alignment``,
``align_threshold``, ``max_shard_size``), or with :func:`~onnx_light_ref.io._plan.safetensors_layout.plan_safetensors`
for ``weights_format="safetensors"`` (keys, dtypes, order, headers, the index), names the files with
:mod:`~onnx_light_ref.io._plan.shard_names` once their count is known, and checks that no output is a source.

The only bytes this module reads are those :func:`~onnx_light_ref.io._plan.dedup.find_duplicates` compares (two chunk
buffers) and typed-field tensors converted to raw bytes (small; see ``docs/align.md``). It never writes a file and
never modifies a source.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, TypedDict, get_args, overload

import onnx

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._arguments import (
    PathLike,
    WeightsFormat,
    check_bool,
    check_int,
    check_optional_int,
    check_weights_file,
)
from onnx_light_ref.io._plan.checkpoint_policy import site_policy
from onnx_light_ref.io._plan.dedup import BlobSource, find_duplicates
from onnx_light_ref.io._plan.destinations import check_outputs, weights_location
from onnx_light_ref.io._plan.placement import ShardedLayout
from onnx_light_ref.io._plan.ranges import CopyRange, RangeColumns, open_source, read_range
from onnx_light_ref.io._plan.safetensors_layout import SafetensorsTensor, plan_safetensors
from onnx_light_ref.io._plan.shard_names import (
    ShardNames,
    check_shard_names,
    default_weights_path,
    index_path,
    shard_paths,
    stale_candidates,
)
from onnx_light_ref.io._plan.sites import (
    SITE_EXTERNALIZED,
    SITE_INLINE,
    SITE_MOVED,
    SiteColumns,
    SitePolicy,
    site_mark,
)
from onnx_light_ref.io._read.alignment import validate_alignment
from onnx_light_ref.io._read.delayed_nodes import DelayedResolver, iter_delayed
from onnx_light_ref.io._read.folder import ModelFolder
from onnx_light_ref.io._read.locations import (
    ExternalRef,
    FileIdentity,
    LocationResolver,
    check_not_hard_linked,
    expected_nbytes,
    file_identity,
    parse_external_data,
)
from onnx_light_ref.io._read.model_file import check_model_strings, load_model_metadata, open_model_folder
from onnx_light_ref.io._read.onnx_compat import typed_raw_bytes
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._read.wire import InlinePayload, StrippedModel, load_model_stripped

if TYPE_CHECKING:
    from typing_extensions import Unpack


logger = logging.getLogger(__name__)

Mode = Literal["streaming", "in_memory"]

# Typed fields a TensorProto may carry its values in; cleared when the tensor moves out.
_NEVER_EXTERNAL = (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING)

_DEDUP_CHUNK = 1024 * 1024  # find_duplicates' two buffers when the caller gives no chunk size
_EXTERNAL = onnx.TensorProto.EXTERNAL


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One source file payloads are copied from: its validated path and identity (checked again when opened)."""

    path: str
    identity: FileIdentity | None
    folder: ModelFolder | None = None  # held since validation: the file is reopened through it as `location`
    location: str | None = None


@dataclass
class Shard:
    """One destination weights file: its path, the location stored in the model, its size and its content.

    File-to-file copies are :attr:`ranges`, columns over the plan's source file table (one entry per distinct
    payload, in destination order); ``writes`` holds the few payloads written from memory.
    """

    path: str
    location: str
    files: Sequence[SourceFile] = ()  # the plan's source file table
    size: int = 0
    ranges: RangeColumns = field(init=False)
    writes: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, bytes) written from memory
    header: bytes = b""  # written at offset 0 before the payloads (a safetensors header), not a payload

    def __post_init__(self) -> None:
        self.ranges = RangeColumns(self.files)

    @property
    def payload_bytes(self) -> int:
        return self.ranges.total + sum(len(data) for _, data in self.writes)


@dataclass(kw_only=True)
class AlignPlan:
    """Everything decided before the first byte is written (built by keyword: 24 fields).

    Per-tensor facts are columns, not objects (``docs/align.md``, design notes): ``sites`` has one byte per tensor
    of the walk (the writer contract's ``SITE_*`` of :mod:`~onnx_light_ref.io._plan.sites`) and ``marks`` its
    :func:`~onnx_light_ref.io._plan.sites.site_mark`; the moved tensors (``SITE_MOVED`` or ``SITE_EXTERNALIZED``),
    in walk order, have their destination in ``move_shards``,
    ``move_offsets`` and ``move_lengths``, and their kept source ``checksum`` in the sparse ``checksums``. The
    tensors themselves are found again by walking ``model``, which planning leaves as is; the writer contract
    refuses a plan whose marks are not those of that walk (nothing is written with a place given to another tensor).
    """

    model: onnx.ModelProto
    stripped: StrippedModel | None  # the stripped parse (streaming with size_threshold), to find placeholders
    dst_onnx_path: str
    shards: list[Shard]
    files: list[SourceFile]
    sites: bytearray
    marks: array[int]  # each site's mark (io/_plan/sites.py site_mark): what ties it to the tensor it describes
    move_shards: array[int]
    move_offsets: array[int]
    move_lengths: array[int]
    checksums: dict[int, str]  # move index -> checksum, for the moved tensors that have one
    externalized_tensors: int = 0  # tensors that were inline in the source
    deduplicated_tensors: int = 0  # tensors sharing bytes stored for an earlier tensor
    deduplicated_bytes: int = 0  # bytes those tensors would have taken
    stale_weights_files: list[str] = field(default_factory=list)  # see stale_shards
    sources: frozenset[FileIdentity] = frozenset()  # every file this job reads: never removed by a temp-file sweep
    weights_format: WeightsFormat = "onnx"
    index: tuple[str, bytes] | None = None  # a sharded safetensors set's index.json: path and content
    unaligned_tensors: list[str] = field(default_factory=list)  # safetensors: >= align_threshold, not aligned
    # inline tensors at or above size_threshold kept inline (rule 2 of the writer contract), by reason
    kept_inline: dict[str, int] = field(default_factory=dict)
    kept_inline_names: dict[str, list[str]] = field(default_factory=dict)  # the same tensors' labels, by reason
    weights_base: str = ""  # the first weights path the shards are named from
    shard_names: ShardNames = None
    size_threshold: int | None = None
    source_paths: dict[FileIdentity, str] = field(default_factory=dict)  # what the outputs must never be
    policy: SitePolicy | None = None  # rule 2's decision for this model (with size_threshold)

    def site_columns(self) -> SiteColumns:
        """The plan's columns as the writer contract's :class:`~onnx_light_ref.io._plan.sites.SiteColumns` (shared,
        not copied): one kind per site, and per moved tensor its shard, offset and length."""
        columns = SiteColumns.from_columns(
            self.sites,
            self.marks,
            [shard.path for shard in self.shards],
            self.move_shards,
            self.move_offsets,
            self.move_lengths,
        )
        columns.checksums = self.checksums
        return columns

    @property
    def total_size(self) -> int:
        """Bytes of every weights file together, padding included."""
        return sum(shard.size for shard in self.shards)

    @property
    def payload_bytes(self) -> int:
        """Distinct tensor bytes written (``total_size - payload_bytes`` is padding)."""
        return sum(shard.payload_bytes for shard in self.shards)

    @property
    def weights_paths(self) -> list[str]:
        return [shard.path for shard in self.shards]

    @property
    def tensors(self) -> int:
        """External tensors of the output model."""
        return len(self.move_lengths)


class LayoutOptions(NamedTuple):
    """The layout options shared by both aligners, validated (see :func:`check_layout_options`)."""

    align_threshold: int = 0
    max_shard_size: int | None = None
    dedup: bool = False
    size_threshold: int | None = None
    weights_format: WeightsFormat = "onnx"
    shard_names: ShardNames = None


class LayoutKeywords(TypedDict, total=False):
    """:class:`LayoutOptions` as keyword arguments of :func:`plan_alignment`."""

    align_threshold: int
    max_shard_size: int | None
    dedup: bool
    size_threshold: int | None
    weights_format: WeightsFormat
    shard_names: ShardNames


def check_layout_options(
    align_threshold: object,
    max_shard_size: object,
    dedup: object,
    size_threshold: object,
    durable: object,
    *,
    weights_format: object = "onnx",
    shard_names: object = None,
) -> LayoutOptions:
    """Validate the keyword options shared by both aligners; return them typed.

    Raises:
        ValueError: a negative or zero value where it is not allowed, an unknown format or shard-name scheme, an
            option the format cannot honour (``ArgumentTypeError``, also a ``TypeError``, for a wrong type).
    """
    threshold = check_int("align_threshold", align_threshold)
    shard_cap = check_optional_int("max_shard_size", max_shard_size, minimum=1)
    check_bool("dedup", dedup)
    inline_threshold = check_optional_int("size_threshold", size_threshold)
    check_bool("durable", durable)
    scheme = check_shard_names(shard_names)
    if weights_format not in get_args(WeightsFormat):
        formats = " or ".join(repr(name) for name in get_args(WeightsFormat))
        raise ValueError(f"weights_format must be {formats}, got {weights_format!r}.")
    if weights_format == "safetensors":
        if dedup:
            raise ValueError(
                "dedup=True is refused with weights_format='safetensors': safetensors forbids two keys sharing "
                "bytes (overlapping data_offsets), so every tensor is stored under its own name."
            )
        if scheme == "transformers.js":
            raise ValueError(
                "shard_names='transformers.js' names raw .onnx_data files; safetensors shards use the 'hf' names "
                "(model-00001-of-0000N.safetensors, the default with weights_format='safetensors')."
            )
        scheme = "hf"  # transformers' shard names: the only ones safetensors loaders know
    fmt: WeightsFormat = "safetensors" if weights_format == "safetensors" else "onnx"
    return LayoutOptions(threshold, shard_cap, bool(dedup), inline_threshold, fmt, scheme)


def plan_alignment(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    *,
    mode: Mode = "streaming",
    chunk_size: int | None = None,
    allow_outside_folder: bool = False,
    **options: Unpack[LayoutKeywords],
) -> AlignPlan:
    """Validate arguments, parse the source metadata, check every reference and lay out every output file.

    Args:
        src_onnx_path, dst_onnx_path, dst_weights_path, alignment: as documented on
            :func:`~onnx_light_ref.io._align.align_external_data_streaming`.
        mode: ``"streaming"`` parses the ``.onnx`` without inline payloads of ``size_threshold`` bytes or more (they
            are copied out of the file); ``"in_memory"`` parses it whole (they are written from memory). The plan
            places the same bytes at the same offsets either way.
        chunk_size: size of each of the two buffers used to compare candidate duplicates (None: 1 MiB).
        allow_outside_folder: follow symbolic links in the source's data paths (trusted layouts only).
        options: ``align_threshold``, ``max_shard_size``, ``dedup``, ``size_threshold``, ``weights_format``,
            ``shard_names`` (:class:`LayoutOptions`), as documented on
            :func:`~onnx_light_ref.io._align.align_external_data_streaming`.

    Returns:
        The :class:`AlignPlan`; nothing was written.

    Raises:
        ValueError: an invalid argument (``ArgumentTypeError`` for a wrong type).
        TypeError: an unknown layout keyword.
        InvalidModelError: ``src_onnx_path`` is not an ONNX model, or has a string field that is not UTF-8.
        ExternalDataError: a malformed or out-of-bounds reference, an inline tensor whose data does not match its
            dims and data type; ``UnsafeLocationError`` for an unsafe location or hard-linked source,
            ``DestinationConflictError`` for an output that is a source (the first weights file; the writer
            contract checks every output).
        FileNotFoundError: the source model or a referenced file does not exist.
    """
    step = validate_alignment(alignment)
    unknown = sorted(set(options) - set(LayoutOptions._fields))
    if unknown:
        raise TypeError(f"plan_alignment() got unexpected keyword argument(s) {', '.join(unknown)}.")
    given = LayoutOptions(**options)
    threshold, shard_cap, dedup, inline_threshold, weights_format, scheme = check_layout_options(
        *given[:4], True, weights_format=given.weights_format, shard_names=given.shard_names
    )
    safetensors = weights_format == "safetensors"
    chunk_size = _DEDUP_CHUNK if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
    src_onnx = os.path.abspath(os.fspath(src_onnx_path))
    dst_onnx = os.path.abspath(os.fspath(dst_onnx_path))
    dst_weights = (
        check_weights_file("dst_weights_path", dst_weights_path)
        if dst_weights_path is not None
        else os.path.abspath(default_weights_path(dst_onnx, weights_format, scheme))
    )
    weights_location(dst_onnx, dst_weights)  # refuse a bad destination before reading anything (the contract's rule)

    table = SourceTable()
    payloads = PayloadColumns()
    walk = walk_source(
        src_onnx,
        mode=mode,
        inline_threshold=inline_threshold,
        allow_outside_folder=allow_outside_folder,
        safetensors=safetensors,
        table=table,
        payloads=payloads,
    )
    sources = walk.sources()
    src_identity = walk.onnx_identity or file_identity(src_onnx)
    if src_identity is not None and src_identity != file_identity(dst_onnx):
        # The source .onnx may be the destination .onnx (replaced atomically once its payloads were copied), but
        # no weights file may overwrite it.
        sources[src_identity] = src_onnx
    # The base weights path first (the layout is not known yet), so that "destination is a source" is reported
    # before any hard-link refusal of the same file and before any byte is read for dedup.
    check_outputs(dst_onnx, [dst_weights], sources)
    for ref in walk.refs.values():
        check_not_hard_linked(ref)

    # safetensors: every key owns its bytes (the format forbids overlaps), so no two tensors share a payload.
    first = (
        array("q", range(len(payloads))) if safetensors else representatives(table.files, payloads, dedup, chunk_size)
    )
    placed = place_payloads(payloads.lengths, first, walk.named, step, threshold, shard_cap, safetensors=safetensors)
    paths = shard_paths(dst_weights, len(placed.sizes), scheme)
    shards = build_shards(paths, dst_onnx, table.files, placed, payloads, first)
    index_file = safetensors_index(dst_onnx, dst_weights, shards, walk.named, placed.shards) if safetensors else None
    # Every output is checked by the writer contract (io/_write/contract.py) before the first byte is written.
    outputs = [s.path for s in shards] + ([index_file[0]] if index_file else [])
    stale = stale_shards(dst_onnx, dst_weights, outputs, set(sources))
    return AlignPlan(
        model=walk.model,
        stripped=walk.stripped,
        dst_onnx_path=dst_onnx,
        shards=shards,
        files=table.files,
        sites=walk.sites,
        marks=walk.marks,
        move_shards=placed.shards,
        move_offsets=placed.offsets,
        move_lengths=payloads.lengths,
        checksums=walk.checksums,
        externalized_tensors=walk.externalized,
        deduplicated_tensors=placed.deduplicated_tensors,
        deduplicated_bytes=placed.deduplicated_bytes,
        stale_weights_files=stale,
        sources=frozenset(sources) | ({src_identity} if src_identity is not None else set()),
        weights_format=weights_format,
        index=index_file,
        unaligned_tensors=placed.unaligned,
        kept_inline=walk.kept_inline,
        kept_inline_names=walk.kept_inline_names,
        weights_base=dst_weights,
        shard_names=scheme,
        size_threshold=inline_threshold,
        source_paths=sources,
        policy=walk.policy,
    )


@dataclass
class SourceWalk:
    """One source model walked by :func:`walk_source`: its parsed metadata and what each of its tensors becomes.

    Its moved tensors are the payloads ``start`` to ``start + moved`` of the :class:`PayloadColumns` it was walked
    into (a family walks several sources into one set of columns); ``checksums`` is keyed by the move index *within
    this model* (0 for its first moved tensor).
    """

    src_onnx: str
    model: onnx.ModelProto
    stripped: StrippedModel | None  # the stripped parse (streaming with size_threshold), to find placeholders
    onnx_identity: FileIdentity | None  # the .onnx, when its inline payloads are copied out of it
    start: int
    sites: bytearray = field(default_factory=bytearray)
    marks: array[int] = field(default_factory=lambda: array("q"))  # each site's site_mark
    checksums: dict[int, str] = field(default_factory=dict)
    moved: int = 0
    externalized: int = 0
    named: list[SafetensorsTensor] = field(default_factory=list)  # safetensors: each moved tensor's key, type, dims
    kept_inline: dict[str, int] = field(default_factory=dict)
    kept_inline_names: dict[str, list[str]] = field(default_factory=dict)  # their labels, by reason
    refs: dict[FileIdentity, ExternalRef] = field(default_factory=dict)  # first reference to each data file
    delayed_files: dict[FileIdentity, str] = field(default_factory=dict)  # files DelayedInitializer nodes read
    policy: SitePolicy | None = None  # rule 2's decision for this model (with size_threshold)

    def sources(self) -> dict[FileIdentity, str]:
        """Identity -> path of every data file this model references (its ``.onnx`` not included)."""
        return {identity: ref.path for identity, ref in self.refs.items()} | self.delayed_files


def walk_source(
    src_onnx: str,
    *,
    mode: Mode,
    inline_threshold: int | None,
    allow_outside_folder: bool,
    safetensors: bool,
    table: SourceTable,
    payloads: PayloadColumns,
) -> SourceWalk:
    """Parse ``src_onnx`` (metadata only), validate every external reference and add each moved tensor's payload.

    Every tensor of :func:`~onnx_light_ref.io._read.walker.iter_tensors` gets one byte in ``sites``; the payloads of
    the moved ones are appended to ``payloads`` (ranges of files indexed in ``table``, or bytes in memory). Reads
    no weight byte except the few typed-field tensors (converted in memory) and inline payloads that must stay
    inline (restored from the ``.onnx``).

    Raises:
        InvalidModelError: ``src_onnx`` is not an ONNX model, or has a string field that is not UTF-8.
        ExternalDataError: a malformed or out-of-bounds reference, an inline tensor whose data does not match its
            dims and data type (``UnsafeLocationError`` for an unsafe location).
        FileNotFoundError: the source model or a referenced file does not exist.
    """
    # Held from now on: the .onnx is parsed through it and every data file is opened relative to it.
    folder = open_model_folder(src_onnx, allow_outside_folder=allow_outside_folder)
    model, stripped, onnx_identity = _load(src_onnx, inline_threshold, mode, folder)
    # Inline payloads are copied out of the file itself: through its real path, since the copy opens sources with
    # O_NOFOLLOW (a symlinked .onnx, as in the Hugging Face cache, is the file the user named, not a swapped one).
    try:
        payload_source = os.path.realpath(src_onnx)
    except OSError as exc:  # a folder on the way renamed during the lookup (EINVAL, ELOOP...)
        raise ExternalDataError(
            f"{src_onnx!r}: a folder on its path changed while it was read ({exc.strerror or exc}); nothing was "
            "written."
        ) from exc
    resolver = LocationResolver(folder)
    policy = site_policy(model, inline_threshold, safetensors=safetensors)  # rule 2 (a checkpoint: no holes)
    walk = SourceWalk(src_onnx, model, stripped, onnx_identity, len(payloads), policy=policy)
    sites, marks = walk.sites, walk.marks
    file_of: dict[str, int] = {}  # location -> its index in the source table (a few files, many tensors)
    for site in iter_tensors(model):
        tensor = site.tensor
        marks.append(site_mark(site))
        if tensor.data_location == _EXTERNAL:
            # Each reference is checked and reduced to columns right away, never kept (docs/align.md).
            ref = parse_external_data(tensor, resolver, label=site.label)
            file_index = file_of.get(ref.location)
            if file_index is None:
                identity = ref.identity
                walk.refs.setdefault(identity, ref)
                file_index = file_of[ref.location] = table.index(ref.path, identity, ref.folder, ref.location)
            if ref.checksum is not None:
                walk.checksums[len(payloads) - walk.start] = ref.checksum
            payloads.add_range(file_index, ref.offset, ref.length)
            sites.append(SITE_MOVED)
        elif policy is not None:
            inline = _InlineData.of(tensor, stripped)
            decision = policy.decide(site, inline.length)  # rule 2 of the writer contract: the one decision
            if not decision.external:
                if inline.payload is not None:
                    _restore_payload(tensor, site.label, inline.payload, payload_source, onnx_identity)
                if decision.reason is not None:
                    walk.kept_inline[decision.reason] = walk.kept_inline.get(decision.reason, 0) + 1
                    walk.kept_inline_names.setdefault(decision.reason, []).append(site.label)
                sites.append(SITE_INLINE)
                continue
            _add_inline(tensor, site.label, inline, payload_source, onnx_identity, table, payloads)
            sites.append(SITE_EXTERNALIZED)
            walk.externalized += 1
        else:
            sites.append(SITE_INLINE)
            continue
        if safetensors:
            name = tensor.name if isinstance(tensor.name, str) else ""
            walk.named.append(
                SafetensorsTensor(
                    name, f"{site.label} in {site.where}", tensor.data_type, tuple(tensor.dims), payloads.lengths[-1]
                )
            )
    _walk_delayed(walk, DelayedResolver(folder), safetensors, table, payloads)
    walk.moved = len(payloads) - walk.start
    return walk


def _walk_delayed(
    walk: SourceWalk, resolver: DelayedResolver, safetensors: bool, table: SourceTable, payloads: PayloadColumns
) -> None:
    """Every ``DelayedInitializer`` node reads a range of a file, as an external tensor does: its range moves into
    the destination's weights like theirs (sites after the tensors', :func:`~onnx_light_ref.io._plan.sites.iter_sites`),
    so the written model never reads a file of the source's folder."""
    for site in iter_delayed(walk.model):
        file, offset, length = resolver.read_range(site)
        walk.delayed_files[file.identity] = file.path
        payloads.add_range(table.index(file.path, file.identity, file.folder, file.location), offset, length)
        walk.sites.append(SITE_MOVED)
        walk.marks.append(site_mark(site))
        if safetensors:
            walk.named.append(SafetensorsTensor(site.label, site.where, site.dtype, site.shape, length))


@dataclass
class PayloadPlacement:
    """Where :func:`place_payloads` put every payload (``shards[i]``, ``offsets[i]``) and what each file holds."""

    shards: array[int]
    offsets: array[int]
    sizes: list[int]  # size of every weights file
    headers: list[bytes]  # safetensors: each file's header
    unaligned: list[str]  # safetensors: names of tensors >= align_threshold not starting aligned
    deduplicated_tensors: int = 0  # payloads stored at the place of an earlier one
    deduplicated_bytes: int = 0


def place_payloads(
    lengths: Sequence[int],
    first: Sequence[int],
    named: Sequence[SafetensorsTensor],
    step: int,
    threshold: int,
    shard_cap: int | None,
    *,
    safetensors: bool,
) -> PayloadPlacement:
    """Give each distinct payload (``first[i] == i``) its file and offset; every other one shares its first's.

    Raw files: :class:`~onnx_light_ref.io._plan.placement.ShardedLayout`, in payload order. safetensors:
    :func:`~onnx_light_ref.io._plan.safetensors_layout.plan_safetensors` over the distinct payloads, keyed by their
    entries of ``named`` (one per payload).

    Raises:
        SafetensorsError: safetensors keys that are empty or repeated, or data types it cannot store.
    """
    placement = PayloadPlacement(array("i"), array("q"), [], [], [])
    if safetensors:
        distinct = [index for index in range(len(lengths)) if first[index] == index]
        st_layout = plan_safetensors([named[index] for index in distinct], step, threshold, shard_cap)
        where = dict(zip(distinct, zip(st_layout.shards, st_layout.offsets, strict=True), strict=True))
        for index in range(len(lengths)):
            shard, offset = where[first[index]]
            placement.shards.append(shard)
            placement.offsets.append(offset)
            if first[index] != index:
                placement.deduplicated_tensors += 1
                placement.deduplicated_bytes += lengths[index]
        placement.headers, placement.unaligned = st_layout.headers, st_layout.unaligned
        placement.sizes = st_layout.sizes if distinct else []
        return placement
    layout = ShardedLayout(step, threshold, shard_cap)
    blobs = array("q")  # each payload's blob in the layout: a duplicate's is its first's
    for index, length in enumerate(lengths):
        representative = first[index]
        if representative != index:  # always an earlier tensor: its blob is known
            blobs.append(blobs[representative])
            placement.deduplicated_tensors += 1
            placement.deduplicated_bytes += length
            continue
        blobs.append(layout.add(length))
    # Read once every blob is placed: a zero-length one's offset is the final end of its file.
    shards, offsets = layout.columns()
    if placement.deduplicated_tensors:
        shards, offsets = [shards[blob] for blob in blobs], [offsets[blob] for blob in blobs]
    placement.shards.extend(shards)
    placement.offsets.extend(offsets)
    placement.sizes = layout.sizes
    return placement


def build_shards(
    paths: Sequence[str],
    dst_onnx: str,
    files: Sequence[SourceFile],
    placement: PayloadPlacement,
    payloads: PayloadColumns,
    first: Sequence[int],
) -> list[Shard]:
    """The weights files of a placement: each one's location from ``dst_onnx``'s folder, header and content, its
    distinct payloads in destination order (the copy engine and the in-memory writer go through each front to back).

    Raises:
        UnsafeLocationError: a weights file outside the folder of ``dst_onnx`` or reached through a symlink.
    """
    shards = [
        Shard(path, weights_location(dst_onnx, path), files, size)
        for path, size in zip(paths, placement.sizes, strict=True)
    ]
    for shard, header in zip(shards, placement.headers, strict=False):
        shard.header = header
    move_shards, move_offsets = placement.shards, placement.offsets
    for index in sorted(
        (i for i in range(len(payloads)) if first[i] == i), key=lambda i: (move_shards[i], move_offsets[i])
    ):
        length = payloads.lengths[index]
        if not length:
            continue
        shard = shards[move_shards[index]]
        file_index = payloads.files[index]
        if file_index < 0:
            shard.writes.append((move_offsets[index], payloads.memory[index]))
        else:
            shard.ranges.add(file_index, payloads.offsets[index], move_offsets[index], length)
    return shards


class SourceTable:
    """One index per source file (by identity), for the range columns and the range keys."""

    def __init__(self) -> None:
        self.files: list[SourceFile] = []
        self._indices: dict[FileIdentity, int] = {}

    def index(
        self, path: str, identity: FileIdentity, folder: ModelFolder | None = None, location: str | None = None
    ) -> int:
        index = self._indices.get(identity)
        if index is None:
            index = self._indices[identity] = len(self.files)
            self.files.append(SourceFile(path, identity, folder, location))
        return index


class PayloadColumns:
    """The payload of every moved tensor, in walk order, as columns: a range of a source file, or bytes in memory."""

    def __init__(self) -> None:
        self.files: array[int] = array("i")  # index into the source table; -1: bytes in `memory`
        self.offsets: array[int] = array("q")
        self.lengths: array[int] = array("q")
        self.memory: dict[int, bytes] = {}  # the few typed-field or short raw_data tensors

    def __len__(self) -> int:
        return len(self.lengths)

    def add_range(self, file_index: int, offset: int, length: int) -> None:
        self.files.append(file_index)
        self.offsets.append(offset)
        self.lengths.append(length)

    def add_bytes(self, data: bytes) -> None:
        self.memory[len(self.lengths)] = data
        self.add_range(-1, 0, len(data))

    def key(self, index: int) -> int | None:
        """Equal keys are the same bytes by construction: same file, offset and length (None for bytes in memory)."""
        file_index = self.files[index]
        if file_index < 0:
            return None
        # offset and length are below 2**63 (checked when parsed), so the packing is exact.
        return (file_index << 128) | (self.offsets[index] << 64) | self.lengths[index]


def _load(
    src_onnx: str, inline_threshold: int | None, mode: Mode, folder: ModelFolder
) -> tuple[onnx.ModelProto, StrippedModel | None, FileIdentity | None]:
    """Parse the source: stripped of its inline payloads when they are to be copied out of the file."""
    if inline_threshold is None or mode == "in_memory":
        return load_model_metadata(src_onnx, folder=folder), None, None
    before = file_identity(src_onnx)
    stripped = load_model_stripped(src_onnx, min_length=inline_threshold, folder=folder)
    # load_model_metadata checks the strings; the stripped parse does not: a non-UTF-8 name is refused the same way.
    check_model_strings(stripped.model, what=repr(src_onnx))
    after = file_identity(src_onnx)
    if before is None or before != after:
        raise ExternalDataError(f"source model {src_onnx!r} was replaced while it was being parsed; nothing written.")
    return stripped.model, stripped, after


@dataclass(frozen=True, slots=True)
class _InlineData:
    """An inline tensor's payload as the plan sees it: its length (None: no byte size), where it is (stripped from
    the parse, as ``raw_data``, or in typed fields), read once (protobuf copies ``raw_data`` on every access)."""

    length: int | None
    expected: int | None
    payload: InlinePayload | None = None
    raw: bytes | None = None

    @classmethod
    def of(cls, tensor: onnx.TensorProto, stripped: StrippedModel | None) -> _InlineData:
        payload = stripped.payload(tensor) if stripped is not None else None
        expected = None if tensor.data_type in _NEVER_EXTERNAL else expected_nbytes(tensor)
        if expected is None:  # STRING, UNDEFINED or an unknown data type: its size cannot be checked
            return cls(None, None, payload)
        if payload is not None:
            return cls(payload.length, expected, payload)
        if tensor.HasField("raw_data"):
            raw = tensor.raw_data
            return cls(len(raw), expected, None, raw)
        return cls(expected, expected)


def _add_inline(
    tensor: onnx.TensorProto,
    label: str,
    inline: _InlineData,
    src_onnx: str,
    onnx_identity: FileIdentity | None,
    table: SourceTable,
    payloads: PayloadColumns,
) -> None:
    """Add the payload of an inline tensor rule 2 moves out to ``payloads``, refusing a malformed one."""
    assert inline.length is not None and inline.expected is not None
    if inline.length != inline.expected:
        raise ExternalDataError(
            f"tensor {label!r}: inline raw_data holds {inline.length} bytes but its dims {list(tensor.dims)} and data "
            f"type {_dtype_name(tensor.data_type)} need {inline.expected} bytes; refusing to externalize a malformed "
            "tensor."
        )
    if inline.payload is not None:
        assert onnx_identity is not None
        payloads.add_range(table.index(src_onnx, onnx_identity), inline.payload.offset, inline.length)
    elif inline.raw is not None:
        payloads.add_bytes(inline.raw)
    else:
        payloads.add_bytes(_typed_bytes(tensor, label, inline.expected))


def _restore_payload(
    tensor: onnx.TensorProto, label: str, payload: InlinePayload, src_onnx: str, onnx_identity: FileIdentity | None
) -> None:
    """Give a tensor that stays inline its stripped ``raw_data`` back, read from the ``.onnx`` (checked unchanged).

    Only tensors rule 2 keeps inline (STRING, UNDEFINED or unknown data types carrying ``raw_data``, which no
    exporter writes; tensors onnx's loader would not read back: sparse, function defaults, training graphs; shape
    tensors) get here; their bytes are held in memory, as the in-memory aligner holds them.
    """
    data = read_range(CopyRange(src_onnx, payload.offset, 0, payload.length, onnx_identity))
    if len(data) != payload.length:
        raise ExternalDataError(
            f"tensor {label!r}: source model {src_onnx!r} ended at offset {payload.offset + len(data)} while its "
            f"inline raw_data needs {payload.length} bytes at offset {payload.offset}; was it truncated while being "
            "read?"
        )
    tensor.raw_data = data


def _typed_bytes(tensor: onnx.TensorProto, label: str, expected: int) -> bytes:
    """Little-endian raw bytes of a tensor stored in typed fields (onnx's own conversion, sub-byte packing included).

    Holds the values twice for a moment (numpy array and bytes); typed fields hold small tensors in practice.
    """
    try:
        data = typed_raw_bytes(tensor)
    except (ValueError, TypeError, KeyError) as exc:
        raise ExternalDataError(
            f"tensor {label!r}: its typed data does not fit its dims {list(tensor.dims)} and data type "
            f"{_dtype_name(tensor.data_type)}: {exc}"
        ) from exc
    if len(data) != expected:
        raise ExternalDataError(
            f"tensor {label!r}: its typed data gives {len(data)} bytes but its dims {list(tensor.dims)} and data "
            f"type {_dtype_name(tensor.data_type)} need {expected} bytes."
        )
    return data


def _dtype_name(data_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_string(data_type).removeprefix("TensorProto.")
    except (KeyError, ValueError):
        return f"unknown data type {data_type}"


def representatives(files: Sequence[SourceFile], payloads: PayloadColumns, dedup: bool, chunk_size: int) -> array[int]:
    """For each payload, the first payload whose bytes it shares (itself when it is the first)."""
    if dedup:
        with _open_files(files) as fds:
            return find_duplicates(_Blobs(files, fds, payloads), chunk_size)
    first: array[int] = array("q", range(len(payloads)))
    first_of: dict[int, int] = {}
    for index in range(len(payloads)):
        key = payloads.key(index)
        if key is not None:
            first[index] = first_of.setdefault(key, index)
    return first


class _Blobs(Sequence[BlobSource]):
    """The payloads as :class:`BlobSource` descriptors for :func:`find_duplicates`, built on demand."""

    def __init__(self, files: Sequence[SourceFile], fds: Sequence[int], payloads: PayloadColumns) -> None:
        self._files = files
        self._fds = fds
        self._payloads = payloads

    def __len__(self) -> int:
        return len(self._payloads)

    @overload
    def __getitem__(self, index: int) -> BlobSource: ...

    @overload
    def __getitem__(self, index: slice) -> list[BlobSource]: ...

    def __getitem__(self, index: int | slice) -> BlobSource | list[BlobSource]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        payloads = self._payloads
        length = payloads.lengths[index]
        file_index = payloads.files[index]
        if file_index < 0:
            return BlobSource(length, data=payloads.memory[index])
        return BlobSource(
            length,
            self._fds[file_index],
            payloads.offsets[index],
            key=payloads.key(index),
            label=repr(self._files[file_index].path),
        )


@contextlib.contextmanager
def _open_files(files: Sequence[SourceFile]) -> Iterator[list[int]]:
    """Open each source file once (refusing one swapped since validation) for the duplicate search."""
    fds: list[int] = []
    try:
        for source in files:
            fds.append(open_source(CopyRange(source.path, 0, 0, 0, source.identity, source.folder, source.location)))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def stale_shards(dst_onnx: str, base: str, written: list[str], sources: set[FileIdentity]) -> list[str]:
    """Files named like weights files of ``dst_onnx`` (any scheme or format) that this run does not write.

    A source of this run is not listed. They are never deleted (this job did not create them); the aligners name
    them so the user can (:func:`~onnx_light_ref.io._plan.shard_names.stale_candidates`).
    """
    return [path for path in stale_candidates(dst_onnx, base, written) if not _is_source(path, sources)]


def safetensors_index(
    dst_onnx: str, base: str, shards: list[Shard], named: list[SafetensorsTensor], move_shards: array[int]
) -> tuple[str, bytes] | None:
    """``<base>.index.json`` of a sharded safetensors set (transformers' form); None for a single file."""
    if len(shards) < 2:
        return None
    path = index_path(base)
    folder = os.path.dirname(path)  # weight_map names files relative to the index, wherever the .onnx is
    weight_map = {tensor.name: os.path.relpath(shards[move_shards[i]].path, folder) for i, tensor in enumerate(named)}
    document = {"metadata": {"total_size": sum(t.length for t in named)}, "weight_map": weight_map}
    return path, (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _is_source(path: str, sources: set[FileIdentity]) -> bool:
    try:
        return file_identity(path) in sources
    except OSError:  # a symlink loop, a permission problem: not a source of this run, which was validated
        return False
