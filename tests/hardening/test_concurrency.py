"""Concurrency: one evaluator shared by 8 threads, several processes aligning one source at once, and writers racing
to publish into one destination (a retried job): the ``.onnx`` left behind must always describe the weights beside it.

The DelayedInitializer kernel reads with its own descriptor and positional reads (``file`` mode) or hands out copies
of a read-only cache (``cpu`` mode), so runs of one evaluator in parallel threads must always return the right
values, and an output array mutated by one caller must never show up in another call. The aligner stages its
outputs under per-process temp names and only removes temp files of dead processes, so parallel runs do not
disturb each other.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_light_ref import align_external_data_in_memory
from onnx_light_ref.ops._evaluate import reference_evaluator
from tests.checks import snapshot_tree, temp_files_under
from tests.hardening import _race_child
from tests.hardening._crash_child import make_call
from tests.hardening.forked import ForkedCall
from tests.models import IR_VERSION, OPSET, externalize, write_external_model, write_model

THREADS = 8
RUNS_PER_THREAD = 50
PASSED_THROUGH = ("w_i64", "w_u8", "w_f16", "w_bool")  # returned by Identity nodes


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {
        "w_f32": rng.standard_normal((64, 64)).astype(np.float32),
        "w_f32_b": rng.standard_normal((64, 64)).astype(np.float32),
        "w_f64": rng.standard_normal(1000),
        "w_i64": rng.integers(-(2**40), 2**40, 777, dtype=np.int64),
        "w_u8": rng.integers(0, 255, 4099, dtype=np.uint8),
        "w_f16": rng.standard_normal((33, 7)).astype(np.float16),
        "w_bool": rng.integers(0, 2, 100).astype(bool),
    }


def write_lazy_model(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Several external initializers in two files (odd offsets), used by Identity, Add and an If branch."""
    arrays = weights()
    (folder / "sub").mkdir()
    locations = {name: "a.data" if index % 2 == 0 else "sub/b.data" for index, name in enumerate(arrays)}
    tensors = [numpy_helper.from_array(array, name) for name, array in arrays.items()]
    externalize(tensors, folder, lambda tensor: locations[tensor.name], gap=b"\x5a" * 5)

    def out(name: str, dtype: int, shape: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, shape)

    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["w_f64"], ["then_out"])], "then", [], [out("then_out", 11, [1000])]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["w_f64"], ["else_out"])], "else", [], [out("else_out", 11, [1000])]
    )
    nodes = [
        helper.make_node("Add", ["w_f32", "w_f32_b"], ["sum"]),
        helper.make_node("If", ["cond"], ["branch"], then_branch=then_graph, else_branch=else_graph),
        *(helper.make_node("Identity", [name], [f"out_{name}"]) for name in PASSED_THROUGH),
    ]
    outputs = [out("sum", 1, [64, 64]), out("branch", 11, [1000])]
    outputs += [
        out(f"out_{name}", helper.np_dtype_to_tensor_dtype(arrays[name].dtype), list(arrays[name].shape))
        for name in PASSED_THROUGH
    ]
    graph = helper.make_graph(nodes, "lazy", [out("cond", onnx.TensorProto.BOOL, [])], outputs, initializer=tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    return write_model(folder / "model.onnx", model), arrays


def expected_outputs(arrays: dict[str, np.ndarray], cond: bool) -> list[np.ndarray]:
    return [
        arrays["w_f32"] + arrays["w_f32_b"],
        arrays["w_f64"] if cond else -arrays["w_f64"],
        arrays["w_i64"],
        arrays["w_u8"],
        arrays["w_f16"],
        arrays["w_bool"],
    ]


@pytest.mark.parametrize("load_device", ["file", "cpu"])
def test_eight_threads_sharing_one_evaluator_always_get_the_right_values(tmp_path: Path, load_device: str):
    path, arrays = write_lazy_model(tmp_path)
    before = snapshot_tree(tmp_path)
    evaluator = reference_evaluator(path, load_device)
    barrier = threading.Barrier(THREADS)
    failures: list[str] = []
    runs = [0] * THREADS

    def worker(index: int) -> None:
        try:
            barrier.wait()
            for run in range(RUNS_PER_THREAD):
                cond = (index + run) % 2 == 0
                got = evaluator.run(None, {"cond": np.array(cond)})
                for position, (value, want) in enumerate(zip(got, expected_outputs(arrays, cond), strict=True)):
                    if value.dtype != want.dtype or not np.array_equal(value, want):
                        failures.append(f"thread {index} run {run}: output {position} differs")
                    value[...] = 0  # a caller scribbling on its output must not reach any other caller
                runs[index] += 1
        except Exception as exc:  # collected: an exception in a thread would otherwise be lost
            failures.append(f"thread {index}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert runs == [RUNS_PER_THREAD] * THREADS
    assert snapshot_tree(tmp_path) == before


def align_in_child(src: Path, dst: Path) -> ForkedCall:
    """The streaming aligner in a child process of its own (forked: it starts at once, so two of them overlap)."""
    return ForkedCall(make_call("align", src, dst, 65536, 4096))


@pytest.fixture(scope="module")
def big_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 MiB in 12 tensors, so that two concurrent copies overlap in time."""
    rng = np.random.default_rng(5)
    arrays = {f"w{i}": rng.standard_normal(512 * 1024, dtype=np.float32) for i in range(12)}
    return write_external_model(tmp_path_factory.mktemp("concurrent_source"), arrays)


def wait_all(children: list[ForkedCall]) -> None:
    for child in children:
        child.finish(timeout=120)  # exit status 0 and a ``done`` line, else the child's traceback


def test_two_processes_aligning_one_source_into_different_destinations(big_source: Path, tmp_path: Path):
    sources_before = snapshot_tree(big_source.parent)
    align_external_data_in_memory(big_source, tmp_path / "oracle.onnx")
    destinations = [tmp_path / "a" / "out.onnx", tmp_path / "b" / "out.onnx"]
    for destination in destinations:
        destination.parent.mkdir()
    wait_all([align_in_child(big_source, destination) for destination in destinations])
    oracle_weights = (tmp_path / "oracle.onnx.data").read_bytes()
    for destination in destinations:
        assert Path(f"{destination}.data").read_bytes() == oracle_weights
    assert destinations[0].read_bytes() == destinations[1].read_bytes()
    assert temp_files_under(tmp_path) == []
    assert snapshot_tree(big_source.parent) == sources_before


def test_two_processes_aligning_into_the_same_destination_leave_one_complete_output(big_source: Path, tmp_path: Path):
    """Not a supported use, but it must not corrupt anything: the last rename wins, and both outputs are equal."""
    sources_before = snapshot_tree(big_source.parent)
    align_external_data_in_memory(big_source, tmp_path / "oracle.onnx")
    destination = tmp_path / "same" / "out.onnx"
    destination.parent.mkdir()
    wait_all([align_in_child(big_source, destination) for _ in range(2)])
    assert Path(f"{destination}.data").read_bytes() == (tmp_path / "oracle.onnx.data").read_bytes()
    assert temp_files_under(tmp_path) == []
    assert sorted(p.name for p in destination.parent.iterdir()) == ["out.onnx", "out.onnx.data"]
    assert snapshot_tree(big_source.parent) == sources_before


# ------------------------------------------------------------------------------- writers racing to one destination


def race_child(dst: Path, writer: int, times: int, *pause: str) -> ForkedCall:
    """Writer ``writer`` publishing ``times`` times into ``dst`` from a child process (``_race_child``'s job)."""
    return ForkedCall(lambda: _race_child.main([str(dst), str(writer), str(times), *pause]))


def finish(child: ForkedCall) -> None:
    child.finish(timeout=120)


def assert_consistent_pair(dst: Path) -> int:
    """The published .onnx describes the weights beside it: its own writer's bytes, read through onnx's loader."""
    model = onnx.load_model(str(dst))  # loads the external data through onnx's own checks
    writer = int(model.graph.name.removeprefix("writer"))
    (tensor,) = model.graph.initializer
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor), _race_child.writer_array(writer))
    entries = {
        e.key: e.value for e in onnx.load_model(str(dst), load_external_data=False).graph.initializer[0].external_data
    }
    assert int(entries["offset"]) + int(entries["length"]) == Path(f"{dst}.data").stat().st_size
    return writer


def test_racing_writers_always_leave_a_consistent_pair(tmp_path: Path):
    """Three processes publish different models into one destination, many times; check after every round."""
    dst = tmp_path / "out" / "m.onnx"
    dst.parent.mkdir()
    winners = set()
    for _round in range(5):
        children = [race_child(dst, writer, 6) for writer in (1, 2, 3)]
        for child in children:
            finish(child)
        winners.add(assert_consistent_pair(dst))
        assert temp_files_under(tmp_path) == []
        assert sorted(p.name for p in dst.parent.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert winners <= {1, 2, 3}


def blocked_on_a_lock(pid: int) -> bool:
    """Whether the kernel lists process ``pid`` as waiting for a lock (``/proc/locks``: ``->`` marks a request
    blocked behind the lock above it)."""
    with open("/proc/locks") as locks:
        return any(line.split()[1] == "->" and line.split()[5] == str(pid) for line in locks)


def test_a_writer_waits_while_another_is_between_its_two_renames(tmp_path: Path):
    """Writer 1 stops after renaming its weights; writer 2, started then, must not publish in that window.

    Without the publication lock writer 2 would finish inside the window and writer 1's .onnx would land beside writer
    2's weights. With it, writer 2 waits for writer 1's .onnx rename (seen in ``/proc/locks``: writer 2 blocked on
    the folder's lock while writer 1 holds it), so the pair left is writer 2's, whole.
    """
    dst = tmp_path / "out" / "m.onnx"
    dst.parent.mkdir()
    mid, resume = tmp_path / "mid", tmp_path / "resume"
    first = race_child(dst, 1, 1, "pause", str(mid), str(resume))
    for _ in range(6000):  # the child creates the marker once its weights are renamed
        if mid.exists():
            break
        time.sleep(0.01)
    else:
        finish(first)  # fails with what the child said
    assert mid.exists()
    second = race_child(dst, 2, 1)
    for _ in range(6000):  # writer 1 pauses for at most _race_child.PAUSE_SECONDS: writer 2 must block before
        if blocked_on_a_lock(second.pid):
            break
        time.sleep(0.001)
    assert blocked_on_a_lock(second.pid), "writer 2 did not wait for writer 1's publication"
    assert not (dst.parent / "m.onnx").exists()  # writer 1's .onnx is not published yet, writer 2's cannot be
    resume.touch()
    finish(first)
    finish(second)
    assert assert_consistent_pair(dst) == 2
    assert temp_files_under(dst.parent) == []
