"""``link_external_data`` / ``onnx-light-ref link``: a model pointed at a safetensors checkpoint, no byte copied."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
import safetensors.numpy as st_numpy

from onnx_light_ref import link_external_data, verify_models
from onnx_light_ref.errors import DestinationConflictError, ExternalDataError, SafetensorsError, UnsafeLocationError
from onnx_light_ref.io._layout_report import build_layout_report
from tests.checks import needs_onnx_with_the_newer_loader_rule, run_onnxruntime, sha256_of_tree
from tests.cli_runner import run_cli
from tests.models import mlp_model, save_external

RNG = np.random.default_rng(7)
WEIGHTS = {
    "w1": RNG.standard_normal((64, 128)).astype(np.float32),
    "b1": RNG.standard_normal(128).astype(np.float32),
    "w2": RNG.standard_normal((128, 16)).astype(np.float32),
    "b2": RNG.standard_normal(16).astype(np.float32),
}
FEEDS = {"x": RNG.standard_normal((3, 64)).astype(np.float32)}


def _source(folder: Path) -> Path:
    return save_external(mlp_model(WEIGHTS), folder / "src.onnx", "src.data")


def _offsets(path: Path) -> dict[str, tuple[str, int, int]]:
    model = onnx.load(str(path), load_external_data=False)
    result = {}
    for tensor in model.graph.initializer:
        entries = {e.key: e.value for e in tensor.external_data}
        result[tensor.name] = (entries["location"], int(entries["offset"]), int(entries["length"]))
    return result


def test_every_matching_tensor_points_into_the_checkpoint_and_nothing_is_copied(tmp_path: Path) -> None:
    src = _source(tmp_path)
    checkpoint = tmp_path / "model.safetensors"
    st_numpy.save_file(WEIGHTS, str(checkpoint))
    before = checkpoint.read_bytes()
    result = link_external_data(src, checkpoint, tmp_path / "linked.onnx")
    assert (result.linked_tensors, result.written_tensors, int(result)) == (4, 0, 0)
    assert result.linked_bytes == sum(a.nbytes for a in WEIGHTS.values())
    assert result.weights_files == () and not (tmp_path / "linked.onnx.data").exists()
    assert checkpoint.read_bytes() == before
    (size,) = struct.unpack("<Q", before[:8])
    header = json.loads(before[8 : 8 + size])
    for name, (location, offset, length) in _offsets(tmp_path / "linked.onnx").items():
        begin, end = header[name]["data_offsets"]
        assert (location, offset, length) == ("model.safetensors", 8 + size + begin, end - begin)
    onnx.checker.check_model(str(tmp_path / "linked.onnx"), full_check=True)
    expected = run_onnxruntime(src, FEEDS)
    assert all(
        np.array_equal(a, b) for a, b in zip(expected, run_onnxruntime(tmp_path / "linked.onnx", FEEDS), strict=False)
    )
    assert verify_models(src, tmp_path / "linked.onnx").equal


def test_name_map_dtype_and_shape_decide_what_is_linked_the_rest_is_written(tmp_path: Path) -> None:
    src = _source(tmp_path)
    checkpoint = {
        "model.layer0.weight": WEIGHTS["w1"],  # mapped
        "b1": WEIGHTS["b1"].astype(np.float64),  # same name, other dtype: written
        "w2": WEIGHTS["w2"].reshape(16, 128),  # same name and bytes, other shape: written
    }
    st_numpy.save_file(checkpoint, str(tmp_path / "ckpt.safetensors"))
    result = link_external_data(
        src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", name_map={"w1": "model.layer0.weight"}
    )
    assert result.linked_tensors == 1 and result.linked_bytes == WEIGHTS["w1"].nbytes
    assert result.written_tensors == 3
    assert result.written_bytes == sum(WEIGHTS[n].nbytes for n in ("b1", "w2", "b2"))
    assert sorted(result.mismatched_tensors) == ["b1", "w2"]
    offsets = _offsets(tmp_path / "linked.onnx")
    assert offsets["w1"][0] == "ckpt.safetensors"
    assert {offsets[n][0] for n in ("b1", "w2", "b2")} == {"linked.onnx.data"}
    assert all(offsets[n][1] % 4096 == 0 for n in ("b1", "w2", "b2"))
    expected = run_onnxruntime(src, FEEDS)
    assert all(
        np.array_equal(a, b) for a, b in zip(expected, run_onnxruntime(tmp_path / "linked.onnx", FEEDS), strict=False)
    )
    assert verify_models(src, tmp_path / "linked.onnx").equal


def test_a_sharded_checkpoint_is_linked_through_its_index(tmp_path: Path) -> None:
    src = _source(tmp_path)
    st_numpy.save_file({"w1": WEIGHTS["w1"], "b1": WEIGHTS["b1"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    st_numpy.save_file({"w2": WEIGHTS["w2"], "b2": WEIGHTS["b2"]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {
        "metadata": {"total_size": 0},
        "weight_map": {
            "w1": "model-00001-of-00002.safetensors",
            "b1": "model-00001-of-00002.safetensors",
            "w2": "model-00002-of-00002.safetensors",
            "b2": "model-00002-of-00002.safetensors",
        },
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    result = link_external_data(model=onnx.load(str(src)), checkpoint=tmp_path / "model.safetensors.index.json",
                                dst_onnx_path=tmp_path / "linked.onnx", size_threshold=0)  # fmt: skip
    assert result.linked_tensors == 4 and len(result.checkpoint_files) == 2
    assert {loc for loc, _, _ in _offsets(tmp_path / "linked.onnx").values()} == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert verify_models(src, tmp_path / "linked.onnx").equal


def test_a_model_proto_with_inline_weights_is_not_modified_and_small_tensors_stay_inline(tmp_path: Path) -> None:
    proto = mlp_model(WEIGHTS)
    original = proto.SerializeToString()
    st_numpy.save_file({"w1": WEIGHTS["w1"]}, str(tmp_path / "ckpt.safetensors"))
    result = link_external_data(proto, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx")
    assert proto.SerializeToString() == original
    assert result.linked_tensors == 1
    assert result.written_tensors == 1  # w2 (8192 bytes); b1 (512) and b2 (64) stay inline below 1024 bytes
    linked = onnx.load(str(tmp_path / "linked.onnx"), load_external_data=False)
    external = {t.name for t in linked.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert external == {"w1", "w2"}
    hidden = np.maximum(FEEDS["x"] @ WEIGHTS["w1"] + WEIGHTS["b1"], 0)
    (output,) = run_onnxruntime(tmp_path / "linked.onnx", FEEDS)
    assert np.allclose(output, hidden @ WEIGHTS["w2"] + WEIGHTS["b2"], atol=1e-4)


def _hostile(path: Path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"w1": {"dtype": "F32", "shape": [64, 128], "data_offsets": [0, 32768]}}', "past the end"),
        (b'{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "a": {}}', "repeats the key"),
        (b'{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}', "uncovered"),  # 8 data bytes, 4 used
        (
            b'{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, '
            b'"b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}',
            "overlap",
        ),
    ],
)
def test_hostile_checkpoints_are_refused_and_nothing_is_written(tmp_path: Path, content: bytes, message: str) -> None:
    src = _source(tmp_path)
    _hostile(tmp_path / "bad.safetensors", content, b"\0" * 8)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(SafetensorsError, match=message):
        link_external_data(src, tmp_path / "bad.safetensors", tmp_path / "linked.onnx")
    assert sha256_of_tree(tmp_path) == before


def test_a_checkpoint_outside_the_destination_folder_or_symlinked_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    src = _source(tmp_path)
    st_numpy.save_file(WEIGHTS, str(tmp_path / "ckpt.safetensors"))
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError, match="inside the model's folder"):
        link_external_data(src, tmp_path / "ckpt.safetensors", tmp_path / "out" / "linked.onnx")
    os.symlink(tmp_path / "ckpt.safetensors", tmp_path / "out" / "link.safetensors")
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError):
        link_external_data(src, tmp_path / "out" / "link.safetensors", tmp_path / "out" / "linked.onnx")
    assert sha256_of_tree(tmp_path) == before


def test_the_checkpoint_is_never_a_destination(tmp_path: Path) -> None:
    src = _source(tmp_path)
    st_numpy.save_file({"w1": WEIGHTS["w1"]}, str(tmp_path / "ckpt.safetensors"))
    before = sha256_of_tree(tmp_path)
    with pytest.raises(DestinationConflictError):
        link_external_data(src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx",
                           dst_weights_path=tmp_path / "ckpt.safetensors")  # fmt: skip
    assert sha256_of_tree(tmp_path) == before


def test_cli_link_with_a_name_map(tmp_path: Path) -> None:
    src = _source(tmp_path)
    st_numpy.save_file({"layers.0.w": WEIGHTS["w1"], "w2": WEIGHTS["w2"]}, str(tmp_path / "ckpt.safetensors"))
    (tmp_path / "names.json").write_text(json.dumps({"w1": "layers.0.w"}))
    command = ["link", str(src), str(tmp_path / "ckpt.safetensors"),
               str(tmp_path / "linked.onnx"), "--map", str(tmp_path / "names.json"), "--no-progress"]  # fmt: skip
    out = run_cli(*command)
    assert out.returncode == 0, out.stderr
    assert "2 tensors linked to the checkpoint (40960 bytes, none copied), 2 written (576 bytes" in out.stdout
    assert verify_models(src, tmp_path / "linked.onnx").equal
    (tmp_path / "bad.json").write_text("[1]")
    out = run_cli(*command[:-3], "--map", str(tmp_path / "bad.json"))
    assert out.returncode == 1 and out.stderr.startswith("error: --map")


def test_the_source_model_is_never_overwritten_by_the_weights_file(tmp_path: Path) -> None:
    src = _source(tmp_path)
    st_numpy.save_file({"w1": WEIGHTS["w1"]}, str(tmp_path / "ckpt.safetensors"))
    before = sha256_of_tree(tmp_path)
    with pytest.raises(DestinationConflictError):
        link_external_data(src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", dst_weights_path=src)
    assert sha256_of_tree(tmp_path) == before


def _hf_cache(root: Path) -> tuple[Path, Path]:
    """A Hugging Face cache layout: snapshots/<rev>/model.safetensors -> ../../blobs/<sha>; returns (snapshot, src)."""
    blobs = root / "blobs"
    snapshot = root / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    st_numpy.save_file({"w1": WEIGHTS["w1"], "w2": WEIGHTS["w2"]}, str(blobs / "5f3a9c"))
    os.symlink("../../blobs/5f3a9c", snapshot / "model.safetensors")
    return snapshot, _source(root)


@needs_onnx_with_the_newer_loader_rule
def test_a_hugging_face_cache_checkpoint_is_refused_by_default_and_linked_with_the_opt_in(tmp_path: Path) -> None:
    snapshot, src = _hf_cache(tmp_path)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError, match=r"symbolic link.*allow_outside_folder=True"):
        link_external_data(src, snapshot / "model.safetensors", snapshot / "linked.onnx")
    assert sha256_of_tree(tmp_path) == before
    result = link_external_data(
        src, snapshot / "model.safetensors", snapshot / "linked.onnx", allow_outside_folder=True
    )
    assert (result.linked_tensors, result.written_tensors) == (2, 2)  # b1, b2 are not in the checkpoint
    assert sha256_of_tree(tmp_path)["blobs/5f3a9c"] == before["blobs/5f3a9c"]
    assert _offsets(snapshot / "linked.onnx")["w1"] == ("model.safetensors", *_offsets_in(tmp_path / "blobs/5f3a9c"))
    # Our readers with the same opt-in read the original tensors back through the symlink.
    assert verify_models(src, snapshot / "linked.onnx", allow_outside_folder=True).equal
    # Neither onnx 1.23 (any symlink in a data path) nor onnxruntime 1.32 (a data path resolving outside the model's
    # folder) loads such a model: the opt-in serves trusting readers only, which is why it is not the default.
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(str(snapshot / "linked.onnx"), full_check=True)
    with pytest.raises(Exception, match="escapes model directory"):
        run_onnxruntime(snapshot / "linked.onnx", FEEDS)


def _offsets_in(checkpoint: Path) -> tuple[int, int]:
    """``w1``'s absolute offset and length in a safetensors file."""
    data = checkpoint.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    begin, end = json.loads(data[8 : 8 + size])["w1"]["data_offsets"]
    return 8 + size + begin, end - begin


