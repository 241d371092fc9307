"""Re-aligning a saved model's external weights: the files a user gets, checked byte by byte and by real consumers."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnx.external_data_helper import _get_all_tensors

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming, errors
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read.walker import iter_tensors
from tests.checks import assert_no_temp_files, onnxruntime_session, sha256_of_tree
from tests.models import externalize, identity_model, make_external_model
from tests.zoo import build_zoo_model, model_facts, reference_tensors

ALIGNMENTS = [0, 1, 64, 4096, 65536]
CHUNK_SIZES = [7, 4096, 4 * 1024 * 1024]


def external_facts(facts):
    return [f for f in facts if f.entries is not None]


def test_reference_arithmetic_28_12_68_bytes_at_alignment_64(tmp_path):
    src = make_external_model(tmp_path, reference_tensors())
    dst = tmp_path / "aligned.onnx"

    total = align_external_data_streaming(src, dst, tmp_path / "aligned.data", alignment=64, chunk_size=7)

    weights = tmp_path / "aligned.data"
    assert total == 196 == weights.stat().st_size
    model = onnx.load_model(str(dst), load_external_data=False)
    data = weights.read_bytes()
    for tensor, expected_offset in zip(model.graph.initializer, [0, 64, 128], strict=True):
        entries = {e.key: e.value for e in tensor.external_data}
        assert tensor.data_location == onnx.TensorProto.EXTERNAL
        assert [e.key for e in tensor.external_data] == ["location", "offset", "length"]
        assert entries["location"] == "aligned.data"
        assert int(entries["offset"]) == expected_offset
        expected = reference_tensors()[tensor.name].tobytes()
        assert int(entries["length"]) == len(expected)
        assert data[expected_offset : expected_offset + len(expected)] == expected
    # Padding is zeros: 28 bytes of w0, then 36 zero bytes up to 64; 12 bytes of w1, then 52 up to 128.
    assert data[28:64] == bytes(36)
    assert data[76:128] == bytes(52)


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_several_source_files_merge_into_one_aligned_file(tmp_path, alignment, chunk_size):
    src = build_zoo_model("several_files", tmp_path).path
    before = model_facts(src)
    assert len({f.entries["location"] for f in before}) == 3

    total = align_external_data_streaming(src, tmp_path / "out.onnx", alignment=alignment, chunk_size=chunk_size)

    after = model_facts(tmp_path / "out.onnx")
    weights = tmp_path / "out.onnx.data"
    assert total == weights.stat().st_size
    assert {f.entries["location"] for f in after} == {"out.onnx.data"}
    assert [f.payload for f in after] == [f.payload for f in before]
    offsets = [int(f.entries["offset"]) for f in after]
    assert all(offset % max(alignment, 1) == 0 for offset in offsets)
    if alignment <= 1:  # packed: every tensor right after the previous one, no padding at all
        lengths = [len(f.payload) for f in after]
        assert offsets == [sum(lengths[:i]) for i in range(len(lengths))]
        assert total == sum(lengths)
    # No trailing padding: the file ends with the last tensor.
    last = max(after, key=lambda f: int(f.entries["offset"]))
    assert total == int(last.entries["offset"]) + len(last.payload)


@pytest.mark.parametrize("chunk_size", [7, 4 * 1024 * 1024])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_streaming_and_in_memory_write_identical_files(tmp_path, zoo_model, alignment, chunk_size):
    streamed = align_external_data_streaming(
        zoo_model.path, tmp_path / "s.onnx", tmp_path / "w.bin", alignment=alignment, chunk_size=chunk_size
    )
    in_memory = align_external_data_in_memory(zoo_model.path, tmp_path / "m.onnx", tmp_path / "w2.bin", alignment)

    assert streamed == in_memory
    assert (tmp_path / "w.bin").read_bytes() == (tmp_path / "w2.bin").read_bytes()
    # Identical models except for the weights file name.
    assert _with_location(tmp_path / "s.onnx", "X") == _with_location(tmp_path / "m.onnx", "X")
    source = model_facts(zoo_model.path)
    result = model_facts(tmp_path / "s.onnx")
    assert [(f.where, f.name, f.payload, f.entries is None) for f in result] == [
        (f.where, f.name, f.payload, f.entries is None) for f in source
    ]
    for fact in external_facts(result):
        offset = int(fact.entries["offset"])
        if int(fact.entries["length"]) == 0:  # at the end of its file: onnx 1.17 reads length 0 as "to the end"
            assert offset == (tmp_path / fact.entries["location"]).stat().st_size
        else:
            assert offset % max(alignment, 1) == 0
        assert offset <= streamed


def _with_location(path: Path, location: str) -> onnx.ModelProto:
    model = onnx.load_model(str(path), load_external_data=False)
    for site in iter_tensors(model):
        for entry in site.tensor.external_data:
            if entry.key == "location":
                entry.value = location
    return model


def test_onnx_loads_the_aligned_model_with_the_source_values(tmp_path, zoo_model):
    align_external_data_streaming(zoo_model.path, tmp_path / "out.onnx", alignment=4096)

    source = onnx.load_model(str(zoo_model.path))
    aligned = onnx.load_model(str(tmp_path / "out.onnx"))

    if zoo_model.name != "sparse":  # onnx's checker cannot read external sparse tensors, in the source model either
        onnx.checker.check_model(str(tmp_path / "out.onnx"))  # checks every location and range on disk
    pairs = list(zip(_get_all_tensors(source), _get_all_tensors(aligned), strict=True))
    assert pairs
    for src_tensor, dst_tensor in pairs:
        np.testing.assert_array_equal(numpy_helper.to_array(dst_tensor), _source_array(src_tensor))


def _source_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The source's value as onnx loads it; an empty tensor from its dims: the zoo's source puts one mid-file, which
    onnx 1.17 loads as the rest of the file (the aligned model, with empty tensors at the end, loads everywhere)."""
    if 0 in tensor.dims:
        return np.zeros(tuple(tensor.dims), dtype=helper.tensor_dtype_to_np_dtype(tensor.data_type))
    return numpy_helper.to_array(tensor)


