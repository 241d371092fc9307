"""The byte progress bar of every command that moves weights (``align``, ``verify``, ``undelay``...).

One tqdm bar on stderr, shown only on a terminal unless disabled, fed by the library's
``progress(done_bytes, total_bytes)`` callback. This module never prints to stdout: summaries are the command's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from tqdm import tqdm

__all__ = ["byte_progress"]


@contextlib.contextmanager
def byte_progress(desc: str, *, hidden: bool) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``progress(done, total)`` callback drawing a bar named ``desc``; the bar is closed on exit.

    Args:
        desc: the bar's label, usually the command's name.
        hidden: never show the bar (``--no-progress``); otherwise it is shown when stderr is a terminal.
    """
    bar = tqdm(
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=True if hidden else None,  # None: shown on a terminal only
        file=sys.stderr,
    )

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()
