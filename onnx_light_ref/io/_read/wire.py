"""Parse a ``.onnx`` file's metadata without its inline tensor payloads, by reading the protobuf wire format.

:func:`load_model_stripped` walks the file's protobuf encoding (tags, varints, length-delimited fields) and descends
only into the messages that can hold a tensor: ModelProto → graph / training_info / functions, GraphProto → node /
initializer / sparse_initializer, NodeProto and FunctionProto → attributes, AttributeProto → t / g / tensors /
graphs / sparse_tensor(s), SparseTensorProto → values / indices, TensorProto → raw_data. Every ``raw_data`` payload
of at least ``min_length`` bytes (and longer than :data:`PLACEHOLDER_LENGTH`) is recorded as an
:class:`InlinePayload` (its byte offset and length in the file) and replaced by a short placeholder; the enclosing
length prefixes are re-encoded and every other byte is copied verbatim. Only that stripped metadata is handed to
protobuf, so a ``.onnx`` larger than protobuf's 2 GiB limit parses as long as its metadata is smaller.

:func:`load_model_lean` is what the readers (``verify``, ``inspect``) call: a ``.onnx`` up to
:data:`WHOLE_PARSE_LIMIT` (16 MiB) is parsed whole by :func:`~onnx_light_ref.io._read.model_file.load_model_metadata`,
a larger one by the scan with every payload stripped, so their memory is the metadata, whatever the inline weights.

This module's scan must never read the file whole, never read a payload larger than its read-ahead window (it seeks over
them), never read past the end of the file, never loop without consuming bytes, and never raise anything for a bad
file but :class:`InvalidModelError` (``FileNotFoundError`` for a missing one). ``docs/wire_format.md`` describes the
format cases in detail.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io._arguments import PathLike, check_int
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._read.folder import ModelFolder, open_model_file
from onnx_light_ref.io._read.model_file import check_model_strings, load_model_metadata, not_a_model_file
from onnx_light_ref.io._read.proto import ModelProto

if TYPE_CHECKING:
    import onnx

logger = logging.getLogger(__name__)

# Protobuf wire types. Groups (3 start, 4 end) are deprecated and no ONNX field is one, but they are legal in the
# encoding of unknown fields, which protobuf (so onnx.load) skips and keeps: the scan skips them the same way.
# 6 and 7 do not exist.
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5

_RAW_DATA = "raw_data"

# Which fields lead to a TensorProto, checked against onnx.proto (tests/io/test_wire.py derives the same table from
# onnx's descriptors, so a future onnx that adds a tensor-holding field fails that test instead of silently keeping
# the new tensors inline). FunctionProto.node is field 7: field 3 is reserved (the old "status").
_SCHEMA: dict[str, dict[int, str]] = {
    "ModelProto": {7: "GraphProto", 20: "TrainingInfoProto", 25: "FunctionProto"},
    "TrainingInfoProto": {1: "GraphProto", 2: "GraphProto"},
    "GraphProto": {1: "NodeProto", 5: "TensorProto", 15: "SparseTensorProto"},
    "NodeProto": {5: "AttributeProto"},
    "FunctionProto": {7: "NodeProto", 11: "AttributeProto"},
    "AttributeProto": {
        5: "TensorProto",
        6: "GraphProto",
        10: "TensorProto",
        11: "GraphProto",
        22: "SparseTensorProto",
        23: "SparseTensorProto",
    },
    "SparseTensorProto": {1: "TensorProto", 2: "TensorProto"},
    "TensorProto": {9: _RAW_DATA},
}

# Protobuf's default recursion limit: a model nested deeper is refused by ParseFromString anyway, and the limit keeps
# a hostile file from exhausting Python's stack.
MAX_NESTING_DEPTH = 100

# Metadata handed to ParseFromString must stay below protobuf's hard 2 GiB message limit; checked while copying so
# that a hostile file cannot make us read gigabytes of "metadata" before protobuf would refuse it.
_PROTOBUF_LIMIT = 2**31 - 1

# Read-ahead window for tags and small fields: one pread per 64 KiB of metadata instead of one per field. A payload
# longer than this is never read (at most its first window's worth may be, as read-ahead).
_WINDOW = 64 * 1024

_MAGIC = b"\x00olrwire"  # the NUL makes a placeholder unlike any text; the nonce makes it unlike any payload
_NONCE_LENGTH = 16
_INDEX_LENGTH = 8
PLACEHOLDER_LENGTH = len(_MAGIC) + _NONCE_LENGTH + _INDEX_LENGTH
"""Bytes of the placeholder that replaces a stripped payload; only longer payloads are stripped."""

WHOLE_PARSE_LIMIT = 16 * 1024 * 1024
"""A ``.onnx`` up to this size is parsed whole by :func:`load_model_lean`, a larger one by the wire scan.