def test_cli_link_allow_outside_folder(tmp_path: Path) -> None:
    snapshot, src = _hf_cache(tmp_path)
    command = ["link", str(src), str(snapshot / "model.safetensors"),
               str(snapshot / "linked.onnx"), "--no-progress"]  # fmt: skip
    out = run_cli(*command)
    assert out.returncode == 1 and "--allow-outside-folder" in out.stderr
    assert not (snapshot / "linked.onnx").exists()
    out = run_cli(*command, "--allow-outside-folder")
    assert out.returncode == 0, out.stderr
    assert "2 tensors linked to the checkpoint" in out.stdout
    assert verify_models(src, snapshot / "linked.onnx", allow_outside_folder=True).equal


def test_a_symlinked_index_or_shard_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    src = _source(tmp_path)
    st_numpy.save_file(WEIGHTS, str(tmp_path / "outside" / "real.safetensors"))
    (tmp_path / "outside" / "index.json").write_text(json.dumps({"weight_map": {"w1": "shard.safetensors"}}))
    os.symlink(tmp_path / "outside" / "index.json", tmp_path / "model.safetensors.index.json")
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError, match=r"checkpoint index .*symbolic link"):
        link_external_data(src, tmp_path / "model.safetensors.index.json", tmp_path / "linked.onnx")
    assert sha256_of_tree(tmp_path) == before
    os.unlink(tmp_path / "model.safetensors.index.json")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w1": "shard.safetensors"}}))
    os.symlink(tmp_path / "outside" / "real.safetensors", tmp_path / "shard.safetensors")
    before = sha256_of_tree(tmp_path)
    with pytest.raises(UnsafeLocationError, match=r"checkpoint file .*symbolic link"):
        link_external_data(src, tmp_path / "model.safetensors.index.json", tmp_path / "linked.onnx")
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("swap", ["replaced", "symlink", "resized"])
def test_a_checkpoint_changed_before_the_publication_is_refused_and_nothing_is_published(
    tmp_path: Path, swap: str
) -> None:
    """The checkpoint is swapped while the tensors not in it are copied (the progress callback runs then)."""
    src = _source(tmp_path)
    checkpoint = tmp_path / "ckpt.safetensors"
    st_numpy.save_file({"w1": WEIGHTS["w1"]}, str(checkpoint))
    st_numpy.save_file({"w1": np.zeros_like(WEIGHTS["w1"])}, str(tmp_path / "other.safetensors"))
    original = checkpoint.read_bytes()
    swapped: list[bool] = []

    def progress(done: int, total: int) -> None:
        if swapped:
            return
        swapped.append(True)
        if swap == "replaced":  # same bytes count, other inode: the model would point at other bytes
            os.replace(tmp_path / "other.safetensors", checkpoint)
        elif swap == "symlink":
            (tmp_path / "outside").mkdir()
            os.replace(tmp_path / "other.safetensors", tmp_path / "outside" / "x.safetensors")
            os.unlink(checkpoint)
            os.symlink(tmp_path / "outside" / "x.safetensors", checkpoint)
        else:
            with open(checkpoint, "ab") as handle:
                handle.write(b"\0" * 16)

    with pytest.raises(ExternalDataError, match=r"ckpt\.safetensors.*nothing was published") as caught:
        link_external_data(src, checkpoint, tmp_path / "linked.onnx", progress=progress)
    assert swapped
    assert ("replaced or resized" in str(caught.value)) == (swap != "symlink")
    assert not (tmp_path / "linked.onnx").exists() and not (tmp_path / "linked.onnx.data").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("linked")) == []
    if swap == "resized":
        assert checkpoint.read_bytes()[: len(original)] == original


