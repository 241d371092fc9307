"""The attribute rules of ``ai.rt::DelayedInitializer``, shared by the kernel and the schema's shape inference.

Both the OpRun kernel (at evaluator construction, or per run for function-linked attributes) and the Python
shape-inference function call :func:`validate_attributes`, so a node that passes inference is a node the kernel
accepts and both report the same message. Checks run in a fixed order, the first failure wins: missing or mistyped
attribute, ``load_device``, ``runtime_device``, empty ``filename`` (then a NUL byte in it), negative ``offset``,
negative dimension, more than 64 dimensions or a dimension above int64 (shapes numpy cannot build, even with zero
elements), unsupported ``dtype``, then the byte size overflowing int64. :func:`check_node_structure` checks what
the schema would (no input, exactly one output, exactly the six attributes, each once, with its type) for callers
that cannot rely on the schema, on the ``NodeProto``, before onnx's ``OpRun`` stores any attribute on the kernel.

This module must never touch the file system: it validates values only (where the file is, and whether it is
there, is the kernel's business at read time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import numpy as np
import onnx
from onnx import AttributeProto

from onnx_light_ref.io.arguments import INT64_MAX
from onnx_light_ref.io.read.dtype_sizes import packed_nbytes
from onnx_light_ref.ops.dtypes import dtype_name, np_dtype_for, refuse_dtype

__all__ = [
    "ATTRIBUTE_TYPES",
    "LOAD_DEVICES",
    "MAX_RANK",
    "RUNTIME_DEVICES",
    "DelayedInitializerParams",
    "check_node_structure",
    "describe_node",
    "validate_attributes",
]

ATTRIBUTE_TYPES: dict[str, int] = {
    "shape": AttributeProto.INTS,
    "dtype": AttributeProto.INT,
    "load_device": AttributeProto.STRING,
    "runtime_device": AttributeProto.STRING,
    "filename": AttributeProto.STRING,
    "offset": AttributeProto.INT,
}
"""The six required attributes and their AttributeProto types, in the order the seed cases write them."""

_TYPE_LABELS: dict[int, str] = {
    AttributeProto.INTS: "INTS (a list of integers)",
    AttributeProto.INT: "INT (an integer)",
    AttributeProto.STRING: "STRING",
}

LOAD_DEVICES = ("cpu", "file")
RUNTIME_DEVICES = ("cpu",)

# Every AttributeProto type onnx's OpRun converts (all but UNDEFINED and unknown numbers).
_CONVERTIBLE_TYPES = frozenset(
    value for value in AttributeProto.AttributeType.values() if value != AttributeProto.UNDEFINED
)

MAX_RANK = 64
"""Most dimensions a numpy array can have (``numpy.ndarray``'s limit, 64 since numpy 2.0 and 32 before)."""


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


def describe_node(node: onnx.NodeProto) -> str:
    """How error messages name a node: by its name, else by its first output."""
    if node.name:
        return f"DelayedInitializer node {node.name!r}"
    if len(node.output) > 0:
        return f"DelayedInitializer node with output {node.output[0]!r}"
    return "DelayedInitializer node (unnamed, no output)"


def check_node_structure(node: onnx.NodeProto, *, where: str) -> None:
    """Refuse a node onnx's ``OpRun`` must never see: inputs, not exactly one output, any attribute but the six,
    one of the six twice or with another type (``ValueError`` naming the node and the attribute).

    ``OpRun`` stores every node attribute on the kernel instance with ``setattr(self, name, value)`` before the
    kernel can look at it, so an attribute named like anything the instance or its class carries (``run``,
    ``onnx_node``, ``__class__``, a private name...) would replace it: the kernel calls this first, before
    ``OpRun.__init__``, and nothing but the six names (:data:`ATTRIBUTE_TYPES`) ever reaches ``setattr``. The schema
    says as much, but it is consulted only when :func:`~onnx_light_ref.ops.register_schemas` ran and the checker is
    called. Function-linked attributes (``ref_attr_name``) count like literal ones and must declare the same type.
    The type is checked on the ``AttributeProto`` (a GRAPH-typed ``shape`` would otherwise make ``OpRun`` build an
    evaluator for it); a STRING value that is not UTF-8 is refused too (``OpRun`` would raise a bare
    ``UnicodeDecodeError``; a filename decoded with replacement characters would name another file).
    """
    if len(node.input) > 0:
        raise ValueError(f"{where}: takes no inputs, got {len(node.input)} ({list(node.input)}).")
    if len(node.output) != 1 or not node.output[0]:
        raise ValueError(f"{where}: must have exactly one (named) output, got {list(node.output)}.")
    seen: set[str] = set()
    for attribute in node.attribute:
        name = attribute.name
        if name not in ATTRIBUTE_TYPES:
            raise ValueError(
                f"{where}: attribute {name!r} is not an attribute of DelayedInitializer, which takes exactly "
                f"{list(ATTRIBUTE_TYPES)}; refused before anything is read."
            )
        if name in seen:
            raise ValueError(f"{where}: attribute {name!r} is given more than once; each attribute must appear once.")
        seen.add(name)
        _check_attribute_type(attribute, where)


def _check_attribute_type(attribute: onnx.AttributeProto, where: str) -> None:
    """The attribute's declared type must be the one the schema gives it, and a STRING value must be UTF-8."""
    expected = ATTRIBUTE_TYPES[attribute.name]
    if attribute.type not in _CONVERTIBLE_TYPES:
        raise ValueError(
            f"{where}: attribute {attribute.name!r} has type {_type_name(attribute.type)}, which cannot be "
            f"read; expected {_type_name(expected)}."
        )
    if attribute.type == AttributeProto.STRING and not attribute.ref_attr_name:
        try:
            attribute.s.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{where}: attribute {attribute.name!r} is not valid UTF-8 ({attribute.s!r}: {exc.reason} at byte "
                f"{exc.start}); STRING attributes must be UTF-8 text."
            ) from None
    if attribute.type != expected:
        linked = f" (linked to {attribute.ref_attr_name!r})" if attribute.ref_attr_name else ""
        raise ValueError(
            f"{where}: attribute {attribute.name!r}{linked} must be {_TYPE_LABELS[expected]}, got "
            f"{_shown_value(attribute)}."
        )


def _shown_value(attribute: onnx.AttributeProto) -> str:
    """How a mistyped attribute is shown: its value as Python would hold it, and its AttributeProto type."""
    kind = _type_name(attribute.type)
    if attribute.ref_attr_name:
        return f"an attribute of type {kind}"
    # (what OpRun would hold it as, the value): FLOAT is a float32 there (shown as the float it is).
    values: dict[int, tuple[str, object]] = {
        AttributeProto.INT: ("int", attribute.i),
        AttributeProto.FLOAT: ("float32", float(attribute.f)),
        AttributeProto.STRING: ("str", attribute.s.decode("utf-8", errors="replace")),
        AttributeProto.INTS: ("list", list(attribute.ints)),
        AttributeProto.FLOATS: ("list", [float(v) for v in attribute.floats]),
        AttributeProto.STRINGS: ("list", [v.decode("utf-8", errors="replace") for v in attribute.strings]),
    }
    if attribute.type not in values:
        return f"an attribute of type {kind}"
    label, value = values[attribute.type]
    return f"{label} {value!r} (an attribute of type {kind})"


def _type_name(attr_type: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(attr_type)
    except ValueError:
        return f"unknown ({attr_type})"


def _type_label(value: object) -> str:
    return type(value).__name__


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    return None


def _check_types(values: Mapping[str, object], where: str) -> dict[str, object]:
    missing = [name for name in ATTRIBUTE_TYPES if name not in values or values[name] is None]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        raise ValueError(
            f"{where}: missing required attribute(s) {names}; all six of {list(ATTRIBUTE_TYPES)} are required."
        )
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

    if load_device not in LOAD_DEVICES:
        raise ValueError(f"{where}: load_device must be 'cpu' or 'file', got {load_device!r}.")
    if runtime_device not in RUNTIME_DEVICES:
        raise ValueError(f"{where}: runtime_device must be 'cpu', got {runtime_device!r}.")
    if not filename:
        raise ValueError(f"{where}: filename must not be empty.")
    if "\x00" in filename:
        raise ValueError(f"{where}: filename {filename!r} contains a NUL byte.")
    if offset < 0:
        raise ValueError(f"{where}: offset must be non-negative, got {offset}.")
    negative = [d for d in shape if d < 0]
    if negative:
        raise ValueError(
            f"{where}: shape must not contain negative dimensions, got {list(shape)} (dimension {negative[0]})."
        )
    if len(shape) > MAX_RANK:
        raise ValueError(
            f"{where}: shape has {len(shape)} dimensions; at most {MAX_RANK} are supported (numpy's limit)."
        )
    too_large = [d for d in shape if d > INT64_MAX]
    if too_large:
        raise ValueError(f"{where}: shape dimension {too_large[0]} does not fit in int64.")
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
