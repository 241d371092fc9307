"""Turn ``ai.rt::DelayedInitializer`` nodes back into external initializers: models for onnx-light, run anywhere.

:func:`undelay_initializers` is the inverse of :func:`~onnx_light_ref.ops._convert.delay_initializers`. Every
``DelayedInitializer`` node of the main graph, of every subgraph (If/Loop/Scan bodies) and of every
``training_info`` graph (initialization, algorithm; those inline, as onnx loads no external data there), whatever
its ``load_device``, becomes an initializer of the graph that held it, named after the node's output, with the node's
``dtype`` and ``shape``, stored as external data in the destination's weights file at an aligned offset. The bytes
are copied file to file by the streaming copy engine (in-kernel where possible), never loaded. The result runs in
onnxruntime, onnx-ir, or any tool that reads standard external data.

Refused, before anything is written: a node anywhere in a model function (its body or a subgraph of it, at any
depth: a function has no initializers), and a subgraph node whose output is also named by an enclosing graph (the
node hides the outer value inside its subgraph for onnx's evaluator; an initializer of that name does not for
onnxruntime, so the undelayed model would compute something else). The work is linear in the size of the model
(names gathered once per graph, each graph's node list rebuilt once).

External tensors the source already has (initializers the converter left alone, ``Constant`` values...) move into
the same weights file, so the destination is self-contained; inline tensors stay inline.

Order of work, as every writer here: validate every argument, node, file and range and plan every offset (nothing
written), then copy into temp files, then publish the weights file and the ``.onnx`` as one transaction. This module
must never read weight bytes into Python objects, never write into a source file, and never read a file outside the
source's folder unless the caller passed ``allow_outside_folder=True``.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import onnx

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._arguments import PathLike, check_bool, check_int, check_weights_file
from onnx_light_ref.io._plan.placement import ShardedLayout
from onnx_light_ref.io._plan.ranges import CopyRange, RangeColumns, read_range
from onnx_light_ref.io._plan.sites import (
    SHAPE_TENSOR,
    SITE_EXTERNALIZED,
    SITE_INLINE,
    SITE_MOVED,
    SiteColumns,
    SitePolicy,
)
from onnx_light_ref.io._read.alignment import validate_alignment
from onnx_light_ref.io._read.delayed_nodes import DelayedFile, DelayedResolver, is_delayed
from onnx_light_ref.io._read.delayed_rules import check_node_structure, describe_node
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.folder import FileIdentity
from onnx_light_ref.io._read.locations import (
    LocationResolver,
    check_not_hard_linked,
    file_identity,
    parse_external_data,
)
from onnx_light_ref.io._read.model_file import load_model_metadata, open_model_folder
from onnx_light_ref.io._read.safetensors_refs import (
    refuse_disagreeing_reference,
)
from onnx_light_ref.io._read.walker import defined_names, iter_graphs, iter_tensors
from onnx_light_ref.io._write.contract import PlannedFile, PlannedModel, ShardSet, WriteOptions, WritePlan, location_for
from onnx_light_ref.io._write.copy_engine import ProgressCallback
from onnx_light_ref.io._write.execute import execute
from onnx_light_ref.ops._attributes import DelayedInitializerParams, validate_attributes
from onnx_light_ref.ops._schema import DOMAIN

logger = logging.getLogger(__name__)

# The copy engine's default: one buffer of this size is the most its last fallback holds in memory.
_DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024


@dataclass
class _Payload:
    """One tensor to place in the destination weights file."""

    label: str
    source: DelayedFile
    src_offset: int
    length: int
    dst_offset: int = 0


@dataclass
class _Plan:
    model: onnx.ModelProto
    tensors: int  # tensors placed in the weights file
    weights_location: str
    total: int
    contract: WritePlan


def _node_params(node: onnx.NodeProto, where: str) -> DelayedInitializerParams:
    check_node_structure(node, where=where)
    linked = [attribute.name for attribute in node.attribute if attribute.ref_attr_name]
    if linked:
        raise ValueError(
            f"{where}: attribute(s) {linked} are function-linked (ref_attr_name): their values are only known per "
            "call of the function, so the node cannot be undelayed statically; inline the function with literal "
            "attributes first."
        )
    # check_node_structure refused any other attribute or type: each value is read from its one field.
    values = {a.name: _VALUE_OF[a.type](a) for a in node.attribute}
    return validate_attributes(values, where=where)


_VALUE_OF: dict[int, Callable[[onnx.AttributeProto], object]] = {
    onnx.AttributeProto.INT: lambda attribute: attribute.i,
    onnx.AttributeProto.INTS: lambda attribute: list(attribute.ints),
    onnx.AttributeProto.STRING: lambda attribute: attribute.s,
}


def _function_subgraphs(function: onnx.FunctionProto) -> Iterator[onnx.GraphProto]:
    """Every graph held by a function's nodes (If/Loop/Scan bodies), at any depth."""
    for node in function.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from iter_graphs(attribute.g)
            for subgraph in attribute.graphs:
                yield from iter_graphs(subgraph)


