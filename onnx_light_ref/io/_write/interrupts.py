"""SIGINT and SIGTERM deferred across the steps that change a destination and their record.

A signal handler runs between any two bytecodes of the main thread; one that raises (the command line's, Python's
default ``KeyboardInterrupt``) could land between a rename and the line that records it, and the rollback would then
undo the weights under a model already published. :func:`deferred_interrupts` replaces the handlers of both signals,
for the block, by one that only records the signal; when the outermost block ends, the previous handlers are back
and each recorded signal is raised again, so it acts exactly where the outcome is whole: before the first move
(everything this run created is removed on the way out) or after the last step (the new outputs stand).

A handler set to ignore the signal is left alone, and so is a thread other than the main one (Python runs signal
handlers in the main thread only: nothing can interrupt the others). SIGKILL cannot be deferred: the order of the
moves is what keeps a killed run consistent (:mod:`~onnx_light_ref.io._write.publish`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_DEFERRED = (signal.SIGINT, signal.SIGTERM)

_state = threading.local()  # depth of nested blocks, handlers saved by the outermost, signals recorded


def _record(signum: int, frame: FrameType | None) -> None:
    _state.pending.append(signum)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Record SIGINT and SIGTERM for the block; raise each again (once) when the outermost block ends.

    Example:
        >>> from onnx_light_ref.io._write.interrupts import deferred_interrupts
        >>> with deferred_interrupts():
        ...     pass  # a rename and its record: no signal handler runs between them
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    depth = getattr(_state, "depth", 0)
    if depth == 0:
        _state.pending = []
        _state.saved = {}
        for signum in _DEFERRED:
            previous = signal.getsignal(signum)
            if previous is not signal.SIG_IGN and previous is not None:
                _state.saved[signum] = previous
                signal.signal(signum, _record)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth
        if depth == 0:
            for signum, previous in _state.saved.items():
                signal.signal(signum, previous)
            pending, _state.pending = list(dict.fromkeys(_state.pending)), []
            for signum in pending:
                signal.raise_signal(signum)  # the restored handler acts on it now
