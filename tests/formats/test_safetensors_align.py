"""Both aligners with ``weights_format="safetensors"``: files that safetensors, onnx and onnxruntime all load."""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from safetensors import safe_open

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming, verify_models
from onnx_light_ref.errors import SafetensorsError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read.locations import expected_nbytes
from tests.checks import run_onnxruntime, sha256_of_tree
from tests.models import identity_model, make_external_model, make_model, save_external, value_info
from tests.zoo import build_zoo_model

# Every ONNX type safetensors can hold that the installed onnx defines (FLOAT8E8M0, FLOAT4E2M1, INT2 and UINT2 came
# after onnx 1.17), with the code it is stored under (packed sub-byte types as U8).
DTYPES = {
    getattr(TensorProto, name): code
    for name, code in {
        "BOOL": "BOOL",
        "UINT8": "U8",
        "INT8": "I8",
        "UINT16": "U16",
        "INT16": "I16",
        "UINT32": "U32",
        "INT32": "I32",
        "UINT64": "U64",
        "INT64": "I64",
        "FLOAT16": "F16",
        "BFLOAT16": "BF16",
        "FLOAT": "F32",
        "DOUBLE": "F64",
        "COMPLEX64": "C64",
        "FLOAT8E4M3FN": "F8_E4M3",
        "FLOAT8E5M2": "F8_E5M2",
        "FLOAT8E4M3FNUZ": "F8_E4M3FNUZ",
        "FLOAT8E5M2FNUZ": "F8_E5M2FNUZ",
        "FLOAT8E8M0": "F8_E8M0",
        "INT4": "U8",
        "UINT4": "U8",
        "FLOAT4E2M1": "U8",
        "INT2": "U8",
        "UINT2": "U8",
    }.items()
    if hasattr(TensorProto, name)
}
NUMPY = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64", "C64"}


def _raw_tensor(name: str, data_type: int, dims: list[int], seed: int) -> TensorProto:
    probe = TensorProto(name=name, data_type=data_type, dims=dims)
    nbytes = expected_nbytes(probe)
    assert nbytes is not None
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 2 if data_type == TensorProto.BOOL else 256, nbytes, dtype=np.uint8).tobytes()
    return helper.make_tensor(name, data_type, dims, data, raw=True)


def _header(path: Path) -> tuple[int, dict[str, dict[str, object]]]:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return 8 + size, json.loads(raw[8 : 8 + size])


def _dtype_model(folder: Path) -> tuple[Path, dict[str, TensorProto]]:
    tensors = {
        f"t_{TensorProto.DataType.Name(dt).lower()}": _raw_tensor(
            f"t_{TensorProto.DataType.Name(dt).lower()}", dt, [3, 5], dt
        )
        for dt in DTYPES
    }
    outputs = [value_info("t_float", TensorProto.FLOAT, [3, 5])]
    graph = helper.make_graph([], "dtypes", [], outputs, list(tensors.values()))
    src = save_external(make_model(graph), folder / "src.onnx", "src.data")
    return src, tensors


@pytest.mark.parametrize("aligner", [align_external_data_streaming, align_external_data_in_memory])
def test_every_dtype_round_trips_through_safetensors_onnx_and_the_safetensors_library(
    tmp_path: Path, aligner: object
) -> None:
    src, tensors = _dtype_model(tmp_path)
    dst = tmp_path / "model.onnx"
    result = aligner(src, dst, weights_format="safetensors")  # type: ignore[operator]
    weights = tmp_path / "model.safetensors"
    assert result.weights_files == (str(weights),)
    assert int(result) == weights.stat().st_size
    data_start, header = _header(weights)
    assert data_start % 4096 == 0
    with safe_open(str(weights), framework="numpy") as f:
        assert set(f.keys()) == set(tensors)
        for name, original in tensors.items():
            code = DTYPES[original.data_type]
            assert f.get_slice(name).get_dtype() == code
            begin, end = header[name]["data_offsets"]  # type: ignore[index]
            stored = weights.read_bytes()[data_start + begin : data_start + end]
            assert stored == original.raw_data, name
            if code in NUMPY:
                assert f.get_tensor(name).tobytes() == original.raw_data, name
            if code == "U8" and original.data_type != TensorProto.UINT8:
                assert header[name]["shape"] == [len(original.raw_data)]
            else:
                assert header[name]["shape"] == list(original.dims)
    onnx.checker.check_model(str(dst), full_check=True)
    loaded = onnx.load(str(dst), load_external_data=False)
    for tensor in loaded.graph.initializer:
        entries = {e.key: e.value for e in tensor.external_data}
        assert entries["location"] == "model.safetensors"
    loaded = onnx.load(str(dst), load_external_data=True)
    assert {t.name: t.raw_data for t in loaded.graph.initializer} == {n: t.raw_data for n, t in tensors.items()}
    assert verify_models(src, dst).equal
    # Every reference agrees with the header entry of its key (packed sub-byte types: U8 of their bytes).
    assert build_layout_report(dst).ok


