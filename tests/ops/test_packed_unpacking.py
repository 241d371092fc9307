"""4-bit and 2-bit weights: the kernel unpacks them as onnx does, bit for bit, in the output plus one chunk.

onnx 1.17 unpacks int4/uint4 in Python: ``numpy_helper.to_array`` on each 3 MiB chunk took ~850 MiB of temporaries
(a 16 MiB int4 weight in cpu mode peaked at +878 MiB, and took minutes), against the documented "output plus one
chunk". The kernel now looks each packed byte up in a table of onnx's own unpacking of the 256 byte values, writing
straight into the output, on every onnx. These tests run on the floor (onnx 1.17) and on the newest onnx; the
figures before and after are in ``benchmarks/test_bench_delayed.py::test_reference_evaluator_int4``.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.io._read.dtype_sizes import element_bits, packed_nbytes
from onnx_light_ref.ops import _raw_arrays as raw_arrays
from onnx_light_ref.ops import reference_evaluator
from onnx_light_ref.ops._dtypes import EXTENDED_DTYPES, dtype_name, is_packed_dtype

PACKED = [t for t in EXTENDED_DTYPES if is_packed_dtype(t)]
BYTE_WISE = [t for t in PACKED if 8 % (element_bits(t) or 3) == 0]  # whole elements per byte: the table's types


@pytest.mark.parametrize("dtype", BYTE_WISE, ids=dtype_name)
def test_the_table_is_onnxs_unpacking_of_each_byte(dtype):
    table = raw_arrays._unpack_table(dtype)
    assert table is not None
    per_byte = 8 // (element_bits(dtype) or 8)
    for byte in (0x00, 0x01, 0x0F, 0x10, 0x7F, 0x80, 0x88, 0x9F, 0xF0, 0xFF):
        alone = numpy_helper.to_array(TensorProto(data_type=dtype, dims=[per_byte], raw_data=bytes([byte])))
        assert table[byte].tobytes() == np.ascontiguousarray(alone).tobytes(), hex(byte)


@pytest.mark.parametrize("count", [1, 2, 7, 4096 * 3 + 1])
@pytest.mark.parametrize("dtype", PACKED, ids=dtype_name)
def test_random_bytes_over_many_blocks_and_chunks_are_unpacked_as_onnx_does(monkeypatch, dtype, count):
    """Blocks of 7 bytes and chunks of 24: every boundary falls inside the tensor; the last byte's padding is
    random too (onnx ignores it)."""
    monkeypatch.setattr(raw_arrays, "_TAKE_BLOCK", 7)
    monkeypatch.setattr(raw_arrays, "PACKED_CHUNK_BYTES", 24)
    nbytes = packed_nbytes(dtype, count)
    assert nbytes is not None
    raw = np.random.default_rng(count + dtype).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    got = raw_arrays.array_from_bytes(dtype, raw, (count,), where="W")
    expected = numpy_helper.to_array(TensorProto(data_type=dtype, dims=[count], raw_data=raw))
    assert got.dtype == expected.dtype
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()


def test_a_16_mib_int4_weight_costs_the_output_and_one_chunk(tmp_path: Path):
    """cpu mode reads the weight when the evaluator is built: the allocations traced meanwhile (numpy's included)
    peak at the output (one byte per element) plus one chunk of packed bytes, plus 1 MiB for everything else."""
    packed = 16 * 2**20
    raw = np.random.default_rng(4).integers(0, 256, packed, dtype=np.uint8)
    (tmp_path / "w.data").write_bytes(raw.tobytes())
    weight = TensorProto(name="W", data_type=TensorProto.INT4, dims=[2 * packed], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "w.data"), ("offset", "0"), ("length", str(packed))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([], "int4", [], [helper.make_tensor_value_info("W", TensorProto.INT4, [2 * packed])])
    graph.initializer.append(weight)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    raw_arrays._unpack_table(TensorProto.INT4)  # built once per process, by onnx: not the weight's cost

    tracemalloc.start()
    try:
        session = reference_evaluator(tmp_path / "model.onnx", "cpu")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    output = 2 * packed
    assert peak <= output + raw_arrays.PACKED_CHUNK_BYTES + 2**20, f"{peak / 2**20:.1f} MiB"
    (got,) = session.run(None, {})
    expected = numpy_helper.to_array(
        TensorProto(data_type=TensorProto.INT4, dims=[2 * 4096], raw_data=raw[:4096].tobytes())
    )
    assert got[: 2 * 4096].tobytes() == np.ascontiguousarray(expected).tobytes()
