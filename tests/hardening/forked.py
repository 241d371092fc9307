"""A writer run in a forked child process, for the tests that kill writers or race them against each other.

A child started with ``python _crash_child.py`` spent about a second importing onnx and numpy before it wrote a
byte: most of the crash and concurrency tests' time. A fork of the test process has them already, and the call
(built in the parent: a model of 64 MiB is generated once, not per child) starts at once. It is still a process of
its own (its own pid, files and memory): SIGKILL ends it at whatever system call it is in, exactly as it would an
exec'd child, and it is reaped before :meth:`ForkedCall.kill` or :meth:`ForkedCall.finish` returns, so its pid is
dead for the publisher's sweep of stale temp files. The child never returns into pytest: it ends with ``os._exit``.
``tests/hardening/test_publish_kill_points.py`` forks its writers the same way.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable

__all__ = ["ForkedCall", "hook_every_publication"]

_POLL_SECONDS = 0.002


class ForkedCall:
    """``call()`` in a forked child: it reports ``ready`` just before the call and ``done <result>`` after it."""

    def __init__(self, call: Callable[[], object]) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            status = 1
            try:
                os.close(read_end)
                os.write(write_end, b"ready\n")
                result = call()
                os.write(write_end, f"done {result}\n".encode())
                status = 0
            except BaseException:
                os.write(write_end, f"error {traceback.format_exc()}".encode())
            finally:
                os._exit(status)
        os.close(write_end)
        self.pid = pid
        self._pipe = os.fdopen(read_end, "rb")
        self._ready_read = False
        self.status: int | None = None

    def wait_ready(self) -> None:
        """Block until the child is about to call (fails with what it said if it ended first)."""
        line = self._pipe.readline()
        self._ready_read = True
        if line != b"ready\n":
            self.kill()
            raise AssertionError(f"the child did not start: {line!r}")

    def kill(self) -> None:
        """SIGKILL the child (if still running) and reap it."""
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)
        self._pipe.close()

    def finish(self, timeout: float) -> str:
        """Wait for the child to end by itself; return its ``done ...`` line (fails with its traceback otherwise)."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
                break
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the child did not finish within {timeout} s")
            time.sleep(_POLL_SECONDS)
        said = self._pipe.read().decode(errors="replace")
        self._pipe.close()
        if not self._ready_read:
            said = said.removeprefix("ready\n")
        assert os.waitstatus_to_exitcode(status) == 0 and said.startswith("done"), said
        return said.strip()


def hook_every_publication(hook: Callable[[str], None]) -> None:
    """In a forked child: ``hook(name)`` runs before each system call of every publication from now on (every writer
    publishes through :meth:`OutputTransaction.publish <onnx_light_ref.io._write.publish.OutputTransaction.publish>`,
    one model or a family); the child ends with ``os._exit``, so the patch is never undone."""
    from onnx_light_ref.io._write import publish

    real_publish = publish.OutputTransaction.publish

    def counted_publish(self: publish.OutputTransaction, *args: object, **kwargs: object) -> object:
        publish.before_syscall = hook
        try:
            return real_publish(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            publish.before_syscall = None

    publish.OutputTransaction.publish = counted_publish  # type: ignore[method-assign]
