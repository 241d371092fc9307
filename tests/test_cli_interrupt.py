"""Ctrl-C and SIGTERM during a writing command (issue 22): nothing left behind, one line, exit 130 / 143.

Each test runs the real command line (``python -m onnx_light_ref ...``) in a child process and signals it while it
works: ``align`` and ``undelay`` copy a 4 GiB SPARSE weights file (holes: no disk block, no memory; copied with a
64 KiB chunk so the copy lasts long enough), ``run`` evaluates a Loop of millions of iterations, and
``generate-tests`` is held after its third case by a hook in the child. The parent waits for the work to be
visible (the publish transaction's ``.olr~...tmp`` temp file, the created output folder, the hook's ``ready``),
stops the child (SIGSTOP) to check it is still mid-job, queues the signal, and lets it go on (SIGCONT). Then: exit
status 128 + signal, stderr exactly ``error: interrupted`` (no traceback), no temp file, the folders the command
created removed, the sources untouched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.checks import run_onnxruntime, snapshot_tree
from tests.models import IR_VERSION, OPSET, external_tensor, identity_model, write_model

pytestmark = pytest.mark.slow

SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]
TENSORS = 16
TENSOR_BYTES = 256 * 1024 * 1024  # 16 x 256 MiB = 4 GiB of holes
WAIT = 120.0  # seconds: only a bound on a broken child, never an assertion about speed


def sparse_model(folder: Path) -> Path:
    """``model.onnx`` with 16 external uint8 tensors of 256 MiB each in one 4 GiB sparse ``model.onnx.data``."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "model.onnx.data", "wb") as data:
        data.truncate(TENSORS * TENSOR_BYTES)
    template = np.zeros(1, np.uint8)
    tensors = []
    for i in range(TENSORS):
        entries = [("location", "model.onnx.data"), ("offset", str(i * TENSOR_BYTES)), ("length", str(TENSOR_BYTES))]
        tensor = external_tensor(f"w{i:02d}", template, entries)
        tensor.dims[:] = [TENSOR_BYTES]
        tensors.append(tensor)
    return write_model(folder / "model.onnx", identity_model(tensors))


def delayed_model(folder: Path) -> Path:
    """The sparse model with its initializers turned into DelayedInitializer nodes (``undelay``'s input)."""
    from onnx_light_ref import delay_initializers

    source = sparse_model(folder)
    return write_model(folder / "delayed.onnx", delay_initializers(source))


