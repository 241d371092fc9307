"""``onnx-light-ref run`` with tensors ``.npy`` cannot carry: bfloat16, float8, int4/uint4, float4, int2/uint2, float6.

The story: a user runs a bfloat16 (or int4, float8...) model and opens the outputs with ``np.load``. ``np.save``
of such an array writes a descr ``np.load`` refuses (``'<f1'``) or raw void (``'|V2'``), so ``run`` writes each
such output widened exactly (float32, int8, uint8) and says so, or its raw bits with ``--raw-bits``; it reads an
input of such a type from a ``.npy`` of the widened type (or the bits) and narrows it exactly, refusing a value the
type cannot hold with one ``error:`` line before anything is evaluated or written.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref._cli import main
from onnx_light_ref._commands.npy_types import feed_dtype, output_for_npy
from onnx_light_ref.io._read.onnx_compat import onnx_readable_tensor
from onnx_light_ref.ops._codes import every_code
from onnx_light_ref.ops._dtypes import EXTENDED_DTYPES, dtype_name, is_packed_dtype
from tests.checks import sha256_of_tree

EXTENDED_IDS = [dtype_name(t) for t in EXTENDED_DTYPES]
WIDENED = {"int4": np.int8, "int2": np.int8, "uint4": np.uint8, "uint2": np.uint8}


def save_model(folder: Path, dtype: int) -> Path:
    """``x_out = Identity(x)`` for an input ``x`` of ``dtype``, and an output ``W``: an external initializer holding
    every bit pattern of ``dtype``."""
    shape, raw = every_code(dtype)
    weights = onnx.TensorProto(name="W", data_type=dtype, dims=list(shape), raw_data=raw)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["x_out"])],
        "types",
        [helper.make_tensor_value_info("x", dtype, list(shape))],
        [helper.make_tensor_value_info("x_out", dtype, list(shape)), helper.make_tensor_value_info("W", dtype, shape)],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    model.ir_version = 10
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="model.data", size_threshold=0)
    return path


def onnx_weights(dtype: int) -> np.ndarray:
    """The array onnx's own evaluator holds for ``W`` (in the field onnx 1.17 reads, for its bfloat16)."""
    shape, raw = every_code(dtype)
    tensor = onnx_readable_tensor(dtype, list(shape), raw, "W")
    graph = helper.make_graph([], "w", [], [helper.make_tensor_value_info("W", dtype, list(shape))], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    (weights,) = ReferenceEvaluator(model).run(None, {})
    return np.asarray(weights)


def onnx_widened(dtype: int) -> np.ndarray:
    """``W`` widened by onnx's own Cast (float32, int8 or uint8), the oracle of the widened outputs."""
    shape, raw = every_code(dtype)
    target = (
        TensorProto.FLOAT
        if dtype_name(dtype) not in WIDENED
        else (TensorProto.INT8 if dtype_name(dtype).startswith("int") else TensorProto.UINT8)
    )
    tensor = onnx_readable_tensor(dtype, list(shape), raw, "W")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["W"], ["y"], to=target)],
        "w",
        [],
        [helper.make_tensor_value_info("y", target, None)],
        [tensor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    (widened,) = ReferenceEvaluator(model).run(None, {})
    widened = np.array(widened)
    if dtype in ONE_NAN:  # its one NaN has no sign: run writes np.nan on every onnx (Cast's sign differs by version)
        widened[np.isnan(widened)] = np.nan
    return widened


# The types with one NaN code, and that code: the float8 fnuz types and float8e8m0 (where this onnx has it).
ONE_NAN = {
    getattr(TensorProto, name): code
    for name, code in (("FLOAT8E4M3FNUZ", 0x80), ("FLOAT8E5M2FNUZ", 0x80), ("FLOAT8E8M0", 0xFF))
    if getattr(TensorProto, name, None) in EXTENDED_DTYPES
}


def run(path: Path, x: Path, out: Path, *options: str) -> int:
    return main(["run", str(path), "--input", f"x={x}", "--output-dir", str(out), *options])


@pytest.mark.parametrize("load_device", ["file", "cpu"])
@pytest.mark.parametrize("dtype", EXTENDED_DTYPES, ids=EXTENDED_IDS)
def test_outputs_are_widened_exactly_and_inputs_narrowed_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: int, load_device: str
) -> None:
    path = save_model(tmp_path, dtype)
    widened = onnx_widened(dtype)
    assert widened.dtype == feed_dtype(dtype)
    np.save(tmp_path / "x.npy", widened)

    assert run(path, tmp_path / "x.npy", tmp_path / "out", "--load-device", load_device) == 0

    w_out, x_out = np.load(tmp_path / "out" / "W.npy"), np.load(tmp_path / "out" / "x_out.npy")
    for saved in (w_out, x_out):
        assert saved.dtype == widened.dtype and saved.shape == widened.shape
        assert saved.tobytes() == widened.tobytes()  # every value, NaNs and -0.0 as onnx's Cast widens them
    out = capsys.readouterr().out
    assert f"W: shape {list(widened.shape)} dtype {widened.dtype} ({dtype_name(dtype)} widened exactly to" in out


