"""Mutation test of the conformance cases: a kernel that changes any bit must fail them in onnx's own Runner.

Each wrong kernel below is the real ``DelayedInitializer`` with one realistic bug in what it returns (a flipped last
bit, mantissas truncated to 10 bits, bytes swapped, the offset off by one, the wrong dtype, subnormals flushed to
zero, ``-0.0`` turned into ``+0.0``; for the extended types also sub-byte values unpacked high nibble first).
The generated folder is run through ``onnx.backend.test.runner.Runner`` (via
``make_runner``) with a backend using that kernel: every mutant must fail at least one case, and the cases named
here must be among the failures. With the Runner's default tolerances (rtol 1e-3, atol 1e-7) several mutants passed
every case (issue 19). A NaN payload change is invisible to any ``assert_allclose`` (NaN equals NaN); our own
suite compares bits and catches it (last test).
"""

from __future__ import annotations

import dataclasses
import io
import os
import unittest
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx.backend.test.runner import Runner
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.backend import DelayedInitializerBackend, generate, seed_weights_paths
from onnx_light_ref.backend._backend import DelayedInitializerBackendRep
from onnx_light_ref.backend._cases import build_cases
from onnx_light_ref.backend._runner import make_runner
from onnx_light_ref.io._read.onnx_compat import evaluator_dtype, onnx_readable_tensor
from onnx_light_ref.ops import DelayedInitializer
from onnx_light_ref.ops._attributes import DelayedInitializerParams
from onnx_light_ref.ops._dtypes import EXTENDED_DTYPES, is_packed_dtype
from onnx_light_ref.ops._schema import register_schemas
from tests.backend.expected_warnings import EVERY_BIT_PATTERN

pytestmark = EVERY_BIT_PATTERN

Mutation = Callable[[np.ndarray], np.ndarray]


@pytest.fixture(scope="module", autouse=True)
def _remove_seed_weights() -> Iterator[None]:
    yield
    for path in seed_weights_paths():
        if os.path.lexists(path):
            os.remove(path)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mutations")
    generate(out)
    return out


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """The array's elements as rows of bytes (a writable view)."""
    return array.reshape(-1).view(np.uint8).reshape(-1, array.dtype.itemsize)


def _unsigned_view(array: np.ndarray) -> np.ndarray:
    """Float parts as unsigned integers of the same width (complex: both parts)."""
    if array.dtype.kind == "c":
        array = array.view(np.dtype(f"f{array.dtype.itemsize // 2}"))
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def flip_last_bit(array: np.ndarray) -> np.ndarray:
    if array.size:
        _bytes_of(array)[:, 0] ^= 1  # the least significant bit of each little-endian element
    return array


def _is_numpy_float(array: np.ndarray) -> bool:
    """float16/32/64 or complex: ``np.finfo`` knows them (not ml_dtypes' float8_e5m2, whose kind is also "f")."""
    return array.dtype.char in "efdFD"


def truncate_mantissa_to_10_bits(array: np.ndarray) -> np.ndarray:
    if not _is_numpy_float(array) or array.size == 0:
        return array
    parts = _unsigned_view(array)
    dropped = np.finfo(array.real.dtype).nmant - 10
    if dropped > 0:
        parts &= parts.dtype.type(~((1 << dropped) - 1) & ((1 << (8 * parts.dtype.itemsize)) - 1))
    return array


def swap_byte_order(array: np.ndarray) -> np.ndarray:
    return array.byteswap()


def flush_subnormals_to_zero(array: np.ndarray) -> np.ndarray:
    if not _is_numpy_float(array):
        return _flush_extended_subnormals(array)
    parts = array.view(array.real.dtype) if array.dtype.kind == "c" else array
    tiny = np.finfo(parts.dtype).tiny
    with np.errstate(invalid="ignore"):
        parts[(np.abs(parts) < tiny) & (parts != 0)] = 0
    return array


