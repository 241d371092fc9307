"""Whether a ``.safetensors`` data file opens in the safetensors library, and whether each ONNX reference into it
reads exactly one of its keys.

A model linked to a checkpoint (``link``) or aligned as safetensors points into the file with ordinary external data
(``offset`` = ``8 + N + begin``). Nothing ties those numbers to the header once the file changes: re-saving the
checkpoint with ``metadata={"format": "pt"}`` grows the header, every tensor moves, and the model then reads header
text and the wrong tensors' bytes as its weights, while each reference is still in bounds. So a reference into a
safetensors file must agree with the header:

* it must not overlap the header (``[0, 8 + N)``);
* when its tensor's name is a key, it must be exactly that key's bytes (offset and length), with its dtype and
  shape (:func:`entry_matches`: the safetensors code of the ONNX type, the dims, or ``U8 [nbytes]`` for a packed
  sub-byte type);
* otherwise (a tensor linked through a name map), it must be exactly the bytes of some key of a matching dtype and
  shape: a range that straddles keys or cuts one reads bytes no key describes.

:func:`read_safetensors_file` parses the header as hostile input through the model's held folder and says why the
library would refuse the file (:mod:`~onnx_light_ref.io.read.safetensors_header`); :func:`check_reference` says why a
reference disagrees. Neither reads a tensor byte nor writes anything.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from onnx_light_ref.errors import ExternalDataError, SafetensorsError
from onnx_light_ref.io.plan.safetensors_layout import safetensors_dtype, storage_shape
from onnx_light_ref.io.read.folder import ModelFolder
from onnx_light_ref.io.read.safetensors_header import SafetensorsEntry, SafetensorsHeader, read_header

__all__ = ["SafetensorsFile", "check_reference", "entry_matches", "read_safetensors_file"]

_KEYS_SHOWN = 3  # keys named in a message about a range that cuts several


@dataclass
class SafetensorsFile:
    """A ``.safetensors`` data file as the header says: ``refusal`` is why the library refuses to open it (None: it
    opens it), ``description`` one line for ``inspect``."""

    location: str
    header: SafetensorsHeader | None
    refusal: str | None
    description: str
    _by_range: dict[tuple[int, int], list[SafetensorsEntry]] = field(default_factory=dict, repr=False)
    _starts: list[int] = field(default_factory=list, repr=False)  # file offsets of the non-empty entries, sorted
    _ordered: list[SafetensorsEntry] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.header is None:
            return
        start = self.header.data_start
        for entry in self.header.entries.values():  # in data order
            self._by_range.setdefault((start + entry.begin, entry.nbytes), []).append(entry)
            if entry.nbytes:
                self._starts.append(start + entry.begin)
                self._ordered.append(entry)

    def at(self, offset: int, length: int) -> list[SafetensorsEntry]:
        """The keys whose bytes are exactly ``[offset, offset + length)`` of the file."""
        return self._by_range.get((offset, length), [])

    def cut(self, offset: int, length: int) -> list[SafetensorsEntry]:
        """The keys whose bytes intersect ``[offset, offset + length)`` (in data order)."""
        assert self.header is not None
        first = max(bisect.bisect_right(self._starts, offset) - 1, 0)
        last = bisect.bisect_left(self._starts, offset + length)
        start = self.header.data_start
        return [e for e in self._ordered[first:last] if start + e.end > offset]


def read_safetensors_file(folder: ModelFolder, location: str) -> SafetensorsFile:
    """Read and judge the header of the ``.safetensors`` file at ``location`` of the held ``folder``.

    Args:
        folder: the model's folder, held open (the file is opened through it, confined like every data file).
        location: the file's ``location``, relative to the folder.

    Returns:
        A :class:`SafetensorsFile`; a header the library refuses (malformed, above its size limit, a data section the
        tensors do not cover exactly) has ``refusal`` set and, when it could be parsed at all, ``header`` too.
    """
    try:
        with folder.open_file(location, subject=f"safetensors file {location!r}") as opened:
            header = read_header(opened.fd, opened.path, opened.size)
    except (SafetensorsError, ExternalDataError, OSError) as exc:
        return SafetensorsFile(location, None, str(exc), f"safetensors header INVALID: {exc}")
    text = f"safetensors header {header.data_start} bytes (data section starts there), {len(header.entries)} tensors"
    if header.metadata:
        text += f", metadata {header.metadata}"
    if header.covered:
        return SafetensorsFile(location, header, None, text + ", data section fully covered")
    begin, end = header.holes[0]
    uncovered = sum(e - b for b, e in header.holes)
    refusal = (
        f"data section NOT fully covered: {uncovered} bytes in {len(header.holes)} range(s), the first at file "
        f"offsets [{header.data_start + begin}, {header.data_start + end}) (safetensors loaders refuse it)"
    )
    return SafetensorsFile(location, header, refusal, f"{text}, {refusal}")


def entry_matches(data_type: int, dims: Sequence[int], length: int, entry: SafetensorsEntry) -> bool:
    """Whether a tensor of ``data_type`` and ``dims`` stored in ``length`` bytes is what ``entry`` describes: the
    same safetensors code, the same shape (``[length]`` for a packed sub-byte type, stored as ``U8``), the same size.
    """
    return (
        safetensors_dtype(data_type) == entry.dtype
        and storage_shape(data_type, tuple(dims), length) == entry.shape
        and length == entry.nbytes
    )


def check_reference(
    file: SafetensorsFile, name: str, data_type: int, dims: Sequence[int], offset: int, length: int
) -> str | None:
    """Why the reference ``[offset, offset + length)`` of tensor ``name`` disagrees with ``file``'s header (None:
    it is exactly the bytes of a key of its dtype and shape, the key of its own name when there is one).

    Args:
        file: the parsed file (``file.header`` must be set).
        name: the tensor's name (a key when it was linked or written by name).
        data_type: its ONNX data type.
        dims: its dims.
        offset: the reference's ``offset`` (a file offset, header included).
        length: the reference's ``length``.

    Returns:
        The problem in words, naming the key(s) and the file offsets; None when the reference agrees.
    """
    header = file.header
    assert header is not None
    where = f"tensor {name or '<unnamed>'!r}: bytes [{offset}, {offset + length}) of {file.location!r}"
    if length and offset < header.data_start:
        return (
            f"{where} overlap its safetensors header (file offsets [0, {header.data_start})): the model would read "
            "header text as weights (was the file re-saved, moving every tensor?)"
        )
    own = header.entries.get(name)
    if own is not None:
        at = (header.data_start + own.begin, own.nbytes)
        if at != (offset, length):
            return (
                f"{where} disagree with the safetensors header entry of the same key, at [{at[0]}, {at[0] + at[1]})"
                + _what_is_there(file, offset, length)
                + " (was the file re-saved, moving its tensors?)"
            )
        if not entry_matches(data_type, dims, length, own):
            expected = _expected(data_type, dims, length)
            return f"{where}: the safetensors header entry of the same key is {_shown(own)}, not {expected}"
        return None
    exact = file.at(offset, length)
    if any(entry_matches(data_type, dims, length, e) for e in exact):
        return None
    if exact:
        return f"{where} are key {exact[0].name!r}, {_shown(exact[0])}, not {_expected(data_type, dims, length)}"
    if not length:
        return None  # reads nothing, whatever the offset: no key's bytes can be misread
    return f"{where} are no key of the safetensors header" + _what_is_there(file, offset, length)


def _what_is_there(file: SafetensorsFile, offset: int, length: int) -> str:
    exact = file.at(offset, length)
    if exact:
        return f"; they are key {exact[0].name!r} ({_shown(exact[0])})"
    cut = file.cut(offset, length) if length else []
    if not cut:
        return ""
    names = ", ".join(repr(e.name) for e in cut[:_KEYS_SHOWN])
    more = f" and {len(cut) - _KEYS_SHOWN} more" if len(cut) > _KEYS_SHOWN else ""
    return f"; they cut across key(s) {names}{more}"


def _shown(entry: SafetensorsEntry) -> str:
    return f"{entry.dtype} {list(entry.shape)}"


def _expected(data_type: int, dims: Sequence[int], length: int) -> str:
    code = safetensors_dtype(data_type)
    if code is None:
        return f"ONNX data type {data_type} (no safetensors code)"
    return f"{code} {list(storage_shape(data_type, tuple(dims), length))} ({length} bytes)"
