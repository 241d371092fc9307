"""Layouts of the aligners (issue 11): align threshold, size-capped shards, dedup, and all of them together.

Every rewrite runs both aligners into separate folders (same file names) and checks that the ``.onnx`` and every
weights file are byte-identical, and that ``verify_models`` finds the source's tensors in the output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_light_ref.io._align import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._results import AlignResult
from onnx_light_ref.io._verify import verify_models
from tests.checks import onnxruntime_session


def run_both(src: Path, out: Path, **options: object) -> AlignResult:
    """Align ``src`` with both aligners into ``out/s`` and ``out/m``; check identical bytes and verify; return one."""
    (out / "s").mkdir(parents=True, exist_ok=True)
    (out / "m").mkdir(parents=True, exist_ok=True)
    chunk_size = options.pop("chunk_size", 4 * 1024 * 1024)
    streamed = align_external_data_streaming(src, out / "s" / "model.onnx", chunk_size=chunk_size, **options)
    in_memory = align_external_data_in_memory(src, out / "m" / "model.onnx", **options)
    assert int(streamed) == int(in_memory)
    assert streamed.tensors == in_memory.tensors
    assert streamed.deduplicated_tensors == in_memory.deduplicated_tensors
    assert streamed.externalized_tensors == in_memory.externalized_tensors
    assert (out / "s" / "model.onnx").read_bytes() == (out / "m" / "model.onnx").read_bytes()
    assert [Path(p).name for p in streamed.weights_files] == [Path(p).name for p in in_memory.weights_files]
    for s_path, m_path in zip(streamed.weights_files, in_memory.weights_files, strict=True):
        assert Path(s_path).read_bytes() == Path(m_path).read_bytes()
    assert sum(Path(p).stat().st_size for p in streamed.weights_files) == int(streamed)
    result = verify_models(src, out / "s" / "model.onnx")
    assert result.equal, result
    return streamed


def entries_of(path: Path) -> dict[str, dict[str, str]]:
    """``{tensor name: external entries}`` of every external tensor of the model at ``path``."""
    model = onnx.load_model(str(path), load_external_data=False)
    return {
        site.tensor.name: {e.key: e.value for e in site.tensor.external_data}
        for site in iter_tensors(model)
        if site.tensor.data_location == onnx.TensorProto.EXTERNAL
    }


def mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def uint8_tensors(lengths: list[int]) -> dict[str, np.ndarray]:
    return {f"t{i}": ((np.arange(n) * (i + 3) + i) % 251).astype(np.uint8) for i, n in enumerate(lengths)}


def test_align_threshold_aligns_large_tensors_and_packs_small_ones(tmp_path, make_external_model):
    src = make_external_model(mkdir(tmp_path / "src"), uint8_tensors([10, 200, 5, 99, 100]))

    result = run_both(src, tmp_path, alignment=4096, align_threshold=100)

    entries = entries_of(tmp_path / "s" / "model.onnx")
    assert [int(entries[f"t{i}"]["offset"]) for i in range(5)] == [0, 4096, 4296, 4301, 8192]
    assert int(result) == 8292 and result.payload_bytes == 414 and result.padding == 8292 - 414
    data = (tmp_path / "s" / "model.onnx.data").read_bytes()
    assert data[10:4096] == bytes(4086)  # padding reads as zeros
    assert data[4301:4400] == uint8_tensors([10, 200, 5, 99])["t3"].tobytes()


def test_align_threshold_zero_aligns_every_tensor_as_before(tmp_path, make_external_model):
    src = make_external_model(mkdir(tmp_path / "src"), uint8_tensors([10, 200, 5]))

    run_both(src, tmp_path, alignment=64, align_threshold=0)

    entries = entries_of(tmp_path / "s" / "model.onnx")
    assert [int(entries[f"t{i}"]["offset"]) for i in range(3)] == [0, 64, 320]


def test_shards_are_capped_never_split_a_tensor_and_restart_offsets(tmp_path, make_external_model):
    src = make_external_model(mkdir(tmp_path / "src"), uint8_tensors([3000, 3000, 3000, 9000, 100]))

    result = run_both(src, tmp_path, alignment=4096, max_shard_size=8192)

    names = [Path(p).name for p in result.weights_files]
    assert names == ["model.onnx.data", "model.onnx.data.1", "model.onnx.data.2"]
    sizes = [Path(p).stat().st_size for p in result.weights_files]
    assert sizes == [7096, 4196, 9000]  # packed largest first: the 100-byte tensor joins the third 3000-byte one
    assert int(result) == sum(sizes)
    entries = entries_of(tmp_path / "s" / "model.onnx")
    placed = [(entries[f"t{i}"]["location"], int(entries[f"t{i}"]["offset"])) for i in range(5)]
    assert placed == [
        ("model.onnx.data", 0),
        ("model.onnx.data", 4096),
        ("model.onnx.data.1", 0),
        ("model.onnx.data.2", 0),  # larger than the cap: a file of its own
        ("model.onnx.data.1", 4096),
    ]
    for name, entry in entries.items():  # every tensor whole inside its file
        size = (tmp_path / "s" / entry["location"]).stat().st_size
        assert int(entry["offset"]) + int(entry["length"]) <= size, name
    for size, path in zip(sizes, result.weights_files, strict=True):
        tensors_in_file = [e for e in entries.values() if e["location"] == Path(path).name]
        assert size <= 8192 or len(tensors_in_file) == 1


def test_shards_follow_a_custom_weights_path(tmp_path, make_external_model):
    src = make_external_model(mkdir(tmp_path / "src"), uint8_tensors([100, 100, 100]))
    (tmp_path / "out" / "w").mkdir(parents=True)

    result = align_external_data_streaming(
        src, tmp_path / "out" / "model.onnx", tmp_path / "out" / "w" / "weights.bin", alignment=0, max_shard_size=150
    )

    assert [Path(p).relative_to(tmp_path / "out").as_posix() for p in result.weights_files] == [
        "w/weights.bin",
        "w/weights.bin.1",
        "w/weights.bin.2",
    ]
    assert {e["location"] for e in entries_of(tmp_path / "out" / "model.onnx").values()} == {
        "w/weights.bin",
        "w/weights.bin.1",
        "w/weights.bin.2",
    }
    assert verify_models(src, tmp_path / "out" / "model.onnx").equal


def _dedup_source(folder: Path, build_identity_model, externalize) -> Path:
    rng = np.random.default_rng(7)
    base = rng.standard_normal(64).astype(np.float32)
    last_byte = base.copy().view(np.uint8)
    last_byte[-1] ^= 1
    other = rng.standard_normal(64).astype(np.float32)
    tensors = {
        "a": base,
        "b": base.copy(),  # same bytes, another name
        "c": last_byte.view(np.float32),  # differs only in its last byte
        "d": base.copy(),  # same bytes, in another file below
        "e": other,  # same length, different bytes
        "f": last_byte.view(np.float32).copy(),  # same bytes as c
        "g": base.astype(np.float64)[:32].astype(np.float32),  # another length
    }
    model = build_identity_model(tensors)
    externalize(model.graph.initializer, folder, lambda t: "other.bin" if t.name == "d" else "w.bin", gap=b"\x07")
    src = folder / "model.onnx"
    onnx.save_model(model, str(src))
    return src


def test_dedup_merges_exactly_the_byte_identical_tensors(tmp_path, build_identity_model, externalize):
    (tmp_path / "src").mkdir()
    src = _dedup_source(tmp_path / "src", build_identity_model, externalize)

    result = run_both(src, tmp_path / "dedup", alignment=64, dedup=True)
    plain = run_both(src, tmp_path / "plain", alignment=64)

    entries = entries_of(tmp_path / "dedup" / "s" / "model.onnx")
    offset = {name: int(entry["offset"]) for name, entry in entries.items()}
    assert offset["a"] == offset["b"] == offset["d"]
    assert offset["c"] == offset["f"] != offset["a"]
    assert len({offset["a"], offset["c"], offset["e"], offset["g"]}) == 4
    assert result.deduplicated_tensors == 3 and result.deduplicated_bytes == 3 * 256
    assert result.payload_bytes == 3 * 256 + 128
    assert result.tensors == 7
    assert (
        plain.deduplicated_tensors == 0
        and len(set(int(e["offset"]) for e in entries_of(tmp_path / "plain" / "s" / "model.onnx").values())) == 7
    )
    assert int(result) < int(plain)


def test_identical_source_ranges_are_merged_without_dedup(tmp_path, build_zoo_model):
    (tmp_path / "src").mkdir()
    zoo = build_zoo_model("shared_range", tmp_path / "src")

    result = run_both(zoo.path, tmp_path, alignment=64)

    entries = entries_of(tmp_path / "s" / "model.onnx")
    assert entries["first"]["offset"] == entries["second"]["offset"]
    assert result.deduplicated_tensors == 1 and result.deduplicated_bytes == 12


def test_dedup_merges_inline_and_external_copies(tmp_path, build_identity_model, externalize):
    same = np.arange(100, dtype=np.float32)
    model = build_identity_model({"ext": same, "inline_raw": same.copy(), "typed": same.copy()}, typed_inline=["typed"])
    (tmp_path / "src").mkdir()
    externalize([model.graph.initializer[0]], tmp_path / "src", "w.bin")
    src = tmp_path / "src" / "model.onnx"
    onnx.save_model(model, str(src))

    result = run_both(src, tmp_path, dedup=True, size_threshold=0)

    entries = entries_of(tmp_path / "s" / "model.onnx")
    assert {e["offset"] for e in entries.values()} == {"0"}
    assert result.externalized_tensors == 2 and result.deduplicated_tensors == 2 and int(result) == 400


def test_all_options_together_run_in_onnxruntime_with_equal_outputs(tmp_path, build_identity_model, externalize):
    rng = np.random.default_rng(11)
    big = rng.standard_normal(3000).astype(np.float32)
    tensors = {
        "big": big,
        "big_copy": big.copy(),
        "mid": rng.standard_normal(700).astype(np.float32),
        "small": np.array([1, 2, 3], dtype=np.int64),
        "inline_big": rng.standard_normal(2000).astype(np.float32),
        "inline_copy": big.copy(),
    }
    model = build_identity_model(tensors)
    (tmp_path / "src").mkdir()
    externalize(list(model.graph.initializer)[:4], tmp_path / "src", lambda t: f"{t.name}.bin")
    src = tmp_path / "src" / "model.onnx"
    onnx.save_model(model, str(src))

    result = run_both(
        src, tmp_path, alignment=4096, align_threshold=1024, max_shard_size=16384, dedup=True, size_threshold=1024
    )

    assert len(result.weights_files) >= 2
    assert result.externalized_tensors == 2 and result.deduplicated_tensors == 2
    before = ort.InferenceSession(str(src)).run(None, {})
    after = ort.InferenceSession(str(tmp_path / "s" / "model.onnx")).run(None, {})
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x, y)


def test_source_model_may_be_the_destination_with_shards(tmp_path, make_external_model, sha256_of_tree):
    tensors = uint8_tensors([500, 500, 500])
    src = make_external_model(mkdir(tmp_path / "src"), tensors)
    reference = make_external_model(mkdir(tmp_path / "ref"), tensors)

    result = align_external_data_streaming(src, src, tmp_path / "src" / "new.bin", max_shard_size=600)

    assert len(result.weights_files) == 3
    assert verify_models(reference, src).equal


@pytest.mark.parametrize("aligner", ["streaming", "in_memory"])
def test_results_report_methods_and_clone_eligible_bytes(tmp_path, make_external_model, aligner):
    src = make_external_model(mkdir(tmp_path / "src"), uint8_tensors([5000, 7000]))
    function = align_external_data_streaming if aligner == "streaming" else align_external_data_in_memory

    result = function(src, tmp_path / "out.onnx", max_shard_size=6000)

    assert sum(result.bytes_by_method.values()) == result.payload_bytes == 12000
    assert set(result.bytes_by_method) == set(result.copy_methods)
    assert 0 <= result.clone_eligible_bytes <= result.payload_bytes
    if aligner == "in_memory":
        assert result.copy_methods == {"pread_pwrite"} and result.clone_eligible_bytes == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    alignment=st.sampled_from([0, 1, 8, 64, 4096]),
    align_threshold=st.sampled_from([0, 1, 16, 100]),
    max_shard_size=st.sampled_from([None, 1, 64, 300, 5000]),
    dedup=st.booleans(),
    size_threshold=st.sampled_from([None, 0, 1, 20, 40, 100]),
    chunk_size=st.integers(min_value=1, max_value=200),
)
def test_generated_models_with_every_option_stream_exactly_like_in_memory(
    tmp_path_factory,
    build_identity_model,
    externalize,
    data,
    alignment,
    align_threshold,
    max_shard_size,
    dedup,
    size_threshold,
    chunk_size,
):
    dtypes = [np.float32, np.int8, np.int64, np.float16, np.bool_]
    count = data.draw(st.integers(min_value=1, max_value=8), label="tensor count")
    tensors = {}
    for index in range(count):
        dtype = data.draw(st.sampled_from(dtypes), label=f"dtype {index}")
        size = data.draw(st.integers(min_value=0, max_value=60), label=f"size {index}")
        seed = data.draw(st.integers(min_value=0, max_value=2), label=f"content {index}")  # few contents: duplicates
        tensors[f"t{index}"] = ((np.arange(size) + seed) % 5).astype(dtype)
    storage = data.draw(
        st.lists(st.sampled_from(["a.bin", "b.bin", "raw", "typed"]), min_size=count, max_size=count), label="storage"
    )
    folder = tmp_path_factory.mktemp("gen")
    model = build_identity_model(tensors, typed_inline=[f"t{i}" for i, s in enumerate(storage) if s == "typed"])
    to_move = [t for t, s in zip(model.graph.initializer, storage, strict=True) if s.endswith(".bin")]
    externalize(to_move, folder, lambda t: storage[int(t.name[1:])], gap=b"\x01\x02")
    src = folder / "model.onnx"
    onnx.save_model(model, str(src))

    result = run_both(
        src,
        folder,
        alignment=alignment,
        align_threshold=align_threshold,
        max_shard_size=max_shard_size,
        dedup=dedup,
        size_threshold=size_threshold,
        chunk_size=chunk_size,
    )

    entries = entries_of(folder / "s" / "model.onnx")
    step = max(alignment, 1)
    for entry in entries.values():
        size = (folder / "s" / entry["location"]).stat().st_size
        assert int(entry["offset"]) + int(entry["length"]) <= size
        if int(entry["length"]) == 0:  # at the end of its file (onnx 1.17 reads length 0 as the rest of the file)
            assert int(entry["offset"]) == size
        elif int(entry["length"]) >= align_threshold:
            assert int(entry["offset"]) % step == 0
    if max_shard_size is not None:
        for path in result.weights_files:
            # An oversized blob has a file of its own, but for zero-length blobs at its end (they add no byte).
            held = [e for e in entries.values() if e["location"] == Path(path).name and int(e["length"])]
            assert Path(path).stat().st_size <= max_shard_size or len({e["offset"] for e in held}) == 1


OPTION_SETS = {
    "threshold+dedup": {"alignment": 64, "align_threshold": 16, "dedup": True},
    "shards+inline": {"alignment": 4096, "max_shard_size": 64, "size_threshold": 0},
    "everything": {"alignment": 64, "align_threshold": 8, "max_shard_size": 100, "dedup": True, "size_threshold": 4},
}


@pytest.mark.parametrize("options", sorted(OPTION_SETS))
def test_zoo_models_with_option_sets_match_in_memory_verify_and_run(tmp_path, zoo_model, options):
    result = run_both(zoo_model.path, tmp_path / "out", **OPTION_SETS[options])

    assert result.tensors >= 1
    aligned = tmp_path / "out" / "s" / "model.onnx"
    before = onnxruntime_session(zoo_model.path).run(None, zoo_model.feeds)
    after = onnxruntime_session(aligned).run(None, zoo_model.feeds)
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("aligner", [align_external_data_streaming, align_external_data_in_memory])
def test_fewer_shards_than_an_earlier_run_leave_its_extra_files_named_not_deleted(
    tmp_path, make_external_model, aligner, caplog
):
    src = make_external_model(mkdir(tmp_path / "src"), uint8_tensors([5000, 5000, 5000, 9000]))
    out = mkdir(tmp_path / "out")
    first = aligner(src, out / "model.onnx", alignment=4096, max_shard_size=8192)  # no two tensors fit together
    assert len(first.weights_files) == 4 and first.stale_weights_files == ()
    # Look-alikes that are not shard names of this destination: never listed.
    for name in ("model.onnx.data.01", "model.onnx.data.x", "model.onnx.data.-1", "model.onnx.data.4.tmp"):
        (out / name).write_bytes(b"other")
    left = {name: (out / name).read_bytes() for name in ("model.onnx.data.2", "model.onnx.data.3")}

    with caplog.at_level("WARNING", logger="onnx_light_ref.io._align"):
        second = aligner(src, out / "model.onnx", alignment=4096, max_shard_size=1 << 20)

    assert [Path(p).name for p in second.weights_files] == ["model.onnx.data"]
    stale = [str(out / "model.onnx.data.1"), str(out / "model.onnx.data.2"), str(out / "model.onnx.data.3")]
    assert list(second.stale_weights_files) == stale
    assert {name: (out / name).read_bytes() for name in left} == left  # untouched
    assert {e["location"] for e in entries_of(out / "model.onnx").values()} == {"model.onnx.data"}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and all(path in warnings[0] for path in stale), warnings
    assert "not deleted" in warnings[0] and str(out / "model.onnx") in warnings[0]
    assert verify_models(src, out / "model.onnx").equal


def test_a_run_writing_no_weights_file_names_the_one_an_earlier_run_left(tmp_path, build_identity_model):
    out = mkdir(tmp_path / "out")
    src = tmp_path / "inline.onnx"
    onnx.save_model(build_identity_model({"a": np.arange(4, dtype=np.float32)}), str(src))
    (out / "model.onnx.data").write_bytes(b"from before")
    (out / "model.onnx.data.1").write_bytes(b"from before")

    result = align_external_data_streaming(src, out / "model.onnx")

    assert result == 0 and result.weights_files == ()
    assert list(result.stale_weights_files) == [str(out / "model.onnx.data"), str(out / "model.onnx.data.1")]
    assert (out / "model.onnx.data").read_bytes() == b"from before"


def test_a_source_named_like_a_further_shard_is_not_called_stale(tmp_path, make_external_model):
    # The source's weights are out.onnx.data.3, next to the destination out.onnx: a shard name, but read by this run.
    src = make_external_model(tmp_path, uint8_tensors([100, 100]), location="out.onnx.data.3")
    (tmp_path / "out.onnx.data.7").symlink_to(tmp_path / "out.onnx.data.3")  # the same file under another name
    source_bytes = (tmp_path / "out.onnx.data.3").read_bytes()

    result = align_external_data_streaming(src, tmp_path / "out.onnx", alignment=64)

    assert result.weights_files == (str(tmp_path / "out.onnx.data"),)
    assert result.stale_weights_files == ()
    assert (tmp_path / "out.onnx.data.3").read_bytes() == source_bytes
    assert verify_models(src, tmp_path / "out.onnx").equal
