"""Look before opening, and one outcome per name, in every opener and mode (issue 26, section 5).

The opener opened a name ``O_RDONLY|O_NONBLOCK`` and only then ``fstat``-ed it: a process blocked writing into a
FIFO of the model's folder was released by evaluator construction, and a device node would have been opened.
``w.bin/``, ``w.bin/.``, ``w.bin//`` were refused by ``openat2`` and opened by the walk; an absolute
``<folder>/w.bin/`` was read when confined and refused with ``allow_outside_folder=True``; a name longer than
PATH_MAX was refused by one opener and opened by the other; ``<folder>/../<folder>/w.bin`` and ``<folder>`` itself
were "outside the model's folder". Here each name gets one answer, and every open of a FIFO or a device is an
``O_PATH`` look (recorded from the audit hook for ``os.open`` and from the ``openat2`` call's flags).
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._read import folder as folder_module
from onnx_light_ref.io._read.folder import PATH_MAX, ModelFolder, open_unconfined
from onnx_light_ref.io._read.model_file import load_model_metadata
from onnx_light_ref.ops import DelayedInitializer, reference_evaluator
from tests.checks import snapshot_tree
from tests.ops.kernel_support import delayed_model, delayed_node, recorded_opens

pytestmark = pytest.mark.skipif(not hasattr(os, "O_PATH"), reason="looking before opening needs O_PATH (Linux)")

OPENERS = ["openat2", "walk"]
LONG = "./" * (PATH_MAX // 2) + "w.bin"  # PATH_MAX + 5 bytes; every component but the last is '.'
SAME_ANSWER_NAMES = ["w.bin/", "w.bin/.", "w.bin//", LONG, "n" * 300]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    return folder


def _answer(call) -> tuple[type, str]:  # type: ignore[no-untyped-def]
    try:
        call()
    except (OSError, ValueError) as exc:
        return type(exc), str(exc)
    return type(None), "opened"


@pytest.mark.parametrize("name", SAME_ANSWER_NAMES, ids=["slash", "slash-dot", "double-slash", "over-PATH_MAX", "300"])
def test_one_name_one_answer_in_both_openers_and_both_modes(
    tree: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    answers = set()
    for opener in OPENERS:
        monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
        for trusted in (False, True):
            with ModelFolder.open(tree, allow_outside_folder=trusted) as folder:
                answers.add(_answer(lambda: folder.open_file(name, tensor_name="t").close()))
                answers.add(_answer(lambda: folder.stat_file(name, tensor_name="t")))
    assert len(answers) == 1, answers
    ((kind, message),) = answers
    if name == "n" * 300:
        assert kind is ExternalDataError and "cannot be accessed: File name too long" in message
    elif name == LONG:
        assert kind is ExternalDataError and f"shorter than PATH_MAX ({PATH_MAX} bytes" in message
    else:
        assert kind is UnsafeLocationError and "does not name a file: it names a folder" in message


@pytest.mark.parametrize("opener", OPENERS)
@pytest.mark.parametrize("load_device", ["cpu", "file"])
@pytest.mark.parametrize("suffix", ["/", "/.", "//"])
def test_the_kernel_refuses_a_trailing_slash_alike_relative_absolute_confined_or_trusted(
    tree: Path, monkeypatch: pytest.MonkeyPatch, opener: str, load_device: str, suffix: str
) -> None:
    monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
    monkeypatch.chdir(tree)
    ops = {
        "bound": DelayedInitializer.bind(tree),
        "trusted": DelayedInitializer.bind(tree, allow_outside_folder=True),
        "unbound": DelayedInitializer,
    }
    for kind, op in ops.items():
        for filename in (f"w.bin{suffix}", f"{tree}/w.bin{suffix}"):
            with pytest.raises(UnsafeLocationError, match="does not name a file") as info:
                ReferenceEvaluator(delayed_model(delayed_node(filename, load_device)), new_ops=[op]).run(None, {})
            assert "node 'w'" in str(info.value) and repr(filename) in str(info.value), kind


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_the_kernel_refuses_a_name_over_path_max_alike(
    tree: Path, monkeypatch: pytest.MonkeyPatch, load_device: str
) -> None:
    monkeypatch.chdir(tree)
    ops = [DelayedInitializer.bind(tree), DelayedInitializer.bind(tree, allow_outside_folder=True), DelayedInitializer]
    for opener in OPENERS:
        monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
        for op in ops:
            for filename in (LONG, f"{tree}/{LONG}"):
                with pytest.raises(ExternalDataError, match=r"PATH_MAX \(4096 bytes"):
                    ReferenceEvaluator(delayed_model(delayed_node(filename, load_device)), new_ops=[op]).run(None, {})


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_dotdot_and_the_folder_itself_are_refused_with_the_real_reason(tree: Path, load_device: str) -> None:
    cases = {
        f"{tree}/../{tree.name}/w.bin": "contains a '..' component; refused as onnx refuses '..'",
        str(tree): f"names the model's folder {str(tree)!r} itself, not a file",
        f"{tree}/": "does not name a file: it names a folder",
    }
    for filename, reason in cases.items():
        with pytest.raises(UnsafeLocationError) as info:
            ReferenceEvaluator(
                delayed_model(delayed_node(filename, load_device)), new_ops=[DelayedInitializer.bind(tree)]
            )
        assert reason in str(info.value) and "outside the model's folder" not in str(info.value), str(info.value)


# ----------------------------------------------------------------------------------------- FIFOs and devices


@pytest.fixture
def flags_seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """The flags of every open the opener makes: ``os.open`` (audit hook) and ``openat2`` (its ``open_how``)."""
    seen: list[tuple[str, int]] = []
    real = folder_module._syscall
    if real is not None:

        def spying(number: int, dir_fd: int, name: bytes, how: object, size: int) -> int:
            seen.append((os.fsdecode(name), ctypes.cast(how, ctypes.POINTER(folder_module._OpenHow))[0].flags))
            return int(real(number, dir_fd, name, how, size))

        monkeypatch.setattr(folder_module, "_syscall", spying)
    with recorded_opens() as opens:
        yield seen
        seen.extend((o.path, o.flags) for o in opens)


def _opened_for_io(seen: list[tuple[str, int]], name: str) -> list[tuple[str, int]]:
    return [(path, flags) for path, flags in seen if path.endswith(name) and not flags & os.O_PATH]


@pytest.fixture
def blocked_writer(tree: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process blocked opening ``model/pipe`` for writing: it writes ``released`` once a reader opens it."""
    fifo = tree / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'released')"])
    for _ in range(60_000):  # until the writer waits in open() (a count, not a time: fails only if it never does)
        state = _waits_for_a_reader(writer.pid)
        if writer.poll() is not None or state is not False:
            break
        time.sleep(0.001)
    WCHAN_SEEN[writer.pid] = state is True  # wchan shows the wait here: a released writer cannot hide
    yield writer
    if writer.poll() is None:  # a test that failed early: release it (a reader opens it), then collect it
        with open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb"):
            writer.wait(timeout=60)


