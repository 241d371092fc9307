"""Safe resolution and validation of ``external_data`` locations and byte ranges.

Everything the package reads or writes through a ``location`` goes through this module, and every check happens
here, before any byte is copied: the location is relative, free of ``..`` components (the ONNX spec forbids them),
of NUL bytes and backslashes, and resolves (symlinks followed) inside the model's folder; the file exists and is a
regular file; ``offset + length`` fits in it; ``length`` agrees with the tensor's dims and dtype.

This module never opens a file for writing and never reads weight bytes: it only ``stat``s.
"""

from __future__ import annotations

import math
import os
import stat
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx.external_data_helper import ExternalDataInfo

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError

__all__ = [
    "ExternalRef",
    "FileIdentity",
    "LocationResolver",
    "check_external_structure",
    "check_location_syntax",
    "check_not_hard_linked",
    "expected_nbytes",
    "file_identity",
    "is_external",
    "parse_external_data",
    "resolve_location",
]

# Largest value an int64 `offset`/`length` can hold: anything above cannot come from a valid writer and would
# overflow the C++ loaders (OpenVINO #34070), so it is refused even though Python ints do not overflow.
_INT64_MAX = 2**63 - 1

# Element types whose elements are smaller than a byte: (elements per byte). Packed as in ONNX raw_data.
_SUB_BYTE_ELEMENTS_PER_BYTE = {
    onnx.TensorProto.INT4: 2,
    onnx.TensorProto.UINT4: 2,
}
for _name, _per_byte in (("FLOAT4E2M1", 2), ("INT2", 4), ("UINT2", 4)):
    if hasattr(onnx.TensorProto, _name):  # newer onnx releases only
        _SUB_BYTE_ELEMENTS_PER_BYTE[getattr(onnx.TensorProto, _name)] = _per_byte


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What makes two paths the same file: device and inode (catches hard links and symlinks)."""

    device: int
    inode: int


@dataclass(frozen=True, slots=True)
class ExternalRef:
    """One validated external reference: where a tensor's bytes are, already checked against the file."""

    tensor_name: str
    location: str  # as written in the model
    path: str  # absolute, symlinks resolved
    offset: int
    length: int
    checksum: str | None
    file_size: int
    identity: FileIdentity
    link_count: int  # > 1: the file is hard-linked (see check_not_hard_linked)


def is_external(tensor: onnx.TensorProto) -> bool:
    """True when the tensor declares ``data_location == EXTERNAL``."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def file_identity(path: str) -> FileIdentity | None:
    """Device and inode of ``path`` (following symlinks), or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def check_location_syntax(location: str, *, tensor_name: str) -> None:
    """Refuse locations that are empty, absolute, contain NUL/backslash, or have a ``..`` component.

    Pure string checks, no file system access. Raises :class:`UnsafeLocationError`.
    """
    where = f"tensor {tensor_name!r}: external data location {location!r}"
    if not location:
        raise UnsafeLocationError(f"{where} is empty; expected a file name relative to the model's folder.")
    if "\x00" in location:
        raise UnsafeLocationError(f"{where} contains a NUL byte.")
    if "\\" in location:
        raise UnsafeLocationError(f"{where} contains a backslash; locations use '/' as separator.")
    if os.path.isabs(location) or location.startswith("/"):
        raise UnsafeLocationError(f"{where} is absolute; the ONNX spec requires a path relative to the model's folder.")
    if ".." in location.split("/"):
        raise UnsafeLocationError(f"{where} contains a '..' component, which the ONNX spec disallows.")
    if location.strip("/.") == "":
        raise UnsafeLocationError(f"{where} does not name a file.")