@pytest.mark.parametrize("dtype", EXTENDED_DTYPES, ids=EXTENDED_IDS)
def test_raw_bits_write_and_read_each_elements_bit_pattern(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: int
) -> None:
    path = save_model(tmp_path, dtype)
    shape, raw = every_code(dtype)
    weights = onnx_weights(dtype)
    bits = output_for_npy(weights, raw_bits=True).array
    if is_packed_dtype(dtype):  # the codes of the packed stream, one per element
        assert bits.dtype == np.uint8
        assert (
            numpy_helper.to_array(onnx.TensorProto(data_type=dtype, dims=list(shape), raw_data=raw)).size == bits.size
        )
    else:
        assert bits.tobytes() == raw  # the raw_data bytes themselves, little-endian
    np.save(tmp_path / "x.npy", bits)

    assert run(path, tmp_path / "x.npy", tmp_path / "out", "--raw-bits") == 0

    for name in ("W", "x_out"):
        saved = np.load(tmp_path / "out" / f"{name}.npy")
        assert saved.dtype == bits.dtype and saved.tobytes() == bits.tobytes()
    assert f"(raw bits of {dtype_name(dtype)} as {bits.dtype} (--raw-bits))" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("dtype", "values", "npy_dtype", "message"),
    [
        (
            TensorProto.BFLOAT16,
            [1.0, 0.1],
            np.float32,
            r"input 'x' is bfloat16 in the model: 1 of its 2 values cannot be held exactly by bfloat16; the first, "
            r"at index \[1\], is 0\.1 \(float32\)",
        ),
        (TensorProto.INT4, [7, 8], np.int8, r"the first, at index \[1\], is 8 \(int8\)"),
        (TensorProto.UINT4, [16, 1], np.uint8, r"the first, at index \[0\], is 16 \(uint8\)"),
        (TensorProto.FLOAT8E4M3FN, [np.inf, 448.0], np.float32, r"the first, at index \[0\], is inf"),
        (TensorProto.FLOAT8E4M3FNUZ, [-0.0, 1.0], np.float32, r"the first, at index \[0\], is -0\.0"),
        (TensorProto.BFLOAT16, [1.0, 2.0], np.float64, r"give a \.npy of float32 \(its values widened exactly\), got"),
    ],
)
def test_a_value_the_type_cannot_hold_is_one_error_line_and_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: int, values: list, npy_dtype: type, message: str
) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", dtype, [2])],
        [helper.make_tensor_value_info("y", dtype, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "model.onnx"))
    np.save(tmp_path / "x.npy", np.array(values, dtype=npy_dtype))
    before = sha256_of_tree(tmp_path)

    assert run(tmp_path / "model.onnx", tmp_path / "x.npy", tmp_path / "out") == 1

    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert re.search(message, lines[0]), lines[0]
    assert lines[0].endswith("Nothing was evaluated.")
    assert sha256_of_tree(tmp_path) == before  # no output folder, no file


def test_raw_bits_refuse_a_code_wider_than_the_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_model(tmp_path, TensorProto.INT4)
    shape, _ = every_code(TensorProto.INT4)
    codes = np.zeros(shape, dtype=np.uint8)
    codes[1, 2] = 16
    np.save(tmp_path / "x.npy", codes)
    before = sha256_of_tree(tmp_path)

    assert run(path, tmp_path / "x.npy", tmp_path / "out", "--raw-bits") == 1

    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: input 'x' is int4 in the model: code 16 at index [1, 2] does not fit in 4 bits (--raw-bits feeds each "
        "element's bit pattern). Nothing was evaluated."
    ]
    assert sha256_of_tree(tmp_path) == before


