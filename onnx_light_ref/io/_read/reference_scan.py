"""The files a ``.onnx`` names, read by streaming its wire format: what rule 1 of the writer contract reads.

A model names a file through the ``location`` entries of its EXTERNAL tensors and the ``filename`` attribute of its
``ai.rt::DelayedInitializer`` nodes, wherever a tensor or a node can live (main graph, subgraphs of ``g`` and
``graphs`` at any depth, functions and their default attributes, ``training_info`` graphs; tensors as initializers,
sparse values and indices, attribute ``t``/``tensors``/``sparse_tensor(s)``). :func:`named_files` walks the
protobuf encoding of the file along those messages only, with positional reads (a 64 KiB read-ahead while it reads
on, 4 KiB after a field it skipped; never the whole file), reads the few fields that decide a reference (a tensor's
``name``, ``data_location`` and ``external_data`` entries; a node's ``domain``, ``op_type``, first ``output``,
``name``, and its attributes' ``name`` and ``s``; the names labels are made of) and seeks over every other field,
whatever it holds (``raw_data``, ``doc_string``, packed ``float_data``, each ``string_data``...).

Two shortcuts keep it fast on models of many nodes and tensors. An element of a repeated field (a node, an
initializer, an attribute, a function...) of at most 4 KiB is first searched, at C speed, for the bytes
``location``, ``DelayedInitializer`` and ``filename``: one without any of them names no file (its key, op type or
attribute name would hold them) and is skipped whole. A small node or tensor that holds one is parsed by protobuf
itself (one call in C), unless the node holds an external tensor or another such node (then it is walked: what
they name needs their place and label). Elements of singular fields (``graph``, ``t``, ``g``, ``sparse_tensor``,
sparse ``values``/``indices``, training graphs) are always walked: protobuf merges repeated occurrences of such a
field, so an occurrence without those bytes may still set the ``data_location`` of a tensor whose ``location`` is in
another; the walk merges them as protobuf does (``data_location`` is a closed enum: a value other than 0 or 1
leaves the previous one; fields of another wire type than their own are unknown fields).

The answer is the one the guard got by parsing the model with protobuf and walking it with
:func:`~onnx_light_ref.io._read.walker.iter_tensors` (``tests/io/test_reference_scan.py`` checks them against each
other on generated hostile encodings): per file named, the first tensor (in ``iter_tensors`` order) or node (depth
first, after every tensor) naming it, and how many do. Two deliberate differences: a ``location`` or ``filename`` of
:data:`PATH_LIMIT` bytes or more names no file (no loader can open a path that long: ``ENAMETOOLONG``) and is not
read; a name of :data:`PATH_LIMIT` bytes or more is cut there in the labels.

Bounds: memory is the read-ahead, the path being walked and the answer (a few hundred KiB); time is at most
:data:`MAX_FIELDS` fields walked. A file past it raises :class:`CannotScanError` (the guard then takes it as
possibly naming any file in its reach). A file whose encoding is broken where the walk goes (truncated, a length
past its message's end, a field number 0, a tag or length varint over 5 bytes, a value varint over 10, a wire type
6 or 7, an end-group tag alone, an unclosed group, messages or groups nested deeper than :data:`MAX_DEPTH`,
protobuf's own limit) raises :class:`MalformedModelError`: protobuf refuses such a file too (the tests check each
case against it), so ``onnx.load`` cannot load it. Parts the walk skips are not checked: a file protobuf refuses may
still be read here, and it then names what it seems to name (the safe side for the guard).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf.message import DecodeError

from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._read import proto
from onnx_light_ref.io._read.delayed_names import DELAYED_DOMAIN, DELAYED_FILENAME, DELAYED_OP_TYPE

Via = Literal["external_data", "delayed_initializer"]

MAX_DEPTH = 100
"""Messages nested below ``ModelProto`` that the walk follows; protobuf (``onnx.load``) refuses one level more."""

MAX_FIELDS = 2_000_000
"""Fields the walk decodes in one file before it gives up (:class:`CannotScanError`): about a second of work. A model
reaches it only with about two million nodes, tensors or other graph entries, or a tensor of that many separately
encoded values holding the bytes ``location``."""

PATH_LIMIT = 4096
"""``PATH_MAX``: a ``location`` or ``filename`` this long or longer cannot be opened by any loader."""

_WINDOW = 64 * 1024  # read-ahead while reading on
_SMALL = 4096  # read-ahead after a field skipped; elements up to this long are searched (and parsed) whole
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_MAX_TAG = 2**32 - 1

# Bytes one of which an element must hold to name a file: an external_data key, the op type, the attribute name.
_NEEDLES = re.compile(b"|".join(re.escape(n.encode()) for n in ("location", DELAYED_OP_TYPE, DELAYED_FILENAME)))
_DOMAIN, _OP_TYPE, _FILENAME = DELAYED_DOMAIN.encode(), DELAYED_OP_TYPE.encode(), DELAYED_FILENAME.encode()


class MalformedModelError(InvalidModelError):
    """The encoding is broken where the walk goes; ``problem`` says what and at which byte offset."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path!r} is not a valid ONNX model: {problem}.")
        self.problem = problem


