"""JSON text from an untrusted file, parsed strictly: UTF-8, no repeated key in any object, no runaway nesting.

Python's ``json`` keeps the last of two equal keys without a word and raises a bare ``RecursionError`` on deep
nesting; for a safetensors header or a name map either one means the file says two things, or is an attack.
:func:`loads_strict` turns both into a ``ValueError`` the caller words for its file. It never opens a file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence


class RepeatedKeyError(ValueError):
    """An object of the JSON text has the key ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"repeated key {key!r}")
        self.key = key


def loads_strict(text: bytes, *, parse_int: Callable[[str], object] | None = None) -> object:
    """Parse UTF-8 JSON bytes, refusing repeated keys and nesting too deep for Python's parser.

    Args:
        text: the bytes.
        parse_int: as for :func:`json.loads` (None: ``int``).

    Returns:
        The parsed value.

    Raises:
        RepeatedKeyError: an object repeats a key (a ``ValueError``).
        ValueError: not UTF-8, not JSON, or nested too deeply (the message says which).
    """
    try:
        return json.loads(text.decode("utf-8"), object_pairs_hook=_refuse_repeats, parse_int=parse_int)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _refuse_repeats(pairs: Sequence[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)  # built in C; a repeated key makes it shorter than the pairs (checked once per object)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKeyError(key)
            seen.add(key)
    return result
