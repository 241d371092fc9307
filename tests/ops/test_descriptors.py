"""Descriptors have an owner and a lifetime (issue 26, section 4).

Each evaluator's folder descriptor was held by a class made by ``bind()``; classes live in reference cycles, and so
does onnx's evaluator, so ``del sess`` released nothing until the cyclic garbage collector ran: with
``RLIMIT_NOFILE`` = base + 16, 8 of 40 build/run/del cycles failed, reported as ``InvalidModelError: ... cannot be
opened: Too many open files``. Now: what ``reference_evaluator`` returns has ``close()`` and ``with``, and goes (with
its descriptors) when dropped; bound classes have ``close()`` and ``with``; held files go with the last node using
them; EMFILE/ENFILE say what they are. Counts are read from ``/proc/self/fd`` with the cyclic collector off, so every
release seen here was made by reference counting or by ``close()``.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as oh
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref.ops import DelayedInitializer, LazyReferenceEvaluator, reference_evaluator
from tests.checks import snapshot_tree
from tests.ops.kernel_support import delayed_model, delayed_node, no_garbage_collection, open_descriptors

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="descriptors are counted in /proc/self/fd")

REPO = Path(__file__).resolve().parents[2]


def _model(folder: Path) -> Path:
    """``m.onnx``: two external initializers in two files (``a.data``, ``b.data``) and a file-mode
    DelayedInitializer node reading ``c.bin``: a live file-mode evaluator holds its folder and three files."""
    graph = oh.make_graph(
        [
            oh.make_node("Add", ["A", "B"], ["s"]),
            delayed_node("c.bin", "file", output="C", name="c"),
            oh.make_node("Add", ["s", "C"], ["y"]),
        ],
        "g",
        [],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        [
            numpy_helper.from_array(np.arange(4, dtype=np.float32), "A"),
            numpy_helper.from_array(np.ones(4, dtype=np.float32), "B"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)])
    for tensor, location in zip(model.graph.initializer, ("a.data", "b.data"), strict=True):
        onnx.external_data_helper.set_external_data(tensor, location)
        (folder / location).write_bytes(tensor.raw_data)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
    (folder / "c.bin").write_bytes(np.full(4, 10, "<f4").tobytes())
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


EXPECTED = np.arange(4, dtype=np.float32) + 11


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_close_with_and_drop_each_release_everything(tmp_path: Path, load_device: str) -> None:
    path = _model(tmp_path)
    with no_garbage_collection():
        base = open_descriptors()
        sess = reference_evaluator(path, load_device)
        assert isinstance(sess, LazyReferenceEvaluator) and isinstance(sess, ReferenceEvaluator)
        np.testing.assert_array_equal(sess.run(None, {})[0], EXPECTED)
        held = open_descriptors() - base
        # The folder and c.bin (its node is file mode), + a.data and b.data when the converted nodes are.
        assert held == (4 if load_device == "file" else 2)
        sess.close()
        sess.close()  # idempotent
        assert sess.closed and open_descriptors() == base
        with pytest.raises(ValueError, match=r"node '.*': this evaluator's DelayedInitializer descriptors were closed"):
            sess.run(None, {})

        with reference_evaluator(path, load_device) as sess:
            np.testing.assert_array_equal(sess.run(None, {})[0], EXPECTED)
        assert open_descriptors() == base

        sess = reference_evaluator(path, load_device)
        sess.run(None, {})
        gone = weakref.ref(sess)
        del sess
        assert gone() is None  # freed by reference counting: onnx's log-callback cycle is gone
        assert open_descriptors() == base


def test_onnx_s_own_evaluator_goes_when_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ReferenceEvaluator(model, new_ops=[...])``: each node's held file (and, unbound, the current directory's
    hold) goes with the evaluator; a bound class keeps only its folder, until it is closed."""
    (tmp_path / "w.bin").write_bytes(bytes(16))
    monkeypatch.chdir(tmp_path)
    model = delayed_model(*(delayed_node("w.bin", "file", output=f"y{i}", name=f"n{i}") for i in range(30)))
    with no_garbage_collection():
        base = open_descriptors()
        sess = ReferenceEvaluator(model, new_ops=[DelayedInitializer])
        assert open_descriptors() - base == 2  # the current directory, and w.bin once for 30 nodes
        sess.run(None, {})
        gone = weakref.ref(sess)
        del sess
        assert gone() is None and open_descriptors() == base

        op = DelayedInitializer.bind(tmp_path)
        assert open_descriptors() - base == 1  # the folder, held by the class from bind() on
        sess = ReferenceEvaluator(model, new_ops=[op])
        assert open_descriptors() - base == 2
        sess.run(None, {})
        del sess
        assert open_descriptors() - base == 1  # w.bin went with the evaluator; the folder stays with the class
        op.close()
        assert open_descriptors() == base


def test_verbose_logging_still_works_through_the_weak_callback(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "w.bin").write_bytes(bytes(16))
    sess = ReferenceEvaluator(
        delayed_model(delayed_node(str(tmp_path / "w.bin"), "file")), new_ops=[DelayedInitializer], verbose=11
    )
    sess.run(None, {})
    assert "-- begin DelayedInitializer.run(0 inputs)" in capsys.readouterr().out


