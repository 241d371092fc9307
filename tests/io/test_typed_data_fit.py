"""Typed data that do not fit their type: compared as the loaders read them, refused where they disagree.

A float16 tensor may hold its values in ``int32_data``, one bit pattern per entry. onnx.proto says each entry MUST
fit the type; ``0x13C00`` does not. onnxruntime refuses such a model ("data overflow"), onnx's ``numpy_helper``
keeps the low 16 bits (1.0), so ``verify`` called it equal to a model holding ``0x3C00``, and ``align
--size-threshold`` wrote 1.0 out of it. Both now refuse it, as they refuse typed data of the wrong count. A BOOL
stored as 2 is true for every loader (onnx 1.18 and newer keep the byte 2, onnx 1.17 and onnxruntime make it 1):
``verify`` compares it as 1; a BOOL stored as 256 is true for onnxruntime and onnx 1.17 and false for newer onnx,
so it is refused. The oracles (onnxruntime, onnx's ``to_array``) are run here on the same tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.errors import ExternalDataError, InvalidModelError
from onnx_light_ref.io._align import align_external_data_streaming
from onnx_light_ref.io._verify import verify_models
from tests.checks import sha256_of_tree

IR_VERSION = 10


def typed(data_type: int, values: list[int], name: str = "w") -> TensorProto:
    return TensorProto(name=name, data_type=data_type, dims=[len(values)], int32_data=values)


def model_with(tensor: TensorProto, path: Path) -> Path:
    """``tensor`` as the initializer of a graph casting it to float (what onnxruntime runs)."""
    graph = helper.make_graph(
        [helper.make_node("Cast", [tensor.name], ["y"], to=TensorProto.FLOAT)],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(tensor.dims))],
        [tensor],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


def onnxruntime_reads(path: Path) -> np.ndarray | str:
    """What onnxruntime computes from the model (the tensor cast to float), or its refusal."""
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        return str(exc)
    return session.run(None, {})[0]


# (type, an entry that is no bit pattern of it, the entry of the same low bits, the largest bit pattern)
OVERFLOWS = [
    (TensorProto.FLOAT16, 0x13C00, 0x3C00, 0xFFFF),
    (TensorProto.FLOAT16, -1, 0xFFFF, 0xFFFF),
    (TensorProto.BFLOAT16, 0x13F80, 0x3F80, 0xFFFF),
    (TensorProto.FLOAT8E4M3FN, 0x138, 0x38, 0xFF),
    (TensorProto.FLOAT8E5M2FNUZ, -2, 0xFE, 0xFF),
]


@pytest.mark.parametrize(("data_type", "bad", "low_bits", "largest"), OVERFLOWS)
def test_a_bit_pattern_out_of_its_range_is_an_invalid_model(tmp_path, data_type, bad, low_bits, largest):
    a = model_with(typed(data_type, [0x3C, low_bits]), tmp_path / "a" / "model.onnx")
    b = model_with(typed(data_type, [0x3C, bad]), tmp_path / "b" / "model.onnx")
    assert "data overflow" in onnxruntime_reads(b)  # the oracle refuses it
    name = TensorProto.DataType.Name(data_type)
    (tmp_path / "out").mkdir()
    before = sha256_of_tree(tmp_path)

    with pytest.raises(InvalidModelError) as info:
        verify_models(a, b)
    assert str(info.value) == (
        f"model B: tensor 'w' (graph 'g') has typed data that does not fit its dims [2] and data type {name}: "
        f"int32_data[1] is {bad}, not a {name} bit pattern (0 to {largest:#x}): "
        "onnxruntime refuses it (data overflow), onnx keeps its low bits"
    )
    with pytest.raises(ExternalDataError, match=rf"tensor 'w': its typed data does not fit .*\[1\] is {bad},"):
        align_external_data_streaming(b, tmp_path / "out" / "model.onnx", size_threshold=0)
    assert sha256_of_tree(tmp_path) == before
    assert verify_models(a, a).equal


def test_a_bool_stored_as_2_is_true_as_every_loader_reads_it(tmp_path):
    ones = model_with(typed(TensorProto.BOOL, [1, 0, 1]), tmp_path / "ones" / "model.onnx")
    twos = model_with(typed(TensorProto.BOOL, [2, 0, -1]), tmp_path / "twos" / "model.onnx")
    for path in (ones, twos):
        assert onnxruntime_reads(path).tolist() == [1.0, 0.0, 1.0]
        loaded = numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0])
        assert loaded.astype(np.float32).tolist() == [1.0, 0.0, 1.0]  # onnx 1.23 holds the bytes 2 and 0xFF

    result = verify_models(ones, twos)
    assert result.equal, result.first_difference
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    align_external_data_streaming(twos, out, size_threshold=0)
    assert (out.parent / "model.onnx.data").read_bytes()[:3] == b"\x01\x00\x01"
    assert onnxruntime_reads(out).tolist() == [1.0, 0.0, 1.0]


def test_a_bool_the_loaders_read_differently_is_an_invalid_model(tmp_path):
    a = model_with(typed(TensorProto.BOOL, [1, 1]), tmp_path / "a" / "model.onnx")
    b = model_with(typed(TensorProto.BOOL, [1, 256]), tmp_path / "b" / "model.onnx")
    (tmp_path / "out").mkdir()
    assert onnxruntime_reads(b).tolist() == [1.0, 1.0]
    keeps_low_byte = numpy_helper.to_array(typed(TensorProto.BOOL, [2])).view(np.uint8)[0] == 2  # onnx >= 1.18
    onnx_reads = numpy_helper.to_array(onnx.load(str(b)).graph.initializer[0]).view(np.uint8).tolist()
    assert onnx_reads == ([1, 0] if keeps_low_byte else [1, 1])
    before = sha256_of_tree(tmp_path)

    with pytest.raises(InvalidModelError, match=r"int32_data\[1\] is 256, a BOOL that onnxruntime and onnx 1\.17 read"):
        verify_models(a, b)
    with pytest.raises(ExternalDataError, match=r"store 0 or 1"):
        align_external_data_streaming(b, tmp_path / "out" / "model.onnx", size_threshold=0)
    assert sha256_of_tree(tmp_path) == before


def test_entries_that_fit_are_read_as_before(tmp_path):
    """The largest bit patterns, and the integer types whose entries every loader truncates alike (int8 300 is 44
    for onnx and onnxruntime), are not refused."""
    for data_type, values in [
        (TensorProto.FLOAT16, [0, 0xFFFF]),
        (TensorProto.BFLOAT16, [0xFFFF, 0x3F80]),
        (TensorProto.INT8, [300, -129]),
        (TensorProto.UINT16, [70000, 1]),
    ]:
        path = model_with(typed(data_type, values), tmp_path / str(data_type) / "model.onnx")
        assert verify_models(path, path).equal
        loaded = onnxruntime_reads(path)
        assert not isinstance(loaded, str), loaded
