"""Describe how a model's external tensors are laid out in their files: offsets, alignment, gaps, overlaps, errors.

:func:`build_layout_report` walks every tensor with :func:`~onnx_light_ref.io.walker.iter_tensors`, validates each
external reference with :func:`~onnx_light_ref.io.locations.parse_external_data` (the same checks every io function
applies) and, instead of stopping at the first problem, records it on that tensor. It then looks at each file:
which byte ranges are used, which are gaps (padding or orphaned bytes), which tensors share one identical range
(normal: deduplicated or tied weights) and which ranges partially overlap (an error: two tensors would see each
other's bytes).

Statuses: ``ok``, ``shared`` (identical range used by several tensors) are fine; ``overlap``, ``out of bounds``,
``missing file``, ``unsafe location`` and ``invalid`` (any other malformed entry) are errors.

This module must never read weight bytes (it only ``stat``s files) and never writes anything; it returns plain
dataclasses and leaves presentation to the caller (``onnx-light-ref inspect``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import onnx

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io.alignment import offset_alignment
from onnx_light_ref.io.locations import LocationResolver, expected_nbytes, is_external, parse_external_data
from onnx_light_ref.io.model_file import load_model_metadata
from onnx_light_ref.io.walker import iter_tensors

__all__ = [
    "ERROR_STATUSES",
    "FileLayout",
    "Gap",
    "LayoutReport",
    "TensorLayout",
    "build_layout_report",
]

ERROR_STATUSES = frozenset({"overlap", "out of bounds", "missing file", "unsafe location", "invalid"})


@dataclass
class TensorLayout:
    """One external tensor as its entries describe it, and what was found checking them."""

    name: str
    where: str
    location: str
    offset: int | None  # None when the entry is missing or not a number
    length: int | None
    status: str = "ok"
    message: str = ""
    shared_with: list[str] = field(default_factory=list)

    @property
    def alignment(self) -> int | None:
        """Largest power of two dividing the offset (0 for offset 0: any alignment), or None if unknown."""
        return None if self.offset is None else offset_alignment(self.offset)

    @property
    def is_error(self) -> bool:
        return self.status in ERROR_STATUSES


@dataclass(frozen=True)
class Gap:
    """Bytes of a data file that no tensor uses (alignment padding, or data nobody references anymore)."""

    offset: int
    length: int


@dataclass
class FileLayout:
    """Totals for one data file, from the tensors whose references are valid."""

    location: str
    path: str | None  # None: missing or unsafe
    size: int | None
    tensors: int = 0
    bytes_used: int = 0  # union of the valid ranges: shared bytes count once
    gaps: list[Gap] = field(default_factory=list)

    @property
    def gap_bytes(self) -> int:
        return sum(gap.length for gap in self.gaps)


@dataclass
class LayoutReport:
    """Everything ``inspect`` prints about one model."""

    model_path: str
    tensors: list[TensorLayout]
    files: list[FileLayout]
    inline_tensors: int  # tensors holding their bytes in the proto (not checked further)

    @property
    def errors(self) -> list[TensorLayout]:
        return [t for t in self.tensors if t.is_error]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def common_alignment(self) -> int | None:
        """Largest power of two every known offset is a multiple of; 0 when all offsets are 0; None: no offsets."""
        alignments = [t.alignment for t in self.tensors if t.alignment is not None]
        if not alignments:
            return None
        nonzero = [a for a in alignments if a > 0]
        return min(nonzero) if nonzero else 0


def _entry_int(tensor: onnx.TensorProto, key: str) -> int | None:
    """The entry's value for display, or None; validation proper is parse_external_data's job."""
    for entry in tensor.external_data:
        if entry.key == key:
            try:
                value = int(entry.value)
            except ValueError:
                return None
            return value if value >= 0 else None
    return None


def _entry_str(tensor: onnx.TensorProto, key: str) -> str:
    for entry in tensor.external_data:
        if entry.key == key:
            return entry.value
    return ""


def _check_tensor(
    tensor: onnx.TensorProto, label: str, where: str, resolver: LocationResolver
) -> tuple[TensorLayout, str | None]:
    """Validate one reference; return its layout and its resolved path (None if it does not resolve)."""
    has_offset = any(entry.key == "offset" for entry in tensor.external_data)
    offset = _entry_int(tensor, "offset") if has_offset else 0
    length = _entry_int(tensor, "length")
    if length is None and not any(entry.key == "length" for entry in tensor.external_data):
        length = expected_nbytes(tensor)
    layout = TensorLayout(label, where, _entry_str(tensor, "location"), offset, length)
    try:
        ref = parse_external_data(tensor, resolver, label=label)
    except UnsafeLocationError as exc:
        layout.status, layout.message = "unsafe location", str(exc)
        return layout, None
    except FileNotFoundError as exc:
        layout.status, layout.message = "missing file", str(exc)
        return layout, None
    except ExternalDataError as exc:
        layout.message = str(exc)
        layout.status = "invalid"
        try:
            path, st = resolver.resolve(layout.location, tensor_name=label)
        except (ExternalDataError, FileNotFoundError):
            return layout, None
        size = st.st_size
        if offset is not None and length is not None and offset + length > size:
            layout.status = "out of bounds"
        return layout, path
    layout.offset, layout.length = ref.offset, ref.length
    return layout, ref.path


def _mark_overlap(
    file: FileLayout, tensors: list[TensorLayout], other: tuple[int, int], others: list[TensorLayout]
) -> None:
    names = ", ".join(repr(t.name) for t in others)
    for tensor in tensors:
        tensor.status = "overlap"
        tensor.message = (
            f"tensor {tensor.name!r}: range [{tensor.offset}, +{tensor.length} bytes) of {file.location!r} partially "
            f"overlaps [{other[0]}, +{other[1]} bytes) of {names}."
        )


def _analyse_file(file: FileLayout, members: list[TensorLayout]) -> None:
    """Mark shared and partially overlapping ranges among valid tensors; compute used bytes and gaps."""
    valid = [t for t in members if not t.is_error and t.offset is not None and t.length is not None]
    by_range: dict[tuple[int, int], list[TensorLayout]] = {}
    for tensor in valid:
        assert tensor.offset is not None and tensor.length is not None
        by_range.setdefault((tensor.offset, tensor.length), []).append(tensor)
    for group in by_range.values():
        if len(group) > 1:
            for tensor in group:
                tensor.status = "shared"
                tensor.shared_with = [other.name for other in group if other is not tensor]
    ranges = sorted(r for r in by_range if r[1] > 0)  # an empty range overlaps nothing
    for index, first in enumerate(ranges):
        for second in ranges[index + 1 :]:
            if second[0] >= first[0] + first[1]:
                break  # sorted by start: no later range reaches back into `first`
            _mark_overlap(file, by_range[first], second, by_range[second])
            _mark_overlap(file, by_range[second], first, by_range[first])
    file.tensors = len(members)
    cursor = used = 0
    for start, length in ranges:
        if start > cursor:
            file.gaps.append(Gap(cursor, start - cursor))
        used += max(0, start + length - max(start, cursor))
        cursor = max(cursor, start + length)
    file.bytes_used = used
    if file.size is not None and file.size > cursor:
        file.gaps.append(Gap(cursor, file.size - cursor))


def build_layout_report(model_path: str | os.PathLike[str]) -> LayoutReport:
    """Parse ``model_path`` (metadata only) and describe every external tensor and data file.

    Raises only for the model file itself (``FileNotFoundError``, :class:`~onnx_light_ref.errors.InvalidModelError`);
    every problem with a tensor's reference is recorded in the report.
    """
    path = os.path.abspath(os.fspath(model_path))
    model = load_model_metadata(path)
    resolver = LocationResolver(os.path.dirname(path))
    tensors: list[TensorLayout] = []
    files: dict[str, FileLayout] = {}  # keyed by resolved path (two spellings of one file are one file)
    members: dict[str, list[TensorLayout]] = {}
    inline = 0
    for site in iter_tensors(model):
        if not is_external(site.tensor):
            inline += 1
            continue
        layout, resolved = _check_tensor(site.tensor, site.label, site.where, resolver)
        tensors.append(layout)
        if layout.status == "unsafe location":
            continue  # names no file we may look at
        key = resolved if resolved is not None else f"\0{layout.location}"
        if key not in files:
            size = os.stat(resolved).st_size if resolved is not None else None
            files[key] = FileLayout(layout.location, resolved, size)
        members.setdefault(key, []).append(layout)
    for key, file in files.items():
        if file.path is None:
            file.tensors = len(members[key])
            continue
        _analyse_file(file, members[key])
    return LayoutReport(path, tensors, list(files.values()), inline)
