"""Read a ``.onnx`` file's metadata (never its external weights) and serialize a model for publication.

A ``.onnx`` is always parsed as binary protobuf, whatever its name: onnx picks a text parser for names ending in
``.json``, ``.textproto``, ``.onnxtxt`` or ``.txt``, and that parser's errors are not ours to leak. Every string field
of a parsed model must be UTF-8 (:func:`check_model_strings`): protobuf hands back ``bytes`` for one that is not, and
code expecting ``str`` (onnx's helpers among them) would fail with a ``TypeError`` or ``UnicodeDecodeError`` far
from the cause.

This module never reads external weights and never writes a file: publication is
:mod:`onnx_light_ref.io._write.publish`'s.
"""

from __future__ import annotations

import errno
import functools
import importlib
import os
import stat
from typing import TYPE_CHECKING, Any

from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._read.folder import ModelFolder, describe_file_type, descriptor_limit_error, open_model_file
from onnx_light_ref.io._read.proto import ModelProto

if TYPE_CHECKING:
    import onnx

_Buffer = bytes | bytearray | memoryview

PROTOBUF_LIMIT = 2**31 - 1
"""Largest message protobuf parses: a ``.onnx`` file above it cannot be loaded whole by anyone."""

# protobuf ships no type stubs (types-protobuf is not a dependency): looked up by name, so that mypy needs none.
_DecodeError: type[Exception] = importlib.import_module("google.protobuf.message").DecodeError
_FieldDescriptor: Any = importlib.import_module("google.protobuf.descriptor").FieldDescriptor

# Per message type: its string fields and its message fields, each as (name, repeated). Built once per type, so the
# walk touches only fields that can hold a string (never raw_data nor the typed value arrays).
_FIELDS: dict[str, tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, bool], ...]]] = {}
# A model larger than this is checked by the Python walk only: the strict parse would hold a second copy of it.
_STRICT_PARSE_LIMIT = 64 * 1024 * 1024
# A model in memory with fewer main-graph initializers and nodes than this is checked by the Python walk only: the
# strict parse would serialize it first (a shared save's 8 MiB of new inline bytes: 30 ms, the walk: under 1 ms).
_STRICT_PARSE_MIN_ITEMS = 1024


def not_a_model_file(path: str, st: os.stat_result, otherwise: str) -> str:
    """The message for a model path that exists but is not a regular file: what it is ("is a directory" for a
    folder, a user who named the folder instead of the model; "is a FIFO (named pipe)", "is a character device"
    such as ``/dev/zero``...: never opened, see :func:`~onnx_light_ref.io._read.folder.open_model_file`), and
    ``otherwise`` for a kind without a name."""
    if stat.S_ISDIR(st.st_mode):
        return f"ONNX model path {path!r} is a directory, not a model file"
    kind = describe_file_type(st)
    if kind.startswith("a special file"):
        return otherwise
    return f"ONNX model path {path!r} is {kind}, not a regular file: not a model file (it was not opened)"


def _is_repeated(field: Any) -> bool:
    """protobuf >= 6 has ``is_repeated`` and dropped ``label``; older releases have only ``label``."""
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == _FieldDescriptor.LABEL_REPEATED)


def _fields_of(descriptor: Any) -> tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, bool], ...]]:
    cached = _FIELDS.get(descriptor.full_name)
    if cached is None:
        strings, messages = [], []
        for field in descriptor.fields:
            repeated = _is_repeated(field)
            if field.type == _FieldDescriptor.TYPE_STRING:
                strings.append((field.name, repeated))
            elif field.type == _FieldDescriptor.TYPE_MESSAGE:
                messages.append((field.name, repeated))
        cached = _FIELDS[descriptor.full_name] = (tuple(strings), tuple(messages))
    return cached


