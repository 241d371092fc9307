"""Rule 2 of the writer contract: which tensor sites may become external data, and where their bytes may sit.

Every writer asks :meth:`SitePolicy.decide` before it moves an inline tensor out of the ``.onnx`` (align with
``size_threshold``, the shared saver's new tensors, ``link``'s linked and written tensors, ``undelay``'s new
initializers); none decides it in its own body. A tensor that is already EXTERNAL stays external (its bytes are never
read to inline it); only a tensor that would *become* external asks. It stays inline, in this order, when:

1. it has no bytes (a zero-length tensor: nothing to point at), no known byte size (``STRING``, ``UNDEFINED``, an
   unknown data type), or fewer bytes than the writer's ``size_threshold`` (None: the writer externalizes nothing);
2. onnx's loader would not read it back (:attr:`~onnx_light_ref.io._read.walker.TensorSite.onnx_loads`: sparse
   tensors, function default attributes, initializers of subgraphs inside functions, ``training_info``): after
   ``onnx.load`` + ``onnx.save`` elsewhere it would point at a file that is not there;
3. it is a *shape tensor*: the value of a graph initializer, or of a ``Constant`` node, that a node of the same graph
   (or of a subgraph below it, unless the subgraph defines the name again) takes at an input whose *data* the op's
   shape inference reads (:data:`DATA_INPUTS`, e.g. ``Reshape``'s ``shape``), also through a call of a model-local
   function whose body reads that input. onnx's shape inference (``check_model(full_check=True)``) and
   onnxruntime's session both refuse such a tensor stored externally: "Cannot parse data from external tensors".
   Measured with onnx 1.23.2 and onnxruntime 1.32.0 (``tests/contract/test_sites.py`` re-derives the table from the
   installed onnx and checks the checker and onnxruntime on each op).

Where bytes may sit (:func:`may_sit`): a tensor of ``n > 0`` bytes inside its file, at or after the first byte a
tensor may use (a safetensors file's data section starts after its header); a zero-length tensor exactly at the end
of its file, because onnx 1.17's loader reads a zero-length reference as "the rest of the file" (it treats length 0
as no length), so only the end gives zero bytes on every onnx; the start of a safetensors data section is not the end
of the file unless the section is empty.

Pure planning: this module never opens a file.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import onnx

from onnx_light_ref.io._read.delayed_nodes import DelayedSite, iter_delayed
from onnx_light_ref.io._read.walker import SitePlace, TensorSite, defined_names, inline_reason, iter_tensors

SHAPE_TENSOR = "shape tensor"
"""The reason (a key of the writers' ``kept_inline_reasons``) for rule 3 of the module docstring."""

_NEVER_EXTERNAL = (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING)

# What each tensor site of a destination model becomes, in iter_tensors order (SiteColumns.kinds).
SITE_INLINE = 0  # inline, and stays inline
SITE_KEPT = 1  # external, its entries kept as they are (a reused reference, a sparse tensor left alone)
SITE_MOVED = 2  # external in the source, placed by the writer (a copy, or a link into a checkpoint)
SITE_EXTERNALIZED = 3  # inline in the source (or new), placed external by the writer: rule 2 decided it

ReferenceSite = TensorSite | DelayedSite
"""A site of a model: a tensor, or a ``DelayedInitializer`` node (it reads bytes of a file, as an external tensor)."""


def iter_sites(model: onnx.ModelProto) -> Iterator[ReferenceSite]:
    """Every site of ``model`` in the order :class:`SiteColumns` follows: every tensor
    (:func:`~onnx_light_ref.io._read.walker.iter_tensors`), then every ``DelayedInitializer`` node
    (:func:`~onnx_light_ref.io._read.delayed_nodes.iter_delayed`)."""
    yield from iter_tensors(model)
    yield from iter_delayed(model)


DATA_INPUTS: Mapping[str, tuple[tuple[int, frozenset[int]], ...]] = {
    # op type of the default domain -> (since opset version, input indices whose data shape inference reads), by
    # version. The version used is the highest one at or below the model's opset: input positions change between
    # versions (Resize-10's input 1 is `scales`, Resize-11's is `roi`, which is not read).
    "AffineGrid": ((20, frozenset({1})),),
    "BlackmanWindow": ((17, frozenset({0})),),
    "CenterCropPad": ((18, frozenset({1})),),
    "Col2Im": ((18, frozenset({1, 2})),),
    "ConstantOfShape": ((9, frozenset({0})),),
    "DFT": ((17, frozenset({1})), (20, frozenset({1, 2}))),
    "Expand": ((8, frozenset({1})),),
    "HammingWindow": ((17, frozenset({0})),),
    "HannWindow": ((17, frozenset({0})),),
    "MelWeightMatrix": ((17, frozenset({0, 1})),),
    "OneHot": ((9, frozenset({0, 1})), (11, frozenset({1}))),
    "Pad": ((11, frozenset({1})), (18, frozenset({1, 3}))),
    "Range": ((11, frozenset({0, 1, 2})),),
    "ReduceL1": ((18, frozenset({1})),),
    "ReduceL2": ((18, frozenset({1})),),
    "ReduceLogSum": ((18, frozenset({1})),),
    "ReduceLogSumExp": ((18, frozenset({1})),),
    "ReduceMax": ((18, frozenset({1})),),
    "ReduceMean": ((18, frozenset({1})),),
    "ReduceMin": ((18, frozenset({1})),),
    "ReduceProd": ((18, frozenset({1})),),
    "ReduceSum": ((13, frozenset({1})),),
    "ReduceSumSquare": ((18, frozenset({1})),),
    "Reshape": ((5, frozenset({1})),),
    "Resize": ((10, frozenset({1})), (11, frozenset({2, 3}))),
    "Slice": ((10, frozenset({1, 2, 3, 4})),),
    "Split": ((13, frozenset({1})),),
    "SplitToSequence": ((11, frozenset({1})),),
    "Squeeze": ((13, frozenset({1})),),
    "STFT": ((17, frozenset({1, 3})),),
    "Tile": ((6, frozenset({1})),),
    "TopK": ((10, frozenset({1})),),
    "Unsqueeze": ((13, frozenset({1})),),
    "Upsample": ((9, frozenset({1})),),
}
"""Inputs whose data the default domain's shape inference reads (``getInputData``), by op type and version.

Found by calling each schema's inference (``onnx.shape_inference.infer_node_outputs``) with that input given as an
external tensor, for every schema version of onnx 1.23 (and by hand for inputs the generic probe cannot reach, such
as ``Pad``'s ``pads`` next to ``axes``); ``ai.onnx.ml`` has none. onnxruntime runs the same inference functions."""

_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True, slots=True)
class SiteDecision:
    """Whether a tensor may become external; ``reason`` names why a tensor large enough to move stays inline."""

    external: bool
    reason: str | None = None


