"""Crash safety: SIGKILL the aligner and the shared saver at random points; the destination is never half-written.

Each function runs in a child process (forked, :mod:`tests.hardening.forked`; the calls are :mod:`._crash_child`'s)
on a 64 MiB model, with a small ``chunk_size`` so the copy takes a while, and is killed after a random delay (seeded)
drawn over the length of an uninterrupted run.
Afterwards the destination must be, file by file, either absent, the previous version, or complete and equal to a
reference output, and the sources must be intact. Half the trials start with no destination, half with a
previous complete one (made distinguishable by a marker in its ``.onnx``).

The previous output holds the same weights names as the new one, so its publication goes through the bridge step
(docs/safety.md, "Atomic output"): a kill between its two commits leaves a third valid ``.onnx``, ``bridged``: the
new model whose weights are read from ``.olr~...bridge`` files holding the new bytes. Every system call of the
publication is killed in turn, deterministically, by ``test_publish_kill_points.py``; these random-time kills
mostly land in the copy.

Temp files of killed runs are left in place between trials on purpose: the next run must not be disturbed by them,
and the final normal run must remove those of dead processes.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import align_external_data_in_memory, save_model_with_shared_external_data
from onnx_light_ref.io._write import publish
from tests.checks import snapshot_tree, temp_files_under
from tests.hardening._crash_child import make_call
from tests.hardening.forked import ForkedCall
from tests.models import write_external_model

SEED = 20240607
CHUNK_SIZE = 4096  # 16,384 copy calls for 64 MiB: long enough to be killed mid-copy
ALIGNMENT = 4096
NEW_BYTES = 64 * 1024 * 1024  # new weights written by the shared saver
ALIGN_TRIALS = 12
SHARED_TRIALS = 10

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model.onnx`` + 64 MiB of weights (16 x 4 MiB, plus odd-sized tensors so that padding is exercised)."""
    folder = tmp_path_factory.mktemp("crash_source")
    rng = np.random.default_rng(SEED)
    arrays = {f"big_{i}": rng.standard_normal(1024 * 1024, dtype=np.float32) for i in range(16)}
    arrays.update({f"odd_{i}": rng.integers(0, 255, 1000 + i, dtype=np.uint8) for i in range(3)})
    return write_external_model(folder, arrays)


def timed_full_run(call: Callable[[], object]) -> float:
    """Run ``call`` in a child to completion; return the seconds between ``ready`` and its exit."""
    child = ForkedCall(call)
    child.wait_ready()
    start = time.monotonic()
    child.finish(timeout=120)
    return time.monotonic() - start


def kill_at_random(rng: random.Random, duration: float, call: Callable[[], object]) -> int:
    """Start ``call`` in a child, SIGKILL it after a random delay, return its pid (its temp files carry it)."""
    child = ForkedCall(call)
    child.wait_ready()
    time.sleep(rng.uniform(0.0, duration * 1.1))
    child.kill()
    return child.pid