@functools.cache
def _strict_model_class() -> Any:
    """``ModelProto``'s schema rebuilt as proto3 in a private descriptor pool: protobuf's parsers refuse a proto3
    string that is not UTF-8 (onnx's proto2 schema hands it back as ``bytes``). None when this protobuf cannot build
    it, or does not refuse such a string (tried on one): the Python walk then does the whole check."""
    try:
        descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")
        descriptor_pool = importlib.import_module("google.protobuf.descriptor_pool")
        message_factory = importlib.import_module("google.protobuf.message_factory")
        schema = descriptor_pb2.FileDescriptorProto()
        ModelProto.DESCRIPTOR.file.CopyToProto(schema)
        schema.syntax = "proto3"
        messages = list(schema.message_type)
        while messages:  # proto3 has no default values (onnx's schema declares none)
            message = messages.pop()
            messages.extend(message.nested_type)
            for field in message.field:
                field.ClearField("default_value")
        pool = descriptor_pool.DescriptorPool()
        pool.Add(schema)
        strict = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{schema.package}.ModelProto"))
        valid = ModelProto(producer_name="a").SerializeToString()
        strict().ParseFromString(valid)
    except Exception:  # another protobuf: the Python walk checks every string
        return None
    try:
        strict().ParseFromString(valid.replace(b"a", b"\xff"))
    except _DecodeError:
        return strict
    return None  # accepted: this parser does not check UTF-8


def _strings_are_utf8(model: Any, data: _Buffer | None) -> bool:
    """True when every string of ``model`` is UTF-8, checked by :func:`_strict_model_class`'s parser; False when it
    refused the model (a string at fault, or anything else) or cannot check it: the Python walk decides then."""
    if data is None and len(model.graph.initializer) + len(model.graph.node) < _STRICT_PARSE_MIN_ITEMS:
        return False  # the walk takes a few ms; serializing a model in memory costs its inline bytes
    strict = _strict_model_class()
    if strict is None:
        return False
    size = len(data) if data is not None else model.ByteSize()
    if size > _STRICT_PARSE_LIMIT:
        return False
    try:
        strict().ParseFromString(data if data is not None else model.SerializeToString())
    except Exception:  # whatever the strict parse refuses, the walk names (or accepts)
        return False
    return True


def _first_non_utf8(message: Any, path: str) -> tuple[str, bytes] | None:
    strings, messages = _fields_of(message.DESCRIPTOR)
    for name, repeated in strings:
        if repeated:
            values = getattr(message, name)
            if values and bytes in map(type, values):  # protobuf's answer for a stored value that is not UTF-8
                index = [type(value) for value in values].index(bytes)
                return f"{path}.{name}[{index}]", values[index]
        else:
            value = getattr(message, name)
            if type(value) is bytes:
                return f"{path}.{name}", value
    for name, repeated in messages:
        if repeated:
            children = getattr(message, name)
            for index in range(len(children)):
                found = _first_non_utf8(children[index], "")
                if found is not None:  # the path is built only on the way back from a hit
                    return f"{path}.{name}[{index}]{found[0]}", found[1]
        elif message.HasField(name):
            found = _first_non_utf8(getattr(message, name), "")
            if found is not None:
                return f"{path}.{name}{found[0]}", found[1]
    return None


def check_model_strings(model: onnx.ModelProto, *, what: str = "the model", data: _Buffer | None = None) -> None:
    """Refuse a model with a string field that is not UTF-8 (a tensor name, a ``location``, a node name...).

    protobuf's C parser checks every string of a proto3 message: the model (or ``data``, its serialized bytes, when
    the caller has them) is parsed once more as :func:`_strict_model_class`, which fails on the first non-UTF-8
    string, in C. Only then (or for a model above :data:`_STRICT_PARSE_LIMIT`, whose second parse would cost its
    size in memory) are the fields walked in Python, to name the one at fault: a model of 100,000 tensors costs
    0.1 s instead of 1 s.

    Args:
        model: the parsed model.
        what: how to name the model in the message (e.g. its path).
        data: the bytes ``model`` was parsed from, if the caller holds them (spares serializing it again).

    Raises:
        InvalidModelError: naming the first such field (e.g. ``graph.initializer[3].name``) and its bytes.
    """
    if _strings_are_utf8(model, data):
        return
    found = _first_non_utf8(model, "model")
    if found is not None:
        field, value = found
        raise InvalidModelError(
            f"{what} is not a valid ONNX model: {field} is not valid UTF-8 ({value[:64]!r}); protobuf string fields "
            "must be UTF-8, and onnx and onnxruntime cannot use such a name."
        )