class CannotScanError(ValueError):
    """The file may be a model, but its references could not be read within the walk's bounds (or it changed while
    it was read): the guard must take it as possibly naming any file in its reach."""


@dataclass(frozen=True, slots=True)
class NamedFile:
    """One file a model names (by ``location``: the entry's or the attribute's text), the first tensor or node naming
    it (its name, or a description of its place), how, and how many tensors or nodes name it so."""

    label: str
    location: str
    via: Via
    count: int


@dataclass(frozen=True, slots=True)
class NamedFiles:
    """What :func:`named_files` found: one :class:`NamedFile` per distinct ``location``/``filename`` text, in order
    of the first tensor (then node) naming each, and whether the model has a graph (an ONNX model has one)."""

    files: list[NamedFile]
    graph: bool


def named_files(fd: int, size: int, path: str) -> NamedFiles:
    """Every file the model in ``fd`` names, and whether it has a graph.

    Args:
        fd: a descriptor of the ``.onnx`` file, open for reading (positional reads only: its offset is not moved).
        size: the file's size (from ``fstat``): nothing past it is read.
        path: the file's name, for the messages.

    Returns:
        The :class:`NamedFiles`.

    Raises:
        MalformedModelError: the encoding is broken where the walk goes, or nested deeper than :data:`MAX_DEPTH`
            (protobuf refuses the file too).
        CannotScanError: the model has more than :data:`MAX_FIELDS` fields to walk, or the file shrank while it was
            read.
        OSError: reading failed (EIO...).

    Example:
        >>> fd = os.open("model.onnx", os.O_RDONLY)  # doctest: +SKIP
        >>> named_files(fd, os.fstat(fd).st_size, "model.onnx").files  # doctest: +SKIP
        [NamedFile(label='w', location='model.onnx.data', via='external_data', count=12)]
    """
    return _Scan(fd, size, path).run()


# ------------------------------------------------------------------------------------------- what a walk holds


