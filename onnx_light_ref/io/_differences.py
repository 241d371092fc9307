"""What ``verify`` reports: one record per difference between two models, and per ``checksum`` entry that is wrong.

:func:`~onnx_light_ref.io._verify.verify_models` says each difference in one sentence (``first_difference``, the
``different: ...`` line) and, for tools, as a :class:`Difference`: its kind (:data:`DifferenceKind`), the tensor of
each model it concerns (:class:`TensorRef`: index, name, kind, readable and structural place, data type, dims) and
the two values that differ. ``onnx-light-ref verify --json`` writes these records as they are. This module also
decides what differs between the metadata of two paired tensors (:func:`metadata_finding`), so that the sentence
and the record come from one comparison.

It holds plain records and pure functions: it never opens a file and never reads a tensor's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

from onnx_light_ref.io._read.proto import data_type_name
from onnx_light_ref.io._read.walker import SitePlace, TensorKind, TensorSite, describe_place

DifferenceKind = Literal[
    "name",
    "place",
    "data_type",
    "dims",
    "sparse_dims",
    "only_in_a",
    "only_in_b",
    "storage",
    "length",
    "bytes",
    "string_count",
    "string_element",
]
"""What differs. Metadata, found before any byte is read: ``name``, ``place`` (kind, readable or structural place),
``data_type``, ``dims``, ``sparse_dims`` (the dense shape of a sparse tensor), ``only_in_a`` / ``only_in_b`` (a
tensor without a partner). Contents: ``storage`` (a STRING tensor external on one side), ``length`` (byte lengths),
``bytes`` (the first differing byte), ``string_count`` and ``string_element`` (STRING tensors)."""

DIFFERENCE_KINDS: tuple[DifferenceKind, ...] = get_args(DifferenceKind)
"""Every :data:`DifferenceKind`, in its order."""

DifferenceValue = str | bytes | int | tuple[int, ...] | None
"""One side's value in a :class:`Difference`: a name (``bytes`` when it is not UTF-8), a data type name, dims, a
length, a byte value, a storage (``"inline"`` / ``"external"``), the first bytes of a string element, or None."""


@dataclass(frozen=True, slots=True)
class TensorRef:
    """One tensor of one model, as a difference names it.

    Attributes:
        model: ``"A"`` or ``"B"``.
        index: its position among its model's tensors, in the order ``verify`` reads them (``tensor #index`` in
            messages).
        name: ``TensorProto.name`` as stored (``bytes`` when it is not UTF-8; ``""`` when unnamed).
        label: the name, or a description of an unnamed tensor's place: how messages quote it.
        kind: what it is in its container (``"initializer"``, ``"attribute"``, ``"sparse initializer values"``...;
            docs/json.md lists them).
        where: the readable place (``graph 'main' / node 'if' (If) / then_branch``).
        place: the structural place, unique in the model: a tuple of steps from the model down to the tensor.
        data_type: the ``TensorProto.DataType`` number.
        dims: the tensor's dims.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, where ``new_head.onnx`` is
        ``model.onnx`` with another head:

        >>> from onnx_light_ref import verify_models
        >>> tensor = verify_models("model.onnx", "new_head.onnx").differences[0].a
        >>> tensor.model, tensor.index, tensor.name, tensor.kind, tensor.where, tensor.dims
        ('A', 6, 'head.weight', 'initializer', "graph 'demo_mlp'", (336, 16))
    """

    model: Literal["A", "B"]
    index: int
    name: str | bytes
    label: str
    kind: TensorKind
    where: str
    place: SitePlace
    data_type: int
    dims: tuple[int, ...]


def tensor_ref(model: Literal["A", "B"], index: int, site: TensorSite) -> TensorRef:
    """The :class:`TensorRef` of the walker's ``site``, the ``index``-th tensor of ``model``."""
    tensor = site.tensor
    return TensorRef(
        model, index, tensor.name, site.label, site.kind, site.where, site.place, tensor.data_type, tuple(tensor.dims)
    )