def _flush_extended_subnormals(array: np.ndarray) -> np.ndarray:
    """bfloat16, float8, float4, float6 (ml_dtypes, which knows their smallest normal): subnormals become +0."""
    finfo = _ml_finfo(array.dtype)
    if finfo is None or array.size == 0:
        return array
    wide = array.astype(np.float32)
    with np.errstate(invalid="ignore"):
        array[(np.abs(wide) < np.float32(finfo.smallest_normal)) & (wide != 0)] = 0
    return array


def _ml_finfo(dtype: np.dtype) -> Any:
    """ml_dtypes' finfo for its float types (onnx >= 1.18 represents the extended types with them), else None."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - onnx 1.17 without ml_dtypes: its structured dtypes are not floats
        return None
    try:
        return ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return None


def _ml_finfo_known() -> bool:
    """Whether this onnx represents the extended floats with ml_dtypes (onnx >= 1.18; not onnx 1.17)."""
    dtype = evaluator_dtype(TensorProto.BFLOAT16)
    return dtype is not None and _ml_finfo(dtype) is not None


def _runner_compares_extended_bits() -> bool:
    """onnx 1.17's Runner compares arrays of its structured dtypes (not numpy numbers) by their bits: there a plain
    case of an extended type sees a zero's sign, which only the bits case sees on newer onnx."""
    zeros = [
        numpy_helper.to_array(onnx_readable_tensor(TensorProto.FLOAT8E4M3FN, [1], bytes([code]))) for code in (0x80, 0)
    ]
    try:
        Runner.assert_similar_outputs([zeros[0]], [zeros[1]], rtol=0.0, atol=0.0)
    except AssertionError:
        return True
    return False


RUNNER_COMPARES_EXTENDED_BITS = _runner_compares_extended_bits()


# The code of -0.0 in each extended float type that has one (its sign bit alone); fnuz and E8M0 have no -0.0.
NEGATIVE_ZERO_CODES = {"BFLOAT16": 0x8000, "FLOAT8E4M3FN": 0x80, "FLOAT8E5M2": 0x80, "FLOAT4E2M1": 0x8}
NEGATIVE_ZERO_CODES.update(FLOAT6E2M3=0x20, FLOAT6E3M2=0x20)
_NEGATIVE_ZERO_BY_DTYPE = {
    evaluator_dtype(getattr(TensorProto, name)): code
    for name, code in NEGATIVE_ZERO_CODES.items()
    if getattr(TensorProto, name, None) in EXTENDED_DTYPES
}


def negative_zero_to_positive(array: np.ndarray) -> np.ndarray:
    code = _NEGATIVE_ZERO_BY_DTYPE.get(array.dtype)
    if code is not None:  # an extended float type: its representation holds the code (sub-byte: in one byte)
        bits = array.reshape(-1).view(np.dtype(f"u{array.dtype.itemsize}"))
        bits[bits == code] = 0
        return array
    if not _is_numpy_float(array):
        return array
    parts = array.view(array.real.dtype) if array.dtype.kind == "c" else array
    parts[parts == 0] = 0.0
    return array


# "V": ml_dtypes' types (bfloat16, float8...) and onnx 1.17's structured ones, returned as their raw unsigned bits.
_WRONG_DTYPE = {"f": "i", "i": "u", "u": "i", "c": "f", "b": "u", "V": "u"}


def wrong_dtype(array: np.ndarray) -> np.ndarray:
    """The same bytes returned as another type of the same width (float32 as int32, int8 as uint8...)."""
    kind = _WRONG_DTYPE[array.dtype.kind]
    width = array.dtype.itemsize // 2 if array.dtype.kind == "c" else array.dtype.itemsize
    other = array.view(np.dtype(f"{kind}{width}"))
    return other if array.dtype.kind != "c" else other.reshape(*array.shape, 2)


