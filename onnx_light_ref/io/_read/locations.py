"""Safe resolution and validation of ``external_data`` locations and byte ranges.

Everything the package reads or writes through a ``location`` goes through this module, and every check happens
here, before any byte is copied: the location is relative, free of ``..`` (the ONNX spec forbids them), of NUL bytes
and backslashes; the file is opened through the model's folder held by a
:class:`~onnx_light_ref.io._read.folder.ModelFolder` (no symbolic link anywhere on the way unless the caller opted in, a
regular file with one hard link: onnx's loader rule, see ``docs/safety.md``); ``offset + length`` fits in it;
``length`` agrees with the tensor's dims and dtype; a reference into a ``*.safetensors`` file agrees with the file's
header (:func:`~onnx_light_ref.io._read.safetensors_refs.check_reference`, the check ``inspect`` reports). A validated
:class:`ExternalRef` carries the folder, the location and the identity of the file, so that whoever reads it later
opens it through the same held folder and notices a file replaced meanwhile.

This module never opens a file for writing, never reads weight bytes and never uses ``realpath`` to decide what may
be read: it looks at files (``O_PATH`` and ``fstat``, never opened for reading; a ``*.safetensors`` file's header is
read, once per file) and closes them.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, NamedTuple

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._posix import check_single_link
from onnx_light_ref.io._read.dtype_sizes import packed_nbytes
from onnx_light_ref.io._read.entries import parse_entry_int, read_entries
from onnx_light_ref.io._read.folder import FileIdentity, ModelFolder
from onnx_light_ref.io._read.proto import TensorProto, data_type_name
from onnx_light_ref.io._read.safetensors_refs import (
    SafetensorsFile,
    is_safetensors_location,
    read_safetensors_file,
    refuse_disagreeing_reference,
)

if TYPE_CHECKING:
    import onnx


class ExternalRef(NamedTuple):
    """One validated external reference: where a tensor's bytes are, already checked against the file (a named
    tuple: a reader builds one per tensor)."""

    tensor_name: str
    location: str  # as written in the model
    path: str  # the folder's path joined with the location: for messages; reopen through `folder`, never by path
    offset: int
    length: int
    checksum: str | None
    file_stat: os.stat_result  # fstat of the file opened through the folder, when it was validated
    folder: ModelFolder | None = None  # the held folder the file was validated through

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


class LocationResolver:
    """Resolves locations through one held model folder, each distinct location once.

    Models keep thousands of tensors in a handful of files; opening every tensor's file anew cost half the time of
    re-aligning 8192 small tensors. Only successes are cached, so every error still names the tensor that hit it.
    Use one resolver per plan: readers reopen each file through :attr:`folder` and re-check device and inode, so a
    file swapped after planning is still caught.

    Args:
        base_dir: the model's folder (opened and held now), or an already held :class:`ModelFolder`.
        allow_outside_folder: when ``base_dir`` is a path: follow symbolic links (trusted layouts only).
        check_safetensors: refuse, in :func:`parse_external_data`, a reference that disagrees with the header of its
            ``*.safetensors`` file (the default, every reader); False only for ``inspect``, which reports the same
            check instead of raising it.
    """

    def __init__(
        self, base_dir: str | ModelFolder, *, allow_outside_folder: bool = False, check_safetensors: bool = True
    ) -> None:
        self._folder = base_dir if isinstance(base_dir, ModelFolder) else None
        self.base_dir = base_dir.path if isinstance(base_dir, ModelFolder) else os.path.abspath(base_dir)
        self.allow_outside_folder = allow_outside_folder
        self.check_safetensors = check_safetensors
        self._resolved: dict[str, tuple[str, os.stat_result]] = {}
        # location -> (display path, fstat, size, whether a reference into it is checked against a safetensors
        # header, the folder): what the fast path of parse_external_data needs per tensor, once per location
        self._known: dict[str, tuple[str, os.stat_result, int, bool, ModelFolder]] = {}
        self._headers: dict[str, SafetensorsFile] = {}

    @property
    def folder(self) -> ModelFolder:
        """The held folder, opened at the first reference (a model without external data opens nothing)."""
        if self._folder is None:
            self._folder = ModelFolder.open(self.base_dir, allow_outside_folder=self.allow_outside_folder)
        return self._folder

    def close(self) -> None:
        """Close the held folder (references validated through it can no longer be reopened)."""
        if self._folder is not None:
            self._folder.close()

    def resolve(self, location: str, *, tensor_name: str) -> tuple[str, os.stat_result]:
        """The display path of ``location`` and the ``fstat`` of the file opened through the folder."""
        hit = self._resolved.get(location)
        if hit is None:
            check_location_syntax(location, tensor_name=tensor_name)
            # Looked at (O_PATH and fstat), never opened for reading: a plan reads no weight.
            st = self.folder.stat_file(location, tensor_name=tensor_name, check_links=False)
            hit = (self.folder.display_path(location), st)
            self._resolved[location] = hit
            check = self.check_safetensors and is_safetensors_location(location)
            self._known[location] = (hit[0], st, st.st_size, check, self.folder)
        return hit

    def safetensors_file(self, location: str) -> SafetensorsFile:
        """The header of the ``*.safetensors`` file ``location`` (already resolved), read once per resolver."""
        hit = self._headers.get(location)
        if hit is None:
            hit = self._headers[location] = read_safetensors_file(self.folder, location)
        return hit


def is_inside(real_base: str, real: str) -> bool:
    """Whether the real path ``real`` is ``real_base`` or below it (both already resolved by ``realpath``).

    For writers' destination checks only: no reader decides what it may read with it (readers open through
    :class:`~onnx_light_ref.io._read.folder.ModelFolder`)."""
    return os.path.commonpath([real_base, real]) == real_base


def expected_nbytes(tensor: onnx.TensorProto, *, label: str | None = None) -> int | None:
    """Byte size of the tensor's raw data from its dims and data type, or None if the type has no fixed size.

    The size per element, packing included (FLOAT6: 4 elements in 3 bytes), is
    :func:`onnx_light_ref.io._read.dtype_sizes.packed_nbytes`'s, the one place the package computes it.

    Never negative: a negative dim makes the size undefined.

    Raises:
        ExternalDataError: a dim is negative.
    """
    dims = tensor.dims
    if dims and min(dims) < 0:
        raise ExternalDataError(
            f"tensor {label or _text(tensor.name)!r} has negative dims {list(dims)}; its byte size is "
            "undefined (dims must be >= 0)."
        )
    return packed_nbytes(tensor.data_type, math.prod(dims))


def _text(value: str | bytes) -> str:
    """A protobuf string for a message: ``bytes`` (not UTF-8) shown with replacement characters, never raised on."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


