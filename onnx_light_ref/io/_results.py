"""What the io writers return: the documented size as an ``int``, carrying the facts a caller reports.

:class:`AlignResult`, :class:`SaveResult`, :class:`LinkResult` and :class:`FamilyResult` *are* ints (the weights
file size, padding included), so code written against the documented ``int`` return value keeps working:
comparisons, arithmetic, ``str``, ``%d``, f-strings and JSON all see the plain number. The extra facts are read-only
attributes, so a command line can print its summary without re-reading the model it just wrote; ``repr`` shows them
(files, bytes, tensors, unaligned, stale...), since a bare ``196`` at the prompt said nothing of what was written.

Every result of the package is a frozen dataclass, these four included: each declares its fields once (typed, with
their defaults) and :class:`_SizeResult` adds the size, so ``AlignResult(196, tensors=3, ...)`` is built, typed,
compared, pickled and copied as an ``int`` without a hand-written ``__new__``. This module never does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import ClassVar, Literal, TypeVar

PairingHow = Literal["name", "map", "content", "transpose"]

_NAMES_SHOWN = 3  # a warning or a repr names this many items of a long list, then counts the rest


def summarize_names(names: Sequence[str], shown: int = _NAMES_SHOWN) -> str:
    """``"a, b, c and 196 more"``: a long list of names (tensors, files) counted, a few of them shown.

    A warning listing 199 tensor names on one line is unreadable; the full list stays on the result.

    Args:
        names: the names, in their order.
        shown: how many to name before counting the rest.

    Returns:
        The names joined by ``", "`` when there are at most ``shown + 1`` of them, else the first ``shown`` and
        ``and N more``.
    """
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def _shown(value: object) -> str:
    """A field's value in a ``repr``: a long tuple as its first items and its length."""
    if isinstance(value, tuple) and len(value) > _NAMES_SHOWN + 1:
        head = ", ".join(repr(item) for item in value[:_NAMES_SHOWN])
        return f"({head}, ... {len(value)} in all)"
    return repr(value)


def record_removed(result: AlignResult | LinkResult | FamilyResult, removed: Sequence[str]) -> None:
    """Record on ``result`` the stale files the publication deleted (``delete_stale``): they move from
    ``stale_weights_files`` (what is still there) to ``removed_files``.

    The result is built before the publication (so that a failure after the commit carries it), and which stale files
    may go is decided again under the folder lock: the writer records what went once the publication returned.
    """
    gone = set(removed)
    stale = result.stale_weights_files
    object.__setattr__(result, "removed_files", tuple(path for path in stale if path in gone))  # frozen: the writer's
    object.__setattr__(result, "stale_weights_files", tuple(path for path in stale if path not in gone))


_Size = TypeVar("_Size", bound="_SizeResult")


