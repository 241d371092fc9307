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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io.entries import is_external, parse_entry_int, read_entries
from onnx_light_ref.io.posix import check_single_link
from onnx_light_ref.onnx_compat import raw_element_size

__all__ = [
    "TYPED_VALUE_FIELDS",
    "ExternalRef",
    "FileIdentity",
    "LocationResolver",
    "check_external_structure",
    "check_location_syntax",
    "check_not_hard_linked",
    "expected_nbytes",
    "file_identity",
    "is_external",  # re-exported from onnx_light_ref.io.entries, where it lives
    "is_inside",
    "parse_external_data",
    "resolve_location",
    "stat_regular_file",
    "typed_value_fields",
]

# Element types whose elements are smaller than a byte: (elements per byte). Packed as in ONNX raw_data.
_SUB_BYTE_ELEMENTS_PER_BYTE: dict[int, int] = {
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
    file_stat: os.stat_result  # of the resolved file, when it was validated

    @property
    def file_size(self) -> int:
        return self.file_stat.st_size

    @property
    def identity(self) -> FileIdentity:
        return FileIdentity(self.file_stat.st_dev, self.file_stat.st_ino)

    @property
    def link_count(self) -> int:
        """More than 1: the file is hard-linked (see :func:`check_not_hard_linked`)."""
        return self.file_stat.st_nlink


def file_identity(path: str) -> FileIdentity | None:
    """Device and inode of ``path`` (following symlinks), or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def check_location_syntax(location: str | bytes, *, tensor_name: str) -> str:
    """Refuse a ``location`` that onnx or onnxruntime would refuse to load; the one rule for reading and writing.

    Refused: a non-``str`` value that is not UTF-8 (protobuf hands back ``bytes`` then), an empty value, a NUL byte,
    a backslash, an absolute path, any ``..`` substring (onnx's checker refuses ``w..1.bin`` too, not only a ``..``
    component), a value ending in ``/`` or ``/.`` or equal to ``.`` (it names a folder, not a file). Pure string
    checks, no file system access.

    Returns:
        The location as ``str`` (decoded when protobuf handed back valid UTF-8 ``bytes``).

    Raises:
        UnsafeLocationError: for every refusal (an :class:`ExternalDataError`, so a ``ValueError``).
    """
    if isinstance(location, bytes):
        try:
            location = location.decode("utf-8")
        except UnicodeDecodeError:
            raise UnsafeLocationError(
                f"tensor {tensor_name!r}: external data location {location[:64]!r} is not valid UTF-8; onnx and "
                "onnxruntime cannot open such a name."
            ) from None
    if not isinstance(location, str):
        raise UnsafeLocationError(
            f"tensor {tensor_name!r}: external data location must be a str, got {type(location).__name__}."
        )
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
    if ".." in location:
        raise UnsafeLocationError(
            f"{where} contains '..' inside a name; onnx refuses to load any location containing '..' (even "
            "'w..1.bin'), so such a model could not be loaded."
        )
    if location.endswith(("/", "/.")) or location == "." or location.strip("/.") == "":
        raise UnsafeLocationError(
            f"{where} does not name a file: it names a folder (it ends with '/' or '/.', or is '.')."
        )
    return location


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


def is_inside(real_base: str, real: str) -> bool:
    """Whether the real path ``real`` is ``real_base`` or below it (both already resolved by ``realpath``)."""
    return os.path.commonpath([real_base, real]) == real_base


def stat_regular_file(
    path: str,
    *,
    missing: Callable[[], FileNotFoundError],
    inaccessible: Callable[[str], Exception],
    not_regular: Callable[[], Exception],
) -> os.stat_result:
    """``os.stat(path)`` of a data file, each way it can fail reported with the caller's message.

    Args:
        path: the real path to check.
        missing: builds the error for a file that does not exist (also ``ENOTDIR``: a component is a file, as in
            ``'w.bin/x'``, so there is no such file).
        inaccessible: builds the error for a name that cannot be read through (``ELOOP``, ``ENAMETOOLONG``,
            ``EACCES``...), given the system's reason.
        not_regular: builds the error for a directory, FIFO, device...

    Returns:
        The ``stat`` result of the regular file.

    Raises:
        FileNotFoundError: from ``missing``.
        Exception: from ``inaccessible`` or ``not_regular`` (``ExternalDataError`` at every caller).
    """
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise missing() from exc
    except OSError as exc:
        raise inaccessible(str(exc.strerror or exc)) from exc
    if not stat.S_ISREG(st.st_mode):
        raise not_regular()
    return st


def _resolve_and_stat(real_base: str, location: str, tensor_name: str) -> tuple[str, os.stat_result]:
    check_location_syntax(location, tensor_name=tensor_name)
    joined = os.path.join(real_base, location)
    real = os.path.realpath(joined)
    if not is_inside(real_base, real):
        raise UnsafeLocationError(
            f"tensor {tensor_name!r}: external data location {location!r} resolves to {real!r}, outside the "
            f"model's folder {real_base!r} (through a symbolic link)."
        )
    st = stat_regular_file(
        real,
        missing=lambda: FileNotFoundError(
            f"tensor {tensor_name!r}: external data file {location!r} does not exist (looked for {joined!r})."
        ),
        inaccessible=lambda reason: ExternalDataError(
            f"tensor {tensor_name!r}: external data location {location!r} ({joined!r}) cannot be accessed: {reason}."
        ),
        not_regular=lambda: ExternalDataError(
            f"tensor {tensor_name!r}: external data location {location!r} ({real!r}) is not a regular file."
        ),
    )
    return real, st


def expected_nbytes(tensor: onnx.TensorProto, *, label: str | None = None) -> int | None:
    """Byte size of the tensor's raw data from its dims and data type, or None if the type has no fixed size.

    Never negative: a negative dim makes the size undefined.

    Raises:
        ExternalDataError: a dim is negative.
    """
    if any(dim < 0 for dim in tensor.dims):
        raise ExternalDataError(
            f"tensor {label or _text(tensor.name)!r} has negative dims {list(tensor.dims)}; its byte size is "
            "undefined (dims must be >= 0)."
        )
    n_elements = math.prod(tensor.dims)
    per_byte = _SUB_BYTE_ELEMENTS_PER_BYTE.get(tensor.data_type)
    if per_byte is not None:
        return (n_elements + per_byte - 1) // per_byte
    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        return None
    fixed = raw_element_size(tensor.data_type)  # bfloat16/float8: onnx < 1.19 maps them to float32
    if fixed is not None:
        return n_elements * fixed
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return n_elements * itemsize


def _text(value: str | bytes) -> str:
    """A protobuf string for a message: ``bytes`` (not UTF-8) shown with replacement characters, never raised on."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


TYPED_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
"""TensorProto's typed value fields: a tensor holds its values in one of them, in ``raw_data`` or externally (one
value field only, as onnx's checker requires)."""


def typed_value_fields(tensor: onnx.TensorProto) -> list[str]:
    """The typed value fields of ``tensor`` that hold values."""
    return [field for field in TYPED_VALUE_FIELDS if len(getattr(tensor, field))]


def check_external_structure(tensor: onnx.TensorProto, *, label: str | None = None) -> None:
    """Refuse an EXTERNAL tensor that also carries inline values (``raw_data`` or a typed field such as
    ``float_data``), or that has no ``external_data`` entries: a reader would have to pick one of two values."""
    name = label or _text(tensor.name)
    if tensor.HasField("raw_data"):
        raise ExternalDataError(
            f"tensor {name!r} has both inline raw_data ({len(tensor.raw_data)} bytes) and external_data; "
            "expected one or the other."
        )
    typed = typed_value_fields(tensor)
    if typed:
        raise ExternalDataError(
            f"tensor {name!r} is marked EXTERNAL but also holds inline values in {', '.join(typed)}; expected its "
            "values in the external file only."
        )
    if len(tensor.external_data) == 0:
        raise ExternalDataError(f"tensor {name!r} is marked EXTERNAL but has no external_data entries.")


def parse_external_data(
    tensor: onnx.TensorProto, base_dir: str | LocationResolver, *, label: str | None = None
) -> ExternalRef:
    """Validate one EXTERNAL tensor's entries against its file and return where its bytes are.

    ``base_dir`` is the model's folder, or a :class:`LocationResolver` for it when validating many tensors.

    Entries are read by :func:`~onnx_light_ref.io.entries.read_entries` (unknown or duplicated keys are an error
    here, not a warning: a writer that adds keys we would silently drop is better told) and numbers by
    :func:`~onnx_light_ref.io.entries.parse_entry_int` (ASCII digits only, within int64). ``length`` is required
    unless dims and dtype give it; when both exist they must agree. ``offset + length`` must fit in the file.
    """
    name = label or _text(tensor.name)
    check_external_structure(tensor, label=name)
    raw = read_entries(tensor, label=name)
    location = raw.get("location")
    if location is None:
        raise ExternalDataError(f"tensor {name!r} has no external_data 'location'.")
    offset_text = raw.get("offset")
    offset = parse_entry_int(offset_text, label=name, key="offset") if offset_text is not None else 0
    length = _entry_length(tensor, name, raw.get("length"), location)
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
        file_stat=st,
    )