def _check_functions(model: onnx.ModelProto) -> None:
    """Refuse a DelayedInitializer anywhere in a model function: in its body or in a subgraph of it, at any depth.

    A function has no initializers to turn the node into, and leaving the node while the ``ai.rt`` opset import
    goes away would hand onnxruntime a model it refuses.
    """
    for function in model.functions:
        name = f"model function {function.domain}::{function.name}"
        if function.overload:
            name += f" (overload {function.overload!r})"
        places = [(node, name) for node in function.node]
        places += [
            (node, f"subgraph {graph.name!r} of {name}")
            for graph in _function_subgraphs(function)
            for node in graph.node
        ]
        for node, place in places:
            if is_delayed(node):
                where = f"{describe_node(node)} in {place}"
                _node_params(node, where)  # a function-linked one gets that message
                raise ValueError(
                    f"{where}: a function has no initializers to turn the node into; inline the function "
                    "(onnx.inliner.inline_local_functions) before undelaying."
                )


def _scoped_graphs(graph: onnx.GraphProto, outer: frozenset[str]) -> Iterator[tuple[onnx.GraphProto, frozenset[str]]]:
    """``graph`` and every subgraph, parents before children, each with the names its enclosing graphs define."""
    yield graph, outer
    inner = outer | defined_names(graph)
    for node in graph.node:
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.HasField("g") else []
            subgraphs.extend(attribute.graphs)
            for subgraph in subgraphs:
                yield from _scoped_graphs(subgraph, inner)


def _check_name(graph: onnx.GraphProto, name: str, taken: set[str], outer: frozenset[str], where: str) -> None:
    if name in taken:
        raise ValueError(f"{where}: graph {graph.name!r} already has an initializer or input named {name!r}.")
    if name in outer:
        # Inside the subgraph the node's output hides the outer value (onnx's evaluator computes with the node's
        # tensor); as a subgraph initializer, onnxruntime lets the outer value win for node inputs: the undelayed
        # model would compute something else.
        raise ValueError(
            f"{where}: its output {name!r} in subgraph {graph.name!r} is also a value of an enclosing graph; as an "
            "initializer it would resolve differently in onnxruntime than the node does, so the model cannot be "
            "undelayed as it is (rename the node's output and its uses in the subgraph first); nothing was written."
        )


def _delayed_scopes(model: onnx.ModelProto) -> Iterator[tuple[onnx.GraphProto, frozenset[str], str]]:
    """Every graph whose DelayedInitializer nodes become initializers, parents first, each with the names its
    enclosing graphs define and how messages name where it is.

    The main graph and its subgraphs; then each ``training_info`` graph (``initialization``, ``algorithm``) and its
    subgraphs. A training graph runs combined with the main graph (ONNX's ``TrainingInfoProto``: the training graph
    is the concatenation of ``ModelProto.graph`` and ``algorithm``), so the main graph's names are its enclosing
    names: a node output there that is also a main-graph name would no longer be the same value once it is an
    initializer. A training graph's new initializers are written inline (onnx's loader reads no external data of
    ``training_info`` tensors); left as they were, its relative filenames would resolve against the destination's
    folder.
    """
    for graph, outer in _scoped_graphs(model.graph, frozenset()):
        yield graph, outer, ""
    main_names = frozenset(defined_names(model.graph))
    for index, training in enumerate(model.training_info):
        for field_name in ("initialization", "algorithm"):
            if training.HasField(field_name):
                root = getattr(training, field_name)
                for graph, outer in _scoped_graphs(root, main_names):
                    yield graph, outer, f" (training_info[{index}].{field_name})"