@dataclass(frozen=True, eq=False, repr=False)
class _SizeResult(int):
    """An ``int`` (``total_size``) with read-only keyword fields: each subclass is a frozen dataclass declaring them
    (``kw_only``). ``eq=False`` keeps ``int``'s equality and hash; pickle and copy rebuild the ``int`` from its value
    (``int.__getnewargs__``) and restore the fields from ``__dict__``."""

    total_size: InitVar[int]
    kept_inline_reasons: dict[str, int] = field(default_factory=dict, kw_only=True)  # every writer's result has it
    _REPR_FIELDS: ClassVar[tuple[str, ...]] = ()
    """What ``repr`` shows after the size, in this order (attributes or properties)."""

    def __new__(cls: type[_Size], total_size: int, **_fields: object) -> _Size:
        return super().__new__(cls, total_size)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={_shown(getattr(self, name))}" for name in self._REPR_FIELDS)
        return f"{type(self).__name__}({int(self)} bytes, {fields})"

    __str__ = int.__repr__  # str(), f"{result}" and "%s" stay the plain number the API documents

    @property
    def kept_inline_tensors(self) -> int:
        """Inline tensors of at least ``size_threshold`` bytes left in the ``.onnx`` (onnx's loader would not read
        them back, or a shape tensor: ``docs/safety.md#glossary``, "kept inline"), see ``kept_inline_reasons``."""
        return sum(self.kept_inline_reasons.values())


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)  # see _SizeResult
class _AlignedResult(_SizeResult):
    """The fields the aligners' results share (:class:`AlignResult`, :class:`FamilyResult`): their meaning is
    documented on each."""

    tensors: int
    weights_files: tuple[str, ...]
    copy_methods: frozenset[str]
    deduplicated_tensors: int = 0
    deduplicated_bytes: int = 0
    externalized_tensors: int = 0
    bytes_by_method: dict[str, int] = field(default_factory=dict)
    clone_eligible_bytes: int = 0
    stale_weights_files: tuple[str, ...] = ()
    weights_format: str = "onnx"
    index_file: str | None = None
    unaligned_tensors: tuple[str, ...] = ()
    removed_files: tuple[str, ...] = ()
    config_file: str | None = None


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)  # see _SizeResult
class AlignResult(_AlignedResult):
    """What the aligners return: the bytes of all weights files written (an ``int``), plus what was written.

    Returned by :func:`~onnx_light_ref.align_external_data_streaming` and
    :func:`~onnx_light_ref.align_external_data_in_memory`. It *is* an ``int`` (padding included; 0 when no tensor
    is external), so code written against the documented size keeps working: arithmetic, ``str``, ``%d`` and JSON
    see the plain number. The other facts are read-only attributes; ``repr`` shows the main ones.

    Attributes:
        tensors: external tensors in the written model (each tensor, even when it shares bytes with another).
        payload_bytes: distinct tensor bytes written; ``int(result) - payload_bytes`` is padding.
        weights_files: absolute paths of the weights files written, in shard order (empty when no tensor is
            external).
        copy_methods: how bytes moved (``"copy_file_range"``, ``"sendfile"``, ``"pread_pwrite"`` — the last also
            for bytes written from memory); empty when no byte moved.
        deduplicated_tensors: tensors pointing at bytes stored for an earlier tensor (identical source ranges, and
            identical bytes with ``dedup``).
        deduplicated_bytes: bytes those tensors would have taken if stored again.
        externalized_tensors: tensors that were inline in the source and are external in the output
            (``size_threshold``).
        bytes_by_method: payload bytes moved by each method of ``copy_methods``.
        clone_eligible_bytes: bytes copied by ``copy_file_range`` between block-aligned offsets on a filesystem that
            shares extents (reflinks): cloned rather than copied. 0 on ext4, tmpfs and across filesystems.
        stale_weights_files: absolute paths of files named like further shards of this destination (``W.3`` when
            this run wrote ``W`` and ``W.1``; ``W`` itself when it wrote none) that an earlier run left: the new
            ``.onnx`` does not reference them, and they are still there (not deleted, or kept by ``delete_stale``
            because another model uses them or the destination does not own them: a warning says which).
        removed_files: with ``delete_stale``, the stale files deleted once the new model was in place (absolute
            paths).
        config_file: with ``update_config``, the ``config.json`` whose ``transformers.js_config`` was updated.
        weights_format: ``"onnx"`` (raw weights files) or ``"safetensors"``.
        index_file: the ``model.safetensors.index.json`` written with a sharded safetensors set, else None.
        unaligned_tensors: safetensors only: names of the tensors of at least ``align_threshold`` bytes that could
            not start at a multiple of the alignment (the data section admits no padding).
        kept_inline_tensors: inline tensors of at least ``size_threshold`` bytes left in the ``.onnx``, because
            onnx's loader would not read them back from external data (sparse tensors, function default
            attributes, ``training_info``) or because they are shape tensors (``docs/safety.md#glossary``, "kept
            inline").
        kept_inline_reasons: the same tensors counted by reason (``"shape tensor"``, ``"sparse tensor"``...).
        kept_inline_names: the same tensors' names by reason (a tensor without a name is labelled by where it is,
            e.g. ``'Constant_0/value'``); with ``weights_format="safetensors"``, every tensor of the source the
            safetensors files do not hold (``"shape tensor"``, ``"no name (no safetensors key)"``...).
        padding: bytes of the weights files that no tensor uses (alignment gaps).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> import os
        >>> from onnx_light_ref import align_external_data_streaming
        >>> result = align_external_data_streaming("model.onnx", "out.onnx", max_shard_size=600_000, size_threshold=1)
        >>> result == result.payload_bytes + result.padding, result.tensors
        (True, 8)
        >>> [os.path.basename(path) for path in result.weights_files]
        ['out.onnx.data', 'out.onnx.data.1']
        >>> result.kept_inline_names  # the Reshape's shape stays in the .onnx
        {'shape tensor': ('shape',)}
    """

    _REPR_FIELDS = (
        "weights_files",
        "tensors",
        "payload_bytes",
        "padding",
        "deduplicated_tensors",
        "externalized_tensors",
        "kept_inline_tensors",
        "unaligned_tensors",
        "stale_weights_files",
        "weights_format",
        "index_file",
    )

    payload_bytes: int
    kept_inline_names: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def padding(self) -> int:
        """Bytes of the weights files that no tensor uses (alignment gaps)."""
        return int(self) - self.payload_bytes


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)  # see _SizeResult
class SaveResult(_SizeResult):
    """What :func:`~onnx_light_ref.save_model_with_shared_external_data` returns: the new weights file's size.

    An ``int``: the bytes of the secondary weights file (padding included; 0, and no file, when no tensor was new),
    plus what was saved as read-only attributes.

    Attributes:
        new_tensors: tensors whose inline bytes moved to the secondary file.
        reused_tensors: EXTERNAL tensors whose references were kept as they were.
        payload_bytes: bytes of the new tensors; ``int(result) - payload_bytes`` is padding.
        weights_files: absolute paths of the weights files written (empty when nothing was new).
        kept_inline_tensors: inline ``raw_data`` tensors of at least ``size_threshold`` bytes left in the ``.onnx``
            (onnx's loader would not read them back, or a shape tensor: ``docs/safety.md#glossary``, "kept inline").
        kept_inline_reasons: the same tensors counted by reason.
        padding: bytes of the secondary file that no tensor uses (alignment gaps).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, a variant of ``model.onnx`` whose head
        bias is new:

        >>> import numpy as np, onnx
        >>> from onnx_light_ref import save_model_with_shared_external_data
        >>> model = onnx.load("model.onnx", load_external_data=False)
        >>> model.graph.initializer[7].CopyFrom(onnx.numpy_helper.from_array(np.zeros(16, np.float32), "head.bias"))
        >>> result = save_model_with_shared_external_data(model, "variant.onnx", size_threshold=0)
        >>> int(result), result.new_tensors, result.reused_tensors, result.kept_inline_reasons
        (64, 1, 7, {'shape tensor': 1})
    """

    _REPR_FIELDS = ("weights_files", "new_tensors", "reused_tensors", "payload_bytes", "padding", "kept_inline_tensors")

    new_tensors: int
    reused_tensors: int
    payload_bytes: int
    weights_files: tuple[str, ...]

    @property
    def padding(self) -> int:
        """Bytes of the secondary file that no tensor uses (alignment gaps)."""
        return int(self) - self.payload_bytes


