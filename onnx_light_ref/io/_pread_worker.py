"""One helper thread that runs a positional read while its caller does something else (usually another read).

``os.preadv`` releases the GIL, so two reads, one here and one in the caller, proceed at once: on a warm page cache
two cores copy, on a disk the device sees two requests. :func:`~onnx_light_ref.io._verify.verify_models` reads model
B's chunk here while it reads model A's. (Not the ``DelayedInitializer`` kernel's one large read: filling a new
array is bound by memory bandwidth and page faults, and two halves read at once measured no faster, slower on a
loaded machine.)

The caller owns every buffer and descriptor: :meth:`PreadWorker.start` hands one read over, :meth:`PreadWorker.result`
waits for it and returns what :func:`~onnx_light_ref.io._posix.pread_exact` returned, or raises what it raised (in the
caller's thread, when the caller asks for it: an error of a read nobody waits for is never raised). One read at a
time. :meth:`PreadWorker.close` (the end of a ``with`` block, also on an exception or Ctrl-C) waits for the read in
flight before returning, so a caller never closes a descriptor or drops a buffer the thread still uses. The thread is
started on the first read and is a daemon: a read stuck in the kernel never keeps the interpreter alive.

This module never opens, closes or allocates: it only reads into the caller's buffers, from the caller's descriptors.
"""

from __future__ import annotations

import threading
from types import TracebackType

from onnx_light_ref.io._posix import pread_exact

THREAD_NAME = "onnx-light-ref-pread"
"""The helper thread's name (tests and debuggers find it by it)."""


class PreadWorker:
    """A helper thread for one positional read at a time (module docstring); use as a context manager."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._request: tuple[int, memoryview, int] | None = None
        self._outcome: int | BaseException = 0
        self._busy = False  # a read was started and its result not taken yet
        self._done = False  # the read started last has finished (its outcome is in _outcome)
        self._closing = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PreadWorker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self, fd: int, view: memoryview, offset: int) -> None:
        """Begin ``pread_exact(fd, view, offset)`` in the thread; the caller must not touch ``view`` until
        :meth:`result` (or :meth:`close`) returns."""
        with self._lock:
            if self._busy or self._closing:
                raise RuntimeError("PreadWorker.start: a read is in flight or the worker is closed")
            self._request, self._busy, self._done = (fd, view, offset), True, False
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def result(self) -> int:
        """Wait for the read started last: the bytes it read, or what it raised (raised here).

        The wait is interruptible (Ctrl-C raises ``KeyboardInterrupt`` here); :meth:`close` then waits for the read.
        """
        with self._lock:
            while self._busy and not self._done:
                self._lock.wait()
            outcome, self._outcome, self._busy = self._outcome, 0, False
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self) -> None:
        """Drop a read not begun yet, wait for the one in flight (its outcome is dropped), stop the thread; later
        calls do nothing."""
        with self._lock:
            self._closing, self._request = True, None
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()  # kept until joined: a close interrupted here waits again when called again
            self._thread = None

    def _serve(self) -> None:
        while True:
            with self._lock:
                while self._request is None and not self._closing:
                    self._lock.wait()
                if self._request is None:
                    return
                (fd, view, offset), self._request = self._request, None
            outcome: int | BaseException
            try:
                outcome = pread_exact(fd, view, offset)
            except BaseException as exc:  # handed over to the caller's thread by result()
                outcome = exc
            with self._lock:
                self._outcome, self._done = outcome, True
                self._lock.notify_all()
