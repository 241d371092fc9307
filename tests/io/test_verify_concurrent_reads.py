"""``verify_models`` reads chunks of 1 MiB or more from both models at once (B's in a helper thread): the same answer
as reading in turn, the same errors in the same order (A's first), errors raised in the thread reported by the
caller, and no thread, descriptor or read left behind after an error or Ctrl-C. Memory stays two chunk buffers."""

from __future__ import annotations

import errno
import os
import signal
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io import _pread_worker
from onnx_light_ref.io import _verify as verify_module
from onnx_light_ref.io._pread_worker import THREAD_NAME, PreadWorker
from onnx_light_ref.io._verify import verify_models
from tests.models import identity_model
from tests.verify_support import flip_byte, summary

MIB = 1024 * 1024
CHUNK = MIB  # the smallest chunk read concurrently: every chunk of the big tensors goes through the worker


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(43)
    return {
        "big0": rng.standard_normal(3 * MIB // 4).astype(np.float32),  # 3 chunks
        "small": rng.standard_normal(100).astype(np.float32),  # read in turn
        "big1": rng.standard_normal(5 * MIB // 8).astype(np.float32),  # 2.5 chunks: its last half chunk in turn
    }


TOTAL = sum(array.nbytes for array in arrays().values())


def one_file_per_tensor(folder: Path) -> Path:
    """The arrays saved by onnx's writer, each tensor in a data file named after it."""
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save_model(identity_model(arrays()), str(path), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0)  # fmt: skip
    return path


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return one_file_per_tensor(tmp_path / "a"), one_file_per_tensor(tmp_path / "b")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every read handed to the worker thread."""
    lengths: list[int] = []
    start = PreadWorker.start

    def counting(self: PreadWorker, fd: int, view: memoryview, offset: int) -> None:
        lengths.append(len(view))
        start(self, fd, view, offset)

    monkeypatch.setattr(PreadWorker, "start", counting)
    return lengths


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def worker_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


def in_turn(monkeypatch: pytest.MonkeyPatch, a: Path, b: Path) -> object:
    """The answer of the same comparison read one side after the other."""
    with monkeypatch.context() as patched:
        patched.setattr(verify_module, "_CONCURRENT_READ", 2**62)
        return summary(verify_models(a, b, chunk_size=CHUNK, max_differences=0))


def test_equal_models_compare_equal_with_every_full_chunk_read_at_once(pair, started):
    a, b = pair
    before = open_descriptors()

    result = verify_models(a, b, chunk_size=CHUNK)

    assert result.equal and result.tensors == 3 and result.bytes_compared == TOTAL
    assert started == [CHUNK] * 5  # big0: 3 chunks; big1: 2 (its last half chunk and `small` are read in turn)
    assert worker_threads() == [] and open_descriptors() == before


@pytest.mark.parametrize(("name", "at"), [("big0", 0), ("big0", CHUNK + 12345), ("big1", 2 * CHUNK + 7)])
def test_a_byte_difference_is_found_at_the_same_place_as_when_read_in_turn(pair, started, monkeypatch, name, at):
    a, b = pair
    flip_byte(b.parent / name, at)

    result = verify_models(a, b, chunk_size=CHUNK, max_differences=0)

    assert result.first_difference is not None
    assert f"bytes differ at offset {at} of" in result.first_difference and repr(name) in result.first_difference
    assert summary(result) == in_turn(monkeypatch, a, b)
    assert started  # the concurrent path ran


def test_bs_file_shortened_while_compared_is_reported_from_the_thread(pair):
    a, b = pair
    data = b.parent / "big1"

    def shorten(done: int, total: int) -> None:
        if done == arrays()["big0"].nbytes:  # big0 compared: cut B's big1 before its first chunk is read
            os.truncate(data, CHUNK // 2)

    with pytest.raises(ExternalDataError) as caught:
        verify_models(a, b, chunk_size=CHUNK, progress=shorten)

    assert str(caught.value) == (
        f"model B ({str(b)!r}): external data file 'big1' ended at byte {CHUNK // 2} while reading {CHUNK} bytes at "
        "offset 0; it was shortened after it was validated."
    )
    assert worker_threads() == []


def test_an_io_error_in_the_thread_is_raised_by_verify(pair, monkeypatch):
    a, b = pair
    before = open_descriptors()

    def failing(fd: int, view: memoryview, offset: int) -> int:
        raise OSError(errno.EIO, "Input/output error (injected)")

    monkeypatch.setattr(_pread_worker, "pread_exact", failing)
    with pytest.raises(OSError) as caught:
        verify_models(a, b, chunk_size=CHUNK)

    assert caught.value.errno == errno.EIO and "injected" in str(caught.value)
    assert worker_threads() == [] and open_descriptors() == before


def test_as_error_is_raised_first_when_both_sides_fail_as_when_read_in_turn(pair):
    a, b = pair

    def break_both(done: int, total: int) -> None:
        if done == arrays()["big0"].nbytes:
            os.truncate(a.parent / "big1", 10)  # A's next read comes short
            os.remove(b.parent / "big1")  # B's next file cannot be opened

    with pytest.raises(ExternalDataError, match=r"^model A .*'big1' ended at byte 10 while reading"):
        verify_models(a, b, chunk_size=CHUNK, progress=break_both)


def test_bs_file_gone_is_reported_once_as_chunk_is_read(pair):
    a, b = pair

    def remove(done: int, total: int) -> None:
        if done == arrays()["big0"].nbytes:
            os.remove(b.parent / "big1")

    with pytest.raises(FileNotFoundError):
        verify_models(a, b, chunk_size=CHUNK, progress=remove)
    assert worker_threads() == []


def test_ctrl_c_while_b_is_read_in_the_thread_waits_for_that_read_then_propagates(pair, monkeypatch):
    """The main thread is interrupted while the worker reads into B's buffer: verify must not return (and close B's
    descriptor) before that read ended."""
    a, b = pair
    before = open_descriptors()
    in_thread, finished = threading.Event(), threading.Event()

    def slow_b(fd: int, view: memoryview, offset: int) -> int:
        in_thread.set()
        threading.Event().wait(0.05)  # still reading when the caller is interrupted
        got = os.preadv(fd, [view], offset)
        finished.set()
        return got

    def interrupted_a(fd: int, view: memoryview, offset: int) -> int:
        in_thread.wait(10)
        raise KeyboardInterrupt

    monkeypatch.setattr(_pread_worker, "pread_exact", slow_b)
    monkeypatch.setattr(verify_module, "pread_exact", interrupted_a)
    with pytest.raises(KeyboardInterrupt):
        verify_models(a, b, chunk_size=CHUNK)

    assert finished.is_set()
    assert worker_threads() == [] and open_descriptors() == before


def test_a_real_sigint_during_a_concurrent_read_raises_keyboard_interrupt_and_leaves_nothing(pair, monkeypatch):
    a, b = pair
    before = open_descriptors()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the runner installed: restored

    def sigint_then_read(fd: int, view: memoryview, offset: int) -> int:
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread, waiting for this read or reading A
        return os.preadv(fd, [view], offset)

    monkeypatch.setattr(_pread_worker, "pread_exact", sigint_then_read)
    try:
        with pytest.raises(KeyboardInterrupt):
            verify_models(a, b, chunk_size=CHUNK)
    finally:
        signal.signal(signal.SIGINT, previous)

    assert worker_threads() == [] and open_descriptors() == before


def test_memory_stays_two_chunk_buffers_as_when_read_in_turn(pair, monkeypatch):
    a, b = pair

    def peak_of_verify() -> int:
        tracemalloc.start()
        try:
            assert verify_models(a, b, chunk_size=CHUNK).equal
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    concurrent = peak_of_verify()
    with monkeypatch.context() as patched:
        patched.setattr(verify_module, "_CONCURRENT_READ", 2**62)
        in_turn_peak = peak_of_verify()

    assert concurrent <= in_turn_peak + 64 * 1024, (concurrent, in_turn_peak)
    assert 2 * CHUNK <= concurrent < 4 * CHUNK, concurrent  # two chunk buffers, the protos, the comparison scratch
