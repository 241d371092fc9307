"""The byte progress bar of every command that moves weights (``align``, ``verify``, the demo's steps...).

One tqdm bar on stderr, by default shown only on a terminal, fed by the library's ``progress(done_bytes,
total_bytes)`` callback. A terminal that reports 0 columns (some CI consoles, serial lines, ``stty cols 0``) would make
tqdm draw nothing; the bar then falls back to :data:`FALLBACK_COLUMNS`. This module never prints to stdout: summaries
are the command's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

FALLBACK_COLUMNS = 80
"""The bar's width when the terminal reports a width of 0 columns."""


def bar_columns(stream: TextIO) -> int | None:
    """The width to give the bar on ``stream``: None (tqdm measures the terminal itself) unless it reports 0 columns.

    Args:
        stream: where the bar is drawn (stderr).

    Returns:
        :data:`FALLBACK_COLUMNS` when ``stream`` is a terminal reporting 0 columns, otherwise None.
    """
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):  # not a terminal, closed, or not a real file: tqdm decides
        return None
    return FALLBACK_COLUMNS if columns <= 0 else None


@contextlib.contextmanager
def byte_progress(
    desc: str, *, hidden: bool, terminal_only: bool = True, leave: bool = True
) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``progress(done, total)`` callback drawing a bar named ``desc``; the bar is closed on exit.

    Args:
        desc: the bar's label, usually the command's name.
        hidden: never show the bar (``--no-progress``).
        terminal_only: when not hidden, show the bar only if stderr is a terminal (default); ``False``: always.
        leave: keep the finished bar on screen (default); ``False``: erase it when closed.

    Yields:
        The callback to hand to the library's ``progress`` parameter.
    """
    if hidden or (terminal_only and not _is_terminal(sys.stderr)):  # no bar: tqdm (50 ms to import) is not needed
        yield _no_progress
        return
    from tqdm import tqdm

    bar = tqdm(
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=False,
        leave=leave,
        file=sys.stderr,
        ncols=bar_columns(sys.stderr),
    )

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()


def _no_progress(done: int, total: int) -> None:
    """The callback when no bar is drawn."""


def _is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (as tqdm's ``disable=None`` asks); one without ``isatty``, or closed, is not."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