def loop_model(path: Path, iterations: int) -> Path:
    """``y = x + iterations`` computed by a Loop adding 1 per iteration: slow in the reference evaluator."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [
            numpy_helper.from_array(np.array(iterations, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return write_model(path, model)


def start(args: list[str], cwd: Path, code: str | None = None) -> subprocess.Popen[str]:
    """The command line in a child process, in ``cwd``, its system temp folder ``cwd/tmp`` (created)."""
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "onnx_light_ref", *args]
    (cwd / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(cwd / "tmp")}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(child: subprocess.Popen[str], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"the child ended (status {child.returncode}) before {what}: {out} {err}")
        if time.monotonic() > deadline:
            child.kill()
            child.communicate()
            pytest.fail(f"no {what} after {WAIT} s")
        time.sleep(0.005)


def temp_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(".olr~*.tmp")) if folder.is_dir() else []


def interrupt(child: subprocess.Popen[str], signum: int, still_working: Callable[[], bool]) -> tuple[str, str]:
    """Stop the child, check it is mid-job, queue ``signum``, resume it; return its stdout and stderr."""
    child.send_signal(signal.SIGSTOP)
    try:
        assert child.poll() is None and still_working(), "the job finished before it could be interrupted"
        child.send_signal(signum)
    finally:
        child.send_signal(signal.SIGCONT)
    return finish(child)


def finish(child: subprocess.Popen[str]) -> tuple[str, str]:
    """The child's stdout and stderr once it has ended; a child still running after :data:`WAIT` is killed (it would
    go on with its job after this test, on a core the other tests need) and the test fails."""
    try:
        return child.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the child was still running after {WAIT} s: stdout {out!r}, stderr {err!r}")


def assert_interrupted(child: subprocess.Popen[str], signum: int, out: str, err: str) -> None:
    assert child.returncode == 128 + signum == (130 if signum == signal.SIGINT else 143), (out, err)
    # One line, no traceback; on onnx < 1.19 register_schemas() logs one WARNING first (no shape inference there).
    lines = [line for line in err.splitlines() if not line.startswith("WARNING ")]
    assert lines == ["error: interrupted"], err
    assert "Traceback" not in out


def source_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Size and mtime of every source file (the 4 GiB holes are not hashed); the ``.onnx`` files are hashed too."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("signum", SIGNALS)
def test_align_interrupted_mid_copy_leaves_nothing(tmp_path: Path, signum: int) -> None:
    src = sparse_model(tmp_path / "src")
    sources, src_bytes = source_state(tmp_path / "src"), src.read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot_tree(work)  # the 4 GiB of holes of src/ are compared by size and mtime, never read
    dst_dir = work / "out" / "deep"  # both folders created by the command
    args = ["align", str(src), str(dst_dir / "m.onnx"), "--chunk-size", "64K", "--no-fsync", "--no-progress"]
    child = start(args, tmp_path)

    wait_for(child, lambda: bool(temp_files(dst_dir)), "temp file in the destination")
    out, err = interrupt(child, signum, lambda: not (dst_dir / "m.onnx").exists())

    assert_interrupted(child, signum, out, err)
    assert not (work / "out").exists()  # temp files gone, then the created folders
    assert snapshot_tree(work) == before
    assert source_state(tmp_path / "src") == sources and src.read_bytes() == src_bytes


@pytest.mark.parametrize("signum", SIGNALS)
def test_align_interrupted_into_an_existing_folder_keeps_the_folder_and_the_previous_output(
    tmp_path: Path, signum: int
) -> None:
    src = sparse_model(tmp_path / "src")
    sources = source_state(tmp_path / "src")
    dst_dir = tmp_path / "out"
    dst_dir.mkdir()
    (dst_dir / "m.onnx").write_bytes(b"previous model")
    (dst_dir / "m.onnx.data").write_bytes(b"previous weights")
    before = snapshot_tree(dst_dir)
    args = ["align", str(src), str(dst_dir / "m.onnx"), "--chunk-size", "64K", "--no-fsync", "--no-progress"]
    child = start(args, tmp_path)

    wait_for(child, lambda: bool(temp_files(dst_dir)), "temp file in the destination")
    out, err = interrupt(child, signum, lambda: (dst_dir / "m.onnx").read_bytes() == b"previous model")

    assert_interrupted(child, signum, out, err)
    assert snapshot_tree(dst_dir) == before  # the previous outputs and the folder stay, no temp file
    assert source_state(tmp_path / "src") == sources


@pytest.mark.parametrize("signum", SIGNALS)
def test_undelay_interrupted_mid_copy_leaves_nothing(tmp_path: Path, signum: int) -> None:
    src = delayed_model(tmp_path / "src")
    sources = source_state(tmp_path / "src")
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot_tree(work)
    dst_dir = work / "standard" / "deep"
    child = start(["undelay", str(src), str(dst_dir / "m.onnx"), "--no-fsync", "--no-progress"], tmp_path)

    wait_for(child, lambda: bool(temp_files(dst_dir)), "temp file in the destination")
    out, err = interrupt(child, signum, lambda: not (dst_dir / "m.onnx").exists())

    assert_interrupted(child, signum, out, err)
    assert not (work / "standard").exists()
    assert snapshot_tree(work) == before
    assert source_state(tmp_path / "src") == sources


@pytest.mark.parametrize("signum", SIGNALS)
def test_run_interrupted_while_evaluating_removes_the_output_folder(tmp_path: Path, signum: int) -> None:
    model = loop_model(tmp_path / "loop.onnx", 10**8)
    np.save(tmp_path / "x.npy", np.zeros(1, np.float32))
    (tmp_path / "tmp").mkdir()
    before = snapshot_tree(tmp_path)
    outputs = tmp_path / "results" / "deep"
    child = start(["run", str(model), "--input", "x=x.npy", "--output-dir", str(outputs)], tmp_path)

    wait_for(child, outputs.is_dir, "output folder")
    out, err = interrupt(child, signum, lambda: not any(outputs.iterdir()))

    assert_interrupted(child, signum, out, err)
    assert not (tmp_path / "results").exists()
    assert snapshot_tree(tmp_path) == before


SWALLOWED_IN_A_CALLBACK = textwrap.dedent(
    """
    import os, signal, sys, time, weakref
    from onnx_light_ref import _cli as cli
    from onnx_light_ref._commands import run

    signum = int(sys.argv[1])

    class Node:
        pass

    def callback(_ref):  # Python prints and ignores what a weak-reference callback raises, then goes on
        os.kill(os.getpid(), signum)  # the handler runs here, at the loop's first check of pending signals
        for _ in range(10**6):
            pass

    def job(args):
        node = Node()
        ref = weakref.ref(node, callback)
        del node  # the callback runs now, and the Interrupted its handler raised is swallowed
        print("swallowed", flush=True)
        for _ in range(6000):  # busy for 10 minutes, as a long evaluation is
            time.sleep(0.1)
        return 0

    run.run_command = job
    raise SystemExit(cli.main(sys.argv[2:]))
    """
)


@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_handled_in_a_weak_reference_callback_still_interrupts(tmp_path: Path, signum: int) -> None:
    """The handler runs wherever the main thread is, a finalizer or a weak-reference callback included (``run`` in the
    import system's module-lock callback, which runs after each import, in onnx's reference operators). Python only
    prints "Exception ignored in" for what is raised there and goes on: the Interrupted was lost, and the handlers, set
    to ignore after the first signal, ignored every later one (an interrupted ``run`` went on until SIGKILL). It is
    delivered again: the command ends as for any interrupt."""
    model = loop_model(tmp_path / "loop.onnx", 1)
    child = start([str(int(signum)), "run", str(model)], tmp_path, SWALLOWED_IN_A_CALLBACK)

    out, err = finish(child)

    assert out == "swallowed\n"
    assert_interrupted(child, signum, out, err)


HOLD_AFTER_THREE_CASES = textwrap.dedent(
    """
    import sys, time
    import importlib
    generate = importlib.import_module("onnx_light_ref.backend._generate")
    from onnx_light_ref._cli import main

    original, written = generate._write_checked_case, []

    def held(case, node_dir):
        result = original(case, node_dir)
        written.append(result)
        if len(written) == 3:
            print("ready", flush=True)
            for _ in range(6000):  # busy for 10 minutes; short sleeps, as work is: a signal caught by another
                time.sleep(0.1)  # thread is handled when the main thread's current system call returns
        return result

    generate._write_checked_case = held
    raise SystemExit(main(sys.argv[1:]))
    """
)


@pytest.mark.parametrize("signum", SIGNALS)
def test_generate_tests_interrupted_removes_the_cases_it_wrote(tmp_path: Path, signum: int) -> None:
    (tmp_path / "tmp").mkdir()
    kept = tmp_path / "cases" / "node" / "my_own_case"
    kept.mkdir(parents=True)
    (kept / "notes.txt").write_text("not written by generate-tests")
    before = snapshot_tree(tmp_path)
    child = start(["generate-tests", str(tmp_path / "cases" / "new" / "deep")], tmp_path, HOLD_AFTER_THREE_CASES)
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    assert len(list((tmp_path / "cases" / "new" / "deep" / "node").iterdir())) == 3

    out, err = interrupt(child, signum, lambda: True)

    assert_interrupted(child, signum, out, err)
    assert not (tmp_path / "cases" / "new").exists()
    assert snapshot_tree(tmp_path) == before
    assert list((tmp_path / "tmp").iterdir()) == []  # the seed cases' weights, written to the temp folder, removed


# ------------------------------------------------- interrupted between the two commits of a re-publication, or after


HOLD_AT_SYSCALL = textwrap.dedent(
    """
    import sys, time
    from onnx_light_ref.io._write import interrupts, publish
    from onnx_light_ref._cli import main

    trigger, exchange, args = sys.argv[1], sys.argv[2] == "exchange", sys.argv[3:]
    if not exchange:  # as on a kernel, libc or filesystem without renameat2(RENAME_EXCHANGE)
        publish._renameat2 = None
    held = []

    def hold(name):
        if name == trigger and not held:
            held.append(name)
            print("ready", flush=True)
            for _ in range(6000):  # held for 10 minutes at most, waiting for the signal
                time.sleep(0.1)  # raises there, unless the publication defers it (then it is recorded)
                if getattr(interrupts._state, "pending", None):
                    break

    publish.before_syscall = hold
    raise SystemExit(main(args))
    """
)


def _olr_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".olr~"))


def _bridge_case(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A previous output of ``align`` (old values, alignment 64) in ``tmp_path/out``, and a new source: re-aligning
    at 128 into the same names goes through bridge names (commit A, the copies, commit B)."""
    from onnx_light_ref import align_external_data_streaming
    from tests.hardening.publication_scenarios import values, write_source

    old, new = values(1), values(2)
    write_source(tmp_path / "old", old)
    write_source(tmp_path / "new", new)
    out = tmp_path / "out"
    out.mkdir()
    align_external_data_streaming(tmp_path / "old" / "model.onnx", out / "out.onnx", alignment=64)
    return out, tmp_path / "new" / "model.onnx", old, new


