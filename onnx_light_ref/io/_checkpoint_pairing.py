"""Which checkpoint key holds each model tensor: by name, through a map, by content, or as a 2-D transpose.

:func:`pair_with_checkpoint` is what ``link --map-by-content`` and ``verify MODEL.onnx CHECKPOINT`` share: names (and
the user's map) first, then, for the tensors left, equal bytes and transposes (:mod:`~onnx_light_ref.io._pairing`).
Without ``by_content`` it reads no byte and only lists the tensors whose shape is a key's transpose
(:attr:`CheckpointPairing.transpose_candidates`: what an export with torch's ``optimize=True`` looks like).

:func:`insert_transposes` is ``link --transpose``'s rewrite: a main-graph initializer that is the transpose of key
``K`` becomes ``Transpose(K)`` (a node producing the old name, ``perm=[1, 0]``) over an initializer that links to
``K``'s bytes, so the checkpoint's layout serves an optimized export and no weight is stored twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from onnx_light_ref.io._pairing import TensorBytes, TensorFiles, pair_by_content, transposable
from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.locations import LocationResolver, expected_nbytes, parse_external_data
from onnx_light_ref.io._read.safetensors_header import is_packed, safetensors_dtype
from onnx_light_ref.io._read.walker import TensorSite, iter_tensors
from onnx_light_ref.io._results import TensorPairing

if TYPE_CHECKING:
    from onnx_light_ref.io._link import CheckpointTensor
    from onnx_light_ref.io._read.folder import ModelFolder


@dataclass
class CheckpointPairing:
    """The pairing of a model with a checkpoint.

    ``pairings``: one per paired model tensor, model order. ``transpose_candidates``: model tensors (names) whose
    dims are a key's swapped (without ``by_content``: not compared). ``unpaired``: model tensors (names) paired with
    no key.
    """

    pairings: list[TensorPairing] = field(default_factory=list)
    transpose_candidates: list[str] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)

    def straight_map(self) -> dict[str, str]:
        """Model tensor -> key of every pairing that is no transpose and not by name: what ``name_map`` takes."""
        return {p.name: p.key for p in self.pairings if p.how in ("map", "content")}

    def transposed(self) -> list[TensorPairing]:
        return [p for p in self.pairings if p.how == "transpose"]


def model_tensors(
    proto: onnx.ModelProto, resolver: LocationResolver, *, sources: bool = True
) -> list[tuple[TensorSite, TensorBytes]]:
    """Every named, dense tensor of ``proto`` whose bytes can be read (external, or inline ``raw_data``).

    A name held by several tensors is left out: a name map cannot tell them apart. External references are
    validated (inside the folder, in bounds) as every reader does; without ``sources`` (a pairing by name only,
    which reads no byte) they are not resolved here, and their :class:`TensorBytes` has no ``source``: the writer
    validates each reference it keeps or copies.
    """
    sites = [site for site in iter_tensors(proto) if site.sparse is None and isinstance(site.tensor.name, str)]
    counts = Counter(site.tensor.name for site in sites)
    found: list[tuple[TensorSite, TensorBytes]] = []
    for site in sites:
        tensor = site.tensor
        if not tensor.name or counts[tensor.name] > 1:
            continue
        dtype = safetensors_dtype(tensor.data_type)
        shape = tuple(tensor.dims)
        nbytes = expected_nbytes(tensor)
        if nbytes is None or any(dim < 0 for dim in shape):
            continue
        if is_packed(tensor.data_type):
            shape = (nbytes,)
        if is_external(tensor) and not sources:
            found.append((site, TensorBytes(tensor.name, dtype, shape, nbytes)))
        elif is_external(tensor):
            ref = parse_external_data(tensor, resolver, label=site.label)
            source = CopyRange(ref.path, ref.offset, 0, ref.length, ref.identity, ref.folder, ref.location)
            found.append((site, TensorBytes(tensor.name, dtype, shape, nbytes, source=source)))
        elif tensor.HasField("raw_data"):
            data = tensor.raw_data
            if len(data) == nbytes:
                found.append((site, TensorBytes(tensor.name, dtype, shape, nbytes, data=data)))
    return found


def pair_with_checkpoint(
    model: Sequence[TensorBytes],
    checkpoint: Mapping[str, TensorBytes],
    files: TensorFiles,
    *,
    name_map: Mapping[str, str],
    by_content: bool,
    transposes: bool = True,
) -> CheckpointPairing:
    """Pair every model tensor with the key that holds it (see the module docstring).

    Args:
        model: the model's tensors (:func:`model_tensors`).
        checkpoint: key -> its bytes.
        files: where bytes are read (only with ``by_content``).
        name_map: model tensor -> key, already checked against both (``check_name_map_targets``).
        by_content: compare bytes to pair the tensors names leave; else only list transpose candidates.
        transposes: with ``by_content``, also pair transposes.

    Returns:
        A :class:`CheckpointPairing`.
    """
    result = CheckpointPairing()
    taken: set[str] = set()
    left: list[TensorBytes] = []
    for tensor in model:
        key = name_map.get(tensor.name, tensor.name)
        entry = checkpoint.get(key)
        if entry is not None and (entry.dtype, entry.shape) == (tensor.dtype, tensor.shape):
            result.pairings.append(TensorPairing(tensor.name, key, "map" if tensor.name in name_map else "name"))
            taken.add(key)
        elif tensor.name not in checkpoint and tensor.name not in name_map:
            left.append(tensor)  # a tensor named like a key never reads another key: readers check it against it
    if by_content:
        result.pairings += pair_by_content(left, checkpoint, files, taken=taken, transposes=transposes)
        order = {tensor.name: index for index, tensor in enumerate(model)}
        result.pairings.sort(key=lambda pairing: order[pairing.name])
    paired = {pairing.name for pairing in result.pairings}
    result.unpaired = [tensor.name for tensor in model if tensor.name not in paired]
    result.transpose_candidates = [
        tensor.name
        for tensor in left
        if tensor.name not in paired and any(transposable(tensor, entry) for entry in checkpoint.values())
    ]
    return result


def insert_transposes(
    proto: onnx.ModelProto,
    transposed: Iterable[TensorPairing],
    keys: Mapping[str, TensorBytes],
    name_map: Mapping[str, str],
) -> tuple[dict[str, str], list[str]]:
    """Replace each main-graph initializer paired as a transpose by ``Transpose(source)``; ``source`` links the key.

    The source initializer is one already linking to the key (the tied embedding of a pre-transposed ``lm_head``),
    else a new one named after the key (or ``<key>.source`` when that name is taken), typed like the key, whose data
    ``link`` then points at the key's bytes. The ``Transpose`` nodes go first in the graph (their inputs are
    initializers). Tensors that are graph inputs (an initializer as a default value) stay as they are.

    Returns:
        The name map entries the new initializers need (source name -> key, for those not named after their key),
        and the model tensors that became ``Transpose`` outputs.
    """
    graph = proto.graph
    inputs = {value.name for value in graph.input}
    taken_names = {value for node in graph.node for value in (*node.input, *node.output)}
    taken_names |= {init.name for init in graph.initializer} | inputs | {value.name for value in graph.output}
    by_name = {init.name: init for init in graph.initializer}
    sources: dict[str, str] = {}  # key -> initializer name holding it straight
    for init in graph.initializer:
        key = name_map.get(init.name, init.name)
        entry = keys.get(key)
        if entry is not None and (entry.dtype, entry.shape) == (safetensors_dtype(init.data_type), tuple(init.dims)):
            sources.setdefault(key, init.name)
    mapping: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    replaced: list[str] = []
    for pairing in transposed:
        old = by_name.get(pairing.name)
        if old is None or pairing.name in inputs:
            continue
        source = sources.get(pairing.key)
        if source is None:
            source = pairing.key if pairing.key not in taken_names else _fresh(pairing.key + ".source", taken_names)
            taken_names.add(source)
            graph.initializer.append(_empty_like(old, source, tuple(keys[pairing.key].shape)))
            sources[pairing.key] = source
            if source != pairing.key:
                mapping[source] = pairing.key
        graph.initializer.remove(old)
        nodes.append(onnx.helper.make_node("Transpose", [source], [pairing.name], perm=[1, 0]))
        replaced.append(pairing.name)
    for node in reversed(nodes):
        graph.node.insert(0, node)
    return mapping, replaced


def _fresh(name: str, taken: set[str]) -> str:
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name}.{number}"
    return candidate


def _empty_like(old: onnx.TensorProto, name: str, dims: tuple[int, ...]) -> onnx.TensorProto:
    """A tensor of ``old``'s type with ``dims`` and empty ``raw_data``: ``link`` points it at the key's bytes."""
    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = old.data_type
    tensor.dims.extend(dims)
    tensor.raw_data = b""
    return tensor


@dataclass(frozen=True, slots=True)
class LinkPairingOptions:
    """``link``'s options for pairing: content, transposes, and the thresholds they respect."""

    by_content: bool
    transpose: bool
    size_threshold: int
    chunk_size: int
    align_threshold: int


