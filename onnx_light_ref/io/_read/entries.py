"""The one reader and the one writer of a tensor's ``external_data`` entries (``location``/``offset``/...).

Reading checks keys against :data:`KNOWN_KEYS` (the keys of onnx's ``ExternalDataInfo``: an unknown key is an error,
since a rewrite would otherwise drop it silently), refuses duplicated keys (onnx's ``ExternalDataInfo`` sets one
attribute per entry, so the last of each wins; onnxruntime refuses a repeated ``location`` and takes the last
``offset``/``length``: a tensor whose bytes depend on the loader is refused by every reader here, and
:func:`last_value` is what onnx would open, for messages and for the sharing guard) and non-UTF-8 values, and
parses numbers strictly: ASCII digits only, within int64. ``int()`` would also take ``"+0"``, ``" 64"``, ``"6_4"``
or non-ASCII digits, which onnxruntime refuses, so a model we accept or write must never contain them.

Writing always produces the canonical entries ``location``, ``offset``, ``length`` (then ``checksum`` when one is
kept), in that order, and marks the tensor EXTERNAL. Entries that already have those keys in that order only get new
values: protobuf arenas never give a deleted entry back, so rebuilding every entry grew memory for nothing.

This module never touches the file system; where a location leads is :mod:`onnx_light_ref.io._read.locations`' business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._arguments import INT64_MAX
from onnx_light_ref.io._read.proto import TensorProto

if TYPE_CHECKING:
    import onnx

KNOWN_KEYS = frozenset({"location", "offset", "length", "checksum"})
"""Keys both loaders accept. onnx also knows ``basepath`` (its ``_ALLOWED_EXTERNAL_DATA_KEYS``), but onnxruntime
refuses a model carrying it ("model format error"), so a reference with it is refused here, as any unknown key."""


_EXTERNAL = TensorProto.EXTERNAL  # a class attribute of a protobuf class: looked up once, not per tensor


def is_external(tensor: onnx.TensorProto) -> bool:
    """True when the tensor declares ``data_location == EXTERNAL``."""
    return tensor.data_location == _EXTERNAL


class Entries(NamedTuple):
    """A tensor's entries as strings, keys checked; numbers not parsed yet (see :func:`parse_entry_int`). A named
    tuple: one is built per tensor read."""

    values: dict[str, str]

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.values


def entry_text(value: str | bytes, *, label: str, what: str) -> str:
    """A protobuf string field as ``str``: protobuf hands back ``bytes`` when the stored value is not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ExternalDataError(
                f"tensor {label!r}: external data {what} is not valid UTF-8 ({value[:64]!r}); onnx and onnxruntime "
                "cannot open such a name."
            ) from None
    return value


def read_entries(tensor: onnx.TensorProto, *, label: str) -> Entries:
    """Return the tensor's entries; :class:`ExternalDataError` for duplicated, unknown or non-UTF-8 keys/values."""
    values: dict[str, str] = {}
    duplicated: list[str] = []
    unknown: list[str] = []
    entries = tensor.external_data
    for index in range(len(entries)):  # by index: iterating a repeated field costs more than its few entries
        entry = entries[index]
        key, value = entry.key, entry.value
        if type(key) is not str or type(value) is not str:  # protobuf's bytes for a value that is not UTF-8
            key = entry_text(key, label=label, what="key")
            value = entry_text(value, label=label, what=f"{key!r} value")
        if key in values or key not in KNOWN_KEYS:
            (duplicated if key in values else unknown).append(key)
        values[key] = value
    if duplicated:
        raise ExternalDataError(
            f"tensor {label!r}: external_data has duplicated keys {sorted(set(duplicated))}; onnx's loader reads the "
            "last of each (onnxruntime refuses a repeated 'location'), so what the tensor holds depends on the "
            "loader: remove the extra entries."
        )
    if unknown:
        hint = (
            " ('basepath' is written by some onnx helpers, but onnxruntime refuses a model that carries it: remove "
            "the entry)"
            if "basepath" in unknown
            else ""
        )
        raise ExternalDataError(
            f"tensor {label!r}: unknown external_data keys {sorted(unknown)}; expected only location, offset, "
            f"length, checksum{hint}."
        )
    return Entries(values)


def last_value(tensor: onnx.TensorProto, key: str) -> str | bytes | None:
    """The value of the last entry named ``key``, as stored (``bytes`` when not UTF-8): what onnx's loader uses.

    For display and for the sharing guard only; a reader resolving the tensor goes through :func:`read_entries`,
    which refuses a repeated key.
    """
    found: str | bytes | None = None
    entries = tensor.external_data
    for index in range(len(entries)):
        entry = entries[index]
        name = entry.key
        if (name.decode("utf-8", errors="replace") if isinstance(name, bytes) else name) == key:
            found = entry.value
    return found


def parse_entry_int(value: str, *, label: str, key: str) -> int:
    """Parse an ``offset``/``length`` value: ASCII digits only, no sign, no space, no underscore, at most int64."""
    if not value or not value.isascii() or not value.isdigit():
        raise ExternalDataError(
            f"tensor {label!r}: external data {key!r} must be a non-negative integer written with ASCII digits "
            f"only, got {value!r}."
        )
    number = int(value)
    if number > INT64_MAX:
        raise ExternalDataError(f"tensor {label!r}: external data {key!r} = {number} does not fit in int64.")
    return number