def test_streaming_and_in_memory_are_byte_identical_and_onnxruntime_outputs_equal(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = {
        "w1": rng.standard_normal((64, 64)).astype(np.float32),  # 16384 bytes: a multiple of 4096
        "b1": rng.standard_normal(5).astype(np.float32),
        "w2": rng.standard_normal((300,)).astype(np.float32),
        "idx": np.arange(1024, dtype=np.int64),  # 8192 bytes
    }
    src = make_external_model(tmp_path, arrays, name="src.onnx")
    a = align_external_data_streaming(src, tmp_path / "a.onnx", weights_format="safetensors", durable=False)
    b = align_external_data_in_memory(src, tmp_path / "b.onnx", weights_format="safetensors", durable=False)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert int(a) == int(b) and a.unaligned_tensors == b.unaligned_tensors
    for out in ("a.onnx", "b.onnx"):
        outputs = run_onnxruntime(tmp_path / out, {})
        for array, output in zip(arrays.values(), outputs, strict=True):
            assert np.array_equal(array, output)


def test_tensors_whose_size_is_a_multiple_of_the_alignment_come_first_and_start_aligned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    arrays = {
        "small": np.ones(3, dtype=np.float32),
        "odd_big": np.ones(1500, dtype=np.float32),  # 6000 bytes: not a multiple of 4096
        "page": np.ones(1024, dtype=np.float32),  # 4096
        "two_pages": np.ones(2048, dtype=np.float32),  # 8192
        "odd_big2": np.ones(1100, dtype=np.float32),  # 4400
    }
    src = make_external_model(tmp_path, arrays, name="src.onnx")
    with caplog.at_level(logging.WARNING):
        result = align_external_data_streaming(
            src, tmp_path / "m.onnx", weights_format="safetensors", align_threshold=4096
        )
    data_start, header = _header(tmp_path / "m.safetensors")
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])  # type: ignore[index]
    assert order == ["two_pages", "page", "odd_big", "odd_big2", "small"]
    begins = {k: data_start + header[k]["data_offsets"][0] for k in header}  # type: ignore[index]
    assert begins["two_pages"] % 4096 == 0 and begins["page"] % 4096 == 0 and begins["odd_big"] % 4096 == 0
    assert result.unaligned_tensors == ("odd_big2",)  # small is below the threshold
    assert "odd_big2" in caplog.text and "could not start aligned" in caplog.text
    model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    offsets = {t.name: int({e.key: e.value for e in t.external_data}["offset"]) for t in model.graph.initializer}
    assert offsets == begins