@dataclass
class LinkPairing:
    """What ``link`` pairs: the name map it links with (the user's, the content pairs, the transposes' sources)."""

    mapping: dict[str, str]
    pairing: CheckpointPairing
    transposed: list[str]

    def facts(self, linked: Sequence[CheckpointTensor], step: int, align_threshold: int) -> dict[str, object]:
        """The result's fields about pairing and alignment (``linked``: the checkpoint tensors linked)."""
        unaligned = sum(
            1
            for found in linked
            if step > 1 and found.entry.nbytes >= max(1, align_threshold)
            and (found.data_start + found.entry.begin) % step
        )  # fmt: skip
        return {
            "pairings": tuple(self.pairing.pairings),
            "transposed_tensors": tuple(self.transposed),
            "transpose_candidates": tuple(self.pairing.transpose_candidates),
            "unaligned_linked": unaligned,
        }


def checkpoint_tensors_bytes(tensors: Mapping[str, CheckpointTensor], folder: ModelFolder) -> dict[str, TensorBytes]:
    """Key -> where its bytes are, read through the held ``folder`` (its files' identities re-checked at open)."""
    return {
        key: TensorBytes(
            key,
            found.entry.dtype,
            found.entry.shape,
            found.entry.nbytes,
            source=CopyRange(
                found.path,
                found.data_start + found.entry.begin,
                0,
                found.entry.nbytes,
                found.file.identity,
                folder,
                found.location,
            ),
        )
        for key, found in tensors.items()
    }


def pair_for_link(
    proto: onnx.ModelProto,
    resolver: LocationResolver,
    tensors: Mapping[str, CheckpointTensor],
    folder: ModelFolder,
    name_map: Mapping[str, str],
    options: LinkPairingOptions,
) -> LinkPairing:
    """Pair ``proto``'s tensors with the checkpoint for ``link``; with ``options.transpose``, rewrite ``proto``."""
    keys = checkpoint_tensors_bytes(tensors, folder)
    compare = options.by_content or options.transpose
    model = [tensor for _, tensor in model_tensors(proto, resolver, sources=compare)]
    with TensorFiles(options.chunk_size) as files:
        pairing = pair_with_checkpoint(model, keys, files, name_map=name_map, by_content=compare)
    mapping = dict(name_map)
    transposed: list[str] = []
    if options.by_content:
        mapping.update(pairing.straight_map())
    if options.transpose:
        sizes = {tensor.name: tensor.nbytes for tensor in model}
        wanted = [p for p in pairing.transposed() if sizes[p.name] >= max(1, options.size_threshold)]
        sources, transposed = insert_transposes(proto, wanted, keys, mapping)
        mapping.update(sources)
    return LinkPairing(mapping, pairing, transposed)