@dataclass(frozen=True, slots=True)
class TensorPairing:
    """A model tensor (``name``) and the checkpoint key holding its values, and how they were paired.

    ``how``: ``"name"`` (the key is its name), ``"map"`` (through a name map), ``"content"`` (equal bytes, compared),
    ``"transpose"`` (the tensor is the key's 2-D transpose, compared).
    """

    name: str
    key: str
    how: PairingHow


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)  # see _SizeResult
class LinkResult(_SizeResult):
    """What :func:`~onnx_light_ref.link_external_data` returns: the bytes of the model's own weights file.

    An ``int`` (padding included; 0 when every external tensor was linked, and no weights file is written), plus what
    was linked and written as read-only attributes.

    Attributes:
        linked_tensors: tensors pointing at the checkpoint's bytes (none of them copied).
        linked_bytes: their bytes, left where they are in the checkpoint.
        written_tensors: tensors written to the model's own weights file.
        written_bytes: their bytes.
        mismatched_tensors: labels of tensors named like a checkpoint key but of another data type or shape
            (written, not linked).
        checkpoint_files: absolute paths of the checkpoint's files.
        weights_files: the model's own weights file, when one was written.
        stale_weights_files: files an earlier run left at this destination that the new ``.onnx`` does not reference
            (its own weights file ``DST.onnx.data`` when every tensor is now linked, or files named like further
            shards of it), still there (not deleted, or kept by ``delete_stale``: a warning says why).
        removed_files: with ``delete_stale``, the stale files deleted once the new model was in place.
        kept_inline_reasons: inline tensors of at least ``size_threshold`` bytes left inline (not linked, not written)
            by reason: ``"shape tensor"``, ``"training_info"``, ``"function default attribute"``...
        kept_inline_tensors: their number.
        pairings: every model tensor paired with a checkpoint key (name, key, how: ``"name"``, ``"map"``,
            ``"content"``, ``"transpose"``), model order; the model tensors that became ``Transpose`` outputs
            (``transpose=True``) are among them.
        transposed_tensors: model tensors now computed by a ``Transpose`` node over a linked key (``transpose=True``).
        transpose_candidates: model tensors whose dims are a checkpoint key's swapped and that were not paired:
            probably pre-transposed weights (torch's ``optimize=True``, the legacy exporter); written.
        unaligned_linked: linked tensors of at least ``align_threshold`` bytes whose checkpoint offset is not a
            multiple of ``alignment`` (a link keeps the checkpoint's layout).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, with a safetensors copy of the weights
        as the checkpoint:

        >>> from onnx_light_ref import align_external_data_streaming, link_external_data
        >>> _ = align_external_data_streaming("model.onnx", "checkpoint.onnx", weights_format="safetensors")
        >>> result = link_external_data("model.onnx", "checkpoint.safetensors", "linked.onnx")
        >>> int(result), result.linked_tensors, result.linked_bytes, result.weights_files
        (0, 8, 1014784, ())
        >>> result.pairings[0]
        TensorPairing(name='W0', key='W0', how='name')
    """

    _REPR_FIELDS = (
        "weights_files",
        "linked_tensors",
        "linked_bytes",
        "written_tensors",
        "written_bytes",
        "mismatched_tensors",
        "checkpoint_files",
    )

    linked_tensors: int
    linked_bytes: int
    written_tensors: int
    written_bytes: int
    mismatched_tensors: tuple[str, ...] = ()
    checkpoint_files: tuple[str, ...] = ()
    weights_files: tuple[str, ...] = ()
    stale_weights_files: tuple[str, ...] = ()
    pairings: tuple[TensorPairing, ...] = ()
    transposed_tensors: tuple[str, ...] = ()
    transpose_candidates: tuple[str, ...] = ()
    unaligned_linked: int = 0
    removed_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class FamilyMember:
    """One member of a family written by :func:`~onnx_light_ref.align_models`.

    Attributes:
        source: absolute path of the source ``.onnx``.
        path: absolute path of the ``.onnx`` written (``<folder>/<its name>``: its file name or the name given).
        tensors: external tensors of the written model.
        payload_bytes: distinct bytes its external tensors reference.
        shared_tensors: its external tensors whose bytes another member uses too.
        externalized_tensors: tensors that were inline in the source (``size_threshold``).
        kept_inline_reasons: inline tensors of at least ``size_threshold`` bytes left in the ``.onnx`` (onnx's
            loader would not read them back, or a shape tensor: ``docs/safety.md#glossary``), by reason.
        kept_inline_names: the same tensors' names, by reason.
    """

    source: str
    path: str
    tensors: int
    payload_bytes: int
    shared_tensors: int = 0
    externalized_tensors: int = 0
    kept_inline_reasons: Mapping[str, int] = field(default_factory=dict)
    kept_inline_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class SharedTensor:
    """A payload stored once in the family's weights files and used by several members.

    Attributes:
        weights_file: absolute path of the weights file holding it.
        offset: its offset in that file.
        length: its size in bytes.
        users: ``(member path, tensor)`` of every tensor using it, in member then model order (a tensor named by
            its name, or by where it is when it has none, e.g. a subgraph's ``'If_0/then_branch/bias'``).
    """

    weights_file: str
    offset: int
    length: int
    users: tuple[tuple[str, str], ...]


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)  # see _SizeResult
class FamilyResult(_AlignedResult):
    """What :func:`~onnx_light_ref.align_models` returns: the bytes of the family's weights files together.

    An ``int`` (padding included), plus what was written for each member and for the family as read-only attributes.
    ``str``, ``format``, ``%d`` and JSON see the plain number; ``repr`` shows the family's totals.

    Attributes:
        members: one :class:`FamilyMember` per source, in the order given.
        weights_files: absolute paths of the shared weights files, in shard order (empty when no tensor is external).
        unique_bytes: distinct payload bytes written, each stored once for the whole family (``int(result) -
            unique_bytes`` is padding).
        separate_bytes: payload bytes the members would store aligned one by one (each member's identical source
            ranges once, as ``align`` stores them, byte-identical tensors again).
        shared_tensors: the payloads several members use (:class:`SharedTensor`).
        tensors: external tensors of all members together.
        deduplicated_tensors: tensors pointing at bytes stored for an earlier tensor (of any member).
        deduplicated_bytes: bytes those tensors would have taken if stored again.
        externalized_tensors: tensors of all members that were inline in their source (``size_threshold``).
        copy_methods, bytes_by_method, clone_eligible_bytes: how the bytes moved (as :class:`AlignResult`).
        stale_weights_files: files of the folder named like further shards of the weights, or that the replaced
            members referenced, that no model written uses now, still there (not deleted, or kept by
            ``delete_stale``: a warning says why).
        removed_files: with ``delete_stale``, the stale files deleted once the family was in place.
        config_file: with ``update_config``, the ``config.json`` whose ``transformers.js_config`` was updated.
        weights_format: ``"onnx"`` or ``"safetensors"``.
        index_file: the ``.safetensors.index.json`` of a sharded safetensors family, else None.
        unaligned_tensors: safetensors only: keys of tensors of at least ``align_threshold`` bytes not aligned.
        kept_inline_reasons: every member's inline tensors left in its ``.onnx`` (``docs/safety.md#glossary``, "kept
            inline"), by reason.
        kept_inline_tensors: their number.
        saved_bytes: payload bytes saved against storing each member separately (``separate_bytes - unique_bytes``).
        padding: bytes of the weights files that no tensor uses (alignment gaps, safetensors headers).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, where ``new_head.onnx`` is
        ``model.onnx`` with another head:

        >>> import os
        >>> from onnx_light_ref import align_models
        >>> os.mkdir("family")
        >>> result = align_models(["model.onnx", "new_head.onnx"], "family")
        >>> [(os.path.basename(member.path), member.tensors, member.shared_tensors) for member in result.members]
        [('model.onnx', 8, 6), ('new_head.onnx', 7, 6)]
        >>> result.unique_bytes, result.saved_bytes, len(result.shared_tensors)
        (1036288, 993216, 6)
    """

    members: tuple[FamilyMember, ...]
    unique_bytes: int
    separate_bytes: int
    shared_tensors: tuple[SharedTensor, ...] = ()

    @property
    def saved_bytes(self) -> int:
        """Payload bytes saved against storing each member separately (``separate_bytes - unique_bytes``)."""
        return self.separate_bytes - self.unique_bytes

    @property
    def padding(self) -> int:
        """Bytes of the weights files that no tensor uses (alignment gaps, safetensors headers)."""
        return int(self) - self.unique_bytes

    def __repr__(self) -> str:  # the family's totals (its members and shared tensors are too many for a line)
        return (
            f"FamilyResult({int(self)} bytes in {len(self.weights_files)} weights file(s): {len(self.members)} "
            f"members, {self.tensors} tensors, unique_bytes={self.unique_bytes}, saved_bytes={self.saved_bytes}, "
            f"shared_tensors={len(self.shared_tensors)})"
        )
