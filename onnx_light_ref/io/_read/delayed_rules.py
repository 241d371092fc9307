"""``ai.rt::DelayedInitializer`` nodes read from a model alone: their static rules, and what each one reads.

The node's rules that need no evaluator live here, so that ``io`` (``inspect``) can apply them without importing
``ops``, and the kernel (:mod:`onnx_light_ref.ops._attributes`) applies the same ones, with the same words: the six
attributes and their types (:func:`check_node_structure`), all present (:func:`check_present`), and their values
(:func:`check_values`: ``load_device``, ``runtime_device``, ``filename``, ``offset``, the dims). What needs the
installed onnx's evaluator (whether it represents the ``dtype``, numpy's size limits) stays in ``ops``.

:func:`delayed_reads` lists every node of a model (main graph, subgraphs, training graphs, model functions) with
what it reads: :class:`DelayedRead` (file name, offset, byte length, dtype, shape), or why that cannot be known
statically (attributes linked to a function's, or refused by the rules above).

This module never touches the file system: where a file is, and whether it holds the bytes, is the reader's business
(``io/_layout_report.py`` for ``inspect``, the kernel at run time, ``undelay``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnx_light_ref.io._arguments import INT64_MAX
from onnx_light_ref.io._read.delayed_names import DELAYED_DOMAIN, DELAYED_OP_TYPE, LOAD_DEVICES
from onnx_light_ref.io._read.dtype_sizes import packed_nbytes
from onnx_light_ref.io._read.proto import AttributeProto, data_type_name

if TYPE_CHECKING:
    import onnx

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

RUNTIME_DEVICES = ("cpu",)

# Every AttributeProto type onnx's OpRun converts (all but UNDEFINED and unknown numbers).
_CONVERTIBLE_TYPES = frozenset(
    value for value in AttributeProto.AttributeType.values() if value != AttributeProto.UNDEFINED
)

MAX_RANK = 64
"""Most dimensions a numpy array can have (``numpy.ndarray``'s limit, 64 since numpy 2.0 and 32 before)."""


def is_delayed(node: onnx.NodeProto) -> bool:
    """True for an ``ai.rt::DelayedInitializer`` node."""
    return node.domain == DELAYED_DOMAIN and node.op_type == DELAYED_OP_TYPE


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
        return str(AttributeProto.AttributeType.Name(attr_type))
    except ValueError:
        return f"unknown ({attr_type})"


def check_present(values: Mapping[str, object], *, where: str) -> None:
    """Refuse a node that lacks one of the six attributes (absent, or None: how ``OpRun`` holds a missing one)."""
    missing = [name for name in ATTRIBUTE_TYPES if name not in values or values[name] is None]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        raise ValueError(
            f"{where}: missing required attribute(s) {names}; all six of {list(ATTRIBUTE_TYPES)} are required."
        )


def check_values(
    shape: tuple[int, ...], load_device: str, runtime_device: str, filename: str, offset: int, *, where: str
) -> None:
    """The checks of the attribute values that need no evaluator, in the kernel's order (the first failure wins):
    ``load_device``, ``runtime_device``, empty ``filename`` (then a NUL byte in it), negative ``offset``, negative
    dimension, more than :data:`MAX_RANK` dimensions or a dimension above int64 (``ValueError`` naming ``where``).
    The ``dtype`` is checked after these, by the reader (the kernel asks the installed onnx's evaluator)."""
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


@dataclass(frozen=True)
class DelayedRead:
    """One ``DelayedInitializer`` node and what it reads, as far as the model alone says.

    ``filename``, ``offset``, ``dtype``, ``shape`` and ``length`` are None when they cannot be known statically:
    ``linked`` (its attributes are a function's, known per call), or ``problem`` (why the kernel refuses the node).
    """

    index: int  # position among the model's DelayedInitializer nodes, in walk order
    node: str | bytes  # NodeProto.name as stored
    output: str  # the tensor it produces (its label in messages); "" when it has none
    where: str  # how messages name the node and its place
    filename: str | None = None
    offset: int | None = None
    dtype: int | None = None
    shape: tuple[int, ...] | None = None
    length: int | None = None  # bytes read: the shape's elements in dtype's raw layout
    load_device: str | None = None
    linked: bool = False
    problem: str | None = None


def delayed_reads(model: onnx.ModelProto) -> list[DelayedRead]:
    """Every ``DelayedInitializer`` node of ``model`` and what it reads, in walk order: the main graph and its
    subgraphs, then each training graph, then each model function (and their subgraphs).

    Args:
        model: the model (its metadata is enough: nothing is read).

    Returns:
        One :class:`DelayedRead` per node; a node the rules refuse carries the kernel's message in ``problem``.
    """
    reads = []
    for index, (node, place) in enumerate(_delayed_nodes(model)):
        where = describe_node(node) + place
        output = node.output[0] if len(node.output) > 0 else ""
        try:
            reads.append(_read(node, index, output, where))
        except ValueError as exc:
            reads.append(DelayedRead(index, node.name, output, where, problem=str(exc)))
    return reads


def _read(node: onnx.NodeProto, index: int, output: str, where: str) -> DelayedRead:
    check_node_structure(node, where=where)
    attributes = {attribute.name: attribute for attribute in node.attribute}
    check_present(attributes, where=where)
    if any(attribute.ref_attr_name for attribute in attributes.values()):
        return DelayedRead(index, node.name, output, where, linked=True)
    shape, dtype = tuple(attributes["shape"].ints), attributes["dtype"].i
    filename, offset = attributes["filename"].s.decode("utf-8"), attributes["offset"].i
    load_device = attributes["load_device"].s.decode("utf-8")
    check_values(shape, load_device, attributes["runtime_device"].s.decode("utf-8"), filename, offset, where=where)
    length = packed_nbytes(dtype, math.prod(shape))
    if length is None:
        name = data_type_name(dtype) or f"unknown data type {dtype}"
        raise ValueError(f"{where}: dtype {dtype} ({name}) has no fixed byte size; the node cannot read it.")
    return DelayedRead(index, node.name, output, where, filename, offset, dtype, shape, length, load_device)


def _delayed_nodes(model: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, str]]:
    """Each DelayedInitializer node and how messages name its place (empty in the main graph)."""
    from onnx_light_ref.io._read.walker import iter_graphs

    roots: list[tuple[onnx.GraphProto | onnx.FunctionProto, str]] = [(model.graph, "")]
    for index, training in enumerate(model.training_info):
        roots += [
            (getattr(training, name), f" (training_info[{index}].{name})")
            for name in ("initialization", "algorithm")
            if training.HasField(name)
        ]
    for function in model.functions:
        overload = f" (overload {function.overload!r})" if function.overload else ""
        roots.append((function, f" in model function {function.domain}::{function.name}{overload}"))
    for root, place in roots:
        for node in root.node:
            if is_delayed(node):
                yield node, place
        for node in root.node:  # subgraphs after the root's own nodes
            for attribute in node.attribute:
                subgraphs = [attribute.g] if attribute.HasField("g") else []
                for graph in (inner for subgraph in [*subgraphs, *attribute.graphs] for inner in iter_graphs(subgraph)):
                    for inner_node in graph.node:
                        if is_delayed(inner_node):
                            yield inner_node, f"{place} in subgraph {graph.name!r}"