_INLINE = SiteDecision(False)
_EXTERNAL = SiteDecision(True)


class SitePolicy:
    """The one decision of rule 2 for the tensors of one model (see the module docstring).

    Args:
        model: the model whose tensors are decided (its nodes say which values are shape tensors).
        size_threshold: tensors with fewer bytes stay inline; None: nothing becomes external.
    """

    def __init__(self, model: onnx.ModelProto, size_threshold: int | None) -> None:
        self.model = model
        self.size_threshold = size_threshold
        self._opsets = _opsets(model.opset_import)
        self._functions = {
            (f.domain, f.name, getattr(f, "overload", "")): index for index, f in enumerate(model.functions)
        }
        self._function_inputs: dict[tuple[str, str, str], frozenset[int]] = {}
        self._consumed: dict[SitePlace, frozenset[str]] = {}
        # The walker hands every site of one graph the same container object: a cheap first lookup, checked by
        # identity (the container is kept alive, so its id is not reused), the place-keyed one behind it.
        self._by_container: dict[int, tuple[object, frozenset[str]]] = {}

    def decide(self, site: TensorSite, nbytes: int | None) -> SiteDecision:
        """May ``site``, of ``nbytes`` bytes (None: unknown), become external data?

        Args:
            site: a tensor of :func:`~onnx_light_ref.io._read.walker.iter_tensors` over this policy's model.
            nbytes: its byte size (None when its data type has none).

        Returns:
            The :class:`SiteDecision`: ``reason`` is set only for a tensor of at least ``size_threshold`` bytes kept
            inline by rule 2 or 3 (the writers count them by reason).
        """
        if self.size_threshold is None or nbytes is None or nbytes <= 0 or nbytes < self.size_threshold:
            return _INLINE
        if site.tensor.data_type in _NEVER_EXTERNAL:
            return _INLINE
        reason = inline_reason(site)
        if reason is not None:
            return SiteDecision(False, reason)
        if self.is_shape_tensor(site):
            return SiteDecision(False, SHAPE_TENSOR)
        return _EXTERNAL

    def is_shape_tensor(self, site: TensorSite) -> bool:
        """Whether ``site`` is a value some node takes at an input whose data shape inference reads (rule 3)."""
        name = _value_name(site)
        if not name:
            return False
        known = self._by_container.get(id(site.container))
        if known is None or known[0] is not site.container:
            prefix = site.place[:-1] if site.kind == "initializer" else site.place[:-3]
            known = self._by_container[id(site.container)] = (site.container, self._consumed_in_container(prefix))
        return name in known[1]

    # ------------------------------------------------------------------------------------- the shape analysis

    def _consumed_in_container(self, prefix: SitePlace) -> frozenset[str]:
        known = self._consumed.get(prefix)
        if known is None:
            nodes, opsets = self._container(prefix)
            known = self._consumed[prefix] = frozenset(self._consumed_by(nodes, opsets))
        return known

    def _container(self, prefix: SitePlace) -> tuple[Sequence[onnx.NodeProto], Mapping[str, int]]:
        """The nodes of the graph or function at ``prefix`` (a :data:`SitePlace` without its slot), with the opsets
        that apply there (a function's own, else the model's)."""
        root, *steps = (cast(tuple[object, ...], step) for step in prefix)
        opsets = self._opsets
        container: onnx.GraphProto | onnx.FunctionProto
        if root[0] == "graph":
            container = self.model.graph
        elif root[0] == "function":
            container = self.model.functions[_index(root)]
            opsets = _opsets(container.opset_import) or opsets
        else:  # ("training", index, field)
            container = getattr(self.model.training_info[_index(root)], str(root[2]))
        for node_step, attribute_step, graph_step in zip(steps[0::3], steps[1::3], steps[2::3], strict=True):
            attribute = container.node[_index(node_step)].attribute[_index(attribute_step)]
            container = attribute.g if graph_step[0] == "g" else attribute.graphs[_index(graph_step)]
        return container.node, opsets

    def _consumed_by(self, nodes: Sequence[onnx.NodeProto], opsets: Mapping[str, int]) -> set[str]:
        """Names the nodes (and their subgraphs, minus what each subgraph defines itself) take at a data input."""
        names: set[str] = set()
        for node in nodes:
            for index in self._data_inputs(node, opsets):
                if index < len(node.input) and node.input[index]:
                    names.add(node.input[index])
            for attribute in node.attribute:
                subgraphs = [attribute.g] if attribute.HasField("g") else []
                for subgraph in [*subgraphs, *attribute.graphs]:
                    names |= self._consumed_by(subgraph.node, opsets) - defined_names(subgraph)
        return names

    def _data_inputs(self, node: onnx.NodeProto, opsets: Mapping[str, int]) -> frozenset[int]:
        domain = node.domain
        if domain in _DEFAULT_DOMAINS:
            return _table_inputs(node.op_type, opsets.get("", 0))
        key = (domain, node.op_type, getattr(node, "overload", ""))
        if key in self._functions:
            return self._function_data_inputs(key)
        return frozenset()

    def _function_data_inputs(self, key: tuple[str, str, str]) -> frozenset[int]:
        """The inputs of a model-local function that its body (or a function it calls) reads as data."""
        known = self._function_inputs.get(key)
        if known is not None:
            return known
        self._function_inputs[key] = frozenset()  # a recursive call reads nothing more than what is found so far
        function = self.model.functions[self._functions[key]]
        consumed = self._consumed_by(function.node, _opsets(function.opset_import) or self._opsets)
        found = frozenset(index for index, name in enumerate(function.input) if name in consumed)
        self._function_inputs[key] = found
        return found


