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
library would refuse the file (:mod:`~onnx_light_ref.io._read.safetensors_header`); :func:`check_reference` says why a
reference disagrees. That one function decides for every reader: ``inspect`` reports its answer (``header
mismatch``); every other reader (the references validated by
:func:`~onnx_light_ref.io._read.locations.parse_external_data`: the aligners, ``verify``, ``delay_initializers``,
``reference_evaluator``, ``undelay``; the ``DelayedInitializer`` kernel and ``undelay``'s node filenames through
:class:`HeaderCache`) raises it as :class:`~onnx_light_ref.errors.SafetensorsReferenceError`
(:func:`refuse_disagreeing_reference`), before any weight byte is read. A header that does not parse names no key
to compare with: readers then read the file as plain external data (``inspect`` says ``safetensors refuses``).
Nothing here reads a tensor byte or writes anything.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from onnx_light_ref.errors import ExternalDataError, SafetensorsError, SafetensorsReferenceError
from onnx_light_ref.io._read.folder import ModelFolder
from onnx_light_ref.io._read.safetensors_header import (
    SafetensorsEntry,
    SafetensorsHeader,
    read_header,
    safetensors_dtype,
    storage_shape,
)

_KEYS_SHOWN = 3  # keys named in a message about a range that cuts several
# Files whose parsed header a HeaderCache keeps: a model's weights are in a few files, and a cache that lives as long
# as the process (the unbound kernel's) must not grow with every file it ever read.
_CACHED_FILES = 8


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


def is_safetensors_location(location: str) -> bool:
    """Whether references into the data file ``location`` (a ``location`` or a ``filename``, as written) are checked
    against a safetensors header: its name ends with ``.safetensors``, the name every safetensors loader expects."""
    return location.endswith(".safetensors")


def read_safetensors_file(folder: ModelFolder, location: str) -> SafetensorsFile:
    """Read and judge the header of the ``.safetensors`` file at ``location`` of the held ``folder``.

    Args:
        folder: the model's folder, held open (the file is opened through it, confined like every data file; a
            hard-linked file is not read: the callers refuse it for that).
        location: the file's ``location``, relative to the folder.

    Returns:
        A :class:`SafetensorsFile`; a header the library refuses (malformed, above its size limit, a data section the
        tensors do not cover exactly) has ``refusal`` set and, when it could be parsed at all, ``header`` too.
    """
    try:
        with folder.open_file(location, subject=f"safetensors file {location!r}") as opened:
            return read_safetensors_fd(opened.fd, opened.path, opened.size, location)
    except (ExternalDataError, OSError) as exc:
        return SafetensorsFile(location, None, str(exc), f"safetensors header INVALID: {exc}")


def read_safetensors_fd(fd: int, path: str, size: int, location: str) -> SafetensorsFile:
    """:func:`read_safetensors_file` of a file already open (a kernel's held weights file).

    Args:
        fd: the open file (read with ``pread`` only).
        path: its name, for the parser's messages.
        size: its size, from ``fstat``.
        location: its name as the model wrote it, for the messages of :func:`check_reference`.

    Returns:
        The :class:`SafetensorsFile` (``header`` None when the header does not parse).
    """
    try:
        header = read_header(fd, path, size)
    except (SafetensorsError, OSError) as exc:
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


def refuse_disagreeing_reference(
    file: SafetensorsFile, name: str, data_type: int, dims: Sequence[int], offset: int, length: int
) -> None:
    """What every reader but ``inspect`` does with :func:`check_reference`: refuse the reference it finds wrong.

    Args:
        file: the parsed file; one whose header does not parse (``file.header`` None) is not checked.
        name, data_type, dims, offset, length: as for :func:`check_reference`.

    Raises:
        SafetensorsReferenceError: the reference disagrees with the header; the message is
            :func:`check_reference`'s, the one ``inspect`` shows (``header mismatch``).
    """
    if file.header is None:
        return
    problem = check_reference(file, name, data_type, dims, offset, length)
    if problem is not None:
        raise SafetensorsReferenceError(problem)


class HeaderCache:
    """Parsed headers of the last few ``.safetensors`` files read, each by the version of the file it was read from.

    A kernel node opens its file on its own (each ``DelayedInitializer`` names one tensor), so a model of thousands
    of nodes would parse its header thousands of times. The key is the file's device, inode, size and change times
    (``st_mtime_ns``, ``st_ctime_ns``) and the name it was read under: a file rewritten in place gets a new key and is
    read again. Thread-safe.
    """

    def __init__(self) -> None:
        self._files: OrderedDict[tuple[object, ...], SafetensorsFile] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, fd: int, path: str, st: os.stat_result, location: str) -> SafetensorsFile:
        """:func:`read_safetensors_fd` of ``fd`` (``st`` is its ``fstat``), or the file parsed for the same key."""
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, location)
        with self._lock:
            hit = self._files.get(key)
            if hit is not None:
                self._files.move_to_end(key)
                return hit
        file = read_safetensors_fd(fd, path, st.st_size, location)
        with self._lock:
            self._files[key] = file
            while len(self._files) > _CACHED_FILES:
                self._files.popitem(last=False)
        return file

    def clear(self) -> None:
        with self._lock:
            self._files.clear()


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
