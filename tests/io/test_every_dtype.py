"""Every element type onnx defines goes through every writer and verify, sized exactly as onnx packs it.

A user's model may hold any ``TensorProto.DataType``: 4-bit and 2-bit integers packed two and four per byte, FLOAT6
packed four values in three bytes, bfloat16, float8, complex, bool, strings. Each writer (both aligners, the shared
saver, delay + undelay) must keep every byte and every offset right, and verify must call the result equal; onnx
itself (``onnx.load_model`` with its external data, ``check_model(full_check=True)``) is the oracle. FLOAT6 used to
be sized at one byte per element: align and verify refused the valid model ``onnx.save_model`` wrote.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    save_model_with_shared_external_data,
    verify_models,
)
from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io._read.dtype_sizes import SPEC_BITS, element_bits, packed_nbytes
from onnx_light_ref.io._read.locations import expected_nbytes
from onnx_light_ref.ops import delay_initializers, undelay_initializers
from tests.checks import sha256_of_tree

EVERY_DTYPE = sorted(value for name, value in TensorProto.DataType.items() if name != "UNDEFINED")


def writable_by_onnx(data_type: int) -> bool:
    """Whether this onnx writes ``data_type`` from numpy as itself (1.17/1.18 write bfloat16/float8 as float32)."""
    if data_type == TensorProto.STRING:
        return True
    try:
        zeros = np.zeros(1, dtype=helper.tensor_dtype_to_np_dtype(data_type))
        return numpy_helper.from_array(zeros).data_type == data_type
    except (KeyError, TypeError, ValueError):
        return False


# The types models are built with below: all of them on onnx >= 1.19 (checked below: only types the size table
# covers may be missing, and their sizes are still checked against onnx.proto's layouts).
WRITABLE = [data_type for data_type in EVERY_DTYPE if writable_by_onnx(data_type)]
# Element counts per tensor: 5 leaves a partial group in every packed type (INT4: 2.5 bytes, INT2: 1.25, FLOAT6:
# 3.75), 8 does not; the second tensor's offset depends on the first one's exact size.
COUNTS = (5, 8)


def dtype_name(data_type: int) -> str:
    return TensorProto.DataType.Name(data_type)


def values_of(data_type: int, count: int, seed: int) -> TensorProto:
    """``count`` distinct-ish values of ``data_type``, written by onnx's own helpers."""
    name = f"{dtype_name(data_type).lower()}_{count}"
    if data_type == TensorProto.STRING:
        return helper.make_tensor(name, data_type, [count], [f"s{seed}-{i}".encode() for i in range(count)])
    np_dtype = helper.tensor_dtype_to_np_dtype(data_type)
    # Three consecutive small values, the first range the type holds exactly (-1..1, 0..2 or 1..3: INT2 holds -2..1,
    # unsigned types no -1, float8e8m0 only powers of two from 2**-127), so a swap of two elements or tensors shows.
    for low in (-1, 0, 1):
        base = (np.arange(count) + seed) % 3 + low
        try:
            with np.errstate(invalid="raise", over="raise"):
                if np.dtype(np_dtype).kind == "b":
                    array = (base % 2).astype(bool)
                elif np.dtype(np_dtype).kind == "c":
                    array = (base + 1j * base).astype(np_dtype)
                else:
                    array = base.astype(np.float32).astype(np_dtype)
        except FloatingPointError:
            continue
        break
    return numpy_helper.from_array(array.reshape(count), name)


