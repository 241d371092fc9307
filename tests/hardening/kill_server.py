"""Writers SIGKILLed at the k-th system call of their publication, forked from a lean process of their own.

``fork()`` copies the page tables of all the memory the forking process maps, and the child then pays a page fault for
each page it writes. A pytest worker maps 200-300 MB once it has collected the suite (onnx, onnxruntime, hypothesis,
every test module); forked from it, a kill point cost about three times what it costs forked from a process that
imported only the writers (one scenario of ``test_publish_kill_points``: 12 s against 4 s with 190 MB more mapped), and
``test_publish_kill_points`` and ``test_family_kill_points`` fork about 1,700 times. So each worker starts this module
once (``python -m tests.hardening.kill_server``, at its first kill point, ended when the worker exits) and sends it
each run as one line of JSON: the function (``module:name``, arguments that JSON holds: paths as strings), ``kill_at``,
``exchange`` and ``cleanup_fails``. The server forks a child that runs it with the publication seam
(``onnx_light_ref.io.write.publish.before_syscall``) counting the system calls of ``OutputTransaction._publish`` (which
``FamilyTransaction.publish_models`` shares) and SIGKILLs itself at the ``kill_at``-th, reaps it, and answers with one
line: ``{"killed": bool, "count": int | null, "error": traceback | null}``. The child is a process of its own exactly
as before (SIGKILL ends it at whatever system call it is in; it is reaped before the answer, so its pid is dead for the
publisher's sweep of stale temp files); only the process it is forked from changed.
"""

from __future__ import annotations

import atexit
import errno
import importlib
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import IO, Any

__all__ = ["in_child"]

ROOT = Path(__file__).resolve().parent.parent.parent


def _run_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """Fork, run the request's function in the child with the seam installed, reap the child; say how it ended."""
    from onnx_light_ref.errors import PublishedWithErrorsError
    from onnx_light_ref.io.write import publish

    module_name, _, function_name = request["function"].partition(":")
    function = getattr(importlib.import_module(module_name), function_name)  # imported here, not in each child
    kill_at: int | None = request["kill_at"]
    cleanup_fails: bool = request["cleanup_fails"]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the server loop
        status = 1
        try:
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # fd 1 is the server's answer pipe: nothing the writer prints may land there
            count = 0

            def hook(name: str) -> None:
                nonlocal count
                count += 1
                if count == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if cleanup_fails and name == "unlink":
                    raise OSError(errno.EIO, "unlink failed (injected)")

            real_publish = publish.OutputTransaction._publish

            def counted_publish(self: publish.OutputTransaction, *args: object, **kwargs: object) -> object:
                publish.before_syscall = hook
                try:
                    return real_publish(self, *args, **kwargs)  # type: ignore[arg-type]
                finally:
                    publish.before_syscall = None

            publish.OutputTransaction._publish = counted_publish  # type: ignore[method-assign]
            if not request["exchange"]:  # as on a kernel, libc or filesystem without renameat2(RENAME_EXCHANGE)
                publish._renameat2 = None
            try:
                function(*request["args"])
            except PublishedWithErrorsError:
                if not cleanup_fails:
                    raise
            os.write(write_end, json.dumps({"count": count}).encode())
            status = 0
        except BaseException:
            os.write(write_end, json.dumps({"error": traceback.format_exc()}).encode())
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read_end, "rb") as said:
            reported = json.loads(said.read() or b"{}")
    except BaseException:
        os.close(read_end)
        raise
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return {"killed": killed, "count": reported.get("count"), "error": reported.get("error"), "status": status}


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Answer each request line until the worker closes its end."""
    for line in requests:
        try:
            answer = _run_in_child(json.loads(line))
        except BaseException:
            answer = {"killed": False, "count": None, "error": traceback.format_exc(), "status": None}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


class _Server:
    """The worker's end: the server process, started at the first request, ended (EOF) when the worker exits."""

    _process: subprocess.Popen[str] | None = None

    @classmethod
    def ask(cls, request: dict[str, Any]) -> dict[str, Any]:
        process = cls._process
        if process is None or process.poll() is not None:
            process = cls._process = subprocess.Popen(
                [sys.executable, "-m", "tests.hardening.kill_server"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # answers carry the tracebacks; a stray write must not block
                text=True,
            )
            atexit.register(cls._stop, process)
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        assert line, f"the kill server ended (exit {process.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    @staticmethod
    def _stop(process: subprocess.Popen[str]) -> None:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def in_child(
    function: str, args: list[Any], kill_at: int | None, *, exchange: bool = True, cleanup_fails: bool = False
) -> int:
    """Run ``function(*args)`` (``"module:name"``) in a child of the kill server, SIGKILLed before the ``kill_at``-th
    system call of its publication (``None``: never).

    ``exchange=False``: as without ``renameat2(RENAME_EXCHANGE)``. ``cleanup_fails``: every ``unlink`` of the
    publication answers EIO instead (nothing is removed), and the ``PublishedWithErrorsError`` the writer then raises
    counts as the run's normal end.

    Returns how many such calls the child made when it was not killed, else -1.
    """
    request = {"function": function, "args": args, "kill_at": kill_at, "exchange": exchange}
    answer = _Server.ask({**request, "cleanup_fails": cleanup_fails})
    if kill_at is None:
        assert not answer["killed"] and answer["count"] is not None, f"the writer failed: {answer}"
        return int(answer["count"])
    assert answer["killed"], f"not killed at call {kill_at}: {answer}"
    return -1


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
