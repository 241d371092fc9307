"""The attribute rules of ``ai.rt::DelayedInitializer``, shared by the kernel and the schema's shape inference.

Both the OpRun kernel (at evaluator construction, or per run for function-linked attributes) and the Python
shape-inference function call :func:`validate_attributes`, so a node that passes inference is a node the kernel
accepts and both report the same message. Checks run in a fixed order, the first failure wins: missing or mistyped
attribute, ``load_device``, ``runtime_device``, empty ``filename`` (then a NUL byte in it), negative ``offset``,
negative dimension, more than 64 dimensions or a dimension above int64 (shapes numpy cannot build, even with zero
elements), unsupported ``dtype``, then the byte size overflowing int64. :func:`check_node_structure` checks what
the schema would (no input, exactly one output, exactly the six attributes, each once, with its type) for callers
that cannot rely on the schema, on the ``NodeProto``, before onnx's ``OpRun`` stores any attribute on the kernel.
The rules that need no evaluator (the node's structure, the values up to the dims) live in
:mod:`onnx_light_ref.io._read.delayed_nodes`, which ``inspect`` applies without this package; this module adds what
needs the installed onnx (the ``dtype``) and numpy (its size limits).

This module must never touch the file system: it validates values only (where the file is, and whether it is
there, is the kernel's business at read time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np
from onnx import AttributeProto

from onnx_light_ref.io._arguments import INT64_MAX
from onnx_light_ref.io._read.delayed_rules import (
    ATTRIBUTE_TYPES,
    check_present,
    check_values,
)
from onnx_light_ref.io._read.dtype_sizes import packed_nbytes
from onnx_light_ref.ops._dtypes import dtype_name, np_dtype_for, refuse_dtype


@dataclass(frozen=True)
class DelayedInitializerParams:
    """Validated attribute values of one DelayedInitializer node (or one call of a function-linked node)."""

    shape: tuple[int, ...]
    dtype: int
    load_device: str
    runtime_device: str
    filename: str
    offset: int

    @property
    def np_dtype(self) -> np.dtype:
        """Native numpy dtype of the output."""
        return np_dtype_for(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies in the file: its element count (1 for a scalar) in ``dtype``'s raw layout."""
        nbytes = packed_nbytes(self.dtype, math.prod(self.shape))
        assert nbytes is not None  # every allowed dtype has a fixed size
        return nbytes


def _type_label(value: object) -> str:
    return type(value).__name__


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    return None


def _check_types(values: Mapping[str, object], where: str) -> dict[str, object]:
    check_present(values, where=where)
    checked: dict[str, object] = {}
    for name, attr_type in ATTRIBUTE_TYPES.items():
        value = values[name]
        if attr_type == AttributeProto.INTS:
            items = [_as_int(v) for v in value] if isinstance(value, (list, tuple)) else None
            if items is None or any(v is None for v in items):
                raise ValueError(
                    f"{where}: attribute {name!r} must be INTS (a list of integers), got {_type_label(value)} "
                    f"{value!r}."
                )
            checked[name] = tuple(items)
        elif attr_type == AttributeProto.INT:
            number = _as_int(value)
            if number is None:
                raise ValueError(
                    f"{where}: attribute {name!r} must be INT (an integer), got {_type_label(value)} {value!r}."
                )
            checked[name] = number
        else:
            if isinstance(value, bytes):
                value = value.decode("utf-8", errors="replace")
            if not isinstance(value, str):
                raise ValueError(f"{where}: attribute {name!r} must be STRING, got {_type_label(value)} {value!r}.")
            checked[name] = value
    return checked


def validate_attributes(values: Mapping[str, object], *, where: str) -> DelayedInitializerParams:
    """Check the six attributes of one node and return them typed; ``ValueError`` naming ``where`` otherwise.

    ``values`` maps attribute names to Python values as ``OpRun`` stores them (INTS -> list of int, INT -> int,
    STRING -> str; ``bytes`` are accepted for STRING as ``onnx.helper.get_attribute_value`` returns them). Absent
    or ``None`` means missing.
    """
    checked = _check_types(values, where)
    shape = cast("tuple[int, ...]", checked["shape"])
    dtype = cast(int, checked["dtype"])
    load_device = cast(str, checked["load_device"])
    runtime_device = cast(str, checked["runtime_device"])
    filename = cast(str, checked["filename"])
    offset = cast(int, checked["offset"])

    check_values(shape, load_device, runtime_device, filename, offset, where=where)
    refuse_dtype(dtype, where=where)  # UnsupportedElementTypeError (a ValueError) naming the type and why
    params = DelayedInitializerParams(
        shape=shape,
        dtype=dtype,
        load_device=load_device,
        runtime_device=runtime_device,
        filename=filename,
        offset=offset,
    )
    # numpy refuses a shape whose non-zero dimensions multiply past its maximum size even when another dimension is
    # 0 (``[0, 2**63-1]``), so the bound is checked on that product, not only on the (zero) byte size.
    nonzero_bytes = math.prod(d for d in shape if d != 0) * params.np_dtype.itemsize
    if 0 in shape and nonzero_bytes > INT64_MAX:
        raise ValueError(
            f"{where}: shape {list(shape)} of {dtype_name(dtype)} cannot be built: its non-zero dimensions span "
            f"{nonzero_bytes} bytes, more than int64 can address (even with a zero dimension, numpy refuses it)."
        )
    if params.nbytes > INT64_MAX or offset > INT64_MAX - params.nbytes:
        raise ValueError(
            f"{where}: shape {list(shape)} of {dtype_name(dtype)} at offset {offset} is too large "
            f"({params.nbytes} bytes); offset + size must fit in int64."
        )
    return params