def canonicalize_nan(array: np.ndarray) -> np.ndarray:
    if not _is_numpy_float(array):
        return array
    parts = array.view(array.real.dtype) if array.dtype.kind == "c" else array
    parts[np.isnan(parts)] = np.nan
    return array


def high_nibble_first(array: np.ndarray, dtype: int) -> np.ndarray:
    """Packed types unpacked in the wrong order: each pair of neighbours swapped (the odd last one kept)."""
    if not is_packed_dtype(dtype) or array.size < 2:
        return array
    flat = array.reshape(-1)
    pairs = flat.size // 2 * 2
    first, second = flat[0:pairs:2].copy(), flat[1:pairs:2].copy()
    flat[0:pairs:2], flat[1:pairs:2] = second, first
    return array


def _params_kernel(mutation: Callable[[np.ndarray, int], np.ndarray]) -> type[DelayedInitializer]:
    def _rt_load(self: DelayedInitializer, params: DelayedInitializerParams) -> np.ndarray:
        return mutation(DelayedInitializer._rt_load(self, params).copy(), params.dtype)

    return type("DelayedInitializer", (DelayedInitializer,), {"_rt_load": _rt_load})


def _value_kernel(mutation: Mutation) -> type[DelayedInitializer]:
    def _rt_load(self: DelayedInitializer, params: DelayedInitializerParams) -> np.ndarray:
        return mutation(DelayedInitializer._rt_load(self, params).copy())

    return type("DelayedInitializer", (DelayedInitializer,), {"_rt_load": _rt_load})


def _offset_kernel(delta: int) -> type[DelayedInitializer]:
    def _rt_load(self: DelayedInitializer, params: DelayedInitializerParams) -> np.ndarray:
        return DelayedInitializer._rt_load(self, dataclasses.replace(params, offset=max(0, params.offset + delta)))

    return type("DelayedInitializer", (DelayedInitializer,), {"_rt_load": _rt_load})


def _backend(kernel: type[DelayedInitializer]) -> type[DelayedInitializerBackend]:
    class MutantBackend(DelayedInitializerBackend):
        op: ClassVar[type[DelayedInitializer]] = kernel

        @classmethod
        def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> DelayedInitializerBackendRep:
            register_schemas()
            onnx.checker.check_model(model, check_custom_domain=True)
            return DelayedInitializerBackendRep(ReferenceEvaluator(model, new_ops=[cls.op]))

    return MutantBackend


def _failing_cases(output_dir: Path, kernel: type[DelayedInitializer]) -> set[str]:
    runner = make_runner(output_dir, _backend(kernel))
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(runner.test_suite)
    failed = {test.id().rsplit(".", 1)[-1] for test, _ in (*result.errors, *result.failures)}
    return {name.removesuffix("_cpu") for name in failed}


C = "test_cc_delayedinitializer_"


def _extended(*names: str, bits: bool = False) -> set[str]:
    """The cases of the listed extended types that this onnx has (``bits``: their bits cases), both modes."""
    kind = "_bits" if bits else ""
    present = [name for name in names if getattr(TensorProto, name, None) in EXTENDED_DTYPES]
    return {f"{C}{name.lower()}{kind}_{mode}" for name in present for mode in ("cpu", "file")}