def test_onnx_ir_loads_the_aligned_initializers(tmp_path, zoo_model):
    align_external_data_streaming(zoo_model.path, tmp_path / "out.onnx", alignment=65536)

    source = ir.load(zoo_model.path)
    aligned = ir.load(tmp_path / "out.onnx")

    assert aligned.graph.initializers.keys() == source.graph.initializers.keys()
    for name, value in source.graph.initializers.items():
        np.testing.assert_array_equal(aligned.graph.initializers[name].const_value.numpy(), value.const_value.numpy())


def test_onnxruntime_outputs_are_identical(tmp_path, zoo_model):
    align_external_data_streaming(zoo_model.path, tmp_path / "out.onnx", alignment=4096)

    def run(path: Path) -> list[np.ndarray]:
        return onnxruntime_session(path).run(None, zoo_model.feeds)

    expected = run(zoo_model.path)
    for got, want in zip(run(tmp_path / "out.onnx"), expected, strict=True):
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


def test_sources_are_never_modified(tmp_path, zoo_model):
    before = sha256_of_tree(zoo_model.path.parent)

    align_external_data_streaming(zoo_model.path, tmp_path / "out.onnx", alignment=64, chunk_size=5)

    assert sha256_of_tree(zoo_model.path.parent) == before
    assert_no_temp_files(tmp_path)