def open_model_folder(path: str, *, allow_outside_folder: bool = False) -> ModelFolder:
    """Open and hold the folder of the model file ``path``, before the model is parsed.

    Parse the model through it too (``folder=`` of :func:`load_model_metadata`): the ``.onnx`` and every file it
    names then come from one folder, whatever is renamed or swapped meanwhile.

    Raises:
        FileNotFoundError: the folder does not exist (reported as the model file not found).
        ExternalDataError: the folder cannot be opened.
    """
    try:
        return ModelFolder.open(os.path.dirname(os.path.abspath(path)), allow_outside_folder=allow_outside_folder)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"ONNX model file not found: {path!r} (its folder does not exist)") from exc


def load_model_metadata(path: str, *, check_strings: bool = True, folder: ModelFolder | None = None) -> onnx.ModelProto:
    """Parse ``path`` as binary protobuf with ``load_external_data=False``: no weight is read.

    The file is looked at before it is opened for reading (a FIFO, a device, a folder is refused saying what it is,
    and never opened: a writer blocked on the FIFO stays blocked) and its size checked before any byte is read:
    protobuf cannot parse a message over 2 GiB, so a larger file (a weights file given by mistake, a model with
    gigabytes of inline weights) is refused instead of being read whole into memory first.

    Args:
        path: the ``.onnx`` file (whatever its name ends with: always parsed as binary protobuf).
        check_strings: refuse a model with a non-UTF-8 string (:func:`check_model_strings`). Only a diagnostic
            reader that reports such strings per tensor itself (``inspect``) passes False; every writer keeps it.
        folder: the held folder of ``path`` (:func:`open_model_folder`): the file is opened relative to it.

    Returns:
        The parsed model, external tensors still EXTERNAL.

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a regular file (the message says what it is).
        OSError: ``EMFILE``/``ENFILE``: no descriptor left (the message says so).
        InvalidModelError: ``path`` cannot be opened (permissions...), is larger than protobuf's 2 GiB limit, cannot
            be parsed as a model, has no graph, or has a string that is not UTF-8.
    """
    path = os.fspath(path)
    try:
        fd = open_model_file(path, folder)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise FileNotFoundError(f"ONNX model file not found: {path!r}") from exc
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise descriptor_limit_error(exc.errno, f"ONNX model file {path!r}") from exc
        if exc.errno not in (errno.ELOOP, errno.ENAMETOOLONG, errno.ENXIO):
            # No raw OSError for a file a reader cannot open (permissions...): one typed error naming it.
            raise InvalidModelError(f"ONNX model file {path!r} cannot be opened: {exc.strerror or exc}.") from exc
        raise FileNotFoundError(f"ONNX model file not found: {path!r} ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(
                not_a_model_file(path, st, f"ONNX model file not found: {path!r} is not a regular file")
            )
        if st.st_size > PROTOBUF_LIMIT:
            raise InvalidModelError(
                f"{path!r} is {st.st_size} bytes, more than protobuf's 2 GiB limit: it cannot be parsed as one model "
                "(a weights file? a model with large inline tensors can be externalized first with "
                "'onnx-light-ref align --size-threshold', which never parses the payloads)."
            )
        data = bytearray(st.st_size)
        got = pread_exact(fd, memoryview(data), 0)
    finally:
        os.close(fd)
    if got != len(data):
        raise InvalidModelError(f"{path!r} shrank while it was read ({got} of {len(data)} bytes).")
    model = ModelProto()
    try:
        model.ParseFromString(memoryview(data))
    except (_DecodeError, RuntimeError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (cannot parse it: {exc}).") from exc
    if not model.HasField("graph"):
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (it has no graph; truncated or not ONNX?).")
    if check_strings:
        check_model_strings(model, what=repr(path), data=data)
    return model
