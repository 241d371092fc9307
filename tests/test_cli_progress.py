"""The commands' progress bar on a real terminal (a pseudo-terminal): drawn at a sensible width when the terminal
reports 0 columns (issue 22), left to tqdm otherwise, never drawn when stderr is not a terminal."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios
from collections.abc import Iterator

import pytest

from onnx_light_ref._commands.progress import FALLBACK_COLUMNS, bar_columns, byte_progress


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal: (master, slave) descriptors, both closed afterwards."""
    master, slave = os.openpty()
    try:
        yield master, slave
    finally:
        os.close(master)
        os.close(slave)


def set_columns(fd: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))


def read_all(master: int) -> str:
    os.set_blocking(master, False)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def draw(monkeypatch: pytest.MonkeyPatch, slave: int) -> None:
    with os.fdopen(os.dup(slave), "w", buffering=1) as stream:
        monkeypatch.setattr(sys, "stderr", stream)
        with byte_progress("align", hidden=False) as progress:
            progress(0, 8 * 1024 * 1024)
            progress(8 * 1024 * 1024, 8 * 1024 * 1024)


def test_a_terminal_reporting_zero_columns_gets_the_fallback_width(terminal, monkeypatch) -> None:
    master, slave = terminal
    set_columns(slave, 0)
    with os.fdopen(os.dup(slave), "w") as stream:
        assert os.get_terminal_size(stream.fileno()).columns == 0
        assert bar_columns(stream) == FALLBACK_COLUMNS

    draw(monkeypatch, slave)

    shown = read_all(master)
    assert "align" in shown and "100%" in shown and "8.00M" in shown
    # The finished bar fills the fallback width (with 0 columns tqdm squeezed it to one cell: "100%|█| 8.00M...").
    finished = next(line for line in shown.replace("\r\n", "\r").split("\r") if "100%" in line)
    assert len(finished) == FALLBACK_COLUMNS
    assert "█" * 20 in finished


def test_a_terminal_with_columns_is_measured_by_tqdm(terminal, monkeypatch) -> None:
    master, slave = terminal
    set_columns(slave, 132)
    with os.fdopen(os.dup(slave), "w") as stream:
        assert bar_columns(stream) is None

    draw(monkeypatch, slave)

    assert "100%" in read_all(master)


def test_not_a_terminal_draws_nothing(tmp_path, monkeypatch) -> None:
    with open(tmp_path / "stderr.txt", "w") as stream:
        assert bar_columns(stream) is None
        monkeypatch.setattr(sys, "stderr", stream)
        with byte_progress("align", hidden=False) as progress:
            progress(10, 10)
    assert (tmp_path / "stderr.txt").read_text() == ""