WCHAN_SEEN: dict[int, bool] = {}


def _waits_for_a_reader(pid: int) -> bool | None:
    """Whether ``pid`` sleeps in the kernel's FIFO open (``wait_for_partner``); None where wchan is hidden."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return None
    return None if wchan in ("", "0") else wchan == "wait_for_partner"


def _check_still_blocked(writer: subprocess.Popen[bytes], fifo: Path) -> None:
    """The writer was never released: it still waits in open(), the first reader is this one, and it gets the bytes.

    A writer released earlier (by an open for reading, closed at once) would be running, or dead of SIGPIPE (exit
    status -13, nothing to read here).
    """
    assert writer.poll() is None
    if WCHAN_SEEN.pop(writer.pid):
        assert _waits_for_a_reader(writer.pid) is True
    with open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb") as reader:  # releases a writer still waiting
        assert writer.wait(timeout=60) == 0
        assert reader.read() == b"released"


@pytest.mark.parametrize("opener", OPENERS)
def test_a_fifo_with_a_blocked_writer_stays_blocked(
    tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags_seen: list[tuple[str, int]],
    blocked_writer: subprocess.Popen[bytes],
    capsys: pytest.CaptureFixture[str],
    opener: str,
) -> None:
    monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
    fifo = tree / "pipe"
    before = snapshot_tree(tree)
    for trusted in (False, True):
        with (
            ModelFolder.open(tree, allow_outside_folder=trusted) as folder,
            pytest.raises(ExternalDataError, match=r"is not a regular file: it is a FIFO \(named pipe\)"),
        ):
            folder.open_file("pipe", tensor_name="t")
    with pytest.raises(ExternalDataError, match="it is a FIFO"):
        open_unconfined(str(fifo), subject="file")
    for load_device in ("cpu", "file"):
        for filename in ("pipe", str(fifo)):
            node = delayed_node(filename, load_device)
            for op in (DelayedInitializer.bind(tree), DelayedInitializer.bind(tree, allow_outside_folder=True)):
                with pytest.raises(ExternalDataError, match="it is a FIFO"):
                    ReferenceEvaluator(delayed_model(node), new_ops=[op]).run(None, {})
    # The model itself, and a --input, given as the FIFO.
    with pytest.raises(FileNotFoundError, match=r"is a FIFO \(named pipe\), not a regular file: not a model file"):
        load_model_metadata(str(fifo))
    with pytest.raises(FileNotFoundError, match="is a FIFO"):
        reference_evaluator(fifo)
    assert main(["run", str(fifo), "--output-dir", str(tree / "out")]) == 1
    assert "is a FIFO (named pipe), not a regular file" in capsys.readouterr().err
    _check_still_blocked(blocked_writer, fifo)
    assert _opened_for_io(flags_seen, "pipe") == []
    assert snapshot_tree(tree) == before


@pytest.mark.parametrize("opener", OPENERS)
def test_a_device_node_is_never_opened(
    tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags_seen: list[tuple[str, int]],
    capsys: pytest.CaptureFixture[str],
    opener: str,
) -> None:
    monkeypatch.setattr(folder_module.PROBE, "force_walk", opener == "walk")
    names = ["/dev/zero"]
    if os.geteuid() == 0:  # a device node as a root-extracted archive would carry it
        os.mknod(tree / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
        names.append("zero")
        with (
            ModelFolder.open(tree) as folder,
            pytest.raises(ExternalDataError, match="it is a character device, which was not opened"),
        ):
            folder.open_file("zero", tensor_name="t")
    for filename in names:
        for op in (DelayedInitializer.bind(tree, allow_outside_folder=True), DelayedInitializer):
            if filename == "zero" and op is DelayedInitializer:
                monkeypatch.chdir(tree)
            node = delayed_node(filename, "cpu", shape=(16,))
            with pytest.raises(ExternalDataError, match="it is a character device"):
                ReferenceEvaluator(delayed_model(node), new_ops=[op])
    with pytest.raises(FileNotFoundError, match="'/dev/zero' is a character device, not a regular file"):
        reference_evaluator("/dev/zero")
    assert main(["run", "/dev/zero", "--output-dir", str(tree / "out")]) == 1
    assert "'/dev/zero' is a character device, not a regular file: not a model file" in capsys.readouterr().err
    assert _opened_for_io(flags_seen, "zero") == []


def test_without_proc_the_name_is_opened_again_and_must_be_the_same_file(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``/proc`` is not mounted, the read descriptor comes from the name again, checked to be the file looked
    at (its inode is held by the ``O_PATH`` descriptor meanwhile, so the comparison is exact)."""
    monkeypatch.setattr(folder_module.PROBE, "no_proc", True)
    with ModelFolder.open(tree) as folder, folder.open_file("w.bin", tensor_name="t") as opened:
        assert os.pread(opened.fd, 16, 0) == np.arange(4, dtype="<f4").tobytes()
    real_look = ModelFolder._look

    def swapped_after_the_look(self: ModelFolder, location: str, what: str, check_links: bool):  # type: ignore[no-untyped-def]
        looked = real_look(self, location, what, check_links)
        (tree / "new.bin").write_bytes(bytes(16))
        os.replace(tree / "new.bin", tree / "w.bin")
        return looked

    monkeypatch.setattr(ModelFolder, "_look", swapped_after_the_look)
    with ModelFolder.open(tree) as folder, pytest.raises(ExternalDataError, match="was replaced while it was being"):
        folder.open_file("w.bin", tensor_name="t")