def resolve_location(base_dir: str, location: str, *, tensor_name: str) -> str:
    """Return the absolute, symlink-free path of ``location`` inside ``base_dir``.

    Checks the syntax, then that the real path stays inside the real ``base_dir`` (a symlinked file or parent folder
    pointing outside is refused), and that it is an existing regular file. Raises :class:`UnsafeLocationError`,
    ``FileNotFoundError`` (also for a path through a regular file) or :class:`ExternalDataError` (not a regular
    file, or not accessible: a symlink loop, a name too long).
    """
    return _resolve_and_stat(os.path.realpath(base_dir), location, tensor_name)[0]


class LocationResolver:
    """Resolves locations against one folder, each distinct location once (see :func:`resolve_location`).

    Models keep thousands of tensors in a handful of files; resolving every tensor anew costs two ``realpath`` walks
    and two ``stat`` calls, which was half the time of re-aligning 8192 small tensors. Only successes are cached,
    so every error still names the tensor that hit it. Use one resolver per plan: the copy engine re-checks device
    and inode when it opens each file, so a file swapped after planning is still caught.
    """

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self._real_base = os.path.realpath(base_dir)
        self._resolved: dict[str, tuple[str, os.stat_result]] = {}

    def resolve(self, location: str, *, tensor_name: str) -> tuple[str, os.stat_result]:
        """The real path of ``location`` and its ``stat`` result."""
        hit = self._resolved.get(location)
        if hit is None:
            hit = _resolve_and_stat(self._real_base, location, tensor_name)
            self._resolved[location] = hit
        return hit


def _resolve_and_stat(real_base: str, location: str, tensor_name: str) -> tuple[str, os.stat_result]:
    check_location_syntax(location, tensor_name=tensor_name)
    joined = os.path.join(real_base, location)
    real = os.path.realpath(joined)
    if os.path.commonpath([real_base, real]) != real_base:
        raise UnsafeLocationError(
            f"tensor {tensor_name!r}: external data location {location!r} resolves to {real!r}, outside the "
            f"model's folder {real_base!r} (through a symbolic link)."
        )
    try:
        st = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):  # ENOTDIR: a component is a file ('w.bin/x'), so no such file
        raise FileNotFoundError(
            f"tensor {tensor_name!r}: external data file {location!r} does not exist (looked for {joined!r})."
        ) from None
    except OSError as exc:  # ELOOP, ENAMETOOLONG, EACCES...: the location names nothing we can read
        raise ExternalDataError(
            f"tensor {tensor_name!r}: external data location {location!r} ({joined!r}) cannot be accessed: "
            f"{exc.strerror or exc}."
        ) from exc
    if not stat.S_ISREG(st.st_mode):
        raise ExternalDataError(
            f"tensor {tensor_name!r}: external data location {location!r} ({real!r}) is not a regular file."
        )
    return real, st


def expected_nbytes(tensor: onnx.TensorProto) -> int | None:
    """Byte size of the tensor's raw data from its dims and data type, or None if the type has no fixed size."""
    n_elements = math.prod(tensor.dims)
    per_byte = _SUB_BYTE_ELEMENTS_PER_BYTE.get(tensor.data_type)
    if per_byte is not None:
        return (n_elements + per_byte - 1) // per_byte
    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return n_elements * itemsize


