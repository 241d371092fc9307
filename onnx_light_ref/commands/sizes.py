"""Byte sizes on the command line (``4096``, ``64K``, ``4M``, ``1G``, ``64MiB``): the one parser every command uses.

It only parses; whether a size is acceptable (a power of two, within a cap) is the library's check, so that the
command line and the Python API refuse the same values with the same words.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["parse_size", "size_argument"]

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_PATTERN = re.compile(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"4M"`` -> 4194304: a plain byte count or a K/M/G suffix (binary units; ``KiB``/``MB`` accepted too).

    Args:
        text: the argument as typed; surrounding spaces and the suffix's case do not matter.

    Returns:
        The size in bytes.

    Raises:
        ValueError: ``text`` is not a size; the message names it and the expected form.
    """
    match = _PATTERN.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid size {text!r}: expected bytes with an optional K/M/G suffix, e.g. 4096, 64K, 8M, 1G."
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def size_argument(text: str) -> int:
    """:func:`parse_size` as an argparse ``type=``: a bad size is a usage error (exit status 2), not a traceback.

    Args:
        text: the argument as typed.

    Returns:
        The size in bytes.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a size.
    """
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
