"""``PreadWorker``: one read in a helper thread while the caller reads elsewhere; its errors come back to the caller,
and closing (also after an error or Ctrl-C) waits for the read in flight, so no descriptor is closed under it."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from onnx_light_ref.io import _pread_worker
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._pread_worker import THREAD_NAME, PreadWorker


def worker_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, bytes]:
    payload = bytes(range(256)) * 64  # 16 KiB
    path = tmp_path / "data.bin"
    path.write_bytes(payload)
    return path, payload


def test_a_read_in_the_thread_fills_the_callers_buffer_while_the_caller_reads(data):
    path, payload = data
    fd = os.open(path, os.O_RDONLY)
    try:
        first, second = bytearray(8192), bytearray(8192)
        with PreadWorker() as worker:
            assert worker_threads() == []  # started by the first read only
            worker.start(fd, memoryview(second), 8192)
            assert pread_exact(fd, memoryview(first), 0) == 8192
            assert worker.result() == 8192
            worker.start(fd, memoryview(second), 16384 - 100)  # the end of the file: a short read, reported
            assert worker.result() == 100
        assert bytes(first) + bytes(second[:100]) == payload[:8192] + payload[-100:]
        assert worker_threads() == []
    finally:
        os.close(fd)


def test_an_error_in_the_thread_is_raised_by_result_in_the_callers_thread_and_the_worker_goes_on(data):
    path, payload = data
    fd = os.open(path, os.O_RDONLY)
    bad_fd = os.open(path, os.O_RDONLY)
    os.close(bad_fd)  # a closed descriptor (not reused by fd): EBADF in the thread
    try:
        buffer = bytearray(10)
        with PreadWorker() as worker:
            worker.start(bad_fd, memoryview(buffer), 0)
            with pytest.raises(OSError) as caught:
                worker.result()
            assert caught.value.errno == errno.EBADF
            worker.start(fd, memoryview(buffer), 5)
            assert worker.result() == 10
        assert bytes(buffer) == payload[5:15]
    finally:
        os.close(fd)


def test_an_error_nobody_waits_for_is_not_raised(monkeypatch):
    def failing(fd: int, view: memoryview, offset: int) -> int:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(_pread_worker, "pread_exact", failing)
    with PreadWorker() as worker:
        worker.start(0, memoryview(bytearray(1)), 0)
    assert worker_threads() == []


def test_close_waits_for_the_read_in_flight(data, monkeypatch):
    path, _ = data
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow(fd: int, view: memoryview, offset: int) -> int:
        started.set()
        release.wait(10)
        got = pread_exact(fd, view, offset)
        finished.set()
        return got

    monkeypatch.setattr(_pread_worker, "pread_exact", slow)
    fd = os.open(path, os.O_RDONLY)
    try:
        worker = PreadWorker()
        worker.start(fd, memoryview(bytearray(16)), 0)
        started.wait(10)
        timer = threading.Timer(0.05, release.set)
        timer.start()
        worker.close()  # the caller gave up (an error, Ctrl-C): it must still wait before closing fd
        assert finished.is_set()
        assert worker_threads() == []
        timer.join()
    finally:
        os.close(fd)


def test_a_second_read_before_the_first_result_and_a_read_after_close_are_refused(data):
    path, _ = data
    fd = os.open(path, os.O_RDONLY)
    try:
        worker = PreadWorker()
        worker.start(fd, memoryview(bytearray(4)), 0)
        with pytest.raises(RuntimeError, match="a read is in flight or the worker is closed"):
            worker.start(fd, memoryview(bytearray(4)), 0)
        assert worker.result() == 4
        worker.close()
        worker.close()  # idempotent
        with pytest.raises(RuntimeError, match="a read is in flight or the worker is closed"):
            worker.start(fd, memoryview(bytearray(4)), 0)
    finally:
        os.close(fd)


def test_a_second_read_is_refused_even_when_the_first_has_finished(data, monkeypatch):
    """The result of a finished read is still the caller's to take: a new read before it is refused (it was accepted
    when the thread had finished first, a race that failed the test above under load)."""
    path, _ = data
    finished = threading.Event()

    def read_then_signal(fd: int, view: memoryview, offset: int) -> int:
        got = pread_exact(fd, view, offset)
        finished.set()
        return got

    monkeypatch.setattr(_pread_worker, "pread_exact", read_then_signal)
    fd = os.open(path, os.O_RDONLY)
    try:
        with PreadWorker() as worker:
            worker.start(fd, memoryview(bytearray(4)), 0)
            assert finished.wait(10)
            while worker_threads() and not worker._done:  # the thread records its outcome right after the read
                threading.Event().wait(0.001)
            with pytest.raises(RuntimeError, match="a read is in flight or the worker is closed"):
                worker.start(fd, memoryview(bytearray(4)), 0)
            assert worker.result() == 4
            worker.start(fd, memoryview(bytearray(4)), 4)  # once taken, the next read is accepted
            assert worker.result() == 4
    finally:
        os.close(fd)