def test_sharded_safetensors_use_hf_names_and_an_index_published_together(tmp_path: Path) -> None:
    arrays = {f"layer{i}.weight": np.full((256,), i, dtype=np.float32) for i in range(5)}  # 1024 bytes each
    src = make_external_model(tmp_path, arrays, name="src.onnx")
    dst = tmp_path / "model.onnx"
    # The cap counts each file's header (4096 bytes: padded to the alignment): two 1 KiB tensors per file.
    result = align_external_data_streaming(src, dst, weights_format="safetensors", max_shard_size=6144)
    names = [f"model-{i:05d}-of-00003.safetensors" for i in range(1, 4)]
    assert [Path(p).name for p in result.weights_files] == names
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert result.index_file == str(tmp_path / "model.safetensors.index.json")
    assert index["metadata"] == {"total_size": 5 * 1024}
    assert index["weight_map"] == {
        "layer0.weight": names[0],
        "layer1.weight": names[0],
        "layer2.weight": names[1],
        "layer3.weight": names[1],
        "layer4.weight": names[2],
    }
    for name in names:
        with safe_open(str(tmp_path / name), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                assert np.array_equal(f.get_tensor(key), arrays[key])
    for array, output in zip(arrays.values(), run_onnxruntime(dst, {}), strict=True):
        assert np.array_equal(array, output)
    assert verify_models(src, dst).equal
    assert build_layout_report(dst).ok


def test_a_single_file_run_reports_an_index_and_shards_left_by_an_earlier_sharded_run(tmp_path: Path) -> None:
    arrays = {f"w{i}": np.full((256,), i, dtype=np.float32) for i in range(3)}
    src = make_external_model(tmp_path, arrays, name="src.onnx")
    dst = tmp_path / "model.onnx"
    align_external_data_streaming(src, dst, weights_format="safetensors", max_shard_size=1024)
    result = align_external_data_streaming(src, dst, weights_format="safetensors")
    assert sorted(Path(p).name for p in result.stale_weights_files) == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    assert (tmp_path / "model.safetensors.index.json").exists()  # reported, never deleted


def test_odd_names_are_keys_as_they_are(tmp_path: Path) -> None:
    names = ["a/b.c:0", "émoji 🙂", 'quote"back\\slash', "x" * 300]
    arrays = {name: np.full(4, i, dtype=np.int32) for i, name in enumerate(names)}
    model = identity_model({f"t{i}": a for i, a in enumerate(arrays.values())})
    for tensor, name in zip(model.graph.initializer, names, strict=True):
        tensor.name = name
    for node, name in zip(model.graph.node, names, strict=True):
        node.input[0] = name
    src = save_external(model, tmp_path / "src.onnx", "src.data")
    align_external_data_streaming(src, tmp_path / "m.onnx", weights_format="safetensors")
    with safe_open(str(tmp_path / "m.safetensors"), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(names)
        for name, array in arrays.items():
            assert np.array_equal(f.get_tensor(name), array)


def _model_with_clashing_names(folder: Path) -> Path:
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "then",
        [],
        [value_info("y", TensorProto.FLOAT, [4])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4], np.ones(4, np.float32).tobytes(), raw=True)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=then_graph)],
        "main",
        [value_info("c", TensorProto.BOOL, [])],
        [value_info("y", TensorProto.FLOAT, [4])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4], np.zeros(4, np.float32).tobytes(), raw=True)],
    )
    return save_external(make_model(graph), folder / "src.onnx", "src.data")


def test_repeated_names_across_subgraphs_are_listed_and_nothing_is_written(tmp_path: Path) -> None:
    src = _model_with_clashing_names(tmp_path)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(SafetensorsError, match=r"'w' used by 3 tensors") as info:
        align_external_data_streaming(src, tmp_path / "m.onnx", weights_format="safetensors")
    assert "then_branch" in str(info.value) and "Nothing written" in str(info.value)
    assert sha256_of_tree(tmp_path) == before