def test_bound_class_close_and_with(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(bytes(16))
    model = delayed_model(delayed_node("w.bin", "file"))
    with no_garbage_collection():
        base = open_descriptors()
        with DelayedInitializer.bind(tmp_path) as op:
            sess = ReferenceEvaluator(model, new_ops=[op])
            sess.run(None, {})
            assert open_descriptors() - base == 2 and not op.closed
        assert op.closed and open_descriptors() == base
        with pytest.raises(ValueError, match="descriptors were closed"):
            sess.run(None, {})
        with pytest.raises(ValueError, match="descriptors were closed"):  # a closed class builds nothing
            ReferenceEvaluator(model, new_ops=[op])
        del sess
    with pytest.raises(TypeError, match="unbound DelayedInitializer holds no descriptors of its own"):
        DelayedInitializer.close()
    with pytest.raises(TypeError, match="close\\(\\) and 'with' are for classes made by"), DelayedInitializer:
        pass
    assert not DelayedInitializer.closed


def test_bind_a_held_folder_holds_its_own_descriptor(tmp_path: Path) -> None:
    from onnx_light_ref.io._read.folder import ModelFolder

    (tmp_path / "w.bin").write_bytes(bytes(16))
    with ModelFolder.open(tmp_path) as folder:
        op = DelayedInitializer.bind(folder)
    # The caller's folder is closed; the class reads through its own duplicate.
    sess = ReferenceEvaluator(delayed_model(delayed_node("w.bin", "cpu")), new_ops=[op])
    np.testing.assert_array_equal(sess.run(None, {})[0], [0, 0, 0, 0])
    op.close()


_CYCLES_CHILD = r"""
import gc, json, os, resource, sys
import numpy as np
from onnx.reference import ReferenceEvaluator
import onnx
from onnx_light_ref.ops import DelayedInitializer, reference_evaluator

path, mode, cycles, collect = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "gc"
if not collect:
    gc.disable()
fds = lambda: len(os.listdir("/proc/self/fd")) - 1
base = fds()
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (base + 16, hard))
model = onnx.load(path, load_external_data=False)
failures = []
for i in range(cycles):
    try:
        if mode == "evaluator-with":
            with reference_evaluator(path) as sess:
                sess.run(None, {})
        elif mode.startswith("evaluator-"):
            sess = reference_evaluator(path, mode.split("-")[1])
            sess.run(None, {})
            del sess
        elif mode == "bound-with":
            with DelayedInitializer.bind(os.path.dirname(path)) as op:
                ReferenceEvaluator(model, new_ops=[op]).run(None, {})
    except OSError as exc:
        failures.append([i, exc.errno, str(exc)])
print(json.dumps({"base": base, "after": fds(), "failures": failures}))
"""


@pytest.mark.parametrize("collector", ["gc", "no-gc"])
@pytest.mark.parametrize("mode", ["evaluator-file", "evaluator-cpu", "evaluator-with", "bound-with"])
def test_forty_cycles_under_a_limit_of_base_plus_16(tmp_path: Path, mode: str, collector: str) -> None:
    """The issue's measurement, in a child (the limit is per process): every cycle succeeds, nothing is left open."""
    path = _model(tmp_path)
    if mode == "bound-with":  # onnx's evaluator on the converted model (external initializers loaded by onnx)
        onnx.save(onnx.load(path), tmp_path / "inline.onnx")
        path = tmp_path / "inline.onnx"
    done = subprocess.run(
        [sys.executable, "-c", _CYCLES_CHILD, str(path), mode, "40", collector],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    result = json.loads(done.stdout)
    print(f"{mode} ({collector}): descriptors before {result['base']}, after 40 cycles {result['after']}")
    assert result["failures"] == []
    assert result["after"] == result["base"]


_EXHAUSTED_CHILD = r"""
import contextlib, io, json, os, resource, sys
from onnx_light_ref.ops import reference_evaluator
from onnx_light_ref._cli import main

path = sys.argv[1]
with contextlib.redirect_stderr(io.StringIO()):  # every module the two calls import, imported while it can be
    reference_evaluator(path).close()
    main(["run", path + ".absent"])
fds = lambda: len(os.listdir("/proc/self/fd")) - 1
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (fds() + 1, hard))
spare = os.open("/", os.O_RDONLY)   # the last free descriptor: taken
try:
    reference_evaluator(path)
except Exception as exc:
    result = {"type": type(exc).__name__, "errno": getattr(exc, "errno", None), "message": str(exc)}
print(json.dumps(result))
sys.stdout.flush()
sys.exit(main(["run", path, "--output-dir", os.path.join(os.path.dirname(path), "out")]))
"""


def test_out_of_descriptors_is_said_as_what_it_is(tmp_path: Path) -> None:
    path = _model(tmp_path)
    before = snapshot_tree(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _EXHAUSTED_CHILD, str(path)], capture_output=True, text=True, cwd=REPO, check=False
    )
    result = json.loads(done.stdout.splitlines()[0])
    assert result["type"] == "OSError" and result["errno"] == errno.EMFILE, result
    assert "this process has too many open files (EMFILE: its limit, RLIMIT_NOFILE, is" in result["message"]
    assert "Close the evaluators you no longer use" in result["message"]
    assert "InvalidModelError" not in done.stderr and "cannot be opened" not in result["message"]
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "too many open files (EMFILE" in lines[0]
    assert snapshot_tree(tmp_path) == before


def test_the_run_command_leaves_no_descriptor_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``run`` in-process (as a test or a notebook calls it): its evaluator's descriptors go with the command."""
    path = _model(tmp_path)
    with no_garbage_collection():
        base = open_descriptors()
        assert main(["run", str(path), "--output-dir", str(tmp_path / "out")]) == 0
        assert open_descriptors() == base
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), EXPECTED)
    capsys.readouterr()
