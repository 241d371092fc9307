"""Byte sizes on the command line (``4096``, ``64K``, ``4M``, ``1G``, ``64MiB``): the one parser every command uses.

:func:`parse_size` only parses. Whether a size is acceptable (a power of two, within a cap) is the library's check,
so that the command line and the Python API refuse the same values with the same words; :func:`alignment_argument`
and :func:`bounded_size` run that check while the command line is parsed, so a bad value is a usage error (exit
status 2, with the usage), as a malformed one is, and never reaches the command.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
# ASCII digits only (``\d`` takes Arabic-Indic, fullwidth... digits, which int() reads); used with fullmatch.
_PATTERN = re.compile(r"\s*([0-9]+)\s*([KMG]?)(?:i?B)?\s*", re.IGNORECASE)


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


def bounded_size(name: str, *, minimum: int = 0, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for a size the library bounds: a value out of range is a usage error (exit 2), like a
    malformed one, in the library's words (``max_shard_size must be >= 1, got 0.``).

    Args:
        name: the library parameter's name, as its message says it.
        minimum: the smallest value accepted.
        maximum: the largest value accepted (None: int64's).

    Returns:
        The ``type=`` function.
    """

    def convert(text: str) -> int:
        from onnx_light_ref.io._arguments import INT64_MAX, check_int  # the library's words; imported when used

        value = size_argument(text)
        try:
            return check_int(name, value, minimum=minimum, maximum=INT64_MAX if maximum is None else maximum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def alignment_argument(text: str) -> int:
    """An argparse ``type=`` for ``--alignment``: a size the library accepts as an alignment (0, 1 or a power of two
    up to 1 GiB), else a usage error (exit 2) in the library's words.

    Args:
        text: the argument as typed.

    Returns:
        The alignment in bytes, as given (0 and 1 both mean packed).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a size or not an alignment.
    """
    from onnx_light_ref.io._read.alignment import validate_alignment  # the library's check; imported when used

    value = size_argument(text)
    try:
        validate_alignment(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value