def test_tensors_in_subgraphs_constants_sparse_and_functions_move_to_the_new_file(tmp_path):
    for name, expected_where in [
        ("subgraphs", ["then_branch", "else_branch", "body"]),
        ("constants", ["/ value", "then_branch", "else_branch"]),
        ("function", ["function ai.test::AddBias"]),
        ("sparse", []),
    ]:
        folder = tmp_path / name
        folder.mkdir()
        src = build_zoo_model(name, folder).path
        align_external_data_streaming(src, folder / "out.onnx", alignment=64)
        model = onnx.load_model(str(folder / "out.onnx"), load_external_data=False)
        sites = list(iter_tensors(model))
        for fragment in expected_where:
            assert any(fragment in site.where for site in sites), (name, fragment)
        for site in sites:
            locations = [e.value for e in site.tensor.external_data if e.key == "location"]
            assert locations == ["out.onnx.data"], (name, site.where)
        if name == "sparse":
            sparse = model.graph.sparse_initializer[0]
            values = np.frombuffer(_read_external(folder, sparse.values), dtype=np.float32)
            indices = np.frombuffer(_read_external(folder, sparse.indices), dtype=np.int64)
            assert values.tolist() == [1.5, -2.5, 3.5]
            assert indices.tolist() == [1, 4, 8]


def _read_external(folder: Path, tensor: onnx.TensorProto) -> bytes:
    entries = {e.key: e.value for e in tensor.external_data}
    with open(folder / entries["location"], "rb") as data_file:
        data_file.seek(int(entries["offset"]))
        return data_file.read(int(entries["length"]))


def test_inline_tensors_stay_inline_with_their_bytes(tmp_path):
    src = build_zoo_model("inline_mixed", tmp_path).path
    source = {t.name: t for t in onnx.load_model(str(src), load_external_data=False).graph.initializer}
    assert source["small_raw"].data_location != onnx.TensorProto.EXTERNAL
    assert source["typed"].int64_data

    align_external_data_streaming(src, tmp_path / "out.onnx", alignment=4096)

    aligned = {
        t.name: t for t in onnx.load_model(str(tmp_path / "out.onnx"), load_external_data=False).graph.initializer
    }
    for name in ("small_raw", "typed"):
        assert aligned[name] == source[name]
    assert aligned["small_raw"].raw_data == np.array([7.0, 8.0], dtype=np.float32).tobytes()
    assert (tmp_path / "out.onnx.data").stat().st_size == 4096 + 400


def test_checksum_entries_are_kept(tmp_path):
    src = build_zoo_model("checksum", tmp_path).path
    source = onnx.load_model(str(src), load_external_data=False)

    align_external_data_streaming(src, tmp_path / "out.onnx", alignment=64)

    aligned = onnx.load_model(str(tmp_path / "out.onnx"), load_external_data=False)
    for src_tensor, dst_tensor in zip(source.graph.initializer, aligned.graph.initializer, strict=True):
        keys = [e.key for e in dst_tensor.external_data]
        assert keys == ["location", "offset", "length", "checksum"]
        assert dst_tensor.external_data[3].value == next(
            e.value for e in src_tensor.external_data if e.key == "checksum"
        )


def test_a_basepath_entry_is_refused_as_onnxruntime_refuses_it(tmp_path):
    src = make_external_model(tmp_path, {"a": np.arange(3, dtype=np.float32)})
    model = onnx.load_model(str(src), load_external_data=False)
    model.graph.initializer[0].external_data.add(key="basepath", value="")
    onnx.save_model(model, str(src))
    refused = ort.capi.onnxruntime_pybind11_state
    # onnxruntime >= 1.21 raises Fail, 1.20 (the floor) RuntimeException: both say "model format error".
    with pytest.raises((refused.Fail, refused.RuntimeException), match="model format error"):
        ort.InferenceSession(str(src))

    with pytest.raises(
        errors.ExternalDataError, match=r"unknown external_data keys \['basepath'\].*onnxruntime refuses"
    ):
        align_external_data_streaming(src, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_entries_in_another_order_are_rewritten_canonically(tmp_path):
    src = make_external_model(tmp_path, {"a": np.arange(3, dtype=np.float32), "b": np.ones(5, dtype=np.int64)})
    model = onnx.load_model(str(src), load_external_data=False)
    a, b = model.graph.initializer
    for tensor, order in ((a, ["length", "location", "offset"]), (b, ["offset", "location", "length"])):
        values = {e.key: e.value for e in tensor.external_data}
        del tensor.external_data[:]
        for key in order:
            tensor.external_data.add(key=key, value=values[key])
    onnx.save_model(model, str(src))

    align_external_data_streaming(src, tmp_path / "out.onnx", alignment=64)

    aligned = onnx.load_model(str(tmp_path / "out.onnx"), load_external_data=False)
    assert [[(e.key, e.value) for e in t.external_data] for t in aligned.graph.initializer] == [
        [("location", "out.onnx.data"), ("offset", "0"), ("length", "12")],
        [("location", "out.onnx.data"), ("offset", "64"), ("length", "40")],
    ]
    loaded = onnx.load_model(str(tmp_path / "out.onnx"))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[1]), np.ones(5, dtype=np.int64))


