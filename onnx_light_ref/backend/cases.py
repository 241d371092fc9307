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

from onnx_light_ref.backend.expect import CaseRegistry, SideFile
from onnx_light_ref.ops.dtypes import ALLOWED_DTYPES, dtype_name, np_dtype_for
from onnx_light_ref.ops.schema import make_delayed_initializer_node

__all__ = [
    "CASE_WEIGHTS_FILENAME",
    "SEED_CASE_NAMES",
    "SEED_WEIGHTS_BASENAMES",
    "build_cases",
    "seed_weights_paths",
]

SEED_CASE_NAMES = ("test_cc_delayedinitializer_cpu", "test_cc_delayedinitializer_file")
SEED_WEIGHTS_BASENAMES = (
    "onnx_light_backend_delayedinitializer_cpu.bin",
    "onnx_light_backend_delayedinitializer_file.bin",
)

# Name of the extra cases' weights file, inside each case directory.
CASE_WEIGHTS_FILENAME = "weights.bin"

# The non-zero-offset case puts its tensor at an odd, unaligned offset inside a larger file with bytes after it, so
# an implementation that ignores `offset`, aligns it, or reads to the end of the file fails.
_OFFSET_CASE_OFFSET = 1001
_OFFSET_CASE_FILE_SIZE = 4096
_OFFSET_CASE_SEED = 4601  # the seed onnx-light's benchmark case uses; any fixed value works


def seed_weights_paths(temp_dir: str | None = None) -> list[str]:
    """Absolute paths of the two seed cases' weights files (in ``temp_dir``, default the system temp dir)."""
    folder = temp_dir if temp_dir is not None else tempfile.gettempdir()
    return [os.path.join(folder, basename) for basename in SEED_WEIGHTS_BASENAMES]


def _raw_bytes(array: np.ndarray) -> bytes:
    """ONNX raw_data bytes of ``array``: little-endian, C order."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _sample(dtype: int, shape: Sequence[int]) -> np.ndarray:
    """Deterministic values for ``dtype`` covering its extremes (min/max, tiny, negative zero...)."""
    np_dtype = np_dtype_for(dtype)
    count = math.prod(shape)
    if np_dtype.kind == "b":
        pool = np.array([True, False, False, True, True, False])
    elif np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        pool = np.array([info.min, 0, 1, 2, info.max - 1, info.max], dtype=np_dtype)
        if np_dtype.kind == "i":
            pool[1] = -1
    elif np_dtype.kind == "f":
        finfo = np.finfo(np_dtype)
        pool = np.array([-1.5, 0.25, finfo.max, finfo.tiny, -0.0, 3.0], dtype=np_dtype)
    else:  # complex
        finfo = np.finfo(np_dtype)
        pool = np.array([1 + 2j, -0.5j, 0, 3.25 - 1j, complex(float(finfo.max), -1.0), 1e-3 + 1e3j], dtype=np_dtype)
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
    registry.expect(node, [], [expected], name=name, side_files=[SideFile(CASE_WEIGHTS_FILENAME, file_bytes)])


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
    )


def build_cases(temp_dir: str | None = None, *, case_root: str | os.PathLike[str] | None = None) -> CaseRegistry:
    """Every DelayedInitializer conformance case, seeds first.

    Extra cases: each allowed dtype in both modes (shape [2, 3], extremes of the type), a scalar, a zero-size
    tensor (its weights file is empty and never opened), and a tensor at an unaligned offset inside a larger file
    with trailing bytes. The seed cases are the same whatever the arguments.

    Args:
        temp_dir: Where the seed weights live (default ``tempfile.gettempdir()``, evaluated now).
        case_root: The absolute folder that will hold the case directories (``<output_dir>/node``): the extra
            cases then name ``<case_root>/<case>/weights.bin`` absolutely. ``None``: they name ``weights.bin``
            relatively (a relocatable suite, run with the op bound to each case directory).

    Returns:
        A new registry; describing cases writes nothing.

    Raises:
        ValueError: ``case_root`` is not absolute.
    """
    root = os.fspath(case_root) if case_root is not None else None
    if root is not None and not os.path.isabs(root):
        raise ValueError(f"case_root must be an absolute path, got {root!r}.")
    registry = CaseRegistry()
    _add_seed_cases(registry, temp_dir)
    modes = ("cpu", "file")

    for dtype in ALLOWED_DTYPES:
        expected = _sample(dtype, [2, 3])
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
    return registry