Parsing whole holds the file twice (the bytes read and protobuf's parsed copy): 32 MiB at this size, as much as two
default chunks of ``verify``. Below it the scan would cost more time than the memory it saves (protobuf is 17-66x
faster on many small tensors, ``benchmarks/wire_scan_timing.py``); above it the scan's cost, a few microseconds per
tensor, is small beside reading the weights, and memory stays the metadata alone whatever the inline weights."""

_MAX_VARINT_BYTES = 10
# upb, the protobuf of ``onnx.load``, reads a tag or a length in at most 5 bytes and refuses a longer encoding even of
# a small value ("wire format was corrupt"; onnxruntime refuses it too), while a varint value may take 10. The scan
# refuses the same: it re-encodes the lengths and keys of the messages it strips payloads from, so an over-long one
# it let through would reach protobuf minimal, and a file no loader opens would read as valid
# (tests/io/test_wire_overlong.py compares the verdicts with onnx.load's).
_MAX_KEY_BYTES = 5
_MAX_TAG = 2**32 - 1


@dataclass(frozen=True, slots=True)
class InlinePayload:
    """Where a stripped ``raw_data`` payload lies in the ``.onnx`` file: ``length`` bytes at byte ``offset``."""

    offset: int
    length: int


@dataclass(eq=False)
class StrippedModel:
    """A model parsed without its large inline payloads, and where those payloads are in the file.

    ``model`` is a real :class:`onnx.ModelProto`; every tensor whose payload was stripped carries a
    :data:`PLACEHOLDER_LENGTH`-byte placeholder in ``raw_data`` instead of its data. Such a model must not be saved
    or evaluated before each of those tensors has been rewritten (made external, or given its bytes back):
    :meth:`payload` tells which tensors they are.

    Attributes:
        model: the parsed metadata.
        path: the ``.onnx`` file, as given (``os.fspath``).
        file_size: its size in bytes when it was parsed; every payload lies inside it.
        payloads: every stripped payload, in file order (placeholder ``i`` names ``payloads[i]``).
        metadata_size: bytes handed to protobuf.
        device, inode: the identity (``st_dev``, ``st_ino``) of the file that was parsed, taken with ``fstat`` on the
            very descriptor that was read, so a path swapped for another file before or after the scan cannot lend
            its identity. ``-1`` when unknown (a StrippedModel built by hand).
        mtime_ns: that file's modification time (``st_mtime_ns``) at the scan, ``-1`` when unknown.

    Before copying payloads out of :attr:`path`, a caller opens it and checks :meth:`same_file` on the ``fstat`` of
    its own descriptor: payload offsets are only meaningful in the file that was scanned.
    """

    model: onnx.ModelProto
    path: str
    file_size: int
    payloads: tuple[InlinePayload, ...]
    metadata_size: int
    _prefix: bytes = field(repr=False)
    device: int = -1
    inode: int = -1
    mtime_ns: int = -1

    def same_file(self, st: os.stat_result) -> bool:
        """Tell whether ``st`` (an ``fstat`` of the file about to be read) is the file that was scanned, unchanged.

        Compares device, inode, size and modification time. A file replaced by another (rename, new inode), or
        rewritten in place to another size or at another time, does not match; neither does any file when the
        identity is unknown (``-1``).

        Args:
            st: the ``os.stat_result`` of the file to compare, best taken with ``os.fstat`` on an open descriptor.

        Returns:
            ``True`` when ``st`` names the scanned file with its scanned size and modification time.
        """
        if self.device < 0 or self.inode < 0:
            return False
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
            self.device,
            self.inode,
            self.file_size,
            self.mtime_ns,
        )

    def payload(self, tensor: onnx.TensorProto) -> InlinePayload | None:
        """Return where ``tensor``'s ``raw_data`` really is, or ``None`` if it was not stripped.

        ``None`` means the tensor's ``raw_data`` (possibly empty) is its real data: it was shorter than
        ``min_length`` or than the placeholder, or the tensor uses typed fields or external data.

        Args:
            tensor: a TensorProto of :attr:`model` (or a copy of one).

        Returns:
            The payload's offset and length in :attr:`path`, or ``None``.
        """
        raw = tensor.raw_data
        if len(raw) != PLACEHOLDER_LENGTH or not raw.startswith(self._prefix):
            return None
        index = int.from_bytes(raw[len(self._prefix) :], "big")
        # The prefix holds a nonce drawn after the file was opened, so a real payload cannot name an index; the bound
        # check only guards against a placeholder copied from another StrippedModel with the same nonce (impossible).
        return self.payloads[index] if index < len(self.payloads) else None


def load_model_stripped(path: PathLike, min_length: int, *, folder: ModelFolder | None = None) -> StrippedModel:
    """Parse a model's metadata; record, instead of reading, every inline ``raw_data`` of at least ``min_length`` bytes.

    The file is read through a bounded window; stripped payloads are seeked over, never read (beyond read-ahead of at
    most 64 KiB). Tensors anywhere are covered: initializers and sparse initializers of the main graph, of every
    subgraph (If/Loop/Scan bodies, at any depth), of ``training_info`` graphs; node attribute tensors ``t``,
    ``tensors``, ``sparse_tensor``, ``sparse_tensors``; and the nodes and default attributes of model functions.
    Payloads of at most :data:`PLACEHOLDER_LENGTH` bytes always stay in the model, as do typed fields
    (``float_data``...) and external data entries. Works for files larger than 2 GiB, provided the metadata left after
    stripping is below protobuf's 2 GiB limit. The result records the identity (device, inode, modification time) of
    the file it read, from ``fstat`` of the descriptor it parsed: see :meth:`StrippedModel.same_file`.

    Args:
        path: the ``.onnx`` file.
        min_length: strip payloads of at least this many bytes (0 strips every payload longer than the placeholder).

    Returns:
        The :class:`StrippedModel`.

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a regular file.
        InvalidModelError: the file is truncated or is not a valid protobuf encoding (the message names the byte
            offset), its metadata exceeds 2 GiB, protobuf refuses the metadata, or the model has no graph.
        ValueError: ``min_length`` is negative (``ArgumentTypeError`` if it is not an int).
    """
    min_length = check_int("min_length", min_length)
    path = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file.
        fd = open_model_file(path, folder)  # relative to the held folder when given
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise FileNotFoundError(f"ONNX model file not found: {path!r}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(not_a_model_file(path, st, f"ONNX model path is not a regular file: {path!r}"))
        prefix = _MAGIC + secrets.token_bytes(_NONCE_LENGTH)
        scanner = _Scanner(_WindowReader(fd, st.st_size, path), path, min_length, prefix)
        metadata = scanner.scan()
        try:
            model = _parse_metadata(metadata, path)
        except InvalidModelError as refusal:
            _diagnose(fd, st.st_size, path, min_length, prefix, refusal)
            raise
    finally:
        os.close(fd)
    logger.debug(
        "%s: %d payloads stripped (%d bytes), %d metadata bytes parsed",
        path,
        len(scanner.payloads),
        sum(p.length for p in scanner.payloads),
        len(metadata),
    )
    return StrippedModel(
        model,
        path,
        st.st_size,
        tuple(scanner.payloads),
        len(metadata),
        prefix,
        device=st.st_dev,
        inode=st.st_ino,
        mtime_ns=st.st_mtime_ns,
    )


def load_model_lean(
    path: PathLike, *, folder: ModelFolder | None = None, check_strings: bool = True
) -> tuple[onnx.ModelProto, StrippedModel | None]:
    """Parse a model's metadata with bounded memory, whatever the size of its inline weights: what readers use.

    A ``.onnx`` of at most :data:`WHOLE_PARSE_LIMIT` bytes is parsed whole
    (:func:`~onnx_light_ref.io._read.model_file.load_model_metadata`); a larger one, also one over protobuf's 2 GiB
    limit, by the wire scan with every payload longer than :data:`PLACEHOLDER_LENGTH` left in the file
    (:func:`load_model_stripped` with ``min_length=0``). Memory is then the metadata (names, graph, typed fields,
    payloads of at most 32 bytes), never the inline weights: ``verify`` reads the stripped payloads back from the
    ``.onnx`` through its chunk buffers, ``inspect`` never reads them.

    Args:
        path: the ``.onnx`` file.
        folder: its held folder (:func:`~onnx_light_ref.io._read.model_file.open_model_folder`): opened through it.
        check_strings: refuse a string that is not UTF-8, as
            :func:`~onnx_light_ref.io._read.model_file.load_model_metadata` does (``inspect`` reports them instead).

    Returns:
        The parsed model and, when the scan parsed it, the :class:`StrippedModel` saying where each stripped payload
        is (``None`` for a model parsed whole, whose inline payloads are in the model).

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a regular file.
        InvalidModelError: ``path`` cannot be parsed as a model (the scan names the byte offset), has no graph, its
            metadata alone exceeds 2 GiB, or (``check_strings``) it has a string that is not UTF-8.
    """
    path = os.fspath(path)
    try:
        size = os.stat(os.path.basename(path), dir_fd=folder.fd).st_size if folder else os.stat(path).st_size
    except OSError:
        size = 0  # missing or unusable: load_model_metadata raises the package's error for it
    if size <= WHOLE_PARSE_LIMIT:
        return load_model_metadata(path, check_strings=check_strings, folder=folder), None
    stripped = load_model_stripped(path, 0, folder=folder)
    if check_strings:
        check_model_strings(stripped.model, what=repr(path))
    return stripped.model, stripped


def _diagnose(fd: int, size: int, path: str, min_length: int, prefix: bytes, refusal: InvalidModelError) -> None:
    """Protobuf refused the metadata: rescan walking every tensor-holding message, to name the byte at fault.

    The fast scan leaves to protobuf the sub-messages too short to hold a payload, so a fault inside one of them
    reaches protobuf, whose message has no offset. Only on that failure path, the file is scanned again the slow way;
    its error (same guarantees: bounded window, nothing read past the end) replaces protobuf's when it finds one.
    """
    scanner = _Scanner(_WindowReader(fd, size, path), path, min_length, prefix, walk_all=True)
    try:
        scanner.scan()
    except InvalidModelError as exc:
        raise exc from refusal


def _parse_metadata(metadata: bytearray, path: str) -> onnx.ModelProto:
    """Hand the stripped bytes to protobuf; its refusals become InvalidModelError."""
    model = ModelProto()
    try:
        model.ParseFromString(memoryview(metadata))
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (protobuf cannot parse it: {exc}).") from exc
    if not model.HasField("graph"):
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (it has no graph; truncated or not ONNX?).")
    return model


def _encode_varint(value: int) -> bytes:
    """Minimal protobuf varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# The same table with each field's encoded key (tag of wire type 2), which the scan writes before re-encoded content.
_CHILDREN: dict[str, dict[int, tuple[str, bytes]]] = {
    kind: {number: (child, _encode_varint(number << 3 | _LEN)) for number, child in fields.items()}
    for kind, fields in _SCHEMA.items()
}


class _WindowReader:
    """Positional reads of a file of known size through one read-ahead window; never reads past ``size``."""

    def __init__(self, fd: int, size: int, path: str) -> None:
        self._fd = fd
        self.size = size
        self._path = path
        self.buffer = bytearray()  # the window: file bytes [start, start + len(buffer))
        self.start = 0

    def read(self, pos: int, count: int) -> bytearray | memoryview:
        """Exactly ``count`` bytes at ``pos``; the caller has checked ``pos + count <= size``."""
        if count > _WINDOW:
            buffer = bytearray(count)
            self._pread(buffer, pos)
            return buffer
        if pos < self.start or pos + count > self.start + len(self.buffer):
            self.fill(pos)
        begin = pos - self.start
        return memoryview(self.buffer)[begin : begin + count]

    def fill(self, pos: int) -> None:
        """Move the window to start at ``pos`` (it ends at the window size or at the end of the file)."""
        buffer = bytearray(min(_WINDOW, self.size - pos))
        self._pread(buffer, pos)
        self.buffer, self.start = buffer, pos

    def _pread(self, buffer: bytearray, pos: int) -> None:
        # An OSError (EIO...) is the disk's problem, not the model's: it propagates as is.
        got = pread_exact(self._fd, memoryview(buffer), pos)
        if got != len(buffer):
            raise InvalidModelError(
                f"{self._path!r}: the file shrank while it was read (expected {len(buffer)} bytes at byte offset "
                f"{pos}, got {got})."
            )


class _Scanner:
    """One pass over the file: re-encodes the tensor-holding messages, records the payloads it strips.

    A message is re-encoded only when something inside it was stripped; every other byte, including whole
    tensor-holding sub-messages where nothing was stripped, stays in a verbatim run copied with one read at the end
    of the run. The hot loop decodes one-byte tags and one-byte varints inline from the read-ahead window and calls
    :meth:`_varint` only for longer ones or at a window edge.
    """

    def __init__(
        self, reader: _WindowReader, path: str, min_length: int, prefix: bytes, *, walk_all: bool = False
    ) -> None:
        self._reader = reader
        # walk_all: descend into every tensor-holding sub-message, even one too short to hold a payload (diagnosis).
        self._walk_all = walk_all
        self._path = path
        # A payload no longer than the placeholder would not shrink, and stripping it would only cost a lookup.
        self._strip_from = max(min_length, PLACEHOLDER_LENGTH + 1)
        self._prefix = prefix
        self._kept = 0
        self.payloads: list[InlinePayload] = []

    def scan(self) -> bytearray:
        out = self._message("ModelProto", 0, self._reader.size, 0)
        if out is None:  # nothing was stripped: the metadata is the whole file
            out = bytearray()
            self._flush(0, self._reader.size, out)
        return out

    def _fail(self, what: str, pos: int, kind: str) -> InvalidModelError:
        return InvalidModelError(
            f"{self._path!r} is not a valid ONNX model: {what} at byte offset {pos} (in a {kind})."
        )

    def _varint(self, pos: int, end: int, kind: str, role: str, number: int = 0) -> tuple[int, int]:
        """Decode the varint at ``pos`` that must end before ``end``; return (value, position after it).

        ``role`` names the varint ("field tag", or field ``number``'s "value" or "length") and sets its longest
        encoding: 10 bytes for a value, 5 for a tag or a length, as upb reads them. ``role`` and ``number`` name it in
        an error; the message is built only on failure.
        """
        reader = self._reader
        longest = _MAX_VARINT_BYTES if role == "value" else _MAX_KEY_BYTES
        limit = min(pos + longest, end)
        if pos < reader.start or limit > reader.start + len(reader.buffer):
            reader.fill(pos)  # limit - pos <= 10 bytes and limit <= end <= file size: the new window covers them
        buffer, base = reader.buffer, reader.start
        value = shift = 0
        for i in range(pos - base, limit - base):
            byte = buffer[i]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, base + i + 1
            shift += 7
        what = role if role == "field tag" else f"field {number} {role}"
        if limit - pos == longest:
            raise self._fail(f"{what} varint longer than {longest} bytes", pos, kind)
        where = "file" if limit == reader.size else "enclosing message"
        raise self._fail(f"{what} varint truncated by the end of the {where}", pos, kind)

    def _message(self, kind: str, start: int, end: int, depth: int) -> bytearray | None:
        """Scan the ``kind`` message in ``[start, end)``; return its re-encoded content, or ``None`` if nothing in it
        was stripped (its bytes are then exactly the file's, and the caller keeps them in its verbatim run)."""
        if depth > MAX_NESTING_DEPTH:
            raise self._fail(f"messages nested deeper than {MAX_NESTING_DEPTH} levels", start, kind)
        children = _CHILDREN[kind]
        reader = self._reader
        strip_from = self._strip_from
        # The smallest message that can hold a strippable payload at any depth (its tag and length take at least a
        # byte each): a shorter tensor-holding sub-message is left to protobuf without being walked here.
        holds_payload = 0 if self._walk_all else strip_from + 2
        buffer, base = reader.buffer, reader.start
        window_end = base + len(buffer)
        out: bytearray | None = None
        pos = copy_from = start
        while pos < end:
            field_start = pos
            # Inline fast paths: a one-byte varint inside the window (most tags and small lengths). Anything else,
            # and every error, goes through _varint, which moves the window; the locals are refreshed after it.
            if base <= pos < window_end and (tag := buffer[pos - base]) < 0x80:
                pos += 1
            else:
                tag, pos = self._varint(pos, end, kind, "field tag")
                buffer, base = reader.buffer, reader.start
                window_end = base + len(buffer)
            if tag < 8 or tag > _MAX_TAG:
                raise self._fail(f"invalid field tag {tag} (field number {tag >> 3})", field_start, kind)
            wire_type = tag & 7
            if wire_type == _LEN:
                if pos < end and base <= pos < window_end and (length := buffer[pos - base]) < 0x80:
                    pos += 1
                else:
                    length, pos = self._varint(pos, end, kind, "length", tag >> 3)
                    buffer, base = reader.buffer, reader.start
                    window_end = base + len(buffer)
                if length > end - pos:
                    raise self._truncated(f"field {tag >> 3} (length {length})", field_start, end, kind)
                child = children.get(tag >> 3)
                if child is not None:
                    child_kind, key = child
                    content: bytes | bytearray | None = None
                    if child_kind == _RAW_DATA:
                        if length >= strip_from:
                            content = self._prefix + len(self.payloads).to_bytes(_INDEX_LENGTH, "big")
                            self.payloads.append(InlinePayload(pos, length))
                    elif length >= holds_payload:
                        content = self._message(child_kind, pos, pos + length, depth + 1)
                    if content is not None:
                        if out is None:
                            out = bytearray()
                        self._flush(copy_from, field_start, out)
                        out += key
                        size = len(content)
                        if size < 0x80:
                            out.append(size)
                        else:
                            out += _encode_varint(size)
                        out += content
                        # The content's own bytes were counted by its flushes; a placeholder by nobody yet.
                        self._kept += len(key) + _MAX_VARINT_BYTES + (len(content) if child_kind == _RAW_DATA else 0)
                        copy_from = pos + length
                        buffer, base = reader.buffer, reader.start
                        window_end = base + len(buffer)
                pos += length
            elif wire_type == _VARINT:
                if pos < end and base <= pos < window_end and buffer[pos - base] < 0x80:
                    pos += 1
                else:
                    _, pos = self._varint(pos, end, kind, "value", tag >> 3)
                    buffer, base = reader.buffer, reader.start
                    window_end = base + len(buffer)
            elif wire_type in (_I64, _I32):
                width = 8 if wire_type == _I64 else 4
                if width > end - pos:
                    raise self._truncated(f"field {tag >> 3} ({width}-byte value)", field_start, end, kind)
                pos += width
            elif wire_type == _SGROUP:
                pos = self._skip_group(tag >> 3, field_start, pos, end, depth + 1, kind)
                buffer, base = reader.buffer, reader.start
                window_end = base + len(buffer)
            elif wire_type == _EGROUP:
                raise self._fail(
                    f"end-group tag of field {tag >> 3} without a matching start-group tag", field_start, kind
                )
            else:
                raise self._fail(f"field {tag >> 3} has the invalid wire type {wire_type}", field_start, kind)
        if out is not None:
            self._flush(copy_from, end, out)
        return out

    def _skip_group(self, number: int, group_start: int, pos: int, end: int, depth: int, kind: str) -> int:
        """Skip the group of field ``number`` whose start tag is at ``group_start``; return the position after its end
        tag. Exactly protobuf's rules for an unknown group (upb's, which ``onnx.load`` parses with): its fields must be
        well formed (length-delimited ones are skipped, not parsed), groups nest (each level counts towards the depth
        limit, as a sub-message does), each group ends with the end-group tag of its own field number, and that tag
        comes before ``end``. A field number 0 is skipped like any other, as upb skips it: only outside groups is it
        invalid. (C++ protobuf, which onnx's checker and onnxruntime parse with, refuses a file with one; such a file
        loads in ``onnx.load`` and is read here the same, and a message too small to hold a payload is not walked at
        all but left to protobuf, so refusing it here would depend on where it sits.) The group's bytes stay in the
        caller's verbatim run: nothing inside a group is a field the scan strips."""
        what = f"{kind} group (field {number})"
        open_groups = [(number, group_start)]
        while True:
            if depth + len(open_groups) - 1 > MAX_NESTING_DEPTH:
                raise self._fail(f"messages nested deeper than {MAX_NESTING_DEPTH} levels", open_groups[-1][1], what)
            if pos >= end:
                number, started = open_groups[-1]
                where = "file" if end == self._reader.size else "enclosing message"
                raise self._fail(
                    f"group of field {number} (started at byte offset {started}) is not closed before the end of "
                    f"the {where}",
                    pos,
                    what,
                )
            field_start = pos
            tag, pos = self._varint(pos, end, what, "field tag")
            # No field number 0 check: protobuf skips one inside a group as any other field (see the docstring).
            if tag > _MAX_TAG:
                raise self._fail(f"invalid field tag {tag} (field number {tag >> 3})", field_start, what)
            wire_type = tag & 7
            if wire_type == _VARINT:
                _, pos = self._varint(pos, end, what, "value", tag >> 3)
            elif wire_type in (_I64, _I32):
                width = 8 if wire_type == _I64 else 4
                if width > end - pos:
                    raise self._truncated(f"field {tag >> 3} ({width}-byte value)", field_start, end, what)
                pos += width
            elif wire_type == _LEN:
                length, pos = self._varint(pos, end, what, "length", tag >> 3)
                if length > end - pos:
                    raise self._truncated(f"field {tag >> 3} (length {length})", field_start, end, what)
                pos += length
            elif wire_type == _SGROUP:
                open_groups.append((tag >> 3, field_start))
            elif wire_type == _EGROUP:
                number, started = open_groups.pop()
                if tag >> 3 != number:
                    raise self._fail(
                        f"end-group tag of field {tag >> 3} does not close the group of field {number} (started at "
                        f"byte offset {started})",
                        field_start,
                        what,
                    )
                if not open_groups:
                    return pos
            else:
                raise self._fail(f"field {tag >> 3} has the invalid wire type {wire_type}", field_start, what)

    def _truncated(self, what: str, pos: int, end: int, kind: str) -> InvalidModelError:
        where = "file" if end == self._reader.size else f"enclosing message (which ends at byte offset {end})"
        return self._fail(f"{what} runs past the end of the {where}", pos, kind)

    def _flush(self, start: int, end: int, out: bytearray) -> None:
        """Copy ``[start, end)`` of the file verbatim, within protobuf's size limit (checked before reading)."""
        self._kept += end - start
        if self._kept > _PROTOBUF_LIMIT:
            raise InvalidModelError(
                f"{self._path!r}: the model's metadata (everything but the stripped payloads) exceeds protobuf's "
                f"2 GiB limit (reached at byte offset {end}); lower min_length or move tensors to external data."
            )
        if end > start:
            out += self._reader.read(start, end - start)