@pytest.mark.parametrize(
    ("trigger", "exchange", "outcome"),
    [
        pytest.param("renameat2", True, "new", id="at-the-first-move"),
        pytest.param("rename", False, "new", id="at-the-first-move-no-exchange"),
        pytest.param("unlink", True, "new", id="after-the-commit"),
        pytest.param("lstat", True, "previous", id="before-the-folder-lock"),
    ],
)
def test_ctrl_c_during_a_re_publication_acts_before_the_first_move_or_after_the_last_step(
    tmp_path: Path, trigger: str, exchange: bool, outcome: str
) -> None:
    """A real SIGINT, from another process, to ``align`` held at a system call of a bridged re-publication. From the
    first move to the last step after the commit the signal is deferred: the publication completes (the new model on
    its final names, no hidden file left), then the command stops with the interrupt's status. Before the first move
    (reading the previous model, ``lstat``) it acts at once: the previous model, nothing hidden left. The bridge names
    a run interrupted between the commits used to leave, or delete under a published model, never appear."""
    from tests.hardening.publication_scenarios import computed, same

    out, new_src, old, new = _bridge_case(tmp_path)
    visible_before = sorted(p.name for p in out.iterdir())
    args = ["align", str(new_src), str(out / "out.onnx"), "--alignment", "128", "--no-progress"]
    child = start([trigger, "exchange" if exchange else "plain", *args], tmp_path, HOLD_AT_SYSCALL)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"

    out_text, err = interrupt(child, signal.SIGINT, lambda: True)

    assert_interrupted(child, signal.SIGINT, out_text, err)
    assert sorted(p.name for p in out.iterdir()) == visible_before  # the same names either way, nothing hidden
    assert same(computed(out / "out.onnx"), new if outcome == "new" else old)
    assert _olr_files(out) == []


