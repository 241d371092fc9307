"""Fuzzing: random models with random external_data entries, random files, nested subgraphs.

Hypothesis draws a model description: tensors of several dtypes and shapes, each inline, valid external (its bytes
really are where its entries say) or hostile external (locations from a list of known-bad ones or random strings,
offsets and lengths from random numbers and malformed strings, unknown or duplicated keys, inline and external at
once), placed in the main graph, in an If branch, in an If nested in an If, or in a Constant attribute, aligned with
random layout options (align threshold, shards, dedup, inline size threshold); plus a
folder with data files of random sizes, a symlink, a symlinked folder and a hard link pointing outside.

Properties, for ``align_external_data_streaming``, ``align_external_data_in_memory``,
``save_model_with_shared_external_data`` and ``delay_initializers``:

* every call either succeeds or raises a documented type (:class:`ExternalDataError` and subclasses,
  :class:`InvalidModelError`, ``FileNotFoundError``, ``ValueError``), never anything else;
* a description whose tensors are all inline or valid always succeeds (no false refusal);
* on success the aligned output loads with onnx and every tensor holds the source's bytes; the streaming output is
  byte-identical to the in-memory one; both aligners fail with the same error type when they fail;
* no source file, symlink or folder changes, and no temp file is left.

Each example builds its own folder with ``tempfile.TemporaryDirectory`` (``tmp_path`` is shared by all examples).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    save_model_with_shared_external_data,
)
from onnx_light_ref.errors import ExternalDataError, InvalidModelError
from onnx_light_ref.ops._convert import delay_initializers
from tests.checks import snapshot_tree, temp_files_under
from tests.models import IR_VERSION, OPSET

DOCUMENTED_ERRORS = (ExternalDataError, InvalidModelError, FileNotFoundError, ValueError)

DTYPES = [np.float32, np.uint8, np.int64, np.float16, np.bool_, np.int32, np.float64]
VALID_FILES = ["a.bin", "sub/b.bin", "c d.bin"]
HOSTILE_LOCATIONS = [
    "../outside/secret.bin",
    "sub/../../outside/secret.bin",
    "sub/../a.bin",
    "/etc/hostname",
    "",
    "a.bin\x00",
    "a\\b.bin",
    ".",
    "./",
    "link.bin",  # symlink to outside/secret.bin
    "ext/secret.bin",  # through a symlinked folder
    "hl.bin",  # hard link of outside/secret.bin
    "dir",  # a folder
    "missing.bin",
    "a.bin/x",
    "a" * 300,
    "sub",
    "./a.bin",
    "sub//b.bin",
]
HOSTILE_NUMBERS = ["-1", "x", "1e3", "0x10", str(2**63), str(2**64), "", " 5", "+3", "٣", "9" * 30]
SECRET = b"outside the model folder " * 20


@dataclass(frozen=True)
class TensorSpec:
    dtype: type
    shape: tuple[int, ...]
    mode: str  # "inline" | "valid" | "hostile"
    container: str  # "main" | "if" | "nested_if" | "constant"
    file: str
    gap: int
    omit_length: bool
    checksum: bool
    location: str
    offset: str | None
    length: str | None  # "match": the byte size from dims and dtype
    extra: tuple[tuple[str, str], ...]
    keep_raw: bool


@dataclass(frozen=True)
class ModelSpec:
    tensors: tuple[TensorSpec, ...]
    trailing: tuple[int, ...]  # junk bytes appended to each valid file
    seed: int
    alignment: int
    chunk_size: int
    layout: tuple[tuple[str, object], ...] = ()  # align_threshold, max_shard_size, dedup, size_threshold


def numbers(low: int, high: int) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), st.integers(low, high).map(str), st.sampled_from(HOSTILE_NUMBERS))


@st.composite
def tensor_specs(draw: st.DrawFn) -> TensorSpec:
    mode = draw(st.sampled_from(["inline", "valid", "valid", "hostile", "hostile"]))
    return TensorSpec(
        dtype=draw(st.sampled_from(DTYPES)),
        shape=tuple(draw(st.lists(st.integers(0, 6), max_size=3))),
        mode=mode,
        container=draw(st.sampled_from(["main", "main", "if", "nested_if", "constant"])),
        file=draw(st.sampled_from(VALID_FILES)),
        gap=draw(st.integers(0, 9)),
        omit_length=draw(st.booleans()),
        checksum=draw(st.booleans()),
        location=draw(
            st.one_of(
                st.sampled_from(HOSTILE_LOCATIONS + VALID_FILES),
                st.text(alphabet="ab./\\\x00 ", max_size=8),
            )
        ),
        offset=draw(numbers(0, 400)),
        length=draw(st.one_of(st.just("match"), st.just("match"), numbers(0, 400))),  # "match": dims x dtype
        extra=tuple(
            draw(
                st.lists(
                    st.sampled_from([("checksum", "00"), ("foo", "bar"), ("location", "a.bin"), ("offset", "0")]),
                    max_size=2,
                )
            )
        ),
        keep_raw=draw(st.booleans()),
    )


model_specs = st.builds(
    ModelSpec,
    tensors=st.lists(tensor_specs(), min_size=1, max_size=5).map(tuple),
    trailing=st.tuples(*(st.integers(0, 50) for _ in VALID_FILES)),
    seed=st.integers(0, 2**32 - 1),
    alignment=st.sampled_from([0, 1, 16, 64, 4096]),
    chunk_size=st.sampled_from([1, 7, 64, 1 << 20]),
    layout=st.tuples(
        st.tuples(st.just("align_threshold"), st.sampled_from([0, 0, 8, 100])),
        st.tuples(st.just("max_shard_size"), st.sampled_from([None, None, 1, 50, 1000])),
        st.tuples(st.just("dedup"), st.booleans()),
        st.tuples(st.just("size_threshold"), st.sampled_from([None, None, 0, 16])),
    ),
)


def make_tensor(index: int, spec: TensorSpec, rng: np.random.Generator, folder: Path) -> onnx.TensorProto:
    """The tensor ``t<index>``; for external modes, its entries (and, when valid, its bytes in the file)."""
    raw = rng.integers(0, 256, int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize, np.uint8)
    array = raw.view(spec.dtype).reshape(spec.shape) if spec.dtype is not np.bool_ else (raw % 2).astype(bool)
    array = array.reshape(spec.shape)
    tensor = numpy_helper.from_array(array, f"t{index}")
    if spec.mode == "inline":
        return tensor
    if spec.mode == "valid":
        payload = tensor.raw_data
        with open(folder / spec.file, "ab") as data_file:
            data_file.write(b"\xee" * spec.gap)
            offset = data_file.tell()
            data_file.write(payload)
        entries = [("location", spec.file), ("offset", str(offset))]
        if not spec.omit_length:
            entries.append(("length", str(len(payload))))
        if spec.checksum:
            entries.append(("checksum", "deadbeef"))
    else:
        entries = [("location", spec.location)]
        length = str(len(tensor.raw_data)) if spec.length == "match" else spec.length
        entries += [(key, value) for key, value in (("offset", spec.offset), ("length", length)) if value is not None]
        entries += list(spec.extra)
    if spec.mode == "valid" or not spec.keep_raw:
        tensor.ClearField("raw_data")
    for key, value in entries:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL
    return tensor


def build_model(tensors: list[tuple[TensorSpec, onnx.TensorProto]]) -> onnx.ModelProto:
    """Place each tensor where its spec says; the graph is well-formed enough for every function under test."""

    def branch(name: str, initializers: list[onnx.TensorProto], nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
        outputs = [helper.make_tensor_value_info(n.output[0], onnx.TensorProto.UNDEFINED, None) for n in nodes[:1]]
        return helper.make_graph(nodes, name, [], outputs, initializer=initializers)

    placed = {place: [t for s, t in tensors if s.container == place] for place in ("main", "if", "nested_if")}
    nodes = [helper.make_node("Identity", [t.name], [f"out_{t.name}"]) for t in placed["main"]]
    for spec, tensor in tensors:
        if spec.container == "constant":
            nodes.append(helper.make_node("Constant", [], [f"out_{tensor.name}"], value=tensor))
    if placed["if"] or placed["nested_if"]:
        inner_nodes = [helper.make_node("Identity", [t.name], [f"in_{t.name}"]) for t in placed["nested_if"]]
        inner = branch("inner_then", placed["nested_if"], inner_nodes or [helper.make_node("Identity", ["c"], ["i"])])
        empty = branch("inner_else", [], [helper.make_node("Identity", ["c"], ["j"])])
        then_nodes = [helper.make_node("If", ["c"], ["nested"], then_branch=inner, else_branch=empty)]
        then_nodes += [helper.make_node("Identity", [t.name], [f"then_{t.name}"]) for t in placed["if"]]
        then_graph = branch("then", placed["if"], then_nodes)
        else_graph = branch("else", [], [helper.make_node("Identity", ["c"], ["k"])])
        nodes.append(helper.make_node("If", ["c"], ["branch"], then_branch=then_graph, else_branch=else_graph))
    outputs = [helper.make_tensor_value_info(n.output[0], onnx.TensorProto.UNDEFINED, None) for n in nodes]
    graph = helper.make_graph(
        nodes,
        "fuzz",
        [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        outputs,
        initializer=placed["main"],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def write_folder(root: Path, spec: ModelSpec) -> tuple[Path, onnx.ModelProto]:
    """root/model (the source, with files and links) and root/outside (what links point at)."""
    model_dir, outside = root / "model", root / "outside"
    model_dir.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(SECRET)
    (model_dir / "sub").mkdir()
    (model_dir / "dir").mkdir()
    (model_dir / "link.bin").symlink_to(outside / "secret.bin")
    (model_dir / "ext").symlink_to(outside, target_is_directory=True)
    os.link(outside / "secret.bin", model_dir / "hl.bin")
    rng = np.random.default_rng(spec.seed)
    tensors = [(s, make_tensor(i, s, rng, model_dir)) for i, s in enumerate(spec.tensors)]
    for name, trailing in zip(VALID_FILES, spec.trailing, strict=True):
        with open(model_dir / name, "ab") as data_file:
            data_file.write(rng.integers(0, 256, trailing, np.uint8).tobytes())
    model = build_model(tensors)
    path = model_dir / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path, model


def source_payloads(model: onnx.ModelProto, base: Path) -> dict[str, bytes]:
    """Every tensor's bytes as the source describes them (plain file reads; only called after a success)."""
    payloads = {}
    for tensor in all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            payloads[tensor.name] = tensor.raw_data
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        with open(base / entries["location"], "rb") as data_file:
            data_file.seek(int(entries.get("offset", "0")))
            size = int(entries["length"]) if "length" in entries else len(blank(tensor).raw_data)
            payloads[tensor.name] = data_file.read(size)
    return payloads