@dataclass(frozen=True, slots=True)
class Difference:
    """One difference between the two models; ``str()`` is its sentence.

    Attributes:
        kind: what differs (:data:`DifferenceKind`).
        message: the sentence ``verify`` prints: ``tensor #i 'name' (kind in where): what differs``.
        a: model A's tensor (None for ``only_in_b``).
        b: model B's tensor (None for ``only_in_a``).
        value_a: A's value of what differs (see :data:`DifferenceValue`; None when the kind has none, e.g.
            ``only_in_a``).
        value_b: B's value.
        offset: for ``bytes``, the offset of the first differing byte in the tensor's bytes; for
            ``string_element``, the element's index; else None.
        length: for ``bytes``, the tensor's byte length; else None.
        elsewhere: for ``only_in_a`` / ``only_in_b`` by name, a tensor of the other model with the same name at
            another place (a tensor moved to another graph), or None.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, where ``new_head.onnx`` is
        ``model.onnx`` with another head:

        >>> from onnx_light_ref import verify_models
        >>> difference = verify_models("model.onnx", "new_head.onnx").differences[0]
        >>> difference.kind, difference.a.name, difference.offset, difference.length
        ('bytes', 'head.weight', 0, 21504)
    """

    kind: DifferenceKind
    message: str
    a: TensorRef | None
    b: TensorRef | None
    value_a: DifferenceValue = None
    value_b: DifferenceValue = None
    offset: int | None = None
    length: int | None = None
    elsewhere: TensorRef | None = None

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class ChecksumMismatch:
    """A ``checksum`` entry matching neither its tensor's bytes nor its file; ``str()`` is its sentence.

    Attributes:
        tensor: the tensor whose entry it is.
        checksum: the entry's value, as written.
        location: the tensor's data file (its ``location`` entry).
        length: the tensor's byte length in that file.
        message: the sentence ``verify`` prints after ``checksum mismatch:``.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, a copy of ``model.onnx`` whose first
        tensor carries a wrong ``checksum`` entry:

        >>> import onnx
        >>> from onnx_light_ref import verify_models
        >>> model = onnx.load("model.onnx", load_external_data=False)
        >>> entry = model.graph.initializer[0].external_data.add()
        >>> entry.key, entry.value = "checksum", "0" * 40
        >>> onnx.save(model, "checked.onnx")
        >>> result = verify_models("model.onnx", "checked.onnx", check_checksums=True)
        >>> [(m.tensor.name, m.location, m.length) for m in result.checksum_mismatch_details]
        [('W0', 'model.onnx.data', 86016)]
    """

    tensor: TensorRef
    checksum: str
    location: str
    length: int
    message: str

    def __str__(self) -> str:
        return self.message


class Finding(NamedTuple):
    """What differs between two paired tensors, before it is tied to them: the kind, the words after ``tensor #i
    ...:``, the two values and, for bytes and string elements, the offset (or index) and the length."""

    kind: DifferenceKind
    what: str
    value_a: DifferenceValue = None
    value_b: DifferenceValue = None
    offset: int | None = None
    length: int | None = None


def metadata_finding(a: TensorSite, b: TensorSite, *, by_position: bool) -> Finding | None:
    """What differs between the name, kind, place, data type and dims of two paired tensors, or None.

    By position the structural place (:attr:`TensorSite.place`, every index on the way) must be equal too: the
    readable ``where`` cannot tell two same-named nodes apart. By name the key already matched, and the place may
    differ where the tensors were reordered.

    Args:
        a: model A's tensor.
        b: its partner in model B.
        by_position: the tensors were paired by position (the structural place is compared too).

    Returns:
        The first metadata difference, in the order name, kind and place, structural place, data type, dims, sparse
        dims; None when they agree.
    """
    ta, tb = a.tensor, b.tensor
    if (  # the usual answer, at once (a comparison of 100,000 pairs)
        ta.name == tb.name
        and a.kind == b.kind
        and a.where == b.where
        and (not by_position or a.place == b.place)
        and ta.data_type == tb.data_type
        and ta.dims == tb.dims
        and a.sparse is None
        and b.sparse is None
    ):
        return None
    if ta.name != tb.name:
        return Finding("name", f"name differs (A: {ta.name!r}, B: {tb.name!r})", ta.name, tb.name)
    if a.kind != b.kind or a.where != b.where:
        value_a, value_b = f"{a.kind.replace('_', ' ')} in {a.where}", f"{b.kind.replace('_', ' ')} in {b.where}"
        return Finding("place", f"place differs (A: {value_a}, B: {value_b})", value_a, value_b)
    if by_position and a.place != b.place:
        value_a, value_b = describe_place(a.place), describe_place(b.place)
        return Finding("place", f"place differs (A: {value_a}, B: {value_b})", value_a, value_b)
    if ta.data_type != tb.data_type:
        name_a, name_b = dtype_name(ta.data_type), dtype_name(tb.data_type)
        return Finding("data_type", f"data type differs (A: {name_a}, B: {name_b})", name_a, name_b)
    if list(ta.dims) != list(tb.dims):
        return Finding("dims", f"dims differ (A: {list(ta.dims)}, B: {list(tb.dims)})", tuple(ta.dims), tuple(tb.dims))
    sparse_a, sparse_b = _sparse_dims(a), _sparse_dims(b)
    if sparse_a != sparse_b:
        return Finding(
            "sparse_dims",
            f"sparse tensor dims differ (A: {None if sparse_a is None else list(sparse_a)}, "
            f"B: {None if sparse_b is None else list(sparse_b)})",
            sparse_a,
            sparse_b,
        )
    return None


def _sparse_dims(site: TensorSite) -> tuple[int, ...] | None:
    """The dense shape of the sparse tensor ``site`` is part of (values and indices alike), None for a dense one."""
    return None if site.sparse is None else tuple(site.sparse.dims)


def dtype_name(data_type: int) -> str:
    """``TensorProto.FLOAT`` -> ``"FLOAT"``; a number onnx does not know -> ``"unknown data type 99"``."""
    name = data_type_name(data_type)
    return f"unknown data type {data_type}" if name is None else name