def test_the_widening_note_says_when_nan_payloads_are_not_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """float8 E5M2 has six NaN codes; float32 from onnx's Cast has two: the note says so, --raw-bits keeps them."""
    path = save_model(tmp_path, TensorProto.FLOAT8E5M2)
    np.save(tmp_path / "x.npy", onnx_widened(TensorProto.FLOAT8E5M2))
    assert run(path, tmp_path / "x.npy", tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert "float8e5m2 widened exactly to float32 (NaN payloads are not kept: 4 of its bit patterns" in out
    assert "bfloat16" not in out


def test_bfloat16_outputs_are_what_np_load_reads_back(tmp_path: Path) -> None:
    """The issue's report: np.load read bfloat16 outputs back as raw void; now as float32 values."""
    path = save_model(tmp_path, TensorProto.BFLOAT16)
    np.save(tmp_path / "x.npy", onnx_widened(TensorProto.BFLOAT16))
    assert run(path, tmp_path / "x.npy", tmp_path / "out") == 0
    saved = np.load(tmp_path / "out" / "W.npy", allow_pickle=False)
    assert saved.dtype == np.float32 and saved.shape == (256, 256)  # element [h, l] holds the code 0xhhll
    assert saved[0x3F, 0x80] == 1.0 and saved[0xBF, 0x80] == -1.0 and saved[0x40, 0x49] == 3.140625
    assert saved[0x80, 0x00] == 0.0 and np.signbit(saved[0x80, 0x00])
    assert saved[0x00, 0x01] == np.float32(2.0**-133)  # the smallest subnormal
    assert saved.view(np.uint32)[0x7F, 0xC1] == 0x7FC10000  # a NaN payload survives


REFUSED = [(29, "<unknown 29>", "element type 29 is not an ONNX element type")]
if not hasattr(TensorProto, "FLOAT4E2M1"):  # onnx 1.17: the newer types are named in the refusal
    REFUSED.append((23, "float4e2m1", "does not define element type 23 (FLOAT4E2M1)"))


@pytest.mark.parametrize(("dtype", "name", "why"), REFUSED)
def test_a_node_of_a_type_this_onnx_cannot_produce_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: int, name: str, why: str
) -> None:
    from onnx_light_ref.ops._schema import make_delayed_initializer_node

    (tmp_path / "w.bin").write_bytes(bytes(8))
    node = make_delayed_initializer_node("y", shape=[4], dtype=dtype, load_device="file", filename="w.bin", offset=0)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.rt", 1)])
    onnx.save(model, str(tmp_path / "model.onnx"))
    before = sha256_of_tree(tmp_path)

    assert main(["run", str(tmp_path / "model.onnx"), "--output-dir", str(tmp_path / "out")]) == 1

    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"error: cannot evaluate {str(tmp_path / 'model.onnx')!r}: DelayedInitializer node ")
    assert f"dtype {dtype} ({name}) is not supported: " in line and why in line
    assert captured.out == "" and sha256_of_tree(tmp_path) == before


# Every float32 NaN: the ones onnx's Cast wrote for a fnuz NaN (-nan on onnx 1.23, nan on 1.17, so `run` on one onnx
# wrote a .npy the other refused), a payload, a signalling NaN.
NANS = {"nan": 0x7FC00000, "-nan": 0xFFC00000, "payload": 0x7FC00001, "signalling": 0x7F800001, "-payload": 0xFFFFFFFF}


@pytest.mark.parametrize("dtype", list(ONE_NAN), ids=dtype_name)
def test_any_nan_is_the_one_nan_of_a_fnuz_or_e8m0_type_on_every_onnx(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: int
) -> None:
    """``x_out = Identity(x)``: every NaN fed is the type's NaN code (checked with --raw-bits), written back as
    ``np.nan`` (0x7FC00000) on every onnx; the same assertions hold in the floor pass (onnx 1.17) and the newest,
    so a .npy either wrote feeds the other."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["x_out"])],
        "g",
        [helper.make_tensor_value_info("x", dtype, [len(NANS) + 1])],
        [helper.make_tensor_value_info("x_out", dtype, [len(NANS) + 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "model.onnx"))
    fed = np.array([*NANS.values(), 0x3F800000], dtype=np.uint32).view(np.float32)  # and a 1.0
    np.save(tmp_path / "x.npy", fed)

    assert run(tmp_path / "model.onnx", tmp_path / "x.npy", tmp_path / "out") == 0
    capsys.readouterr()
    written = np.load(tmp_path / "out" / "x_out.npy")
    assert written.view(np.uint32).tolist() == [0x7FC00000] * len(NANS) + [0x3F800000]

    assert run(tmp_path / "model.onnx", tmp_path / "out" / "x_out.npy", tmp_path / "again") == 0  # fed back
    assert np.load(tmp_path / "again" / "x_out.npy").tobytes() == written.tobytes()
    np.save(tmp_path / "codes.npy", np.array([ONE_NAN[dtype]] * len(NANS) + [0], dtype=np.uint8))
    assert run(tmp_path / "model.onnx", tmp_path / "codes.npy", tmp_path / "bits", "--raw-bits") == 0
    assert np.load(tmp_path / "bits" / "x_out.npy").tolist()[: len(NANS)] == [ONE_NAN[dtype]] * len(NANS)


def test_a_type_with_two_nans_keeps_refusing_a_nan_payload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """float8e4m3fn has two NaNs (+ and -): no NaN is mapped there, a payload it cannot hold is refused."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "model.onnx"))
    np.save(tmp_path / "x.npy", np.array([NANS["-nan"], NANS["payload"]], dtype=np.uint32).view(np.float32))
    before = sha256_of_tree(tmp_path)

    assert run(tmp_path / "model.onnx", tmp_path / "x.npy", tmp_path / "out") == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "1 of its 2 values cannot be held exactly by float8e4m3fn; the first, at index [1], is nan" in line
    assert sha256_of_tree(tmp_path) == before
