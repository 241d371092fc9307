"""Conformance cases of ``ai.rt::DelayedInitializer``: the two onnx-light seed cases and our extra ones.

The seed cases (``test_cc_delayedinitializer_cpu`` and ``test_cc_delayedinitializer_file``) reproduce onnx-light's
exactly: an ABSOLUTE ``filename`` in the system temporary directory (``tempfile.gettempdir()``, so ``TMPDIR`` is
honoured), attributes in the order shape, dtype, load_device, runtime_device, filename, offset. They are kept for
compatibility; they are not portable (the model names a file outside its folder).

Every extra case keeps its weights file in its own case directory (``weights.bin``). Its model names that file
either ABSOLUTELY (``build_cases(case_root=...)``, what ``generate`` does by default): the case then runs in any
harness that loads ``model.onnx`` and prepares the proto without a path, from any working directory (onnx's
``Runner`` does exactly that); or RELATIVELY (``case_root=None``): the case folder can be moved anywhere, and a
runner binds the op to the case directory (``DelayedInitializer.bind(case_dir)``, or the backend's ``base_dir``).
Extra names share the ``test_cc_delayedinitializer_`` prefix so that harness filters written for onnx-light's
cases (onnxruntime excludes ``^test_cc_delayedinitializer_``) also apply to them.

This module only describes cases; it must never write a file (see ``generate``).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence

import numpy as np
from onnx import TensorProto
from onnx import helper as oh

from onnx_light_ref.backend._expect import CaseRegistry, SideFile
from onnx_light_ref.backend._typed_cases import add_extended_cases
from onnx_light_ref.ops._dtypes import PORTABLE_DTYPES, dtype_name, np_dtype_for
from onnx_light_ref.ops._schema import make_delayed_initializer_node

SEED_CASE_NAMES = ("test_cc_delayedinitializer_cpu", "test_cc_delayedinitializer_file")
SEED_WEIGHTS_BASENAMES = (
    "onnx_light_backend_delayedinitializer_cpu.bin",
    "onnx_light_backend_delayedinitializer_file.bin",
)

# A loader of raw bytes is exact: every case is compared with tolerances 0 (written to its data.json, which onnx's
# loader reads), so any changed bit of a value other than a zero's sign or a NaN's payload fails the Runner.
EXACT_RTOL = 0.0
EXACT_ATOL = 0.0

# Name of the extra cases' weights file, inside each case directory.
CASE_WEIGHTS_FILENAME = "weights.bin"

# The non-zero-offset case puts its tensor at an odd, unaligned offset inside a larger file with bytes after it, so
# an implementation that ignores `offset`, aligns it, or reads to the end of the file fails.
_OFFSET_CASE_OFFSET = 1001
_OFFSET_CASE_FILE_SIZE = 4096
_OFFSET_CASE_SEED = 4601  # the seed onnx-light's benchmark case uses; any fixed value works


def seed_weights_paths(temp_dir: str | None = None) -> list[str]:
    """Absolute paths of the two seed cases' weights files (in ``temp_dir``, default the system temp dir).

    onnx-light's two seed cases name their weights by an absolute path in the system temp folder, so
    :func:`~onnx_light_ref.backend.generate` writes them there, outside its folder: remove them when done.

    Args:
        temp_dir: the folder they are in (default ``tempfile.gettempdir()``, evaluated now).

    Returns:
        The two paths, the ``cpu`` case's first.

    Raises:
        Nothing: the paths are computed, not looked up.

    Example:
        In any folder:

        >>> import os, tempfile
        >>> from onnx_light_ref.backend import seed_weights_paths
        >>> [os.path.relpath(path, tempfile.gettempdir()) for path in seed_weights_paths()]
        ['onnx_light_backend_delayedinitializer_cpu.bin', 'onnx_light_backend_delayedinitializer_file.bin']
    """
    folder = temp_dir if temp_dir is not None else tempfile.gettempdir()
    return [os.path.join(folder, basename) for basename in SEED_WEIGHTS_BASENAMES]


def _raw_bytes(array: np.ndarray) -> bytes:
    """ONNX raw_data bytes of ``array``: little-endian, C order."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _nan_with_payload(np_dtype: np.dtype) -> np.ndarray:
    """A negative quiet NaN whose lowest payload bit is set (not numpy's canonical NaN), as a 0-d array."""
    finfo = np.finfo(np_dtype)
    bits = np_dtype.itemsize * 8
    exponent_mask = ((1 << (bits - 1)) - 1) & ~((1 << finfo.nmant) - 1)
    pattern = (1 << (bits - 1)) | exponent_mask | (1 << (finfo.nmant - 1)) | 1
    unsigned = np.dtype(f"<u{np_dtype.itemsize}")
    return np.array(pattern, dtype=unsigned).view(np_dtype.newbyteorder("<")).astype(np_dtype)