def _plan_delayed(
    model: onnx.ModelProto, resolver: DelayedResolver, mark: str
) -> tuple[list[_Payload], list[onnx.GraphProto]]:
    """Validate every node and add its initializer to the (private) model.

    Each new initializer with bytes is marked (``data_location`` EXTERNAL, no entries, ``doc_string`` ``mark`` and
    its index into the returned payloads): the walk that follows finds it by that mark wherever the node was, as no
    source tensor can carry it (a source tensor marked EXTERNAL has entries, and ``mark`` is new to this run).
    Returns the payloads, and the graphs whose nodes :func:`_remove_delayed_nodes` drops. Linear in the size of
    the model: each graph's names are gathered once.
    """
    payloads: list[_Payload] = []
    graphs: list[onnx.GraphProto] = []
    for graph, outer, place in list(_delayed_scopes(model)):
        delayed = [node for node in graph.node if is_delayed(node)]
        if not delayed:
            continue
        graphs.append(graph)
        taken = {t.name for t in graph.initializer} | {v.name for v in graph.input}
        for node in delayed:
            where = describe_node(node) + place
            params = _node_params(node, where)
            name = node.output[0]
            _check_name(graph, name, taken, outer, where)
            taken.add(name)
            if params.nbytes == 0:  # nothing to point at: an empty tensor stays inline
                graph.initializer.add(name=name, data_type=params.dtype, dims=params.shape, raw_data=b"")
                continue
            source = resolver.resolve(params.filename, where)
            end = params.offset + params.nbytes
            if end > source.size:
                raise ExternalDataError(
                    f"{where}: file {params.filename!r} too short: needs {end} bytes ({params.nbytes} bytes at "
                    f"offset {params.offset}), has {source.size}; nothing was written."
                )
            if source.safetensors is not None:  # the kernel's check, by the node's output name
                refuse_disagreeing_reference(
                    source.safetensors, name, params.dtype, params.shape, params.offset, params.nbytes
                )
            graph.initializer.add(
                name=name,
                data_type=params.dtype,
                dims=params.shape,
                data_location=onnx.TensorProto.EXTERNAL,
                doc_string=f"{mark}{len(payloads)}",
            )
            payloads.append(_Payload(name, source, params.offset, params.nbytes))
    return payloads, graphs


def _remove_delayed_nodes(graphs: list[onnx.GraphProto]) -> None:
    """Drop the DelayedInitializer nodes of ``graphs`` (listed parents before their subgraphs).

    Deleting one element of a repeated field moves every later one (k deletions: O(k*n), 33.8 s for 16k nodes);
    the kept nodes are copied once instead. Subgraphs go first, so a parent copies them already cleaned; the copies
    make earlier references into the graphs stale, hence this runs after the layout step filled the tensors.
    """
    for graph in reversed(graphs):
        kept = []
        for node in graph.node:
            if not is_delayed(node):
                copy = onnx.NodeProto()
                copy.CopyFrom(node)
                kept.append(copy)
        del graph.node[:]
        graph.node.extend(kept)