def unbridged(path: Path, content: bytes, weights: dict[str, bytes]) -> bytes | None:
    """``content`` (a ``.onnx``) with each bridge location put back to its final name, if every bridge file it
    references holds exactly the bytes ``weights`` (final name -> bytes) expects; None when it is not a bridge."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(content)
    except Exception:  # a half-written file: not a bridge
        return None
    by_tag = {publish._name_tag(name): name for name in weights}
    bridged = False
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value.endswith(".bridge"):
                final = by_tag.get(entry.value.split("~")[1])
                if final is None or (path.parent / entry.value).read_bytes() != weights[final]:
                    return None
                entry.value, bridged = final, True
    return model.SerializeToString() if bridged else None


def file_state(path: Path, reference: bytes, previous: bytes | None, weights: dict[str, bytes] | None = None) -> str:
    """``absent``, ``previous``, ``complete`` or ``bridged`` (the new model through bridge files, ``weights`` =
    final name -> expected bytes); fails on anything else (a half-written or foreign file)."""
    if not path.exists():
        return "absent"
    content = path.read_bytes()
    if content == reference:
        return "complete"
    if previous is not None and content == previous:
        return "previous"
    if weights is not None and unbridged(path, content, weights) == reference:
        return "bridged"
    pytest.fail(f"{path.name} is neither absent, the previous version, nor complete ({len(content)} bytes)")


def with_marker(onnx_path: Path) -> bytes:
    """Rewrite the ``.onnx`` with a doc_string marker: a 'previous version' distinguishable from the new one."""
    model = onnx.load_model(onnx_path, load_external_data=False)
    model.doc_string = "previous version"
    content = model.SerializeToString()
    onnx_path.write_bytes(content)
    return content


def run_trials(
    rng: random.Random, trials: int, duration: float, dst_onnx: Path, dst_weights: Path, references, call
) -> Counter:
    """Kill ``trials`` runs; alternate an absent and a previous destination; return the outcome counts."""
    ref_onnx, ref_weights = references
    outcomes: Counter = Counter()
    for trial in range(trials):
        with_previous = trial % 2 == 1
        previous_onnx = None
        if with_previous:
            dst_weights.write_bytes(ref_weights)
            dst_onnx.write_bytes(ref_onnx)
            previous_onnx = with_marker(dst_onnx)
        else:
            for path in (dst_onnx, dst_weights):
                path.unlink(missing_ok=True)
        pid = kill_at_random(rng, duration, call)
        onnx_state = file_state(dst_onnx, ref_onnx, previous_onnx, {dst_weights.name: ref_weights})
        weights_state = file_state(dst_weights, ref_weights, ref_weights if with_previous else None)
        if with_previous:
            assert onnx_state in ("previous", "complete", "bridged")
            assert weights_state == "complete"  # previous and new weights are the same bytes (see module doc)
        elif onnx_state == "complete":
            assert weights_state == "complete", "the .onnx was published before its weights"
        killed_mid_write = any(f"~{pid}~" in Path(p).name for p in temp_files_under(dst_onnx.parent))
        outcomes[
            f"{'previous' if with_previous else 'absent'} -> onnx {onnx_state}, weights {weights_state}"
            f"{', temp file left' if killed_mid_write else ''}"
        ] += 1
        if onnx_state != "absent":
            onnx.checker.check_model(str(dst_onnx))  # by path: resolves the weights from the destination folder
    return outcomes


def loads_equal_to_source(onnx_path: Path, source_path: Path) -> None:
    loaded = onnx.load_model(onnx_path)
    expected = onnx.load_model(source_path)
    got = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    want = {t.name: onnx.numpy_helper.to_array(t) for t in expected.graph.initializer}
    assert got.keys() == want.keys()
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_sigkilled_aligner_leaves_absent_previous_or_complete_destination(source: Path, tmp_path: Path):
    sources_before = snapshot_tree(source.parent)
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    align_external_data_in_memory(source, reference_dir / "out.onnx", alignment=ALIGNMENT)
    references = ((reference_dir / "out.onnx").read_bytes(), (reference_dir / "out.onnx.data").read_bytes())
    loads_equal_to_source(reference_dir / "out.onnx", source)

    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    dst_onnx, dst_weights = dst_dir / "out.onnx", dst_dir / "out.onnx.data"
    call = make_call("align", source, dst_onnx, CHUNK_SIZE, ALIGNMENT)
    duration = timed_full_run(call)
    assert dst_onnx.read_bytes() == references[0]  # streaming in a child == in-memory oracle, byte for byte
    assert dst_weights.read_bytes() == references[1]

    outcomes = run_trials(random.Random(SEED), ALIGN_TRIALS, duration, dst_onnx, dst_weights, references, call)
    print(f"aligner: {ALIGN_TRIALS} SIGKILL trials over a {duration:.2f} s run: {dict(outcomes)}")
    assert snapshot_tree(source.parent) == sources_before

    dst_onnx.unlink(missing_ok=True)
    dst_weights.unlink(missing_ok=True)
    timed_full_run(call)  # stale temp files of the killed children must not get in the way...
    assert temp_files_under(dst_dir) == []  # ...and are removed, their pids being dead
    assert (dst_onnx.read_bytes(), dst_weights.read_bytes()) == references
    loads_equal_to_source(dst_onnx, source)


SHARD_SIZE = 16 * 1024 * 1024  # the 64 MiB source gives five weights files
SHARDED_TRIALS = 12


def shard_paths(dst_onnx: Path, count: int) -> list[Path]:
    return [Path(f"{dst_onnx}.data")] + [Path(f"{dst_onnx}.data.{i}") for i in range(1, count)]


def test_sigkilled_sharded_aligner_leaves_every_file_absent_previous_or_complete(source: Path, tmp_path: Path):
    sources_before = snapshot_tree(source.parent)
    options = {"alignment": 4096, "align_threshold": 1024, "max_shard_size": SHARD_SIZE, "dedup": True}
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    result = align_external_data_in_memory(source, reference_dir / "out.onnx", size_threshold=1024, **options)
    assert len(result.weights_files) >= 3
    ref_onnx = (reference_dir / "out.onnx").read_bytes()
    ref_shards = [Path(p).read_bytes() for p in result.weights_files]

    dst_dir = tmp_path / "dst"
    dst_dir.mkdir()
    dst_onnx = dst_dir / "out.onnx"
    shards = shard_paths(dst_onnx, len(ref_shards))
    call = make_call("align-sharded", source, dst_onnx, CHUNK_SIZE, SHARD_SIZE)
    duration = timed_full_run(call)
    assert dst_onnx.read_bytes() == ref_onnx  # streaming in a child == in-memory oracle, byte for byte
    assert [p.read_bytes() for p in shards] == ref_shards

    rng = random.Random(SEED + 2)
    outcomes: Counter = Counter()
    for trial in range(SHARDED_TRIALS):
        with_previous = trial % 2 == 1
        previous_onnx = None
        if with_previous:
            for path, content in zip(shards, ref_shards, strict=True):
                path.write_bytes(content)
            dst_onnx.write_bytes(ref_onnx)
            previous_onnx = with_marker(dst_onnx)
        else:
            for path in (dst_onnx, *shards):
                path.unlink(missing_ok=True)
        kill_at_random(rng, duration, call)
        onnx_state = file_state(
            dst_onnx, ref_onnx, previous_onnx, {p.name: c for p, c in zip(shards, ref_shards, strict=True)}
        )
        states = [
            file_state(path, content, content if with_previous else None)
            for path, content in zip(shards, ref_shards, strict=True)
        ]
        if with_previous:
            assert onnx_state in ("previous", "complete", "bridged")
            assert set(states) == {"complete"}  # previous and new weights are the same bytes (see module doc)
        elif onnx_state == "complete":
            assert set(states) == {"complete"}, "the .onnx was published before all of its weights files"
        outcomes[f"{'previous' if with_previous else 'absent'} -> onnx {onnx_state}, shards {states}"] += 1
        if onnx_state != "absent":
            onnx.checker.check_model(str(dst_onnx))
    print(f"sharded aligner: {SHARDED_TRIALS} SIGKILL trials over a {duration:.2f} s run: {dict(outcomes)}")
    assert snapshot_tree(source.parent) == sources_before

    for path in (dst_onnx, *shards):
        path.unlink(missing_ok=True)
    timed_full_run(call)
    assert temp_files_under(dst_dir) == []
    assert dst_onnx.read_bytes() == ref_onnx and [p.read_bytes() for p in shards] == ref_shards
    loads_equal_to_source(dst_onnx, source)


def test_sigkilled_shared_saver_leaves_absent_previous_or_complete_destination(source: Path, tmp_path: Path):
    from tests.hardening._crash_child import new_weights, variant_model

    sources_before = snapshot_tree(source.parent)
    # The variant must sit next to the source to reuse its weights: work in a private copy of the source folder
    # (hard links would be refused as sources; the files are copied).
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        (folder / name).write_bytes((source.parent / name).read_bytes())
    copy_before = snapshot_tree(folder)
    src = folder / "model.onnx"

    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    (reference_dir / "model.onnx.data").write_bytes((folder / "model.onnx.data").read_bytes())
    save_model_with_shared_external_data(variant_model(str(src), NEW_BYTES, SEED), reference_dir / "variant.onnx")
    references = ((reference_dir / "variant.onnx").read_bytes(), (reference_dir / "variant.onnx.data").read_bytes())

    dst_onnx, dst_weights = folder / "variant.onnx", folder / "variant.onnx.data"
    call = make_call("shared", src, dst_onnx, NEW_BYTES, SEED)  # the 64 MiB variant is built once, here
    duration = timed_full_run(call)
    assert (dst_onnx.read_bytes(), dst_weights.read_bytes()) == references

    outcomes = run_trials(random.Random(SEED + 1), SHARED_TRIALS, duration, dst_onnx, dst_weights, references, call)
    print(f"shared saver: {SHARED_TRIALS} SIGKILL trials over a {duration:.2f} s run: {dict(outcomes)}")

    dst_onnx.unlink(missing_ok=True)
    dst_weights.unlink(missing_ok=True)
    timed_full_run(call)
    assert temp_files_under(folder) == []
    assert (dst_onnx.read_bytes(), dst_weights.read_bytes()) == references
    loaded = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load_model(dst_onnx).graph.initializer}
    expected = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load_model(src).graph.initializer}
    expected.update(new_weights(NEW_BYTES, SEED))
    assert loaded.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(loaded[name], array, err_msg=name)
    after = snapshot_tree(folder)
    for name in ("model.onnx", "model.onnx.data"):
        assert after[name] == copy_before[name]
    assert snapshot_tree(source.parent) == sources_before