def _parse_int_entry(tensor_name: str, key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ExternalDataError(
            f"tensor {tensor_name!r}: external data {key!r} must be a non-negative integer, got {value!r}."
        ) from None
    if number < 0:
        raise ExternalDataError(f"tensor {tensor_name!r}: external data {key!r} must be non-negative, got {number}.")
    if number > _INT64_MAX:
        raise ExternalDataError(f"tensor {tensor_name!r}: external data {key!r} = {number} does not fit in int64.")
    return number


def check_external_structure(tensor: onnx.TensorProto, *, label: str | None = None) -> None:
    """Refuse an EXTERNAL tensor that also carries inline ``raw_data``, or that has no ``external_data`` entries."""
    name = label or tensor.name
    if tensor.HasField("raw_data"):
        raise ExternalDataError(
            f"tensor {name!r} has both inline raw_data ({len(tensor.raw_data)} bytes) and external_data; "
            "expected one or the other."
        )
    if len(tensor.external_data) == 0:
        raise ExternalDataError(f"tensor {name!r} is marked EXTERNAL but has no external_data entries.")


def parse_external_data(
    tensor: onnx.TensorProto, base_dir: str | LocationResolver, *, label: str | None = None
) -> ExternalRef:
    """Validate one EXTERNAL tensor's entries against its file and return where its bytes are.

    ``base_dir`` is the model's folder, or a :class:`LocationResolver` for it when validating many tensors.

    Uses onnx's :class:`ExternalDataInfo` for the key whitelist (unknown keys are an error here, not a warning: a
    writer that adds keys we would silently drop is better told). ``length`` is required unless dims and dtype give
    it; when both exist they must agree. ``offset + length`` must fit in the file.
    """
    name = label or tensor.name
    check_external_structure(tensor, label=name)
    keys = [entry.key for entry in tensor.external_data]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        raise ExternalDataError(f"tensor {name!r}: external_data has duplicated keys {duplicated}.")
    raw = {entry.key: entry.value for entry in tensor.external_data}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            info = ExternalDataInfo(tensor)
        except ValueError:
            info = None  # onnx's message lacks the file; ours below is reported instead
    if caught:
        unknown = sorted(set(keys) - {"location", "offset", "length", "checksum", "basepath"})
        raise ExternalDataError(
            f"tensor {name!r}: unknown external_data keys {unknown}; expected only location, offset, length, checksum."
        )
    del info
    location = raw.get("location", "")
    if "location" not in raw:
        raise ExternalDataError(f"tensor {name!r} has no external_data 'location'.")
    offset = _parse_int_entry(name, "offset", raw["offset"]) if "offset" in raw else 0
    expected = expected_nbytes(tensor)
    if "length" in raw:
        length = _parse_int_entry(name, "length", raw["length"])
        if expected is not None and length != expected:
            raise ExternalDataError(
                f"tensor {name!r}: external data length {length} (in {raw.get('location')!r}) does not match dims "
                f"{list(tensor.dims)} and "
                f"data type {onnx.helper.tensor_dtype_to_string(tensor.data_type)} ({expected} bytes)."
            )
    elif expected is not None:
        length = expected
    else:
        raise ExternalDataError(
            f"tensor {name!r} has no external_data 'length' and its data type "
            f"{tensor.data_type} does not give a byte size."
        )
    resolver = base_dir if isinstance(base_dir, LocationResolver) else LocationResolver(base_dir)
    path, st = resolver.resolve(location, tensor_name=name)
    if offset > st.st_size or length > st.st_size - offset:
        raise ExternalDataError(
            f"tensor {name!r}: external data range [offset {offset}, +{length} bytes) exceeds the size of "
            f"{location!r} ({st.st_size} bytes)."
        )
    return ExternalRef(
        tensor_name=name,
        location=location,
        path=path,
        offset=offset,
        length=length,
        checksum=raw.get("checksum"),
        file_size=st.st_size,
        identity=FileIdentity(st.st_dev, st.st_ino),
        link_count=st.st_nlink,
    )


def check_not_hard_linked(ref: ExternalRef) -> None:
    """Refuse to read a data file that has several hard links, as onnx >= 1.21 does.

    A hard link inside the model folder can name any file the user can read (CVE-2026-34446): copying its bytes into
    a new weights file would leak it. Kept separate from :func:`parse_external_data` so that callers can first report
    the more useful "destination is a source" error when the extra link is their own destination.
    """
    if ref.link_count > 1:
        raise UnsafeLocationError(
            f"tensor {ref.tensor_name!r}: external data file {ref.location!r} ({ref.path!r}) has "
            f"{ref.link_count} hard links; refused as onnx does (a hard link can expose a file from outside the "
            "model's folder). Copy the file instead of hard-linking it."
        )