def test_a_packed_int4_tensor_links_to_u8_of_exactly_its_bytes(tmp_path: Path) -> None:
    """INT4 with 5 elements is 3 packed bytes: linked to a U8 [3] key, not to U8 [1, 3] (same bytes, other shape)."""
    packed = np.array([0x21, 0x43, 0x05], dtype=np.uint8)  # 1, 2, 3, 4, 5 packed low nibble first
    tensors = [
        onnx.helper.make_tensor(name, onnx.TensorProto.INT4, [5], packed.tobytes(), raw=True) for name in ("a", "b")
    ]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Cast", [name], [f"{name}_out"], to=onnx.TensorProto.INT8) for name in ("a", "b")],
        "g",
        [],
        [onnx.helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.INT8, [5]) for name in ("a", "b")],
        initializer=tensors,
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    st_numpy.save_file({"a": packed, "b": packed.reshape(1, 3)}, str(tmp_path / "ckpt.safetensors"))
    result = link_external_data(model, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", size_threshold=1)
    assert (result.linked_tensors, tuple(result.mismatched_tensors)) == (1, ("b",))
    assert _offsets(tmp_path / "linked.onnx")["a"][0] == "ckpt.safetensors"
    onnx.save(model, tmp_path / "inline.onnx")
    assert verify_models(tmp_path / "inline.onnx", tmp_path / "linked.onnx").equal
    assert build_layout_report(tmp_path / "linked.onnx").ok  # INT4 [5] reading U8 [3] agrees with the header
    try:
        outputs = run_onnxruntime(tmp_path / "linked.onnx", {})
    except Exception as exc:  # onnxruntime < 1.2x has no int4 Cast kernel (NOT_IMPLEMENTED)
        if "NOT_IMPLEMENTED" not in str(exc):
            raise
        pytest.skip(f"this onnxruntime cannot run an int4 Cast: {exc}")
    assert [list(out) for out in outputs] == [[1, 2, 3, 4, 5]] * 2