def test_unnamed_and_unstorable_tensors_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    complex128 = helper.make_tensor("c", TensorProto.COMPLEX128, [2], np.zeros(2, np.complex128).tobytes(), raw=True)
    unnamed = helper.make_tensor("", TensorProto.FLOAT, [2], np.zeros(2, np.float32).tobytes(), raw=True)
    graph = helper.make_graph([], "g", [], [value_info("c", TensorProto.COMPLEX128, [2])], [complex128])
    src = save_external(make_model(graph), tmp_path / "src.onnx", "src.data")
    before = sha256_of_tree(tmp_path)
    message = r"1 tensor\(s\) have a data type safetensors cannot store: .*COMPLEX128"
    with pytest.raises(SafetensorsError, match=message):
        align_external_data_streaming(src, tmp_path / "m.onnx", weights_format="safetensors")
    assert sha256_of_tree(tmp_path) == before
    graph = helper.make_graph([], "g", [], [value_info("c", TensorProto.FLOAT, [2])], [unnamed])
    src2 = save_external(make_model(graph), tmp_path / "src2.onnx", "src2.data")
    before = sha256_of_tree(tmp_path)
    with pytest.raises(SafetensorsError, match="without a name"):
        align_external_data_in_memory(src2, tmp_path / "m.onnx", weights_format="safetensors")
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dedup": True}, "dedup=True is refused"),
        ({"shard_names": "transformers.js"}, "safetensors shards use the 'hf' names"),
        ({"weights_format": "gguf"}, "weights_format must be"),
    ],
)
def test_options_the_format_cannot_honour_are_refused_with_a_reason(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    src = make_external_model(tmp_path, {"w": np.ones(4, np.float32)}, name="src.onnx")
    before = sha256_of_tree(tmp_path)
    kwargs = {"weights_format": "safetensors", **options}
    with pytest.raises(ValueError, match=message):
        align_external_data_streaming(src, tmp_path / "m.onnx", **kwargs)  # type: ignore[arg-type]
    assert sha256_of_tree(tmp_path) == before


def test_every_named_initializer_moves_into_safetensors_whatever_the_size_threshold(tmp_path: Path) -> None:
    """A checkpoint with holes is not a checkpoint: the 16-byte ``shape`` goes into the file too (issue 41)."""
    arrays = {"big": np.arange(2048, dtype=np.float32), "shape": np.array([2, 3], dtype=np.int64)}
    src = tmp_path / "src.onnx"
    src.write_bytes(identity_model(arrays).SerializeToString())
    result = align_external_data_streaming(src, tmp_path / "m.onnx", weights_format="safetensors", size_threshold=1024)
    assert result.externalized_tensors == 2 and result.kept_inline_tensors == 0
    with safe_open(str(tmp_path / "m.safetensors"), framework="numpy") as f:
        assert sorted(f.keys()) == ["big", "shape"]
        assert np.array_equal(f.get_tensor("big"), arrays["big"])
        assert np.array_equal(f.get_tensor("shape"), arrays["shape"])
    outputs = run_onnxruntime(tmp_path / "m.onnx", {})
    assert all(np.array_equal(a, o) for a, o in zip(arrays.values(), outputs, strict=True))
    assert math.prod(onnx.load(str(tmp_path / "m.onnx")).graph.initializer[1].dims) == 2


def test_an_index_in_a_weights_subfolder_names_files_relative_to_itself(tmp_path: Path) -> None:
    arrays = {f"w{i}": np.full((256,), i, dtype=np.float32) for i in range(2)}
    src = make_external_model(tmp_path, arrays, name="src.onnx")
    (tmp_path / "weights").mkdir()
    result = align_external_data_streaming(
        src, tmp_path / "model.onnx", tmp_path / "weights" / "model.safetensors", 0,
        weights_format="safetensors", max_shard_size=1024,
    )  # fmt: skip
    index = json.loads((tmp_path / "weights" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"w0": "model-00001-of-00002.safetensors", "w1": "model-00002-of-00002.safetensors"}
    assert result.index_file == str(tmp_path / "weights" / "model.safetensors.index.json")
    locations = {e.value for t in onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}  # fmt: skip
    assert locations == {"weights/model-00001-of-00002.safetensors", "weights/model-00002-of-00002.safetensors"}
    for array, output in zip(arrays.values(), run_onnxruntime(tmp_path / "model.onnx", {}), strict=True):
        assert np.array_equal(array, output)


@pytest.mark.parametrize("alignment", [0, 64])
def test_zero_byte_tensors_go_last_at_the_end_of_the_file(tmp_path: Path, alignment: int) -> None:
    """onnx 1.17 reads a zero-length reference as "the rest of the file": only the file's end holds zero bytes."""
    src = build_zoo_model("zero_length", tmp_path).path  # a (40 B), empty_mid, b (12 B), empty_last, external
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()

    align_external_data_streaming(src, out, alignment=alignment, weights_format="safetensors")

    data = out.parent / "model.safetensors"
    start, header = _header(data)
    assert header["empty_mid"]["data_offsets"] == header["empty_last"]["data_offsets"] == [52, 52]
    assert sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")[-1] == (52, 52)
    model = onnx.load_model(str(out), load_external_data=False)
    entries = {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer}
    for name in ("empty_mid", "empty_last"):
        assert entries[name] == {"location": "model.safetensors", "offset": str(start + 52), "length": "0"}
    assert start + 52 == data.stat().st_size
    loaded = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load_model(str(out)).graph.initializer}
    assert loaded["empty_last"].shape == (0, 4) and loaded["empty_mid"].shape == (0,)
    with safe_open(str(data), framework="numpy") as opened:
        assert opened.get_tensor("empty_last").shape == (0, 4)
        np.testing.assert_array_equal(opened.get_tensor("b"), loaded["b"])
    assert verify_models(src, out).equal
    assert build_layout_report(out).ok