def _arabic_indic(number: int) -> str:
    """``number`` in Arabic-Indic digits (U+0660-U+0669), which ``\\d`` matches and ``int()`` reads."""
    return "".join(chr(0x0660 + int(digit)) for digit in str(number))


# ------------------------------------------- the first and last moments: while parsing, and once the work is done

HOLD_WHILE_PARSING = textwrap.dedent(
    """
    import sys, time
    from onnx_light_ref import _cli as cli
    from onnx_light_ref._commands import sizes

    where = sys.argv.pop(1)  # the rest is the command line console_main reads

    def hold(what):
        heavy = sorted(name for name in ("onnx", "numpy", "ml_dtypes") if name in sys.modules)
        print(f"{what} {heavy}", flush=True)
        for _ in range(6000):  # held for 10 minutes at most, waiting for the signal
            time.sleep(0.1)

    if where == "size":  # inside argparse, converting --chunk-size
        real = sizes.parse_size

        def parse_size(text):
            hold("parsing")
            return real(text)

        sizes.parse_size = parse_size
    else:  # while the parser is built: importing a command module

        class Finder:
            def find_spec(self, name, path=None, target=None):
                if name == "onnx_light_ref._commands.verify":
                    hold("importing")
                return None

        sys.meta_path.insert(0, Finder())
    raise SystemExit(cli.console_main())
    """
)


@pytest.mark.parametrize("where", ["size", "import"])
@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_while_the_command_line_is_parsed_is_one_line_and_the_status(
    tmp_path: Path, signum: int, where: str
) -> None:
    """The handlers are installed before the parser is built and before a size option is converted (which imported
    onnx and numpy inside argparse, ~0.5 s): a Ctrl-C there was a KeyboardInterrupt traceback and a death by
    SIGINT. The child is held exactly there, then signalled."""
    src = identity_model_file(tmp_path / "src")
    before = snapshot_tree(tmp_path / "src")
    args = ["align", str(src), str(tmp_path / "out" / "m.onnx"), "--chunk-size", "64K"]
    child = start([where, *args], tmp_path, HOLD_WHILE_PARSING)
    assert child.stdout is not None
    # Nothing heavy is imported while the command line is parsed.
    assert child.stdout.readline() == ("parsing []\n" if where == "size" else "importing []\n")

    out, err = interrupt(child, signum, lambda: True)

    assert_interrupted(child, signum, out, err)
    assert not (tmp_path / "out").exists()
    assert snapshot_tree(tmp_path / "src") == before