def _text(raw: bytes) -> str | bytes:
    """A string field as protobuf hands it back: text when it is UTF-8, else the bytes."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def _raw(text: str | bytes, most: int = PATH_LIMIT) -> bytes:
    """A string protobuf parsed (text, or bytes when not UTF-8) as its bytes, cut at ``most`` as the walk cuts it."""
    return (text.encode() if isinstance(text, str) else text)[:most]


def _label(raw: bytes) -> str:
    return raw.decode("utf-8", errors="backslashreplace")


class _Graph:
    __slots__ = ("describe", "initializers", "name", "nodes", "place", "sparse")

    def __init__(self, place: tuple[int, ...], describe: Callable[[str | bytes], str]) -> None:
        self.place, self.describe = place, describe
        self.name = b""
        self.nodes = self.initializers = self.sparse = 0

    def where(self) -> str:
        return self.describe(_text(self.name))


class _Function:
    __slots__ = ("defaults", "domain", "name", "nodes", "overload", "place")

    def __init__(self, place: tuple[int, ...]) -> None:
        self.place = place
        self.name = self.domain = self.overload = b""
        self.nodes = self.defaults = 0

    def where(self) -> str:
        overload = _text(self.overload)
        suffix = f" (overload {overload!r})" if overload else ""
        return f"function {_text(self.domain)!s}::{_text(self.name)!s}{suffix}"


class _Node:
    __slots__ = ("attributes", "container", "domain", "filenames", "index", "name", "op_type", "output", "place")

    def __init__(self, place: tuple[int, ...], index: int, container: _Graph | _Function) -> None:
        self.place, self.index, self.container = place, index, container
        self.name = self.op_type = self.domain = b""
        self.output: bytes | None = None
        self.attributes = 0
        self.filenames: list[bytes] = []

    def where(self) -> str:
        return f"{self.container.where()} / node {_text(self.name) or f'#{self.index}'!r} ({_text(self.op_type)!s})"

    def label(self) -> str:
        if self.output is not None:
            return _label(self.output)
        return _label(self.name) or DELAYED_OP_TYPE


class _Attribute:
    __slots__ = (
        "function",
        "g",
        "graphs",
        "kinds",
        "name",
        "node",
        "place",
        "s",
        "sparse",
        "sparse_count",
        "t",
        "tensors",
    )

    def __init__(self, place: tuple[int, ...], node: _Node | None, function: _Function | None) -> None:
        self.place, self.node, self.function = place, node, function
        prefix = "attribute" if node is not None else "function default"
        self.kinds = (prefix, f"sparse {prefix} values", f"sparse {prefix} indices")
        self.name = self.s = b""
        self.t: _Tensor | None = None
        self.sparse: _Sparse | None = None
        self.g: _Graph | None = None
        self.tensors = self.graphs = self.sparse_count = 0

    def where(self) -> str:
        if self.node is not None:
            return f"{self.node.where()} / {_text(self.name)!s}"
        assert self.function is not None
        return f"{self.function.where()} / default of attribute {_text(self.name)!r}"


class _Tensor:
    __slots__ = ("external", "holder", "kind", "locations", "name", "place")

    def __init__(self, place: tuple[int, ...], kind: str, holder: _Graph | _Attribute) -> None:
        self.place, self.kind, self.holder = place, kind, holder
        self.name = b""
        self.external = False
        self.locations: list[bytes] = []

    def label(self) -> str:
        return _label(self.name) or f"<unnamed {self.kind} in {self.holder.where()}>"


class _Sparse:
    __slots__ = ("holder", "indices", "kinds", "place", "values")

    def __init__(self, place: tuple[int, ...], holder: _Graph | _Attribute, kinds: tuple[str, ...]) -> None:
        self.place, self.holder, self.kinds = place, holder, kinds
        self.values: _Tensor | None = None
        self.indices: _Tensor | None = None


class _Entry:
    __slots__ = ("key", "value")

    def __init__(self) -> None:
        self.key = self.value = b""


class _Training:
    __slots__ = ("algorithm", "index", "initialization")

    def __init__(self, index: int) -> None:
        self.index = index
        self.initialization: _Graph | None = None
        self.algorithm: _Graph | None = None


class _Model:
    __slots__ = ("functions", "graph", "trainings")

    def __init__(self) -> None:
        self.graph: _Graph | None = None
        self.functions = self.trainings = 0


def _training_graph(step: int, field: str) -> Callable[[_Training], _Graph]:
    """What makes the graph of a training entry's ``field`` (``step`` 0 or 1 in the order of places)."""
    return lambda training: _Graph(
        (2, training.index, step), lambda name: f"training_info[{training.index}] {field} graph {name!r}"
    )


# --------------------------------------------------------------------------------------------------- the walk


def _tag(message: Any, field: str, wire_type: int = _LEN) -> int:
    """The encoded tag of ``message``'s ``field`` (numbers from onnx's own descriptors)."""
    return int(message.DESCRIPTOR.fields_by_name[field].number) << 3 | wire_type


_Handler = Callable[[Any, int, int, int], None]


