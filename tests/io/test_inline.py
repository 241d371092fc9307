"""Inline tensors moved to aligned external data (issue 12): ``size_threshold`` on both aligners.

Sources are real single-file models (and zoo models made inline with onnx's own loader); outputs are compared byte
for byte between the streaming and in-memory aligners, verified against the source and run in onnxruntime.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._align import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._verify import verify_models
from tests.checks import onnxruntime_session

OPSET = 18
IR_VERSION = 10
ALIGNERS = ["streaming", "in_memory"]


def align(aligner: str, src: Path, dst: Path, **options: object):
    function = align_external_data_streaming if aligner == "streaming" else align_external_data_in_memory
    return function(src, dst, **options)


def both(src: Path, out: Path, **options: object):
    """Both aligners into ``out/s`` and ``out/m``: identical bytes, verified against the source."""
    for sub in ("s", "m"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    streamed = align_external_data_streaming(src, out / "s" / "model.onnx", **options)
    in_memory = align_external_data_in_memory(src, out / "m" / "model.onnx", **options)
    assert (out / "s" / "model.onnx").read_bytes() == (out / "m" / "model.onnx").read_bytes()
    for s_path, m_path in zip(streamed.weights_files, in_memory.weights_files, strict=True):
        assert Path(s_path).read_bytes() == Path(m_path).read_bytes()
    assert int(streamed) == int(in_memory) and streamed.externalized_tensors == in_memory.externalized_tensors
    assert b"\x00olrwire" not in (out / "s" / "model.onnx").read_bytes()  # no placeholder published
    verified = verify_models(src, out / "s" / "model.onnx")
    assert verified.equal, verified
    return streamed


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def storage_list(path: Path) -> list[tuple[str, str]]:
    """``(tensor label, "external" | "raw" | "typed" | "other")`` for every tensor of the model at ``path``."""
    model = onnx.load_model(str(path), load_external_data=False)
    kinds = []
    for site in iter_tensors(model):
        tensor = site.tensor
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            kind = "external"
        elif tensor.HasField("raw_data"):
            kind = "raw"
        elif any(len(getattr(tensor, f)) for f in _TYPED_FIELDS):
            kind = "typed"
        else:
            kind = "other"
        kinds.append((site.label, kind))
    return kinds


def storage(path: Path) -> dict[str, str]:
    return dict(storage_list(path))


def run(path: Path, feeds: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    return onnxruntime_session(path).run(None, feeds or {})


def save_inline(model: onnx.ModelProto, folder: Path, name: str = "model.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save_model(model, str(path))
    return path


def test_inline_only_model_large_tensors_are_copied_out_of_the_onnx_file(tmp_path, build_identity_model):
    rng = np.random.default_rng(1)
    tensors = {
        "big": rng.standard_normal(3000).astype(np.float32),
        "small": np.array([1.0, 2.0], dtype=np.float32),
        "big_i64": np.arange(500, dtype=np.int64),
    }
    src = save_inline(build_identity_model(tensors), tmp_path / "src")

    result = both(src, tmp_path, size_threshold=1024, alignment=4096)

    assert storage(tmp_path / "s" / "model.onnx") == {"big": "external", "small": "raw", "big_i64": "external"}
    assert result.externalized_tensors == 2 and result.tensors == 2
    # Stripped payloads go file to file (copy engine), never through a Python buffer.
    assert result.bytes_by_method.get("pread_pwrite", 0) == 0
    assert sum(result.bytes_by_method.values()) == 12000 + 4000
    assert (tmp_path / "s" / "model.onnx").stat().st_size < 1000
    for x, y in zip(run(src), run(tmp_path / "s" / "model.onnx"), strict=True):
        np.testing.assert_array_equal(x, y)


def test_default_keeps_inline_tensors_inline(tmp_path, build_identity_model):
    src = save_inline(build_identity_model({"big": np.arange(3000, dtype=np.float32)}), tmp_path / "src")

    result = both(src, tmp_path)

    assert int(result) == 0 and result.weights_files == ()
    assert storage(tmp_path / "s" / "model.onnx") == {"big": "raw"}


def test_mixed_external_in_several_files_and_inline(tmp_path, build_zoo_model):
    (tmp_path / "src").mkdir()
    zoo = build_zoo_model("inline_mixed", tmp_path / "src")

    result = both(zoo.path, tmp_path, size_threshold=0, alignment=64)

    assert storage(tmp_path / "s" / "model.onnx") == dict.fromkeys(["big", "small_raw", "typed", "big2"], "external")
    assert result.externalized_tensors == 2 and result.tensors == 4
    for x, y in zip(run(zoo.path), run(tmp_path / "s" / "model.onnx"), strict=True):
        np.testing.assert_array_equal(x, y)


TYPED = {
    "f32": np.array([1.5, -2.25, 3.0], dtype=np.float32),
    "f64": np.array([[1.0, 2.0], [3.5, -4.0]]),
    "i64": np.array([1, -2, 3, 2**40], dtype=np.int64),
    "i32": np.array([7, -8], dtype=np.int32),
    "i8": np.array([-1, 2, -3], dtype=np.int8),
    "u16": np.array([1, 65535], dtype=np.uint16),
    "f16": np.array([0.5, -1.25, 2.0], dtype=np.float16),
    "b": np.array([True, False, True]),
    "u64": np.array([2**63 + 5, 1], dtype=np.uint64),
}


def test_typed_field_tensors_come_out_with_the_same_values(tmp_path, build_identity_model):
    src = save_inline(build_identity_model(TYPED, typed_inline=list(TYPED)), tmp_path / "src")
    assert set(storage(src).values()) == {"typed"}

    result = both(src, tmp_path, size_threshold=1, alignment=16)

    assert set(storage(tmp_path / "s" / "model.onnx").values()) == {"external"}
    assert result.externalized_tensors == len(TYPED)
    assert result.bytes_by_method == {"pread_pwrite": sum(a.nbytes for a in TYPED.values())}
    loaded = onnx.load_model(str(tmp_path / "s" / "model.onnx"))
    for tensor in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), TYPED[tensor.name])
    for x, y in zip(run(src), run(tmp_path / "s" / "model.onnx"), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["subgraphs", "constants", "function", "sparse"])
def test_zoo_models_made_inline_externalize_every_site(tmp_path, build_zoo_model, name):
    (tmp_path / "zoo").mkdir()
    zoo = build_zoo_model(name, tmp_path / "zoo")
    # onnx's own loader brings the external data back inline (sparse tensors stay external: onnx does not load them)
    inline = onnx.load_model(str(zoo.path))
    src = save_inline(inline, tmp_path / "zoo", "inline.onnx")
    before = [kind for _, kind in storage_list(src)]
    assert "raw" in before

    result = both(src, tmp_path, size_threshold=0, alignment=64)

    after = [kind for _, kind in storage_list(tmp_path / "s" / "model.onnx")]
    assert set(after) == {"external"}
    assert result.externalized_tensors == before.count("raw")
    for x, y in zip(run(zoo.path, zoo.feeds), run(tmp_path / "s" / "model.onnx", zoo.feeds), strict=True):
        np.testing.assert_array_equal(x, y)


def test_inline_sparse_and_attribute_tensors_with_payloads_are_copied_from_the_file(tmp_path):
    values = numpy_helper.from_array(np.arange(40, dtype=np.float32), "sp")
    indices = numpy_helper.from_array(np.arange(0, 80, 2, dtype=np.int64), "")
    sparse = helper.make_sparse_tensor(values, indices, [80])
    constant = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(50, np.float32), "cv"))
    graph = helper.make_graph(
        [constant, helper.make_node("Identity", ["sp"], ["out_sp"])],
        "g",
        [],
        [
            helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [50]),
            helper.make_tensor_value_info("out_sp", onnx.TensorProto.FLOAT, [80]),
        ],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    src = save_inline(model, tmp_path / "src")

    result = both(src, tmp_path, size_threshold=100)

    # onnx.load never reads a sparse tensor's external data back: the sparse values and indices stay inline
    # (onnx's own saver never externalizes them either); the Constant's tensor moves.
    assert result.externalized_tensors == 1
    assert result.kept_inline_tensors == 2 and result.kept_inline_reasons == {"sparse tensor": 2}
    assert [kind for _, kind in storage_list(tmp_path / "s" / "model.onnx")] == ["raw", "raw", "external"]
    assert result.bytes_by_method.get("pread_pwrite", 0) == 0  # copied out of the .onnx
    # (full_check's shape inference refuses Identity on a sparse input whatever the storage: no full check here)
    onnx.checker.check_model(str(tmp_path / "s" / "model.onnx"))
    loaded = onnx.load(str(tmp_path / "s" / "model.onnx"), load_external_data=True)
    assert not any(site.tensor.data_location == onnx.TensorProto.EXTERNAL for site in iter_tensors(loaded))
    for x, y in zip(run(src), run(tmp_path / "s" / "model.onnx"), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_small_reshape_shape_stays_inline_with_a_sensible_threshold(tmp_path):
    weights = numpy_helper.from_array(np.arange(1024, dtype=np.float32), "w")
    shape = numpy_helper.from_array(np.array([32, 32], dtype=np.int64), "shape")  # 16 bytes
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["w", "shape"], ["y"])],
        "reshape",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[weights, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    src = save_inline(model, tmp_path / "src")

    both(src, tmp_path, size_threshold=1024)

    assert storage(tmp_path / "s" / "model.onnx") == {"w": "external", "shape": "raw"}
    (output,) = run(tmp_path / "s" / "model.onnx")
    assert output.shape == (32, 32)
    np.testing.assert_array_equal(output.ravel(), np.arange(1024, dtype=np.float32))


def test_string_and_empty_tensors_stay_inline(tmp_path):
    strings = helper.make_tensor("s", onnx.TensorProto.STRING, [2], [b"hello" * 20, b"world" * 20])
    empty = numpy_helper.from_array(np.zeros((0, 3), dtype=np.float32), "empty")
    big = numpy_helper.from_array(np.arange(64, dtype=np.float32), "big")
    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [f"out_{n}"]) for n in ("s", "empty", "big")],
        "g",
        [],
        [
            helper.make_tensor_value_info("out_s", onnx.TensorProto.STRING, [2]),
            helper.make_tensor_value_info("out_empty", onnx.TensorProto.FLOAT, [0, 3]),
            helper.make_tensor_value_info("out_big", onnx.TensorProto.FLOAT, [64]),
        ],
        initializer=[strings, empty, big],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    src = save_inline(model, tmp_path / "src")

    result = both(src, tmp_path, size_threshold=0)

    kinds = storage(tmp_path / "s" / "model.onnx")
    assert kinds["big"] == "external" and kinds["s"] != "external" and kinds["empty"] != "external"
    assert result.externalized_tensors == 1
    for x, y in zip(run(src), run(tmp_path / "s" / "model.onnx"), strict=True):
        np.testing.assert_array_equal(x, y)


def test_short_raw_payloads_below_the_placeholder_are_written_from_memory(tmp_path, build_identity_model):
    src = save_inline(build_identity_model({"tiny": np.array([1, 2, 3], dtype=np.int32)}), tmp_path / "src")

    result = both(src, tmp_path, size_threshold=4)

    assert result.externalized_tensors == 1 and result.bytes_by_method == {"pread_pwrite": 12}


def test_the_source_model_may_be_the_destination(tmp_path, build_identity_model):
    tensors = {"a": np.arange(2000, dtype=np.float32), "b": np.arange(10, dtype=np.int64)}
    src = save_inline(build_identity_model(tensors), tmp_path / "src")
    reference = save_inline(build_identity_model(tensors), tmp_path / "ref")

    result = align_external_data_streaming(src, src, size_threshold=64)

    assert result.externalized_tensors == 2
    assert verify_models(reference, src).equal
    assert src.stat().st_size < 1000


def _malformed_raw(folder: Path) -> Path:
    tensor = numpy_helper.from_array(np.arange(100, dtype=np.float32), "bad")
    tensor.raw_data = tensor.raw_data[:-4]  # 396 bytes for dims [100] float
    return save_inline(helper.make_model(helper.make_graph([], "g", [], [], initializer=[tensor])), folder)


def _malformed_typed(folder: Path) -> Path:
    tensor = helper.make_tensor("bad", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    del tensor.float_data[-1]  # two values for dims [3]
    return save_inline(helper.make_model(helper.make_graph([], "g", [], [], initializer=[tensor])), folder)


@pytest.mark.parametrize("aligner", ALIGNERS)
@pytest.mark.parametrize(
    ("make", "fragments"),
    [(_malformed_raw, ["'bad'", "396 bytes", "[100]", "400 bytes"]), (_malformed_typed, ["'bad'", "[3]"])],
)
def test_a_tensor_whose_data_does_not_fit_its_dims_is_refused(
    tmp_path, sha256_of_tree, assert_no_temp_files, aligner, make, fragments
):
    src = make(tmp_path / "src")
    before = sha256_of_tree(tmp_path)

    with pytest.raises(ExternalDataError) as raised:
        align(aligner, src, tmp_path / "src" / "out.onnx", size_threshold=0)

    for fragment in fragments:
        assert fragment in str(raised.value)
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_a_source_model_swapped_after_planning_is_refused(tmp_path, build_identity_model, monkeypatch, sha256_of_tree):
    import onnx_light_ref.io._align as align_module

    src = save_inline(build_identity_model({"a": np.arange(2000, dtype=np.float32)}), tmp_path / "src")
    real_plan = align_module.plan_alignment

    def plan_then_swap(*args, **kwargs):
        plan = real_plan(*args, **kwargs)
        copy = tmp_path / "copy.onnx"
        shutil.copyfile(src, copy)
        copy.replace(src)  # same bytes, another file
        return plan

    monkeypatch.setattr(align_module, "plan_alignment", plan_then_swap)
    with pytest.raises(ExternalDataError, match="was replaced"):
        align_external_data_streaming(src, tmp_path / "src" / "out.onnx", size_threshold=0)
    assert not (tmp_path / "src" / "out.onnx").exists()
    assert not (tmp_path / "src" / "out.onnx.data").exists()


@pytest.mark.parametrize("data_type", [onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING, 999])
def test_a_stripped_payload_that_must_stay_inline_gets_its_bytes_back(tmp_path, data_type):
    # raw_data under a data type whose size is unknown (or STRING): never externalized, but the streaming parse had
    # stripped its payload; it used to end in a bare AssertionError where the in-memory aligner succeeded.
    odd = onnx.TensorProto(name="odd", data_type=data_type, dims=[100], raw_data=bytes(range(100)))
    big = numpy_helper.from_array(np.arange(64, dtype=np.float32), "big")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["big"], ["out"])],
        "g",
        [],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [64])],
        initializer=[big, odd],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    src.write_bytes(model.SerializeToString())
    for sub in ("s", "m"):
        (tmp_path / sub).mkdir()

    streamed = align_external_data_streaming(src, tmp_path / "s" / "model.onnx", size_threshold=0)
    in_memory = align_external_data_in_memory(src, tmp_path / "m" / "model.onnx", size_threshold=0)

    assert (tmp_path / "s" / "model.onnx").read_bytes() == (tmp_path / "m" / "model.onnx").read_bytes()
    assert Path(streamed.weights_files[0]).read_bytes() == Path(in_memory.weights_files[0]).read_bytes()
    assert streamed.externalized_tensors == 1
    saved = {t.name: t for t in onnx.load_model(str(tmp_path / "s" / "model.onnx")).graph.initializer}
    assert saved["odd"].raw_data == bytes(range(100)) and saved["odd"].data_location == onnx.TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(saved["big"]), np.arange(64, dtype=np.float32))


def test_a_symlinked_source_model_is_copied_from_the_file_it_names(tmp_path, build_identity_model):
    # The Hugging Face cache layout: snapshots/<rev>/model.onnx -> ../../blobs/<sha>. The payloads are copied out of
    # the file behind the link (the copy opens sources with O_NOFOLLOW and used to call it "replaced").
    tensors = {"a": np.arange(2000, dtype=np.float32), "b": np.arange(2000, dtype=np.float32)}
    blob = save_inline(build_identity_model(tensors), tmp_path / "cache" / "blobs", "0123abcd")
    snapshot = tmp_path / "cache" / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "model.onnx").symlink_to(Path("..") / ".." / "blobs" / blob.name)
    before = blob.read_bytes()

    result = both(snapshot / "model.onnx", tmp_path / "out", size_threshold=1024, dedup=True)

    assert result.externalized_tensors == 2 and result.deduplicated_tensors == 1
    assert result.bytes_by_method.get("pread_pwrite", 0) == 0  # still file to file
    assert blob.read_bytes() == before and (snapshot / "model.onnx").is_symlink()
    for x, y in zip(run(blob), run(tmp_path / "out" / "s" / "model.onnx"), strict=True):
        np.testing.assert_array_equal(x, y)


def test_an_odd_count_of_typed_int4_values_moves_out_as_their_packed_bytes(tmp_path):
    """onnx 1.17's from_array refuses an odd INT4/UINT4 count; the aligners still write the bytes make_tensor packs."""
    tensors = [
        helper.make_tensor("i4", onnx.TensorProto.INT4, [5], [1, -2, 3, -4, 5]),
        helper.make_tensor("u4", onnx.TensorProto.UINT4, [3], [1, 2, 15]),
    ]
    graph = helper.make_graph([], "g", [], [], initializer=tensors)
    src = save_inline(helper.make_model(graph, ir_version=10), tmp_path / "src")

    result = both(src, tmp_path, size_threshold=0, alignment=4)

    assert result.externalized_tensors == 2
    model = onnx.load_model(str(tmp_path / "s" / "model.onnx"), load_external_data=False)
    entries = {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer}
    offsets = {name: int(e["offset"]) for name, e in entries.items()}
    data = (tmp_path / "s" / "model.onnx.data").read_bytes()
    assert data[offsets["i4"] : offsets["i4"] + 3].hex() == "e1c305"
    assert data[offsets["u4"] : offsets["u4"] + 2].hex() == "210f"
    assert verify_models(src, tmp_path / "s" / "model.onnx").equal