def blank(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A zero-filled inline copy of an external tensor (to learn its byte size from dims and dtype)."""
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return numpy_helper.from_array(np.zeros(list(tensor.dims), dtype), tensor.name)


def all_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    from onnx.external_data_helper import _get_all_tensors  # onnx's own walker: an independent oracle

    return list(_get_all_tensors(model))


def call(function, *args, **kwargs) -> BaseException | None:
    try:
        function(*args, **kwargs)
    except DOCUMENTED_ERRORS as exc:
        return exc
    return None


def everything_valid(spec: ModelSpec) -> bool:
    return all(t.mode in ("inline", "valid") for t in spec.tensors)


def check_aligned(dst: Path, payloads: dict[str, bytes]) -> None:
    loaded = onnx.load_model(dst)  # onnx's own loader and its location checks accept what was written
    got = {t.name: t.raw_data for t in all_tensors(loaded)}
    assert got == payloads


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=model_specs)
def test_random_external_data_succeeds_correctly_or_raises_a_documented_error(spec: ModelSpec):
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        src, model = write_folder(root, spec)
        sources = {folder: snapshot_tree(root / folder) for folder in ("model", "outside")}
        stream_dir, memory_dir = root / "stream", root / "memory"
        stream_dir.mkdir()
        memory_dir.mkdir()

        layout = dict(spec.layout)
        streamed = call(
            align_external_data_streaming, src, stream_dir / "out.onnx", None, spec.alignment, spec.chunk_size, **layout
        )
        in_memory = call(align_external_data_in_memory, src, memory_dir / "out.onnx", None, spec.alignment, **layout)
        assert type(streamed) is type(in_memory), (streamed, in_memory)
        event(f"align: {type(streamed).__name__}")
        if everything_valid(spec):
            assert streamed is None, streamed
        if streamed is None:
            assert sorted(os.listdir(stream_dir)) == sorted(os.listdir(memory_dir))
            for name in os.listdir(stream_dir):
                assert (stream_dir / name).read_bytes() == (memory_dir / name).read_bytes(), name
            check_aligned(stream_dir / "out.onnx", source_payloads(model, src.parent))
        else:
            assert os.listdir(stream_dir) == os.listdir(memory_dir) == []  # a refused run leaves nothing

        variant = onnx.load_model(src, load_external_data=False)
        variant.graph.initializer.append(numpy_helper.from_array(np.arange(5, dtype=np.int16), "new"))
        variant_path = src.parent / "variant.onnx"
        shared = call(save_model_with_shared_external_data, variant, variant_path, spec.alignment)
        if everything_valid(spec):
            assert shared is None, shared
        if shared is None:
            saved = onnx.load_model(variant_path, load_external_data=False)
            expected = source_payloads(model, src.parent)
            expected["new"] = np.arange(5, dtype=np.int16).tobytes()
            assert source_payloads(saved, src.parent) == expected
            for name in ("variant.onnx", "variant.onnx.data"):
                (src.parent / name).unlink(missing_ok=True)

        delayed = call(delay_initializers, src)
        event(f"shared: {type(shared).__name__}")
        event(f"delay: {type(delayed).__name__}")
        event(f"all valid: {everything_valid(spec)}")
        if everything_valid(spec):
            assert delayed is None, delayed

        assert temp_files_under(root) == []
        assert {folder: snapshot_tree(root / folder) for folder in ("model", "outside")} == sources