def _index(step: tuple[object, ...]) -> int:
    """The index a :data:`SitePlace` step holds after its name (``("node", 3)`` -> 3)."""
    value = step[1]
    assert isinstance(value, int)
    return value


def _opsets(imports: Sequence[onnx.OperatorSetIdProto]) -> dict[str, int]:
    return {("" if entry.domain == "ai.onnx" else entry.domain): entry.version for entry in imports}


def _table_inputs(op_type: str, version: int) -> frozenset[int]:
    found: frozenset[int] = frozenset()
    for since, indices in DATA_INPUTS.get(op_type, ()):
        if since <= version:
            found = indices
    return found


def _value_name(site: TensorSite) -> str:
    """The value name a tensor site defines in its graph: an initializer's name, a ``Constant`` node's output."""
    if site.kind == "initializer":
        name = site.tensor.name
    elif (
        site.kind == "attribute"
        and site.node is not None
        and site.node.op_type == "Constant"
        and site.node.domain in _DEFAULT_DOMAINS
        and len(site.node.output) == 1
    ):
        name = site.node.output[0]
    else:
        return ""
    return name if isinstance(name, str) else ""


def site_mark(site: ReferenceSite) -> int:
    """What ties a recorded site to the site it describes: the hash of a tensor's place (unique in its model) and
    key (its name there), of a ``DelayedInitializer`` node's place and output. Equal when the same model is walked
    again; a walk that drifted (another order, tensors swapped, a model changed since) gives other marks."""
    if isinstance(site, TensorSite):
        return hash((site.place, site.key))
    return hash((site.where, site.label))