def _float_pool(np_dtype: np.dtype) -> np.ndarray:
    """Eight values in which every bit of the format matters, so a tolerance of 0 sees any changed bit.

    Every mantissa bit set (the largest magnitude below 2), alternating mantissa bits (1/3), the largest finite
    value, the smallest normal, the smallest subnormal (flushed to zero by a careless kernel), -0.0 (its sign is
    only visible through a probe case: see :func:`_add_signed_zero_cases`), a NaN with a payload (compared by bits
    in our suite) and -inf.
    """
    finfo = np.finfo(np_dtype)
    values = [
        np.nextafter(np_dtype.type(-2), np_dtype.type(0)),
        np_dtype.type(1) / np_dtype.type(3),
        finfo.max,
        finfo.tiny,
        finfo.smallest_subnormal,
        np_dtype.type(-0.0),
        _nan_with_payload(np_dtype),
        np_dtype.type(-np.inf),
    ]
    return np.array(values, dtype=np_dtype)


def _sample(dtype: int, shape: Sequence[int]) -> np.ndarray:
    """Deterministic values for ``dtype`` covering its extremes (min/max, tiny, subnormal, negative zero, NaN...)."""
    np_dtype = np_dtype_for(dtype)
    count = math.prod(shape)
    if np_dtype.kind == "b":
        pool = np.array([True, False, False, True, True, False, True, True])
    elif np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        pool = np.array([info.min, 0, 1, 2, info.max - 1, info.max, info.min + 1, 0x5A], dtype=np_dtype)
        if np_dtype.kind == "i":
            pool[1] = -1
    elif np_dtype.kind == "f":
        pool = _float_pool(np_dtype)
    else:  # complex: each part runs through the float pool, shifted so that every special meets a plain value
        parts = _float_pool(np.dtype(f"f{np_dtype.itemsize // 2}"))
        pairs = np.stack([parts, np.roll(parts, 3)], axis=1)
        pool = np.ascontiguousarray(pairs).view(np_dtype).reshape(-1)
    return np.resize(pool, count).reshape(tuple(shape)).astype(np_dtype)


def _add_case(
    registry: CaseRegistry,
    name: str,
    *,
    case_root: str | None,
    expected: np.ndarray,
    dtype: int,
    load_device: str,
    file_bytes: bytes,
    offset: int,
) -> None:
    # The side file is always written in the case directory; only what the model calls it changes.
    filename = CASE_WEIGHTS_FILENAME if case_root is None else os.path.join(case_root, name, CASE_WEIGHTS_FILENAME)
    node = make_delayed_initializer_node(
        "y",
        shape=list(expected.shape),
        dtype=dtype,
        load_device=load_device,
        filename=filename,
        offset=offset,
    )
    registry.expect(
        node,
        [],
        [expected],
        name=name,
        side_files=[SideFile(CASE_WEIGHTS_FILENAME, file_bytes)],
        rtol=EXACT_RTOL,
        atol=EXACT_ATOL,
    )


def _add_signed_zero_cases(registry: CaseRegistry, root: str | None) -> None:
    """Cases whose model is the op followed by ``Reciprocal``: the sign of a zero becomes the sign of an infinity.

    The Runner compares with ``assert_allclose``, for which ``-0.0`` equals ``+0.0`` whatever the tolerances (the
    difference is 0), so a kernel turning ``-0.0`` into ``+0.0`` would pass every plain case; ``1/-0.0 = -inf``
    and ``1/+0.0 = +inf`` differ, and the Runner checks where each infinity is.
    """
    for dtype in (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE):
        np_dtype = np_dtype_for(dtype)
        zeros = np.array([-0.0, 0.0, -0.0, 2.0], dtype=np_dtype)
        with np.errstate(divide="ignore"):
            expected = np.reciprocal(zeros)
        for mode in ("cpu", "file"):
            name = f"test_cc_delayedinitializer_signed_zero_{dtype_name(dtype)}_{mode}"
            filename = CASE_WEIGHTS_FILENAME if root is None else os.path.join(root, name, CASE_WEIGHTS_FILENAME)
            node = make_delayed_initializer_node(
                "z", shape=[4], dtype=dtype, load_device=mode, filename=filename, offset=0
            )
            registry.expect(
                node,
                [],
                [expected],
                name=name,
                side_files=[SideFile(CASE_WEIGHTS_FILENAME, _raw_bytes(zeros))],
                rtol=EXACT_RTOL,
                atol=EXACT_ATOL,
                followed_by=[oh.make_node("Reciprocal", ["z"], ["y"])],
            )