def test_zero_length_tensors_sit_at_the_end_of_the_file_on_every_onnx(tmp_path):
    src = build_zoo_model("zero_length", tmp_path).path

    total = align_external_data_streaming(src, tmp_path / "out.onnx", alignment=64)

    model = onnx.load_model(str(tmp_path / "out.onnx"), load_external_data=False)
    entries = {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer}
    offsets = {name: int(e["offset"]) for name, e in entries.items()}
    # a: 40 bytes at 0; b (12 bytes) at 64, so the file ends at 76; both empty tensors point there, at the end,
    # where even onnx 1.17 (which reads length 0 as "the rest of the file") finds zero bytes. No trailing padding.
    assert offsets == {"a": 0, "empty_mid": 76, "b": 64, "empty_last": 76}
    assert entries["empty_mid"]["length"] == entries["empty_last"]["length"] == "0"
    assert total == 76 == (tmp_path / "out.onnx.data").stat().st_size
    loaded = onnx.load_model(str(tmp_path / "out.onnx"))
    arrays = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert arrays["empty_last"].shape == (0, 4) and arrays["empty_mid"].size == 0
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)
    report = build_layout_report(tmp_path / "out.onnx")
    assert report.ok and report.common_alignment == 64  # the empty tensors' offset 76 holds no byte to align


def test_identical_source_ranges_are_stored_once(tmp_path):
    src = build_zoo_model("shared_range", tmp_path).path

    total = align_external_data_streaming(src, tmp_path / "out.onnx", alignment=64)

    model = onnx.load_model(str(tmp_path / "out.onnx"), load_external_data=False)
    offsets = {t.name: int(t.external_data[1].value) for t in model.graph.initializer}
    assert offsets == {"first": 0, "other": 64, "second": 0}
    assert total == 64 + 16


def test_model_without_external_tensors_returns_zero_and_writes_no_weights(tmp_path):
    src = tmp_path / "inline.onnx"
    onnx.save_model(identity_model({"w": np.arange(4, dtype=np.float32)}), str(src))

    total = align_external_data_streaming(src, tmp_path / "out.onnx")

    assert total == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inline.onnx", "out.onnx"]
    assert onnx.load_model(str(tmp_path / "out.onnx")) == onnx.load_model(str(src))


def test_destination_model_may_overwrite_the_source_model(tmp_path):
    src = make_external_model(tmp_path, reference_tensors())
    old_weights = (tmp_path / "model.onnx.data").read_bytes()

    total = align_external_data_streaming(src, src, tmp_path / "model.aligned.data", alignment=64)

    assert total == 196
    assert (tmp_path / "model.onnx.data").read_bytes() == old_weights
    metadata = onnx.load_model(str(src), load_external_data=False)
    assert {t.external_data[0].value for t in metadata.graph.initializer} == {"model.aligned.data"}
    loaded = onnx.load_model(str(src))
    for tensor in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), reference_tensors()[tensor.name])


def test_weights_in_a_subfolder_are_referenced_as_sub_path(tmp_path):
    src = make_external_model(tmp_path, reference_tensors())
    (tmp_path / "sub").mkdir()

    align_external_data_streaming(src, tmp_path / "out.onnx", tmp_path / "sub" / "w.bin", alignment=64)

    metadata = onnx.load_model(str(tmp_path / "out.onnx"), load_external_data=False)
    assert {t.external_data[0].value for t in metadata.graph.initializer} == {"sub/w.bin"}
    loaded = onnx.load_model(str(tmp_path / "out.onnx"))
    for tensor in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), reference_tensors()[tensor.name])