class SiteColumns:
    """Every site of one destination model, in :func:`iter_sites` order (its tensors, then its
    ``DelayedInitializer`` nodes), each recorded with the site it describes (:meth:`record`).

    One byte per site (``SITE_*``) in :attr:`kinds` and its :func:`site_mark` in :attr:`marks`, which the writer
    contract compares with the model walked again: a plan whose sites drifted from the walk (another order, a
    model changed after planning) is refused
    (:class:`~onnx_light_ref.io._write.contract.WriterContractError`), never written with one tensor's place given to
    another. The placed sites (``SITE_MOVED``, ``SITE_EXTERNALIZED``), in walk
    order, have their file (an index into :attr:`targets`), offset and length in three columns: a few bytes per
    tensor, not an object (models with 100,000 tensors, ``docs/align.md``); :attr:`checksums` keeps the source
    ``checksum`` entry of the placed tensors that had one (by placed index).
    """

    __slots__ = ("_indices", "checksums", "kinds", "lengths", "marks", "offsets", "target", "targets")

    def __init__(self) -> None:
        self.kinds = bytearray()
        self.marks: array[int] = array("q")
        self.targets: list[str] = []
        self._indices: dict[str, int] = {}
        self.target: array[int] = array("i")
        self.offsets: array[int] = array("q")
        self.lengths: array[int] = array("q")
        self.checksums: dict[int, str] = {}

    @classmethod
    def from_columns(
        cls,
        kinds: bytearray,
        marks: array[int],
        targets: list[str],
        target: array[int],
        offsets: array[int],
        lengths: array[int],
    ) -> SiteColumns:
        """Columns a planner already keeps (shared, not copied): ``target`` indexes ``targets``."""
        columns = cls()
        columns.kinds, columns.marks = kinds, marks
        columns.targets, columns.target, columns.offsets, columns.lengths = targets, target, offsets, lengths
        columns._indices = {path: index for index, path in enumerate(targets)}
        return columns

    def record(self, site: ReferenceSite, kind: int) -> None:
        """Record the next site of the walk and its kind; a placed one gets its place from :meth:`place`."""
        self.kinds.append(kind)
        self.marks.append(site_mark(site))

    def add(self, site: ReferenceSite, kind: int, path: str | None = None, offset: int = 0, length: int = 0) -> None:
        """Record the next site: a placed one (``SITE_MOVED``/``SITE_EXTERNALIZED``) names its file and range."""
        self.record(site, kind)
        if kind in (SITE_MOVED, SITE_EXTERNALIZED):
            assert path is not None
            self.place(path, offset, length)

    def place(self, path: str, offset: int, length: int) -> None:
        """Append a placed site's file and range (for writers that record kinds and places separately)."""
        index = self._indices.get(path)
        if index is None:
            index = self._indices[path] = len(self.targets)
            self.targets.append(path)
        self.target.append(index)
        self.offsets.append(offset)
        self.lengths.append(length)

    @property
    def placed(self) -> int:
        return len(self.lengths)