class _Scan:
    """One walk over one file (module docstring). Handlers get ``(state, position, length or value, depth)``."""

    def __init__(self, fd: int, size: int, path: str) -> None:
        self._fd, self._size, self._path = fd, size, path
        self._buffer = bytearray()
        self._base, self._limit = 0, -1  # the first read is a small one: many models are that small
        self._searched = self._needle = -1  # the window was searched from _searched: no needle before _needle
        self._budget = MAX_FIELDS
        self._found: dict[bytes, list[Any]] = {}  # raw text -> [order key, labelled, via, count]
        self._root = _Model()
        model, graph, node, attribute = proto.ModelProto, proto.GraphProto, proto.NodeProto, proto.AttributeProto
        tensor, function, sparse = proto.TensorProto, proto.FunctionProto, proto.SparseTensorProto
        training, entry = proto.TrainingInfoProto, proto.StringStringEntryProto
        # One table per message: the handler of each field that can lead to a file; every other field is skipped.
        # Repeated fields' elements are numbered and may be skipped whole (_each); a singular field's occurrences
        # merge into one state (_merged), as protobuf merges them.
        self._entry: dict[int, _Handler] = {
            _tag(entry, "key"): self._set("key"),
            _tag(entry, "value"): self._set("value", path=True),
        }
        self._tensor: dict[int, _Handler] = {
            _tag(tensor, "name"): self._set("name"),
            _tag(tensor, "external_data"): self._external_data,
            _tag(tensor, "data_location", _VARINT): self._data_location,
        }
        self._sparse: dict[int, _Handler] = {
            _tag(sparse, "values"): self._merged("values", lambda s: _Tensor((*s.place, 0), s.kinds[0], s.holder)),
            _tag(sparse, "indices"): self._merged("indices", lambda s: _Tensor((*s.place, 1), s.kinds[1], s.holder)),
        }
        self._graph: dict[int, _Handler] = {}  # filled below: attributes hold graphs, graphs hold nodes
        self._attribute: dict[int, _Handler] = {
            _tag(attribute, "name"): self._set("name"),
            _tag(attribute, "s"): self._set("s", path=True),
            _tag(attribute, "t"): self._merged("t", lambda a: _Tensor((*a.place, 0), a.kinds[0], a)),
            _tag(attribute, "tensors"): self._each(
                "tensors", lambda a, i: _Tensor((*a.place, 1, i), a.kinds[0], a), self._tensor_message
            ),
            _tag(attribute, "sparse_tensor"): self._merged("sparse", lambda a: _Sparse((*a.place, 2), a, a.kinds[1:])),
            _tag(attribute, "sparse_tensors"): self._each(
                "sparse_count", lambda a, i: _Sparse((*a.place, 3, i), a, a.kinds[1:]), self._sparse_message
            ),
            _tag(attribute, "g"): self._merged("g", lambda a: _Graph((*a.place, 4), lambda _: a.where())),
            _tag(attribute, "graphs"): self._each(
                "graphs",
                lambda a, i: _Graph((*a.place, 5, i), lambda _: f"{a.where()}[{i}]"),
                self._walker(self._graph),
            ),
        }
        self._node: dict[int, _Handler] = {
            _tag(node, "output"): self._output,
            _tag(node, "name"): self._set("name"),
            _tag(node, "op_type"): self._set("op_type"),
            _tag(node, "domain"): self._set("domain"),
            _tag(node, "attribute"): self._each(
                "attributes", lambda n, i: _Attribute((*n.place, i), n, None), self._attribute_message
            ),
        }
        self._graph.update({
            _tag(graph, "node"): self._each("nodes", lambda g, i: _Node((*g.place, 2, i), i, g), self._node_message),
            _tag(graph, "name"): self._set("name"),
            _tag(graph, "initializer"): self._each(
                "initializers", lambda g, i: _Tensor((*g.place, 0, i), "initializer", g), self._tensor_message
            ),
            _tag(graph, "sparse_initializer"): self._each(
                "sparse",
                lambda g, i: _Sparse((*g.place, 1, i), g, ("sparse initializer values", "sparse initializer indices")),
                self._sparse_message,
            ),
        })  # fmt: skip
        function_fields: dict[int, _Handler] = {
            _tag(function, "name"): self._set("name"),
            _tag(function, "domain"): self._set("domain"),
            _tag(function, "overload"): self._set("overload"),
            _tag(function, "node"): self._each("nodes", lambda f, i: _Node((*f.place, 0, i), i, f), self._node_message),
            _tag(function, "attribute_proto"): self._each(
                "defaults", lambda f, i: _Attribute((*f.place, 1, i), None, f), self._attribute_message
            ),
        }
        training_fields = {
            _tag(training, field): self._merged(field, _training_graph(step, field))
            for step, field in enumerate(("initialization", "algorithm"))
        }
        self._model: dict[int, _Handler] = {
            _tag(model, "graph"): self._merged("graph", lambda _: _Graph((0,), lambda name: f"graph {name!r}")),
            _tag(model, "training_info"): self._each(
                "trainings", lambda _, i: _Training(i), self._walker(training_fields)
            ),
            _tag(model, "functions"): self._each(
                "functions", lambda _, i: _Function((1, i)), self._walker(function_fields)
            ),
        }
        self._tables = {_Graph: self._graph, _Tensor: self._tensor, _Sparse: self._sparse}

    def run(self) -> NamedFiles:
        self._walk(self._model, 0, self._size, -1, self._root)
        ordered = sorted(self._found.items(), key=lambda item: item[1][0])
        files = [NamedFile(held.label(), os.fsdecode(raw), via, count) for raw, (_, held, via, count) in ordered]
        return NamedFiles(files, self._root.graph is not None)

    # -------------------------------------------------------------------------------------------- the encoding

    def _malformed(self, what: str, pos: int) -> MalformedModelError:
        return MalformedModelError(self._path, f"{what} at byte offset {pos}")

    def _window(self, pos: int, count: int) -> int:
        """Make the window cover ``count`` bytes at ``pos`` (inside the file); return ``pos``'s index in it. Read on
        from the window's end, it reads a whole window; after a field skipped, a small one (the next field may be
        skipped too)."""
        if pos < self._base or pos + count > self._limit:
            size = _WINDOW if pos == self._limit else _SMALL
            buffer = bytearray(min(max(size, count), self._size - pos))
            if pread_exact(self._fd, memoryview(buffer), pos) != len(buffer):
                raise CannotScanError(f"the file shrank while it was read (at byte offset {pos})")
            self._buffer, self._base, self._limit = buffer, pos, pos + len(buffer)
            self._searched = self._needle = -1
        return pos - self._base

    def _varint(self, pos: int, end: int, most: int, what: str) -> tuple[int, int]:
        """The varint of at most ``most`` bytes at ``pos`` (protobuf's limits: 5 for tags and lengths, 10 for
        values), inside ``end``; returns it and the position after it."""
        stop = min(pos + most, end)
        first = self._window(pos, stop - pos)
        buffer = self._buffer
        value = shift = 0
        for i in range(first, first + stop - pos):
            byte = buffer[i]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos + i - first + 1
            shift += 7
        if stop - pos == most:
            raise self._malformed(f"{what} varint longer than {most} bytes", pos)
        raise self._malformed(f"{what} varint cut by the end of its message", pos)

    def _count(self, fields: int) -> None:
        self._budget -= fields
        if self._budget < 0:
            raise CannotScanError(
                f"more than {MAX_FIELDS:,} fields to read in the messages that can name a file (reached at byte "
                f"offset {self._base})"
            )

    def _walk(self, fields: dict[int, _Handler], pos: int, length: int, depth: int, state: Any) -> None:
        """Walk the message in ``[pos, pos + length)`` at ``depth`` (the model is 0): each field whose tag is in
        ``fields`` goes to its handler, every other one is checked as protobuf checks it and skipped."""
        depth += 1
        if depth > MAX_DEPTH:
            raise self._malformed(f"messages nested deeper than {MAX_DEPTH} levels (protobuf's limit)", pos)
        end = pos + length
        # The hot loop: one-byte tags and lengths are decoded inline from the window (kept in locals, refreshed
        # after every call that may move it); longer ones, window edges and every error go through _varint.
        buffer, base, limit = self._buffer, self._base, self._limit
        walked = 0
        while pos < end:
            walked += 1
            if walked == 1024:  # the budget, counted now and then (handlers count their own walks)
                self._count(walked)
                walked = 0
            start = pos
            if base <= pos < limit and (tag := buffer[pos - base]) < 0x80:
                pos += 1
            else:
                tag, pos = self._varint(pos, end, 5, "field tag")
                buffer, base, limit = self._buffer, self._base, self._limit
            if tag < 8 or tag > _MAX_TAG:
                raise self._malformed(f"invalid field tag {tag} (field number {tag >> 3})", start)
            wire_type = tag & 7
            if wire_type == _LEN:
                if pos < end and base <= pos < limit and (size := buffer[pos - base]) < 0x80:
                    pos += 1
                elif pos + 1 < end and base <= pos and pos + 1 < limit and (high := buffer[pos + 1 - base]) < 0x80:
                    size = (size & 0x7F) | high << 7  # two bytes (most nodes and tensors): the first was read above
                    pos += 2
                else:
                    size, pos = self._varint(pos, end, 5, f"field {tag >> 3} length")
                    buffer, base, limit = self._buffer, self._base, self._limit
                if size > end - pos:
                    raise self._malformed(f"field {tag >> 3} (length {size}) runs past the end of its message", start)
                handler = fields.get(tag)
                if handler is not None:
                    handler(state, pos, size, depth)
                    buffer, base, limit = self._buffer, self._base, self._limit
                pos += size
            elif wire_type == _VARINT:
                if pos < end and base <= pos < limit and (value := buffer[pos - base]) < 0x80:
                    pos += 1
                else:
                    value, pos = self._varint(pos, end, 10, f"field {tag >> 3} value")
                    buffer, base, limit = self._buffer, self._base, self._limit
                handler = fields.get(tag)
                if handler is not None:
                    handler(state, value, 0, depth)
            elif wire_type in (_I32, _I64):
                pos += 4 if wire_type == _I32 else 8
                if pos > end:
                    raise self._malformed(
                        f"field {tag >> 3} (fixed-width value) runs past the end of its message", start
                    )
            elif wire_type == _SGROUP:
                pos = self._skip_group(tag >> 3, start, pos, end, depth)
                buffer, base, limit = self._buffer, self._base, self._limit
            else:
                raise self._malformed(f"field {tag >> 3} has the wire type {wire_type} outside a group", start)
        self._count(walked)

    def _skip_group(self, number: int, start: int, pos: int, end: int, depth: int) -> int:
        """Skip the group opened at ``start`` as protobuf does (each level counts towards the depth; field number 0
        is allowed inside; it ends with its own field's end tag, inside ``end``); return the position after it."""
        open_groups = [number]
        while True:
            if depth + len(open_groups) > MAX_DEPTH:
                raise self._malformed(f"groups nested deeper than {MAX_DEPTH} levels (protobuf's limit)", start)
            if pos >= end:
                raise self._malformed(f"group of field {open_groups[-1]} not closed before its message ends", start)
            self._count(1)
            field_start = pos
            tag, pos = self._varint(pos, end, 5, "field tag")
            wire_type = tag & 7
            if tag > _MAX_TAG or wire_type > _I32:
                raise self._malformed(f"invalid field tag {tag} inside a group", field_start)
            if wire_type == _VARINT:
                pos = self._varint(pos, end, 10, f"field {tag >> 3} value")[1]
            elif wire_type == _LEN:
                size, pos = self._varint(pos, end, 5, f"field {tag >> 3} length")
                pos += size
            elif wire_type in (_I32, _I64):
                pos += 4 if wire_type == _I32 else 8
            elif wire_type == _SGROUP:
                open_groups.append(tag >> 3)
            elif open_groups.pop() != tag >> 3:
                raise self._malformed(f"end-group tag of field {tag >> 3} closes another field's group", field_start)
            elif not open_groups:
                return pos
            if pos > end:
                raise self._malformed(f"field {tag >> 3} runs past the end of its message", field_start)

    def _clean(self, pos: int, length: int) -> bool:
        """Whether the element in ``[pos, pos + length)`` fits the window and holds none of the bytes
        (:data:`_NEEDLES`) that can name a file: as an element of a repeated field it merges with nothing, so it
        is skipped whole. The window is searched once, from the first element not known clean to the next match."""
        if length > _SMALL:
            return False
        if pos < self._base or pos + length > self._limit:
            self._window(pos, length)
        if not self._searched <= pos <= self._needle:
            found = _NEEDLES.search(self._buffer, pos - self._base)
            self._searched, self._needle = pos, self._limit if found is None else self._base + found.start()
        return self._needle >= pos + length

    def _read(self, pos: int, length: int) -> bytes:
        """A string field's bytes, cut at :data:`PATH_LIMIT` (names in labels)."""
        length = min(length, PATH_LIMIT)
        first = self._window(pos, length)
        return bytes(self._buffer[first : first + length])

    def _set(self, name: str, *, path: bool = False) -> _Handler:
        """A handler setting the string attribute ``name`` of the state (the last occurrence wins, as in protobuf);
        ``path``: a value of :data:`PATH_LIMIT` bytes or more names no file and is not read (empty)."""

        def handle(state: Any, pos: int, length: int, _: int) -> None:
            setattr(state, name, b"" if path and length >= PATH_LIMIT else self._read(pos, length))

        return handle

    # ------------------------------------------------------------------------------------------------ messages

    def _each(self, counter: str, element: Callable[[Any, int], Any], message: _Handler) -> _Handler:
        """The handler of a repeated field's elements: each is numbered (the holder's ``counter``: its place), then
        skipped whole when clean (:meth:`_clean`: it merges with nothing), else ``element(holder, index)`` is read
        by ``message``."""

        def handle(holder: Any, pos: int, length: int, depth: int) -> None:
            index = getattr(holder, counter)
            setattr(holder, counter, index + 1)
            if not self._clean(pos, length):
                message(element(holder, index), pos, length, depth)

        return handle

    def _merged(self, slot: str, make: Callable[[Any], Any]) -> _Handler:
        """The handler of a singular message field: every occurrence is walked into one state (the holder's
        ``slot``, made by ``make`` at the first), as protobuf merges them; it is read when its holder ends."""

        def handle(holder: Any, pos: int, length: int, depth: int) -> None:
            state = getattr(holder, slot)
            if state is None:
                state = make(holder)
                setattr(holder, slot, state)
            self._walk(self._tables[type(state)], pos, length, depth, state)

        return handle

    def _walker(self, fields: dict[int, _Handler]) -> _Handler:
        return lambda state, pos, length, depth: self._walk(fields, pos, length, depth, state)

    def _node_message(self, node: _Node, pos: int, length: int, depth: int) -> None:
        parsed = self._parsed(proto.NodeProto, pos, length, depth)
        if isinstance(parsed, proto.NodeProto) and self._flat(pos, length, parsed.op_type == DELAYED_OP_TYPE):
            if parsed.domain != DELAYED_DOMAIN or parsed.op_type != DELAYED_OP_TYPE:
                return
            node.domain, node.op_type, node.name = _DOMAIN, _OP_TYPE, _raw(parsed.name)
            node.output = _raw(parsed.output[0]) if parsed.output else None
            node.filenames = [a.s for a in parsed.attribute if a.name == DELAYED_FILENAME and 0 < len(a.s) < PATH_LIMIT]
        else:
            self._walk(self._node, pos, length, depth, node)
        if node.domain == _DOMAIN and node.op_type == _OP_TYPE:
            for index, filename in enumerate(node.filenames):
                self._name(filename, (1, *node.place, index), node, "delayed_initializer")

    def _flat(self, pos: int, length: int, delayed: bool) -> bool:
        """Whether the node in the window at ``pos`` can name a file only by its own ``filename`` attributes: none
        of its bytes is ``location`` (no external tensor inside) and ``DelayedInitializer`` is there only as its
        own op type (no such node in a subgraph); else it is walked, for the places and labels of what it holds."""
        first = pos - self._base
        last = first + length
        buffer = self._buffer
        return buffer.find(b"location", first, last) < 0 and buffer.count(_OP_TYPE, first, last) == delayed

    def _output(self, node: _Node, pos: int, length: int, _: int) -> None:
        if node.output is None:  # the label is the first output
            node.output = self._read(pos, length)

    def _attribute_message(self, attribute: _Attribute, pos: int, length: int, depth: int) -> None:
        self._walk(self._attribute, pos, length, depth, attribute)
        if attribute.t is not None:
            self._tensor_named(attribute.t)
        if attribute.sparse is not None:
            self._sparse_named(attribute.sparse)
        if attribute.node is not None and attribute.name == _FILENAME and attribute.s:
            attribute.node.filenames.append(attribute.s)

    def _sparse_message(self, sparse: _Sparse, pos: int, length: int, depth: int) -> None:
        self._walk(self._sparse, pos, length, depth, sparse)
        self._sparse_named(sparse)

    def _sparse_named(self, sparse: _Sparse) -> None:
        for tensor in (sparse.values, sparse.indices):
            if tensor is not None:
                self._tensor_named(tensor)

    def _tensor_message(self, tensor: _Tensor, pos: int, length: int, depth: int) -> None:
        parsed = self._parsed(proto.TensorProto, pos, length, depth)
        if isinstance(parsed, proto.TensorProto):
            tensor.name, tensor.external = _raw(parsed.name), parsed.data_location == proto.TensorProto.EXTERNAL
            for entry in parsed.external_data:
                value = _raw(entry.value, PATH_LIMIT + 1)
                if entry.key == "location" and 0 < len(value) < PATH_LIMIT:
                    tensor.locations.append(value)
        else:
            self._walk(self._tensor, pos, length, depth, tensor)
        self._tensor_named(tensor)

    def _parsed(self, kind: type[proto.NodeProto | proto.TensorProto], pos: int, length: int, depth: int) -> object:
        """A node or tensor no longer than the window (and already in it: it held a needle) in a message at
        ``depth``, parsed by protobuf: one call in C instead of a walk of its fields here, exactly protobuf's answer
        (merges, enums, text). None for a longer one, one whose fields would be deeper than the walk goes (the walk
        says so), or one protobuf refuses (the walk then says where it is broken, or reads what it can)."""
        if length > _SMALL or depth + 2 > MAX_DEPTH:
            return None
        self._count(1 + length // 1024)
        first = self._window(pos, length)
        message = kind()
        try:
            message.ParseFromString(memoryview(self._buffer)[first : first + length])
        except DecodeError:
            return None
        return message

    def _data_location(self, tensor: _Tensor, value: int, _: int, __: int) -> None:
        value &= 0xFFFFFFFF  # an int32 enum; a closed one: a value it does not know leaves the field as it was
        if value in (proto.TensorProto.DEFAULT, proto.TensorProto.EXTERNAL):
            tensor.external = value == proto.TensorProto.EXTERNAL

    def _external_data(self, tensor: _Tensor, pos: int, length: int, depth: int) -> None:
        if self._clean(pos, length):
            return
        entry = _Entry()
        self._walk(self._entry, pos, length, depth, entry)
        if entry.key == b"location" and entry.value:
            tensor.locations.append(entry.value)

    # ---------------------------------------------------------------------------------------------- the answer

    def _tensor_named(self, tensor: _Tensor) -> None:
        if tensor.external:
            for index, location in enumerate(dict.fromkeys(tensor.locations)):  # each name once per tensor
                self._name(location, (0, *tensor.place, index), tensor, "external_data")

    def _name(self, raw: bytes, order: tuple[int, ...], held: _Tensor | _Node, via: Via) -> None:
        found = self._found.get(raw)
        if found is None:
            self._found[raw] = [order, held, via, 1]
            return
        found[3] += 1
        if order < found[0]:
            found[:3] = [order, held, via]