def _all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node the model holds: main graph, model functions, training graphs, and all their subgraphs."""
    roots = [model.graph]
    for training in model.training_info:
        roots.extend(getattr(training, field) for field in ("initialization", "algorithm") if training.HasField(field))
    for root in roots:
        for graph in iter_graphs(root):
            yield from graph.node
    for function in model.functions:
        yield from function.node
        for graph in _function_subgraphs(function):
            yield from graph.node


def _remove_unused_opset(model: onnx.ModelProto) -> None:
    if any(node.domain == DOMAIN for node in _all_nodes(model)):
        return
    for index in reversed(range(len(model.opset_import))):
        if model.opset_import[index].domain == DOMAIN:
            del model.opset_import[index]


def undelay_initializers(
    src_onnx_path: PathLike,
    dst_onnx_path: PathLike,
    dst_weights_path: PathLike | None = None,
    alignment: int = 4096,
    *,
    allow_outside_folder: bool = False,
    durable: bool = True,
    chunk_size: int = _DEFAULT_CHUNK_SIZE,
    progress: ProgressCallback | None = None,
    replace_shared: bool = False,
    overwrite: bool = False,
) -> int:
    """Write ``dst_onnx_path`` where every ``DelayedInitializer`` node of ``src_onnx_path`` is an external initializer.

    Each node (main graph and every subgraph, either ``load_device``) becomes an initializer of the graph that held
    it, named after its output, with its ``dtype`` and ``shape``; its bytes are copied from ``filename`` at
    ``offset`` into ``dst_weights_path`` at an offset aligned to ``alignment``, file to file, never loaded. External
    tensors the source already has are moved into the same file (so the destination stands alone); inline tensors
    and zero-byte tensors stay inline. The ``ai.rt`` opset import is removed when no ``ai.rt`` node is left.
    Everything is validated before anything is written, and both files appear atomically (temp files, renamed
    together; on failure the destinations are as before and no temp file is left).

    Args:
        src_onnx_path: the model with ``DelayedInitializer`` nodes (its weights are never loaded).
        dst_onnx_path: the model to write.
        dst_weights_path: its weights file, inside the destination's folder (default ``<dst_onnx_path>.data``).
        alignment: byte alignment of each tensor in the weights file, a power of two; 0 or 1 pack them.
        allow_outside_folder: trust absolute ``filename`` values outside the source's folder (the spec's examples
            use ``/tmp`` paths) and symbolic links: a relative name that is a link in the folder reads its target.
        durable: fsync the outputs and their folder before returning (default); ``False``: same bytes, no fsync.
        chunk_size: most bytes one copy call moves (and the size of the one buffer the last fallback uses).
        progress: called as ``progress(done_bytes, total_bytes)`` while copying.
        replace_shared: replace an existing weights file even when another model references it (a ``.onnx`` of
            its folder or an ancestor folder, through external data or ``DelayedInitializer`` filenames); False
            (default) refuses with ``SharedWeightsError`` naming the other models.
        overwrite: replace existing files the destination does not own (not the ``.onnx``, not referenced by its
            previous version, not named after it); False (default) refuses with ``ExistingFileError`` naming them.

    Returns:
        The size of the weights file written (payload and padding), 0 when none was needed.

    Raises:
        UnsafeLocationError: a filename outside the source's folder (without the opt-in), through a symlink, with
            ``..``; a hard-linked data file; a weights path outside the destination's folder.
        FileNotFoundError: the source, a data file or the destination folder is missing.
        DestinationConflictError: a destination is a source file, a directory, a name too long, or both
            destinations are one file; ``SharedWeightsError``: the weights file exists and another model uses it
            (without ``replace_shared``); ``ExistingFileError``: an output exists and the destination does not own
            it (without ``overwrite``).
        ExternalDataError: a data file too short for its node, not a regular file, or not accessible.
        InvalidModelError: the source is not an ONNX model.
        OSError: the copy or the publication failed before the commit (with ``durable``, an fsync error such as
            EIO); the destination is then the previous model.
        PublishedWithErrorsError: the new model is published (its ``result`` attribute is the size written), but a
            step after the commit failed: the fsync that makes it durable, or removing the previous versions (see
            ``docs/durability.md``).
        ValueError: a bad argument, a node with bad attributes or structure, a function-linked node, a node inside
            a model function or a subgraph of one, an output name already used by an initializer or input of its
            graph or (in a subgraph) by a value of an enclosing graph, a node whose initializer onnx's loader would
            not read back, a shape tensor (e.g. a ``Reshape`` ``shape``: it is written inline, read from its file)
            larger than 1 MiB.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``light.onnx`` is ``model.onnx`` with
        its weights read by ``DelayedInitializer`` nodes:

        >>> from onnx_light_ref import undelay_initializers, verify_models
        >>> undelay_initializers("light.onnx", "standard.onnx")
        1032256
        >>> verify_models("model.onnx", "standard.onnx", by_name=True).equal
        True
    """
    src = os.path.abspath(os.fspath(src_onnx_path))
    dst = os.path.abspath(os.fspath(dst_onnx_path))
    weights = (
        check_weights_file("dst_weights_path", dst_weights_path) if dst_weights_path is not None else dst + ".data"
    )
    alignment = validate_alignment(alignment)
    allow_outside_folder = check_bool("allow_outside_folder", allow_outside_folder)
    durable = check_bool("durable", durable)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    options = WriteOptions(
        check_bool("replace_shared", replace_shared), check_bool("overwrite", overwrite), allow_outside_folder
    )

    plan = _plan(src, dst, weights, alignment, options)
    if plan.total == 0:
        logger.info("no tensor bytes to copy; writing %s only", dst)
    execute(plan.contract, lambda _stats: plan.total, durable=durable, chunk_size=chunk_size, progress=progress)
    logger.info("undelayed %s -> %s (%d tensors, %d bytes)", src, dst, plan.tensors, plan.total)
    return plan.total


def _plan(src: str, dst: str, weights: str, alignment: int, options: WriteOptions) -> _Plan:
    """Everything decided and checked (the writer contract included), nothing written."""
    # Held from here until the copy: the .onnx and every source file are opened relative to it, never by path.
    folder = open_model_folder(src, allow_outside_folder=options.allow_outside_folder)
    model = load_model_metadata(src, folder=folder)
    _check_functions(model)
    mark = f"{_NEW_MARK}{secrets.token_hex(8)}:"
    new, graphs = _plan_delayed(model, DelayedResolver(folder), mark)
    # The nodes go before the walk: 100,000 of them were walked three times, each attribute looked at.
    _remove_delayed_nodes(graphs)
    _remove_unused_opset(model)
    walk = _walk(model, new, mark, LocationResolver(folder))
    total, ranges = _layout(walk, weights, alignment)
    source_ids = {payload.source.identity: payload.source.path for payload in [*new, *walk.existing]}
    src_id = file_identity(src)
    if src_id is not None:
        source_ids[src_id] = src
    contract = WritePlan(
        "undelay",
        [PlannedModel(dst, model, walk.sites, 0, walk.policy)],
        [PlannedFile(weights, "weights", total, ranges=ranges, shard_set=ShardSet(weights))] if len(ranges) else [],
        options,
        source_ids,
        rename_hint="another name (dst_weights_path / --weights)",
    )
    return _Plan(model, len(ranges), location_for(dst, weights), total, contract)


# A new initializer is marked with this prefix, a token of the run and its index (_plan_delayed) until the walk
# found it.
_NEW_MARK = "\0undelay:"
_MAX_INLINE_SHAPE = 1024 * 1024  # a shape tensor is written inline; one larger than this is no shape
# onnx's loader does not read a training_info tensor back from external data (walker.inline_reason): such a
# node becomes an inline initializer, its bytes copied into the destination .onnx.
_TRAINING_INFO = "training_info"


@dataclass
class _Walk:
    """The model walked once: every site recorded, the new initializers decided, the source's external tensors
    validated (``existing``, in walk order), and each placed site's payload (``placed``, in walk order)."""

    sites: SiteColumns
    policy: SitePolicy
    existing: list[_Payload]
    placed: list[_Payload]
    new: list[_Payload]