SIGNALLED_AFTER_THE_WORK = textwrap.dedent(
    """
    import os, signal, sys
    from onnx_light_ref import _cli as cli

    signum = int(sys.argv.pop(1))  # the rest is the command line console_main reads
    status = cli.console_main()
    print(f"done {status}", flush=True)
    os.kill(os.getpid(), signum)  # as a SIGTERM from a supervisor arriving while the interpreter exits
    print("still here", flush=True)
    raise SystemExit(status)
    """
)


@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_after_the_command_finished_keeps_its_status(tmp_path: Path, signum: int) -> None:
    """Once ``console_main`` has the command's status the work is done: a late SIGTERM (or Ctrl-C) used to kill the
    process by the default action (exit by signal, stdout possibly lost) after a complete, successful run."""
    src = identity_model_file(tmp_path / "src")
    dst = tmp_path / "out" / "m.onnx"
    child = start([str(int(signum)), "align", str(src), str(dst), "--no-progress"], tmp_path, SIGNALLED_AFTER_THE_WORK)

    out, err = finish(child)

    assert child.returncode == 0, err
    assert out.splitlines()[-2:] == ["done 0", "still here"]
    assert "interrupted" not in err and "Traceback" not in err
    (loaded,) = run_onnxruntime(dst, {})
    assert np.array_equal(loaded, np.arange(4, dtype=np.float32))


def identity_model_file(folder: Path) -> Path:
    """``model.onnx`` returning its one external initializer ``w`` (4 float32: 0, 1, 2, 3) from ``model.onnx.data``."""
    folder.mkdir(parents=True)
    values = np.arange(4, dtype=np.float32)
    (folder / "model.onnx.data").write_bytes(values.tobytes())
    tensor = external_tensor("w", values, [("location", "model.onnx.data"), ("offset", "0"), ("length", "16")])
    return write_model(folder / "model.onnx", identity_model([tensor]))


HOLD_INSIDE_AN_EXTENSION = textwrap.dedent(
    """
    import os, sys, threading, time
    from onnx_light_ref import _cli as cli

    release = sys.argv.pop(1)  # the rest is the command line console_main reads
    held = []

    def deferred():
        return any(thread.name == "onnx-light-ref-interrupt" for thread in threading.enumerate())

    class Finder:  # holds the first import that a C extension's own initialization makes (numpy's does several)
        def find_spec(self, name, path=None, target=None):
            if not held and cli._initializing_an_extension(sys._getframe()):
                held.append(name)
                print("held", flush=True)
                said = False
                while not os.path.exists(release):
                    if not said and deferred():  # the handler ran here, and sends the signal again later
                        print("deferred", flush=True)
                        said = True
                    time.sleep(0.01)
            return None

    sys.meta_path.insert(0, Finder())
    raise SystemExit(cli.console_main())
    """
)


@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_while_a_c_extension_initializes_waits_for_it_to_finish(tmp_path: Path, signum: int) -> None:
    """onnx's C++ extension imports Python modules while it initializes; a KeyboardInterrupt raised there unwound
    through code that does not expect it and the process died by SIGSEGV (seen as `run` exiting -11 when SIGTERM
    came while it imported onnx). The signal is sent again until it lands in plain Python: one line, 130 / 143."""
    src = identity_model_file(tmp_path / "src")
    release = tmp_path / "release"
    args = [str(release), "align", str(src), str(tmp_path / "out" / "m.onnx"), "--no-progress"]
    child = start(args, tmp_path, HOLD_INSIDE_AN_EXTENSION)
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    child.send_signal(signum)
    assert child.stdout.readline() == "deferred\n"  # not raised inside the extension: sent again, later
    release.touch()

    out, err = finish(child)

    assert_interrupted(child, signum, out, err)
    assert not (tmp_path / "out").exists()