def _entry_length(tensor: onnx.TensorProto, name: str, text: str | None, location: str) -> int:
    """The ``length`` entry, checked against dims x dtype; or dims x dtype when the entry is absent."""
    expected = expected_nbytes(tensor, label=name)
    if text is not None:
        length = parse_entry_int(text, label=name, key="length")
        if expected is not None and length != expected:
            raise ExternalDataError(
                f"tensor {name!r}: external data length {length} (in {location!r}) does not match dims "
                f"{list(tensor.dims)} and "
                f"data type {onnx.helper.tensor_dtype_to_string(tensor.data_type)} ({expected} bytes)."
            )
        return length
    if expected is None:
        raise ExternalDataError(
            f"tensor {name!r} has no external_data 'length' and its data type "
            f"{tensor.data_type} does not give a byte size."
        )
    return expected


def check_not_hard_linked(ref: ExternalRef) -> None:
    """Refuse to read a data file that has several hard links, as onnx >= 1.21 does.

    A hard link inside the model folder can name any file the user can read (CVE-2026-34446): copying its bytes into
    a new weights file would leak it. Kept separate from :func:`parse_external_data` so that callers can first report
    the more useful "destination is a source" error when the extra link is their own destination.
    """
    check_single_link(
        ref.file_stat, what=f"tensor {ref.tensor_name!r}: external data file {ref.location!r} ({ref.path!r})"
    )