def _walk(model: onnx.ModelProto, new: list[_Payload], mark: str, resolver: LocationResolver) -> _Walk:
    """One walk of the model (its nodes already initializers): rule 2 decides every new initializer (the one
    decision, :class:`~onnx_light_ref.io._plan.sites.SitePolicy`): a shape tensor is written inline (its bytes read
    from its file, at most 1 MiB), one onnx's loader would not read back from external data is written inline too
    when it is a ``training_info`` initializer (onnx loads inline tensors everywhere) and refused otherwise; the
    others are placed. The source's external tensors are validated like any reference, to move into the
    destination file."""
    walk = _Walk(SiteColumns(), SitePolicy(model, 0), [], [], [])
    externalized = bytearray(len(new))
    for site in iter_tensors(model):
        tensor = site.tensor
        if not is_external(tensor):
            walk.sites.record(site, SITE_INLINE)
        elif len(tensor.external_data) == 0 and tensor.doc_string.startswith(mark):
            index = int(tensor.doc_string[len(mark) :])
            payload = new[index]
            tensor.ClearField("doc_string")
            tensor.ClearField("data_location")
            decision = walk.policy.decide(site, payload.length)
            if decision.external:
                walk.sites.record(site, SITE_EXTERNALIZED)
                walk.placed.append(payload)
                externalized[index] = 1
            elif decision.reason in (SHAPE_TENSOR, _TRAINING_INFO):
                tensor.raw_data = _read_inline(payload, shape=decision.reason == SHAPE_TENSOR)
                walk.sites.record(site, SITE_INLINE)
            else:
                raise ValueError(
                    f"DelayedInitializer output {payload.label!r}: as an initializer it would be a "
                    f"{decision.reason}, which onnx's loader does not read back from external data; nothing was "
                    "written."
                )
        else:
            ref = parse_external_data(tensor, resolver, label=site.label)
            check_not_hard_linked(ref)
            source = DelayedFile(ref.path, ref.identity, ref.file_size, ref.folder, ref.location)
            payload = _Payload(site.label, source, ref.offset, ref.length)
            walk.existing.append(payload)
            walk.placed.append(payload)
            walk.sites.record(site, SITE_MOVED)
    walk.new = [payload for payload, placed in zip(new, externalized, strict=True) if placed]
    return walk