EXTENDED_FLOATS_WITH_SIGNED_ZERO = tuple(NEGATIVE_ZERO_CODES)
MUTANTS: dict[str, tuple[type[DelayedInitializer], set[str]]] = {
    "last bit flipped": (
        _value_kernel(flip_last_bit),
        {f"{C}float16_cpu", f"{C}float_file", f"{C}bool_cpu"}
        # onnx's Runner compares bfloat16 within two ulps: only the bits case sees its last bit.
        | _extended("BFLOAT16", bits=True)
        | _extended(
            "FLOAT8E4M3FN", "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "INT4", "UINT4", "FLOAT4E2M1", "INT2", "FLOAT6E3M2"
        ),
    ),
    "mantissa truncated to 10 bits": (
        _value_kernel(truncate_mantissa_to_10_bits),
        {f"{C}float_cpu", f"{C}double_file", f"{C}complex64_cpu", f"{C}complex128_file"},
    ),
    "byte order swapped": (
        _value_kernel(swap_byte_order),
        {f"{C}int32_cpu", f"{C}float16_file", f"{C}offset_cpu"} | _extended("BFLOAT16", bits=True),
    ),
    "offset + 1": (_offset_kernel(+1), {f"{C}offset_cpu", f"{C}offset_file", f"{C}file"}),
    "offset - 1": (_offset_kernel(-1), {f"{C}offset_cpu", f"{C}offset_file", f"{C}file"}),
    "wrong dtype": (
        _value_kernel(wrong_dtype),
        {f"{C}float_cpu", f"{C}int8_file", f"{C}complex64_cpu"}
        | _extended("BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E5M2", "INT4", "UINT4", "FLOAT4E2M1", "FLOAT6E2M3"),
    ),
    "sub-byte values unpacked high nibble first": (
        _params_kernel(high_nibble_first),
        _extended("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2"),
    ),
    "subnormals flushed to zero": (
        _value_kernel(flush_subnormals_to_zero),
        {f"{C}float16_cpu", f"{C}float_file", f"{C}double_cpu", f"{C}complex128_file"}
        | (
            _extended("BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E5M2", "FLOAT4E2M1", "FLOAT6E3M2")
            if _ml_finfo_known()
            else set()
        ),
    ),
    "-0.0 turned into +0.0": (
        _value_kernel(negative_zero_to_positive),
        {f"{C}signed_zero_{t}_{m}" for t in ("float16", "float", "double") for m in ("cpu", "file")}
        | _extended(*EXTENDED_FLOATS_WITH_SIGNED_ZERO, bits=True)
        | (_extended(*EXTENDED_FLOATS_WITH_SIGNED_ZERO) if RUNNER_COMPARES_EXTENDED_BITS else set()),
    ),
}


def test_the_real_kernel_passes_every_case(generated: Path) -> None:
    assert len(EXTENDED_DTYPES) >= 7  # bfloat16, four float8, int4, uint4 on every supported onnx
    assert _failing_cases(generated, DelayedInitializer) == set()


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_every_wrong_kernel_fails_in_onnx_runner(generated: Path, mutant: str) -> None:
    kernel, expected = MUTANTS[mutant]
    failing = _failing_cases(generated, kernel)
    assert failing, f"{mutant}: passed every case in onnx's Runner"
    assert expected <= failing, f"{mutant}: expected {sorted(expected - failing)} to fail too"


def test_signed_zero_is_invisible_to_the_runner_except_through_the_probe_cases(generated: Path) -> None:
    """Why the signed-zero cases exist: with any tolerance, assert_allclose calls -0.0 and +0.0 equal."""
    kernel, probes = MUTANTS["-0.0 turned into +0.0"]
    assert _failing_cases(generated, kernel) == probes


def test_a_changed_nan_payload_fails_our_bit_comparison(generated: Path) -> None:
    """NaN equals NaN for the Runner; our suite compares bytes, so a kernel canonicalizing NaNs fails it."""
    case = build_cases()[f"{C}float_cpu"]
    model = onnx.load(str(generated / "node" / case.name / "model.onnx"))
    (honest,) = ReferenceEvaluator(model, new_ops=[DelayedInitializer]).run(None, {})
    (mutated,) = ReferenceEvaluator(model, new_ops=[_value_kernel(canonicalize_nan)]).run(None, {})
    Runner.assert_similar_outputs([case.outputs[0]], [mutated], rtol=case.rtol, atol=case.atol)  # invisible here
    assert honest.tobytes() == case.outputs[0].tobytes()
    assert mutated.tobytes() != case.outputs[0].tobytes()