def every_dtype_model() -> onnx.ModelProto:
    initializers = [values_of(dt, count, seed) for seed, dt in enumerate(WRITABLE) for count in COUNTS]
    graph = helper.make_graph([], "every_dtype", [], [], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def payloads(path: Path) -> dict[str, tuple[int, list[int], bytes]]:
    """What onnx loads (external data included): data type, dims and the bytes of every initializer."""
    model = onnx.load_model(str(path))
    result = {}
    for tensor in model.graph.initializer:
        data = b"\0".join(tensor.string_data) if tensor.data_type == TensorProto.STRING else tensor.raw_data
        result[tensor.name] = (tensor.data_type, list(tensor.dims), data)
    return result


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    """The model saved by onnx inline, and with every tensor it can externalize in one data file."""
    folder = tmp_path_factory.mktemp("every_dtype")
    inline, external = folder / "inline" / "model.onnx", folder / "external" / "model.onnx"
    for path in (inline, external):
        path.parent.mkdir()
        onnx.save_model(
            every_dtype_model(),
            str(path),
            save_as_external_data=path is external,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
            size_threshold=0,
        )
        onnx.checker.check_model(str(path), full_check=True)
    return inline, external


def test_the_sources_hold_every_dtype_packed_as_onnx_packs_it(sources):
    _, external = sources
    stored = payloads(external)

    assert {data_type for data_type, _, _ in stored.values()} == set(WRITABLE)
    assert set(EVERY_DTYPE) - set(WRITABLE) <= set(SPEC_BITS)
    for name, (data_type, dims, data) in stored.items():
        if data_type != TensorProto.STRING:
            assert len(data) == packed_nbytes(data_type, dims[0]), name
    if "float6e2m3_5" in stored:  # onnx >= 1.20
        assert len(stored["float6e2m3_5"][2]) == 4 and len(stored["float6e2m3_8"][2]) == 6  # 4 values in 3 bytes


def align_streaming(src: Path, dst: Path) -> Path:
    align_external_data_streaming(src, dst, alignment=64)
    return dst


def align_in_memory(src: Path, dst: Path) -> Path:
    align_external_data_in_memory(src, dst, alignment=64)
    return dst


def shared_save(src: Path, dst: Path) -> Path:
    save_model_with_shared_external_data(onnx.load_model(str(src)), dst, alignment=64)
    return dst


def delay_then_undelay(src: Path, dst: Path) -> Path:
    """Every external initializer an ``ai.rt::DelayedInitializer`` can produce is delayed, then restored; the other
    types stay external initializers all along."""
    work = dst.parent.parent / "delayed"
    shutil.copytree(src.parent, work)  # the delayed model reads the source's data file by a relative name
    delayed = work / "delayed.onnx"
    onnx.save_model(delay_initializers(work / src.name), str(delayed))
    undelay_initializers(delayed, dst, alignment=64)
    return dst


WRITERS: dict[str, tuple[Callable[[Path, Path], Path], str, bool]] = {
    # name: (writer, which source it reads, pair by name)
    "align_streaming": (align_streaming, "external", False),
    "align_in_memory": (align_in_memory, "external", False),
    "shared_save": (shared_save, "inline", False),
    "delay_undelay": (delay_then_undelay, "external", True),  # undelay appends restored initializers: reordered
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_dtype_goes_through_the_writer_and_verifies_equal(tmp_path, sources, writer):
    write, which, by_name = WRITERS[writer]
    src = sources[0] if which == "inline" else sources[1]
    before = sha256_of_tree(src.parent)
    (tmp_path / "out").mkdir()

    dst = write(src, tmp_path / "out" / "model.onnx")

    onnx.checker.check_model(str(dst), full_check=True)
    assert payloads(dst) == payloads(src)
    result = verify_models(src, dst, by_name=by_name)
    assert result.equal, result.first_difference
    assert result.tensors == len(WRITABLE) * len(COUNTS)
    # Verify across storages too: the written model against onnx's inline one and its external one.
    for other in sources:
        assert verify_models(other, dst, by_name=by_name).equal
    assert sha256_of_tree(src.parent) == before


# STRING has no raw_data: its element count is checked instead (tests/io/test_verify.py).
@pytest.mark.parametrize("data_type", [dt for dt in WRITABLE if dt != TensorProto.STRING], ids=dtype_name)
def test_a_byte_more_of_any_dtype_is_refused_by_verify(tmp_path, data_type):
    tensor = values_of(data_type, 5, 0)
    paths = []
    for extra in (b"", b"\0"):
        bad = onnx.TensorProto()
        bad.CopyFrom(tensor)
        bad.raw_data = tensor.raw_data + extra
        path = tmp_path / f"{len(extra)}.onnx"
        graph = helper.make_graph([], "g", [], [], initializer=[bad])
        onnx.save_model(helper.make_model(graph), str(path))
        paths.append(path)

    with pytest.raises(InvalidModelError, match=rf"^model B: .* has {len(tensor.raw_data) + 1} bytes of raw_data, but"):
        verify_models(paths[0], paths[1])
    assert verify_models(paths[0], paths[0]).equal


# --- the one size function against onnx's own writers ------------------------------------------------------------


@pytest.mark.parametrize("data_type", WRITABLE, ids=dtype_name)
def test_the_size_of_every_dtype_is_the_one_onnx_writes(data_type):
    if data_type == TensorProto.STRING:
        assert element_bits(data_type) is None
        assert expected_nbytes(helper.make_tensor("s", data_type, [2], [b"a", b"b"])) is None
        return
    for count in range(0, 14):
        tensor = (
            values_of(data_type, count, 0)
            if count
            else numpy_helper.from_array(np.zeros(0, dtype=helper.tensor_dtype_to_np_dtype(data_type)))
        )
        assert tensor.data_type == data_type
        assert packed_nbytes(data_type, count) == len(tensor.raw_data), (dtype_name(data_type), count)
        assert expected_nbytes(tensor) == len(tensor.raw_data)
        # onnx's make_tensor checks raw sizes itself: it accepts exactly this length.
        helper.make_tensor("t", data_type, [count], tensor.raw_data, raw=True)


def test_the_fallback_table_agrees_with_onnx_for_every_type_it_lists():
    assert set(SPEC_BITS) <= set(EVERY_DTYPE)
    for data_type, bits in SPEC_BITS.items():
        written = numpy_helper.from_array(np.zeros(8, dtype=helper.tensor_dtype_to_np_dtype(data_type)))
        if written.data_type == data_type:  # onnx 1.17/1.18 write bfloat16/float8 as float32: nothing to compare
            assert len(written.raw_data) == bits, dtype_name(data_type)
        assert element_bits(data_type) == bits


def test_types_without_a_fixed_size_and_bad_counts():
    assert element_bits(TensorProto.UNDEFINED) is None
    assert element_bits(10_000) is None
    assert packed_nbytes(10_000, 3) is None
    assert packed_nbytes(TensorProto.INT4, 0) == 0
    assert packed_nbytes(TensorProto.INT4, 3) == 2
    with pytest.raises(ValueError, match=r"^n_elements must be >= 0, got -1\.$"):
        packed_nbytes(TensorProto.FLOAT, -1)