TYPED_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
"""TensorProto's typed value fields: a tensor holds its values in one of them, in ``raw_data`` or externally (one
value field only, as onnx's checker requires)."""


def typed_value_fields(tensor: onnx.TensorProto) -> list[str]:
    """The typed value fields of ``tensor`` that hold values."""
    return [field for field in TYPED_VALUE_FIELDS if len(getattr(tensor, field))]


def _holds_values(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` carries inline values: ``raw_data`` or a typed field (the one test of every reference)."""
    return bool(
        tensor.HasField("raw_data")
        or len(tensor.float_data)
        or len(tensor.int32_data)
        or len(tensor.string_data)
        or len(tensor.int64_data)
        or len(tensor.double_data)
        or len(tensor.uint64_data)
    )


def check_external_structure(tensor: onnx.TensorProto, *, label: str | None = None) -> None:
    """Refuse an EXTERNAL tensor that also carries inline values (``raw_data`` or a typed field such as
    ``float_data``), or that has no ``external_data`` entries: a reader would have to pick one of two values."""
    if not _holds_values(tensor) and len(tensor.external_data):
        return
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

    Entries are read by :func:`~onnx_light_ref.io._read.entries.read_entries` (unknown or duplicated keys are an error
    here, not a warning: a writer that adds keys we would silently drop is better told) and numbers by
    :func:`~onnx_light_ref.io._read.entries.parse_entry_int` (ASCII digits only, within int64). ``length`` is required
    unless dims and dtype give it; when both exist they must agree. ``offset + length`` must fit in the file. A
    reference into a ``*.safetensors`` file must agree with its header (unless the resolver was made with
    ``check_safetensors=False``): :func:`~onnx_light_ref.io._read.safetensors_refs.refuse_disagreeing_reference`.

    Raises:
        UnsafeLocationError: the location is unsafe (see :func:`check_location_syntax`, :class:`ModelFolder`).
        FileNotFoundError: the file does not exist.
        SafetensorsReferenceError: the reference overlaps its safetensors file's header or is not its key's bytes.
        ExternalDataError: any other malformed entry, a range past the end of the file.
    """
    resolver = base_dir if isinstance(base_dir, LocationResolver) else LocationResolver(base_dir)
    return _parse_canonical(tensor, resolver, label) or _parse_full(tensor, resolver, label)


def _parse_full(tensor: onnx.TensorProto, resolver: LocationResolver, label: str | None) -> ExternalRef:
    """:func:`parse_external_data` with every check in order: the one that raises."""
    name = label or _text(tensor.name)
    if _holds_values(tensor) or not len(tensor.external_data):
        check_external_structure(tensor, label=name)  # raises, saying which
    raw = read_entries(tensor, label=name).values
    location = raw.get("location")
    if location is None:
        raise ExternalDataError(f"tensor {name!r} has no external_data 'location'.")
    offset_text = raw.get("offset")
    offset = 0 if offset_text is None else _entry_int(offset_text, name, "offset")
    length = _entry_length(tensor, name, raw.get("length"), location)
    path, st = resolver.resolve(location, tensor_name=name)
    if offset > st.st_size or length > st.st_size - offset:
        raise ExternalDataError(
            f"tensor {name!r}: external data range [offset {offset}, +{length} bytes) exceeds the size of "
            f"{location!r} ({st.st_size} bytes)."
        )
    if resolver.check_safetensors and is_safetensors_location(location):
        key = tensor.name if isinstance(tensor.name, str) else ""  # a non-UTF-8 name is no safetensors key
        file = resolver.safetensors_file(location)
        refuse_disagreeing_reference(file, key, tensor.data_type, tensor.dims, offset, length)
    return ExternalRef(name, location, path, offset, length, raw.get("checksum"), st, resolver.folder)


_FIELDS = TensorProto.DESCRIPTOR.fields_by_name
_CANONICAL_FIELDS = tuple(_FIELDS[name] for name in ("dims", "data_type", "name", "external_data", "data_location"))
"""What ``ListFields()`` of the usual EXTERNAL tensor lists, in this order (field-number order): no value field."""


def _parse_canonical(tensor: onnx.TensorProto, resolver: LocationResolver, label: str | None) -> ExternalRef | None:
    """:func:`parse_external_data` for the usual reference, or None to let the full check decide (and raise).

    The usual reference: the fields of :data:`_CANONICAL_FIELDS` only (no inline value, a name, dims), the entries
    ``location``, ``offset``, ``length`` (then ``checksum``) in that order with ``str`` values, numbers of at most 18
    ASCII digits, a location the resolver already checked, ``length`` equal to dims x dtype, the range inside the
    file. Anything else returns None; so every refusal, and its message, is the full check's. One ``ListFields()``
    answers which fields are set, and each field is read once: at 100,000 tensors, protobuf accesses are the cost.
    """
    fields = tensor.ListFields()
    if len(fields) != 5:
        return None
    (f_dims, dims), (f_type, data_type), (f_name, name), (f_entries, entries), (f_location, _) = fields
    if (f_dims, f_type, f_name, f_entries, f_location) != _CANONICAL_FIELDS or not 3 <= len(entries) <= 4:
        return None
    checksum = None
    if len(entries) == 3:
        location_entry, offset_entry, length_entry = entries
    else:
        location_entry, offset_entry, length_entry, checksum_entry = entries
        if checksum_entry.key != "checksum" or type(checksum := checksum_entry.value) is not str:
            return None
    location, offset_text, length_text = location_entry.value, offset_entry.value, length_entry.value
    known = resolver._known.get(location) if type(location) is str else None
    if (
        known is None
        or location_entry.key != "location"
        or offset_entry.key != "offset"
        or length_entry.key != "length"
        or type(offset_text) is not str
        or type(length_text) is not str
        or len(offset_text) > 18
        or len(length_text) > 18
        or not (offset_text + length_text).isascii()
        or not offset_text.isdigit()
        or not length_text.isdigit()
        or type(name) is not str
    ):
        return None
    dims = dims[:]
    if dims and min(dims) < 0:
        return None
    offset, length = int(offset_text), int(length_text)
    path, st, size, check_safetensors, folder = known
    # None (no fixed size: the full check says why) never equals a length
    if length != packed_nbytes(data_type, math.prod(dims)) or offset > size or length > size - offset:
        return None
    if check_safetensors:
        refuse_disagreeing_reference(resolver.safetensors_file(location), name, data_type, dims, offset, length)
    # Built as a tuple with every field given: ExternalRef(...) runs the named tuple's Python-level __new__.
    return tuple.__new__(ExternalRef, (label or name, location, path, offset, length, checksum, st, folder))


def _entry_int(text: str, name: str, key: str) -> int:
    """:func:`~onnx_light_ref.io._read.entries.parse_entry_int`, at once for the usual value (at most 18 ASCII
    digits: below int64's limit)."""
    if len(text) <= 18 and text.isascii() and text.isdigit():
        return int(text)
    return parse_entry_int(text, label=name, key=key)


def _entry_length(tensor: onnx.TensorProto, name: str, text: str | None, location: str) -> int:
    """The ``length`` entry, checked against dims x dtype; or dims x dtype when the entry is absent."""
    expected = expected_nbytes(tensor, label=name)
    if text is not None:
        length = _entry_int(text, name, "length")
        if expected is not None and length != expected:
            raise ExternalDataError(
                f"tensor {name!r}: external data length {length} (in {location!r}) does not match dims "
                f"{list(tensor.dims)} and "
                f"data type TensorProto.{data_type_name(tensor.data_type)} ({expected} bytes)."
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
