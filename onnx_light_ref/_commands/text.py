"""Text taken from a model, made safe to print on a terminal: the one escaping function every command uses.

A model is untrusted input: its tensor and node names, op types, domains and locations (and every error message that
quotes them) can carry ESC sequences (colours, cursor moves, OSC 52 clipboard writes), BEL, carriage returns, or
bidi overrides that reorder what the reader sees. :func:`printable` escapes each such character. ``inspect``,
``run``, ``verify`` and :func:`~onnx_light_ref._commands.errors.error_exit` print through it.

This module never prints and never decides what is shown: it only escapes.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every character a terminal could act on shown as a Python escape (``\\x1b``, ``\\u202e``).

    Non-printable characters (``str.isprintable``: controls such as ESC, BEL, CR, LF, format characters such as bidi
    overrides, line and paragraph separators, unassigned code points) would move the cursor, recolour or reorder the
    output; they are escaped. The result is printable, so escaping it again changes nothing.

    Args:
        text: any text taken from a model.

    Returns:
        The text, safe to print on one line.
    """
    if text.isprintable():
        return text
    return "".join(_escape(char) for char in text)


def _escape(char: str) -> str:
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
