"""The byte progress bar of every command that moves weights (``align``, ``verify``, the demo's steps...).

One tqdm bar on stderr, by default shown only on a terminal, fed by the library's ``progress(done_bytes,
total_bytes)`` callback. This module never prints to stdout: summaries are the command's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from tqdm import tqdm

__all__ = ["byte_progress"]


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
    bar = tqdm(
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=True if hidden else (None if terminal_only else False),  # None: tqdm checks for a terminal
        leave=leave,
        file=sys.stderr,
    )

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()