def _add_seed_cases(registry: CaseRegistry, temp_dir: str | None) -> None:
    cpu_path, file_path = seed_weights_paths(temp_dir)

    cpu_expected = np.array([3.0, 4.0, 5.0], dtype=np.float32)
    registry.expect(
        make_delayed_initializer_node(
            "y", shape=[3], dtype=TensorProto.FLOAT, load_device="cpu", filename=cpu_path, offset=0
        ),
        [],
        [cpu_expected],
        name="test_cc_delayedinitializer_cpu",
        side_files=[SideFile(cpu_path, _raw_bytes(cpu_expected))],
        rtol=EXACT_RTOL,
        atol=EXACT_ATOL,
    )

    file_expected = np.array([1.5, -2.0], dtype=np.float32)
    registry.expect(
        make_delayed_initializer_node(
            "y", shape=[2], dtype=TensorProto.FLOAT, load_device="file", filename=file_path, offset=8
        ),
        [],
        [file_expected],
        name="test_cc_delayedinitializer_file",
        side_files=[SideFile(file_path, bytes(8) + _raw_bytes(file_expected))],
        rtol=EXACT_RTOL,
        atol=EXACT_ATOL,
    )


def build_cases(temp_dir: str | None = None, *, case_root: str | os.PathLike[str] | None = None) -> CaseRegistry:
    """Every DelayedInitializer conformance case, seeds first.

    Extra cases: each portable dtype in both modes (shape [2, 4], extremes of the type), a scalar, a zero-size
    tensor (its weights file is empty and never opened), a tensor at an unaligned offset inside a larger file
    with trailing bytes, the signed-zero probes, and every extended type the installed onnx represents (bfloat16,
    float8, int4, float4...). The seed cases (:data:`~onnx_light_ref.backend.SEED_CASE_NAMES`) are the same whatever
    the arguments.

    Args:
        temp_dir: Where the seed weights live (default ``tempfile.gettempdir()``, evaluated now).
        case_root: The absolute folder that will hold the case directories (``<output_dir>/node``): the extra
            cases then name ``<case_root>/<case>/weights.bin`` absolutely. ``None``: they name ``weights.bin``
            relatively (a relocatable suite, run with the op bound to each case directory).

    Returns:
        A new registry; describing cases writes nothing.

    Raises:
        ValueError: ``case_root`` is not absolute.

    Example:
        In any folder (describing cases writes nothing):

        >>> from onnx_light_ref.backend import SEED_CASE_NAMES, build_cases
        >>> registry = build_cases()
        >>> registry.names()[:3]
        ['test_cc_delayedinitializer_cpu', 'test_cc_delayedinitializer_file', 'test_cc_delayedinitializer_float_cpu']
        >>> tuple(registry.names()[:2]) == SEED_CASE_NAMES
        True
    """
    root = os.fspath(case_root) if case_root is not None else None
    if root is not None and not os.path.isabs(root):
        raise ValueError(f"case_root must be an absolute path, got {root!r}.")
    registry = CaseRegistry()
    _add_seed_cases(registry, temp_dir)
    modes = ("cpu", "file")

    for dtype in PORTABLE_DTYPES:
        expected = _sample(dtype, [2, 4])
        for mode in modes:
            _add_case(
                registry,
                f"test_cc_delayedinitializer_{dtype_name(dtype)}_{mode}",
                case_root=root,
                expected=expected,
                dtype=dtype,
                load_device=mode,
                file_bytes=_raw_bytes(expected),
                offset=0,
            )

    scalar = np.array(-7.25, dtype=np.float64)
    zero_size = np.zeros((0, 3), dtype=np.float32)
    rng = np.random.default_rng(_OFFSET_CASE_SEED)
    block = rng.integers(-(2**31), 2**31 - 1, size=(4, 4), dtype=np.int32)
    filler = rng.integers(0, 256, size=_OFFSET_CASE_FILE_SIZE, dtype=np.uint8).tobytes()
    block_bytes = _raw_bytes(block)
    offset_file = (
        filler[:_OFFSET_CASE_OFFSET]
        + block_bytes
        + filler[_OFFSET_CASE_OFFSET + len(block_bytes) : _OFFSET_CASE_FILE_SIZE]
    )
    for mode in modes:
        _add_case(
            registry,
            f"test_cc_delayedinitializer_scalar_{mode}",
            case_root=root,
            expected=scalar,
            dtype=TensorProto.DOUBLE,
            load_device=mode,
            file_bytes=_raw_bytes(scalar),
            offset=0,
        )
        _add_case(
            registry,
            f"test_cc_delayedinitializer_zero_size_{mode}",
            case_root=root,
            expected=zero_size,
            dtype=TensorProto.FLOAT,
            load_device=mode,
            file_bytes=b"",
            offset=0,
        )
        _add_case(
            registry,
            f"test_cc_delayedinitializer_offset_{mode}",
            case_root=root,
            expected=block,
            dtype=TensorProto.INT32,
            load_device=mode,
            file_bytes=offset_file,
            offset=_OFFSET_CASE_OFFSET,
        )
    _add_signed_zero_cases(registry, root)
    add_extended_cases(registry, root)
    return registry
