"""Allocate an output tensor, or say with a typed error that it cannot be held in memory.

A weights file may be sparse (an 8 TiB file occupying 0 bytes on disk) with a shape that matches it: every size
check passes, and only the allocation can tell that the tensor does not fit. numpy then raises an untyped
``MemoryError`` (or, with memory overcommit, succeeds and the process is killed while the array is filled).
:func:`allocate_tensor` refuses a tensor larger than the memory this process could ever be given (RAM plus swap,
or the address-space limit) before allocating, and turns a failing allocation into
:class:`~onnx_light_ref.errors.TensorAllocationError` naming the tensor.

This module must never touch the file the tensor comes from, and never allocate more than the one array asked for.
"""

from __future__ import annotations

import os
import resource

import numpy as np

from onnx_light_ref.errors import TensorAllocationError

_MEMINFO = "/proc/meminfo"


def _swap_bytes() -> int:
    try:
        with open(_MEMINFO, encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("SwapTotal:"):
                    return int(line.split()[1]) * 1024  # the value is in kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def allocatable_bytes() -> int | None:
    """The most bytes one allocation of this process could ever get: RAM plus swap, at most ``RLIMIT_AS``.

    Returns:
        That bound, or ``None`` when the platform does not tell (then only the allocation itself decides).
    """
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None
    if physical <= 0:
        return None
    bound = physical + _swap_bytes()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        bound = min(bound, soft)
    return bound


def allocate_tensor(shape: tuple[int, ...], dtype: np.dtype, *, where: str) -> np.ndarray:
    """An uninitialized array of ``shape`` and ``dtype``, or a typed error if it cannot be held in memory.

    Args:
        shape: the dimensions (validated: non-negative, numpy's rank limit).
        dtype: the element type.
        where: who needs the tensor (a node, a tensor name), for the message.

    Returns:
        ``np.empty(shape, dtype)``.

    Raises:
        TensorAllocationError: the tensor is larger than :func:`allocatable_bytes`, or numpy cannot allocate it.
    """
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    limit = allocatable_bytes()
    what = f"{where}: a tensor of shape {list(shape)} and dtype {dtype} needs {nbytes} bytes"
    if limit is not None and nbytes > limit:
        raise TensorAllocationError(
            f"{what}, more than this machine can allocate ({limit} bytes of memory and swap, or the address-space "
            "limit); nothing was read."
        )
    try:
        return np.empty(shape, dtype=dtype)
    except MemoryError as exc:
        raise TensorAllocationError(f"{what}, and allocating them failed ({exc}); nothing was read.") from exc