def test_progress_reports_bytes_monotonically_up_to_the_total(tmp_path):
    src = make_external_model(tmp_path, reference_tensors())
    calls: list[tuple[int, int]] = []

    align_external_data_streaming(
        src, tmp_path / "out.onnx", alignment=64, chunk_size=5, progress=lambda d, t: calls.append((d, t))
    )

    assert len(calls) > 3
    assert {total for _, total in calls} == {108}
    done = [d for d, _ in calls]
    assert done == sorted(done)
    assert done[-1] == 108


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    alignment=st.sampled_from([0, 1, 2, 8, 64, 512, 4096]),
    chunk_size=st.integers(min_value=1, max_value=300),
)
def test_generated_models_stream_exactly_like_in_memory(tmp_path_factory, data, alignment, chunk_size):
    dtypes = [np.float32, np.float64, np.int8, np.int64, np.uint16, np.float16, np.bool_]
    count = data.draw(st.integers(min_value=1, max_value=8), label="tensor count")
    tensors = {}
    for index in range(count):
        dtype = data.draw(st.sampled_from(dtypes), label=f"dtype {index}")
        size = data.draw(st.integers(min_value=0, max_value=40), label=f"size {index}")
        tensors[f"t{index}"] = (np.arange(size) % 7).astype(dtype)
    files = data.draw(st.lists(st.sampled_from(["a.bin", "b.bin", "d/c.bin"]), min_size=count, max_size=count))
    inline = data.draw(st.lists(st.booleans(), min_size=count, max_size=count), label="inline")
    gap = data.draw(st.binary(max_size=9), label="gap")
    folder = tmp_path_factory.mktemp("gen")
    model = identity_model(tensors)
    to_move = [t for t, keep in zip(model.graph.initializer, inline, strict=True) if not keep]
    externalize(to_move, folder, lambda t: files[int(t.name[1:])], gap=gap)
    src = folder / "model.onnx"
    onnx.save_model(model, str(src))

    streamed = align_external_data_streaming(src, folder / "s.onnx", alignment=alignment, chunk_size=chunk_size)
    in_memory = align_external_data_in_memory(src, folder / "m.onnx", folder / "s.onnx.data.copy", alignment)

    assert streamed == in_memory
    if to_move:
        assert (folder / "s.onnx.data").read_bytes() == (folder / "s.onnx.data.copy").read_bytes()
    else:
        assert streamed == 0
        assert not (folder / "s.onnx.data").exists()
    s_facts, m_facts = model_facts(folder / "s.onnx"), model_facts(folder / "m.onnx")
    assert [(f.entry_keys, f.payload) for f in s_facts] == [(f.entry_keys, f.payload) for f in m_facts]
    assert [f.payload for f in s_facts] == [f.payload for f in model_facts(src)]
    for s_fact, m_fact in zip(s_facts, m_facts, strict=True):
        if s_fact.entries is not None:
            assert {**s_fact.entries, "location": "x"} == {**m_fact.entries, "location": "x"}


def test_the_in_memory_twin_takes_the_streaming_parameters_but_chunk_size():
    """Its docstring says so instead of repeating each option (issue 39): names, order, kinds, defaults, types."""
    streaming = inspect.signature(align_external_data_streaming)
    in_memory = inspect.signature(align_external_data_in_memory)
    assert [p for name, p in streaming.parameters.items() if name != "chunk_size"] == list(
        in_memory.parameters.values()
    )
    assert streaming.return_annotation == in_memory.return_annotation
    with pytest.raises(
        TypeError, match=r"align_external_data_in_memory\(\) got an unexpected keyword argument 'chunk_size'"
    ):
        align_external_data_in_memory("a.onnx", "b.onnx", chunk_size=1)  # type: ignore[call-arg]
