"""Describe how a model's external tensors are laid out in their files: offsets, alignment, gaps, overlaps, errors.

:func:`build_layout_report` walks every tensor with :func:`~onnx_light_ref.io._read.walker.iter_tensors` (function
default attributes and training graphs included), reads its entries with :mod:`onnx_light_ref.io._read.entries`,
validates the reference with :func:`~onnx_light_ref.io._read.locations.parse_external_data` (the same checks every io
function applies) and, instead of stopping at the first problem, records it on that tensor. It then looks at each file:
which byte ranges are used, which are gaps (padding or orphaned bytes), which tensors share one identical range (normal:
deduplicated or tied weights) and which ranges partially overlap (an error: two tensors would see each other's
bytes). Overlaps are found with one sort and binary searches, O(n log n): thousands of mutually overlapping ranges
(a hostile or broken model) must not make ``inspect`` quadratic.

Statuses (:data:`LayoutStatus`): ``ok``, ``shared`` (identical range used by several tensors) are fine; ``overlap``,
``out of bounds``, ``missing file``, ``unsafe location`` (a location that escapes the model's folder or is
malformed), ``hard-linked`` (the file has several hard links, which onnx and ``align`` refuse to read),
``invalid`` (any other malformed entry: unknown or duplicated keys, non-UTF-8 text, a number that is not plain
ASCII digits, a length that disagrees with dims, negative dims) and ``zero-length mid-file`` (a reference of zero
bytes, ``length`` 0 or a tensor without elements, at an offset before the end of its file: onnx 1.17's loader
treats length 0 as no length, and every onnx a missing ``length``, and reads the rest of the file into a tensor
without elements, which ``numpy_helper.to_array``, the reference evaluator and ``check_model`` of the loaded model
then refuse; onnxruntime reads zero bytes; the end of the file is the one place that gives zero bytes everywhere,
where this package's writers put such tensors) are errors; so is ``loader refuses``: the reference
is fine by the checks above, but ``onnx.load``, ``check_model(full_check=True)`` or onnxruntime refuses it (a
symlink on the data path even inside the folder, a ``basepath`` key, a non-UTF-8 name, a place onnx does not load
external data from). Every external tensor also carries :attr:`TensorLayout.refusals`: which loader refuses what
(:func:`~onnx_light_ref.io._read.loader_rule.loader_refusals`), whatever its status. A non-UTF-8 string elsewhere in the
model (a node name...) is noted in :attr:`LayoutReport.notes` (the loaders accept it; this package's writers refuse
it). ``ok`` means all three loaders accept the model's external data.

A data file named ``*.safetensors`` also gets its header read and described (:attr:`FileLayout.safetensors`,
:mod:`~onnx_light_ref.io._read.safetensors_refs`). Two more error statuses come from it: ``safetensors refuses`` (the
tensor's file is one the ``safetensors`` library refuses to open: a malformed header, one above its 100,000,000-byte
limit, a data section the tensors do not cover exactly) and ``header mismatch`` (the reference overlaps the file's
header, or is not exactly the bytes of the key of its name, or of any key of its dtype and shape: what a model linked
to a checkpoint reads after the checkpoint was re-saved). So ``ok`` also means that every ``*.safetensors`` data file
opens in the safetensors library and that each reference into one reads exactly one of its keys.

A model read by ``ai.rt::DelayedInitializer`` nodes (onnx-light's form) names its files in node attributes instead:
:attr:`LayoutReport.delayed` lists what each node reads (:func:`~onnx_light_ref.io._read.delayed_nodes.delayed_reads`:
file, offset, byte length from ``shape`` and ``dtype``), checked as the ``run`` command and ``undelay`` open it (the
kernel bound to the model's folder): a relative ``filename`` by the rule of an external ``location``, an absolute one
only below the model's folder unless ``allow_outside_folder``; then the same statuses as external tensors (``missing
file``, ``unsafe location``, ``hard-linked``, ``out of bounds``, ``header mismatch``...; ``invalid``: the node breaks a
rule the kernel applies to its attributes). These ranges take part in each file's shared ranges, overlaps and gaps
like external ones. A node whose attributes are a model function's (``ref_attr_name``) reads what each call says:
status ``linked``, not an error, not checked. A node reading zero bytes opens nothing (as the kernel): ``ok``.

This module must never read weight bytes (it only ``stat``s files and reads safetensors headers) and never writes
anything; it returns plain dataclasses and leaves presentation to the caller (``onnx-light-ref inspect``).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from onnx_light_ref.errors import ExternalDataError, InvalidModelError, UnsafeLocationError
from onnx_light_ref.io._arguments import PathLike, check_bool
from onnx_light_ref.io._posix import check_single_link
from onnx_light_ref.io._read.alignment import offset_alignment
from onnx_light_ref.io._read.delayed_rules import DelayedRead, delayed_reads
from onnx_light_ref.io._read.entries import is_external, last_value, parse_entry_int, read_entries
from onnx_light_ref.io._read.folder import ModelFolder, check_file_name, relative_below, stat_unconfined
from onnx_light_ref.io._read.loader_rule import Refusal, loader_refusals
from onnx_light_ref.io._read.locations import (
    LocationResolver,
    check_location_syntax,
    expected_nbytes,
    parse_external_data,
)
from onnx_light_ref.io._read.model_file import check_model_strings, open_model_folder
from onnx_light_ref.io._read.safetensors_header import SafetensorsHeader
from onnx_light_ref.io._read.safetensors_refs import check_reference, is_safetensors_location, read_safetensors_file
from onnx_light_ref.io._read.walker import SitePlace, TensorKind, TensorSite, iter_tensors
from onnx_light_ref.io._read.wire import load_model_lean

if TYPE_CHECKING:
    import onnx

LayoutStatus = Literal[
    "ok",
    "shared",
    "overlap",
    "out of bounds",
    "missing file",
    "unsafe location",
    "hard-linked",
    "invalid",
    "loader refuses",
    "safetensors refuses",
    "header mismatch",
    "zero-length mid-file",
    "linked",
]
"""What was found checking one tensor's reference (or one DelayedInitializer node's); see the module docstring."""

# Names listed in one overlap message; the rest of the partner group is counted.
_NAMES_SHOWN = 3

ERROR_STATUSES: frozenset[LayoutStatus] = frozenset(
    status for status in get_args(LayoutStatus) if status not in ("ok", "shared", "linked")
)
"""Every status but ``ok``, ``shared`` and ``linked``."""


@dataclass
class TensorLayout:
    """One external tensor as its entries describe it, and what was found checking them."""

    name: str
    where: str
    location: str
    offset: int | None  # None when the entry is missing or not a number
    length: int | None
    status: LayoutStatus = "ok"
    message: str = ""
    # Names of every tensor on this identical range (itself included): one list object per group, shared by its
    # members, so that thousands of tensors on one range cost O(n), not O(n^2). Empty when the range is not shared.
    shared_range: list[str] = field(default_factory=list)
    # Which loader (onnx.load, check_model, onnxruntime) refuses what about this reference; empty: none of these rules.
    refusals: list[Refusal] = field(default_factory=list)
    # What the tensor is, from the walker and the proto (for exports such as ``inspect --json``): its index in the
    # walker order of the whole model (inline tensors counted), kind, structural place, data type and dims, and its
    # name and location entry exactly as stored (``bytes`` when not UTF-8; ``name`` and ``location`` are for display).
    index: int = -1
    kind: TensorKind = "initializer"
    place: SitePlace = ()
    data_type: int = 0
    dims: tuple[int, ...] = ()
    raw_name: str | bytes = ""
    raw_location: str | bytes = ""

    @property
    def shared_with(self) -> list[str]:
        """The other tensors using exactly this range (tied or deduplicated weights)."""
        others = list(self.shared_range)
        if self.name in others:
            others.remove(self.name)
        return others

    @property
    def alignment(self) -> int | None:
        """Largest power of two dividing the offset (0 for offset 0: any alignment), or None if unknown."""
        return None if self.offset is None else offset_alignment(self.offset)

    @property
    def is_error(self) -> bool:
        """True for every status but ``ok``, ``shared`` and ``linked``."""
        return self.status in ERROR_STATUSES


@dataclass
class DelayedLayout(TensorLayout):
    """What one ``DelayedInitializer`` node reads (``name`` is its output, ``location`` its ``filename``,
    ``length`` the bytes its ``shape`` and ``dtype`` make, ``index`` its position among the model's such nodes), and
    what was found checking it; ``data_type`` is 0 and ``dims`` empty when unknown."""

    node: str | bytes = ""  # NodeProto.name as stored
    load_device: str | None = None
    path: str | None = None  # the file it resolved to; None: unresolved (or nothing to read)
    file_size: int | None = None


@dataclass(frozen=True)
class Gap:
    """Bytes of a data file that no tensor uses (alignment padding, or data nobody references anymore)."""

    offset: int
    length: int


@dataclass(frozen=True)
class Overlap:
    """A tensor's range that partially overlaps other ranges of its file: ``partner`` is one of them (the one the
    message names), ``ranges`` how many distinct ranges it overlaps."""

    tensor: str
    offset: int
    length: int
    partner: Gap
    ranges: int


@dataclass
class FileLayout:
    """Totals for one data file, from the tensors whose references are valid."""

    location: str
    path: str | None  # None: missing or unsafe
    size: int | None
    tensors: int = 0
    bytes_used: int = 0  # union of the valid ranges: shared bytes count once
    gaps: list[Gap] = field(default_factory=list)  # a safetensors file's header (when it parses) is not one
    safetensors: str | None = None  # a ``*.safetensors`` file: what its header says (see read_safetensors_file)
    safetensors_ok: bool = True  # False: the safetensors library refuses the file (malformed, too large, not covered)
    safetensors_header: SafetensorsHeader | None = None  # the parsed header (None: not safetensors, or malformed)
    overlaps: list[Overlap] = field(default_factory=list)  # tensors partially overlapping others, in offset order

    @property
    def gap_bytes(self) -> int:
        """Bytes of the file no valid tensor uses."""
        return sum(gap.length for gap in self.gaps)


@dataclass
class LayoutReport:
    """Everything ``inspect`` prints about one model."""

    model_path: str
    tensors: list[TensorLayout]
    files: list[FileLayout]
    inline_tensors: int  # tensors holding their bytes in the proto (not checked further)
    # Not errors: e.g. non-UTF-8 text, which the loaders accept and this package's writers refuse.
    notes: list[str] = field(default_factory=list)
    delayed: list[DelayedLayout] = field(default_factory=list)  # what each DelayedInitializer node reads

    @property
    def errors(self) -> list[TensorLayout]:
        """The tensors in error in walk order, then the DelayedInitializer nodes in error."""
        return [t for t in [*self.tensors, *self.delayed] if t.is_error]

    @property
    def ok(self) -> bool:
        """True when no tensor is in error."""
        return not self.errors

    @property
    def common_alignment(self) -> int | None:
        """Largest power of two every known offset is a multiple of; 0 when all offsets are 0; None: no offsets.

        Zero-length tensors do not count: they hold no byte to align, and this package's writers put them at the end
        of their file (``docs/align.md``), wherever that is.
        """
        alignments = [t.alignment for t in [*self.tensors, *self.delayed] if t.alignment is not None and t.length != 0]
        if not alignments:
            return None
        nonzero = [a for a in alignments if a > 0]
        return min(nonzero) if nonzero else 0


def _display_text(value: str | bytes) -> str:
    """A proto string for display: protobuf hands back ``bytes`` for text that is not UTF-8."""
    return value.decode("utf-8", errors="backslashreplace") if isinstance(value, bytes) else value


def _raw_location(tensor: onnx.TensorProto) -> str:
    """The ``location`` entry as written, for display when the entries cannot be read properly (the last one when the
    key repeats: the file onnx's loader opens)."""
    value = last_value(tensor, "location")
    return "" if value is None else _display_text(value)


def _read_range(tensor: onnx.TensorProto, label: str, layout: TensorLayout) -> None:
    """Fill ``layout``'s location, offset and length from the entries; raise ExternalDataError for a bad one.

    ``parse_external_data`` checks these too; reading them here first gives the table its columns even when a later
    check fails, and refuses what must never reach the report as "ok" (a negative length from negative dims).
    """
    entries = read_entries(tensor, label=label)
    layout.location = entries.get("location") or ""
    offset_text, length_text = entries.get("offset"), entries.get("length")
    layout.offset = 0 if offset_text is None else parse_entry_int(offset_text, label=label, key="offset")
    if length_text is not None:
        layout.length = parse_entry_int(length_text, label=label, key="length")
        return
    negative = [dim for dim in tensor.dims if dim < 0]
    if negative:
        raise ExternalDataError(
            f"tensor {label!r} has negative dims {list(tensor.dims)} and no external_data 'length'; its byte size "
            "is undefined."
        )
    layout.length = expected_nbytes(tensor)


def _check_tensor(
    tensor: onnx.TensorProto, label: str, where: str, resolver: LocationResolver
) -> tuple[TensorLayout, str | None, int | None]:
    """Validate one reference; return its layout, its resolved path and the file size (None: does not resolve)."""
    layout = TensorLayout(label, where, _raw_location(tensor), None, None)
    try:
        _read_range(tensor, label, layout)
    except ExternalDataError as exc:
        layout.status, layout.message = "invalid", str(exc)
        return layout, None, None
    try:
        ref = parse_external_data(tensor, resolver, label=label)
    except UnsafeLocationError as exc:
        layout.status, layout.message = "unsafe location", str(exc)
        return layout, None, None
    except FileNotFoundError as exc:
        layout.status, layout.message = "missing file", exc.strerror or str(exc)
        return layout, None, None
    except ExternalDataError as exc:
        layout.status, layout.message = "invalid", str(exc)
        try:
            path, st = resolver.resolve(layout.location, tensor_name=label)
        except (ExternalDataError, FileNotFoundError):
            return layout, None, None
        if layout.offset is not None and layout.length is not None and layout.offset + layout.length > st.st_size:
            layout.status = "out of bounds"
        return layout, path, st.st_size
    layout.offset, layout.length = ref.offset, ref.length
    _, st = resolver.resolve(ref.location, tensor_name=label)
    try:
        check_single_link(st, what=f"tensor {label!r}: external data file {ref.location!r} ({ref.path!r})")
    except UnsafeLocationError as exc:
        layout.status, layout.message = "hard-linked", str(exc)
        return layout, ref.path, ref.file_size
    if ref.length == 0 and ref.offset != ref.file_size:
        layout.status = "zero-length mid-file"
        layout.message = _zero_length_message(label, ref.location, ref.offset, ref.file_size, tensor)
    return layout, ref.path, ref.file_size


def _zero_length_message(label: str, location: str, offset: int, size: int, tensor: onnx.TensorProto) -> str:
    """Why a zero-length reference inside its file is an error (module docstring), and where it belongs."""
    who = (
        "every onnx reads a reference without 'length' as the rest of the file"
        if last_value(tensor, "length") is None
        else "onnx 1.17 (the oldest onnx this package supports) reads length 0 as no length: the rest of the file"
    )
    return (
        f"tensor {label!r}: zero-length reference at offset {offset} of {location!r} ({size} bytes), not at its "
        f"end: {who} ({size - offset} bytes for a tensor without elements; numpy_helper.to_array and the reference "
        f"evaluator fail on it, check_model refuses the loaded model). Point it at the end of its file (offset "
        f"{size}), where every loader reads zero bytes, as this package's writers do."
    )


def _mark_overlaps(file: FileLayout, by_range: dict[tuple[int, int], list[TensorLayout]]) -> None:
    """Mark every tensor whose range partially overlaps another distinct range of the file, in O(n log n).

    Two non-empty ranges ``[s, e)`` and ``[s', e')`` intersect iff ``s' < e`` and ``e' > s``. Over the sorted starts
    and ends, the ranges intersecting ``[s, e)`` are those starting before ``e`` minus those ending at or before
    ``s`` (which all start before ``e`` too), minus the range itself. Each message names one partner (the range
    that reaches furthest among the earlier ones, or else the next one, both of which intersect it) and the count.
    """
    ranges = sorted(r for r in by_range if r[1] > 0)  # an empty range overlaps nothing
    starts = [start for start, _ in ranges]
    ends = sorted(start + length for start, length in ranges)
    reach: tuple[int, int] | None = None  # the earlier range ending last
    for index, (start, length) in enumerate(ranges):
        end = start + length
        count = bisect.bisect_left(starts, end) - bisect.bisect_right(ends, start) - 1
        if count > 0:
            partner = reach if reach is not None and reach[0] + reach[1] > start else ranges[index + 1]
            names = _some_names(by_range[partner])
            more = f" and {count - 1} other range{'s' if count > 2 else ''}" if count > 1 else ""
            for tensor in by_range[(start, length)]:
                file.overlaps.append(Overlap(tensor.name, start, length, Gap(*partner), count))
                tensor.status = "overlap"
                tensor.message = (
                    f"tensor {tensor.name!r}: range [{start}, +{length} bytes) of {file.location!r} partially "
                    f"overlaps [{partner[0]}, +{partner[1]} bytes) of {names}{more}."
                )
        if reach is None or end > reach[0] + reach[1]:
            reach = (start, length)


def _some_names(tensors: list[TensorLayout]) -> str:
    """The first few names of a group of tensors sharing one range, and how many more: every overlapping tensor's
    message names its partner group, so listing the whole group would make the messages quadratic in size."""
    shown = ", ".join(repr(t.name) for t in tensors[:_NAMES_SHOWN])
    hidden = len(tensors) - _NAMES_SHOWN
    return shown if hidden <= 0 else f"{shown} (and {hidden} more tensor{'s' if hidden > 1 else ''} on that range)"


def _analyse_file(file: FileLayout, members: list[TensorLayout]) -> None:
    """Mark shared and partially overlapping ranges among valid tensors; compute used bytes and gaps."""
    by_range: dict[tuple[int, int], list[TensorLayout]] = {}
    for tensor in members:
        if not tensor.is_error and tensor.offset is not None and tensor.length is not None:
            by_range.setdefault((tensor.offset, tensor.length), []).append(tensor)
    for group in by_range.values():
        if len(group) > 1:
            names = [tensor.name for tensor in group]
            for tensor in group:
                tensor.status = "shared"
                tensor.shared_range = names
    _mark_overlaps(file, by_range)
    file.tensors = len(members)
    cursor = used = 0
    for start, length in sorted(r for r in by_range if r[1] > 0):
        if start > cursor:
            file.gaps.append(Gap(cursor, start - cursor))
        used += max(0, start + length - max(start, cursor))
        cursor = max(cursor, start + length)
    file.bytes_used = used
    if file.size is not None and file.size > cursor:
        file.gaps.append(Gap(cursor, file.size - cursor))


def build_layout_report(model_path: PathLike, *, allow_outside_folder: bool = False) -> LayoutReport:
    """Parse ``model_path`` (metadata only) and describe every external tensor and data file.

    Every problem with a tensor's reference is recorded in the report, with the tensor's status and a message;
    nothing about a tensor raises. Files are ``stat``ed, never read.

    Args:
        model_path: the ``.onnx`` file; locations are resolved against its folder, held open from the start.
        allow_outside_folder: follow symbolic links in data paths (a trusted layout such as the Hugging Face cache).
            Default: a data path through a symbolic link is an "unsafe location", as onnx's loader refuses it.
            With it, the per-loader refusals about symbolic links are still listed but do not make the tensor an
            error (the caller vouches for the layout); every other refusal does.

    Returns:
        A :class:`LayoutReport`: one :class:`TensorLayout` per external tensor in walk order, one :class:`FileLayout`
        per data file that resolves (or is missing), and the count of inline tensors.

    Raises:
        FileNotFoundError: ``model_path`` does not exist.
        InvalidModelError: ``model_path`` is not a parsable ONNX model.
    """
    path = os.path.abspath(os.fspath(model_path))
    # Names that are not UTF-8 are reported per tensor below, instead of refusing the whole model.
    folder = open_model_folder(path, allow_outside_folder=allow_outside_folder)  # held: parse and open through it
    # Inline payloads of a large .onnx stay in the file: only the metadata is parsed, whatever the inline weights.
    model, _ = load_model_lean(path, check_strings=False, folder=folder)
    check_bool("allow_outside_folder", allow_outside_folder)
    # The safetensors checks are reported below (check_reference, the one every reader raises), not raised.
    resolver = LocationResolver(folder, check_safetensors=False)
    try:  # for the per-loader diagnosis only (what path-resolving loaders would see), never to decide a read
        real_model_dir: str | None = os.path.dirname(os.path.realpath(path))
    except OSError:  # a folder renamed during the lookup
        real_model_dir = None
    tensors: list[TensorLayout] = []
    files: dict[str, FileLayout] = {}  # keyed by normalized path (two spellings of one file are one file)
    members: dict[str, list[TensorLayout]] = {}

    def add(layout: TensorLayout, resolved: str | None, size: int | None) -> None:
        if resolved is None and layout.status != "missing file":
            return  # an unsafe or unreadable location names no file we may look at
        key = resolved if resolved is not None else f"\0{layout.location}"
        if key not in files:
            files[key] = FileLayout(layout.location, resolved, size)
        members.setdefault(key, []).append(layout)

    inline = 0
    for index, site in enumerate(iter_tensors(model)):
        if not is_external(site.tensor):
            inline += 1
            continue
        layout, resolved, size = _check_tensor(site.tensor, site.label, site.where, resolver)
        layout.refusals = loader_refusals(site, os.path.dirname(path), real_model_dir)
        _describe_site(layout, site, index)
        tensors.append(layout)
        add(layout, resolved, size)
    delayed = [_check_delayed(read, resolver, allow_outside_folder) for read in delayed_reads(model)]
    for layout in delayed:
        add(layout, layout.path, layout.file_size)
    for key, file in files.items():
        if file.path is None:
            file.tensors = len(members[key])
            continue
        _analyse_file(file, members[key])
        if is_safetensors_location(file.path):
            _check_safetensors(resolver.folder, file, members[key])
    for layout in tensors:
        # With the opt-in the caller trusts symbolic links (the Hugging Face cache): still listed, not an error.
        blocking = [r for r in layout.refusals if not (allow_outside_folder and r.symlink)]
        if blocking and not layout.is_error:
            layout.status = "loader refuses"
            layout.message = f"tensor {layout.name!r}: " + "; ".join(r.describe() for r in layout.refusals)
    notes: list[str] = []
    try:
        check_model_strings(model, what=repr(path))
    except InvalidModelError as exc:  # the loaders take it; align, verify and the shared saver refuse it
        notes.append(f"{exc} (the loaders accept it; this package's writers refuse it)")
    resolver.close()
    return LayoutReport(path, tensors, list(files.values()), inline, notes, delayed)


def _describe_site(layout: TensorLayout, site: TensorSite, index: int) -> None:
    """Copy onto ``layout`` what the walker and the proto say the tensor is (see the fields of TensorLayout)."""
    tensor = site.tensor
    layout.index, layout.kind, layout.place = index, site.kind, site.place
    layout.data_type, layout.dims, layout.raw_name = tensor.data_type, tuple(tensor.dims), tensor.name
    layout.raw_location = last_value(tensor, "location") or ""


def _check_delayed(read: DelayedRead, resolver: LocationResolver, allow_outside_folder: bool) -> DelayedLayout:
    """What ``read`` reads, checked as the kernel bound to the model's folder opens it (module docstring)."""
    layout = DelayedLayout(
        read.output or read.where, read.where, read.filename or "", read.offset, read.length, index=read.index,
        data_type=read.dtype or 0, dims=read.shape or (), raw_name=read.output, raw_location=read.filename or "",
        node=read.node, load_device=read.load_device,
    )  # fmt: skip
    if read.linked:
        layout.status = "linked"
        layout.message = (
            f"{read.where}: its attributes are linked to the model function's (ref_attr_name): what it reads is "
            "known per call only, and is not checked here."
        )
        return layout
    if read.problem is not None or read.filename is None or read.offset is None or read.length is None:
        layout.status, layout.message = "invalid", read.problem or ""
        return layout
    if read.length == 0:
        return layout  # reads nothing: the kernel opens no file
    try:
        path, st, trusted = _locate_delayed(
            read.filename, read.where, layout.name, resolver.folder, allow_outside_folder
        )
    except UnsafeLocationError as exc:
        layout.status, layout.message = "unsafe location", str(exc)
        return layout
    except FileNotFoundError as exc:
        layout.status, layout.message = "missing file", exc.strerror or str(exc)
        return layout
    except ExternalDataError as exc:  # not a regular file, not accessible
        layout.status, layout.message = "invalid", str(exc)
        return layout
    layout.path, layout.file_size = path, st.st_size
    try:
        if not trusted:
            check_single_link(st, what=f"{read.where}: file {read.filename!r} ({path!r})")
    except UnsafeLocationError as exc:
        layout.status, layout.message = "hard-linked", str(exc)
        return layout
    needed = read.offset + read.length
    if needed > st.st_size:
        layout.status = "out of bounds"
        layout.message = (
            f"{read.where}: file {read.filename!r} too short: needs {needed} bytes ({read.length} bytes at offset "
            f"{read.offset}), has {st.st_size} bytes."
        )
    return layout


def _locate_delayed(
    filename: str, where: str, label: str, folder: ModelFolder, allow_outside_folder: bool
) -> tuple[str, os.stat_result, bool]:
    """The path and ``stat`` of the file a node names, by the bound kernel's rule and in its words; and whether the
    name is trusted as it is (absolute, with ``allow_outside_folder``: hard links are not refused, as the kernel
    opens it)."""
    what, subject = f"{where}: filename {filename!r}", f"{where}: file {filename!r}"
    check_file_name(filename, what)
    if os.path.isabs(filename):
        if allow_outside_folder:
            return filename, stat_unconfined(filename, subject=subject), True
        outside = " Pass allow_outside_folder=True (CLI: --allow-outside-folder) if you trust this model."
        name = relative_below(folder.path, filename, what=what, outside=outside)
    else:
        try:
            check_location_syntax(filename, tensor_name=label)
        except UnsafeLocationError as exc:
            raise UnsafeLocationError(
                f"{where}: relative filename {filename!r} must stay inside the folder {folder.path!r}: {exc}"
            ) from exc
        name = filename
    return folder.display_path(name), folder.stat_file(name, subject=subject, check_links=False), False


def _check_safetensors(folder: ModelFolder, file: FileLayout, members: list[TensorLayout]) -> None:
    """Describe a ``*.safetensors`` file's header (no tensor byte read) and mark the tensors it makes wrong: every
    reference that disagrees with the header, then every other tensor of a file the library refuses."""
    checked = read_safetensors_file(folder, file.location)
    file.safetensors, file.safetensors_ok = checked.description, checked.refusal is None
    file.safetensors_header = checked.header
    if checked.header is not None:  # the header is the file's own bytes, not a gap between tensors
        start = checked.header.data_start
        file.gaps = [Gap(max(g.offset, start), g.offset + g.length - max(g.offset, start))
                     for g in file.gaps if g.offset + g.length > start]  # fmt: skip
    for tensor in members:
        if tensor.is_error or tensor.offset is None or tensor.length is None:
            continue
        problem = None
        if checked.header is not None:
            key = tensor.raw_name if isinstance(tensor.raw_name, str) else ""  # a non-UTF-8 name is no key
            problem = check_reference(checked, key, tensor.data_type, tensor.dims, tensor.offset, tensor.length)
        if problem is not None:
            tensor.status, tensor.message = "header mismatch", problem
        elif checked.refusal is not None:
            tensor.status = "safetensors refuses"
            tensor.message = (
                f"tensor {tensor.name!r}: its data file {file.location!r} is refused by the safetensors library: "
                f"{checked.refusal}"
            )