def may_sit(offset: int, length: int, file_size: int, *, data_start: int = 0) -> bool:
    """Whether ``length`` bytes at ``offset`` sit where every loader reads exactly them (module docstring).

    Args:
        offset: where the tensor's bytes start in the file.
        length: how many bytes it has.
        file_size: the file's final size.
        data_start: the first byte a tensor may use (a safetensors file's header size, 0 for raw weights files).

    Returns:
        True for a tensor inside ``[data_start, file_size]``, a zero-length one exactly at ``file_size``.
    """
    if length == 0:
        return offset == file_size
    return data_start <= offset and offset + length <= file_size


def all_may_sit(columns: SiteColumns, sizes: Sequence[int | None], starts: Sequence[int]) -> bool:
    """Whether every placed site of ``columns`` passes :func:`may_sit` in its file (``sizes[t]``, ``starts[t]``: the
    size and first usable byte of ``columns.targets[t]``; a size of None is not checked), in one pass over the
    columns rather than one call per site. False when one may not (or has a negative offset or length): the caller
    then checks site by site, to name the first one.
    """
    if not len(columns.lengths):
        return True
    offsets, lengths, target = (
        np.frombuffer(c, dtype=c.typecode) for c in (columns.offsets, columns.lengths, columns.target)
    )
    if (offsets < 0).any() or (lengths < 0).any():
        return False
    size = np.array([-1 if value is None else value for value in sizes], dtype=np.int64)[target]
    start = np.array(starts, dtype=np.int64)[target]
    inside = (start <= offsets) & (offsets <= size - lengths)  # no overflow: sizes and lengths are >= 0 here
    fits = np.where(lengths == 0, offsets == size, inside) | (size < 0)
    return bool(fits.all())


def placement_problem(offset: int, length: int, file_size: int, *, data_start: int = 0) -> str | None:
    """Why :func:`may_sit` refuses a placement, in words (None when it accepts it)."""
    if may_sit(offset, length, file_size, data_start=data_start):
        return None
    if length == 0:
        return (
            f"a zero-length tensor at offset {offset} of a {file_size}-byte file: onnx 1.17 reads it as the rest of "
            "the file; it must sit at the end of its file"
        )
    if offset < data_start:
        return f"{length} bytes at offset {offset}, inside the file's header (its data starts at {data_start})"
    return f"{length} bytes at offset {offset}, past the end of the {file_size}-byte file"
