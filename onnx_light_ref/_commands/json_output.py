"""The one JSON writer of ``--json``: a document on stdout that is valid, pure ASCII and round-trips hostile text.

``inspect --json`` and ``verify --json`` build a plain document (dicts, lists, ints, bools, None, and text as the
model or the filesystem gave it) and hand it to :func:`write_document`. Text is what needs care: a model's names
and locations are hostile input (terminal escapes, bidi overrides, bytes that are not UTF-8) and file names may not
be UTF-8 either. The rule, documented in ``docs/json.md``:

- text that is valid Unicode is a JSON string holding exactly that text. The document is written with
  ``ensure_ascii=True``, so every control character, every bidi override and every non-ASCII character is a
  ``\\uXXXX`` escape: the bytes on stdout are printable ASCII, safe on a terminal, and ``json.loads`` gives back the
  exact text;
- text that is not (a proto string protobuf hands back as ``bytes``, a file name that Python decoded with
  ``surrogateescape``) is an object ``{"hex": "<its bytes in lowercase hex>", "display": "<escaped form>"}``: the
  bytes round-trip through ``hex``; ``display`` is the backslash-escaped form the text output shows. A JSON string
  never holds a lone surrogate, which strict parsers refuse.

This module never decides what a document holds, never reads a model, and writes nothing but the document (and,
through :func:`error_document`'s caller, the usual ``error:`` line).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from onnx_light_ref.schemas import SCHEMA_VERSIONS


def encode_text(value: str | bytes) -> str | dict[str, str]:
    """``value`` as the documents hold text: a string when it is valid Unicode, else ``{"hex", "display"}``.

    Args:
        value: a ``str`` (possibly holding ``surrogateescape`` code points from a non-UTF-8 file name) or the
            ``bytes`` protobuf returns for a string field that is not UTF-8.

    Returns:
        The JSON value.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: surrogateescape'd bytes, or garbage
            raw = value.encode("utf-8", errors="surrogateescape" if _escaped_only(value) else "surrogatepass")
        else:
            return value
    else:
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"hex": raw.hex(), "display": raw.decode("utf-8", errors="backslashreplace")}


def _escaped_only(text: str) -> bool:
    """True when every surrogate in ``text`` is one ``surrogateescape`` makes (U+DC80..U+DCFF: one raw byte each)."""
    return all(not 0xD800 <= ord(char) <= 0xDFFF or 0xDC80 <= ord(char) <= 0xDCFF for char in text)


def to_json_value(value: Any) -> Any:
    """``value`` with every ``str`` and ``bytes`` inside passed through :func:`encode_text`, tuples as lists.

    Args:
        value: a document: dicts with ``str`` keys, lists, tuples, text, ints, floats, bools and None.

    Returns:
        The same document, ready for ``json.dumps``.

    Raises:
        TypeError: a value of another type (a bug in the caller: documents are built from plain values).
    """
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (str, bytes)):
        return encode_text(value)
    if isinstance(value, Mapping):
        return {str(key): to_json_value(item) for key, item in value.items()}
    if isinstance(value, Sequence):
        return [to_json_value(item) for item in value]
    raise TypeError(f"cannot write a {type(value).__name__} in a JSON document: {value!r}")


def write_document(document: Mapping[str, Any]) -> None:
    """Write ``document`` on stdout as one JSON document (indented, ASCII only), followed by a newline."""
    sys.stdout.write(json.dumps(to_json_value(document), ensure_ascii=True, indent=2, allow_nan=False) + "\n")


def error_document(command: str, error: BaseException) -> dict[str, Any]:
    """The document a command writes instead of its report when it cannot run (the model is unreadable...).

    Args:
        command: ``"inspect"`` or ``"verify"``.
        error: the exception the command caught; its class name and message are written.

    Returns:
        ``{"schema_version", "command", "kind": "error", "ok": false, "error": {"type", "message"}}``.
    """
    return {
        "schema_version": SCHEMA_VERSIONS[command],
        "command": command,
        "kind": "error",
        "ok": False,
        "error": {"type": type(error).__name__, "message": str(error)},
    }