def _layout(walk: _Walk, weights: str, alignment: int) -> tuple[int, RangeColumns]:
    """Place every payload (the nodes' in node order, then the source's external tensors in walk order; all
    aligned, a zero-length one at the end of the file), give each placed site its place, and list the copies."""
    layout = ShardedLayout(alignment)
    sources: list[DelayedFile] = []
    index_of: dict[FileIdentity, int] = {}
    order = [*walk.new, *walk.existing]
    where = [layout.place(payload.length) for payload in order]
    ranges = RangeColumns(sources)
    for payload, place in zip(order, where, strict=True):  # once all are placed: the end of the file is known
        payload.dst_offset = place.offset
        source = payload.source
        index = index_of.get(source.identity)
        if index is None:
            index = index_of[source.identity] = len(sources)
            sources.append(source)
        ranges.add(index, payload.src_offset, payload.dst_offset, payload.length)
    for payload in walk.placed:
        walk.sites.place(weights, payload.dst_offset, payload.length)
    return (layout.total_size if order else 0), ranges


def _read_inline(payload: _Payload, *, shape: bool) -> bytes:
    """The bytes of a tensor written inline, read from its source file (checked to be the very file validated).

    ``shape``: a shape tensor (at most 1 MiB); otherwise a ``training_info`` initializer, whose size only protobuf's
    2 GiB limit bounds (the serialization refuses beyond it).
    """
    if shape and payload.length > _MAX_INLINE_SHAPE:
        raise ValueError(
            f"DelayedInitializer output {payload.label!r} feeds a shape input (onnx's checker and onnxruntime need it "
            f"inline) but holds {payload.length} bytes, above the {_MAX_INLINE_SHAPE} a shape tensor may hold; "
            "nothing was written."
        )
    source = payload.source
    data = read_range(
        CopyRange(source.path, payload.src_offset, 0, payload.length, source.identity, source.folder, source.location)
    )
    if len(data) != payload.length:
        raise ExternalDataError(
            f"DelayedInitializer output {payload.label!r}: file {source.path!r} ended at offset "
            f"{payload.src_offset + len(data)}, {payload.length} bytes were expected at {payload.src_offset}."
        )
    return data
