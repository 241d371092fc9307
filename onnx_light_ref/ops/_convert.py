"""Turn a model's external initializers into ``ai.rt::DelayedInitializer`` nodes, so weights load only when used.

:func:`delay_initializers` rewrites the graph (and every If/Loop/Scan body) so that each external initializer
becomes a zero-input node whose output carries the initializer's name. onnx's ``ReferenceEvaluator`` then no longer
needs the weights in the proto: with ``load_device="file"`` the kernel reads each tensor at every run, with
``load_device="cpu"`` once when the evaluator is built.

How ``filename`` is bound: the node stores the ``location`` exactly as the model wrote it (relative to the model's
folder). The kernel resolves a relative filename at evaluation time against the folder its class is bound to,
``DelayedInitializer.bind(folder)``; :func:`onnx_light_ref.ops.reference_evaluator` binds the model's folder for
you. An unbound ``DelayedInitializer`` resolves against the current directory, which is rarely what you want.

What is left as it was (the evaluator then loads those external tensors eagerly, with onnx's own loader):

* initializers also listed in their graph's inputs (overridable defaults, see :func:`_shadowed_by_inputs`);
* initializers smaller than ``min_size`` bytes;
* initializers whose element type the op cannot produce (string, or a type the installed onnx cannot represent:
  see :mod:`onnx_light_ref.ops._dtypes`), and with ``portable=True`` every type outside the seed spec's 14
  (bfloat16, float8, int4...: onnx-light's C++ runtime has no kernel for them), logged and listed in
  :attr:`ConversionPlan.kept_dtype`;
* subgraph initializers named like a value of an enclosing graph (see below);
* initializers of ``ModelProto.training_info`` graphs, which inference never runs;
* sparse initializers and tensors held in node attributes (``Constant``'s ``value``...): the op produces dense
  initializers only; onnx's evaluator loads such tensors itself (and refuses sparse initializers outright);
* inline initializers (they already are in memory).

A subgraph initializer may carry the name of a value of an enclosing graph (legal for an initializer, not for a
node output: the graph would leave SSA form and the checker rejects it). Runtimes disagree on which value such a
name resolves to (onnx's ReferenceEvaluator and onnxruntime both let the outer value win for node inputs, and
differ for a subgraph output naming the initializer directly), so the converter does not pick a meaning: such an
initializer stays as it is (:attr:`ConversionPlan.kept_shadowing`) and the runtime resolves it as it did before.

Model-local functions are inlined first (``onnx.inliner.inline_local_functions``) when the model has any, because
onnx's evaluator does not hand ``new_ops`` to the evaluators it builds for functions.

This module must never read weight bytes: every reference is validated with
:func:`onnx_light_ref.io._read.locations.parse_external_data`, which resolves the location and ``stat``s the file only.
It never mutates the model it is given.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import onnx
import onnx.inliner

from onnx_light_ref.io._arguments import PathLike, check_bool, check_int
from onnx_light_ref.io._read.delayed_rules import LOAD_DEVICES
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.folder import ModelFolder
from onnx_light_ref.io._read.locations import (
    ExternalRef,
    LocationResolver,
    check_not_hard_linked,
    expected_nbytes,
    parse_external_data,
)
from onnx_light_ref.io._read.model_file import load_model_metadata
from onnx_light_ref.io._read.walker import defined_names, iter_graphs, iter_tensors
from onnx_light_ref.ops._dtypes import (
    ALLOWED_DTYPES,
    PORTABLE_DTYPES,
    dtype_name,
    is_allowed_dtype,
    is_portable_dtype,
    refusal_reason,
)
from onnx_light_ref.ops._schema import DOMAIN, OP_TYPE, SINCE_VERSION, make_delayed_initializer_node

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DelayedTensor:
    """One initializer chosen for conversion, with its validated external reference."""

    tensor: onnx.TensorProto
    graph: onnx.GraphProto
    ref: ExternalRef
    where: str


@dataclass(frozen=True)
class ConversionPlan:
    """What :func:`delay_initializers` will change, decided before the model is touched."""

    model: onnx.ModelProto  # the private copy that will be rewritten
    base_dir: str
    delayed: list[DelayedTensor]
    kept_shadowed: list[str]  # external initializers kept because a graph input overrides them
    kept_small: list[str]  # external initializers kept because they are smaller than min_size
    kept_dtype: list[str]  # external initializers kept because the op cannot produce their element type
    kept_shadowing: list[str]  # subgraph initializers kept because an enclosing graph defines the same name


def _shadowed_by_inputs(graph: onnx.GraphProto) -> set[str]:
    """Names of initializers that are also graph inputs.

    Such an initializer is only a default value: the caller may feed the input to override it. Turning it into a
    node would give the name two producers (the graph input and the node), which is invalid SSA, and onnx's
    evaluator would silently let the node's output win over the fed value. So these stay initializers.
    """
    return {value.name for value in graph.input}


def _load(
    model_or_path: onnx.ModelProto | PathLike, base_dir: PathLike | ModelFolder | None
) -> tuple[onnx.ModelProto, str | None]:
    held = base_dir if isinstance(base_dir, ModelFolder) else None
    if isinstance(base_dir, ModelFolder):
        base_dir = base_dir.path
    if isinstance(model_or_path, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_path)
        return model, os.path.abspath(os.fspath(base_dir)) if base_dir is not None else None
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(model_or_path))
        folder = os.fspath(base_dir) if base_dir is not None else os.path.dirname(path)
        # Parsed through the held folder when it is the model's own (the evaluator's), so both come from one folder.
        through = held if held is not None and os.path.dirname(path) == held.path else None
        return load_model_metadata(path, folder=through), os.path.abspath(folder)
    raise TypeError(
        f"model_or_path must be an onnx.ModelProto or a path to a .onnx file, got {type(model_or_path).__name__}."
    )


def plan_delayed_initializers(
    model_or_path: onnx.ModelProto | PathLike,
    *,
    base_dir: PathLike | ModelFolder | None = None,
    min_size: int = 0,
    portable: bool = False,
) -> ConversionPlan:
    """Load (metadata only) or copy the model, inline its functions, and validate every initializer to convert.

    Args:
        model_or_path: A ``.onnx`` path or a ModelProto (copied).
        base_dir: Folder the locations are relative to (default: the model's folder for a path), or a held
            :class:`~onnx_light_ref.io._read.folder.ModelFolder` to validate through.
        min_size: Initializers smaller than this many bytes are kept.
        portable: Convert only the seed spec's 14 element types (onnx-light's runtime); others are kept.

    Returns:
        The plan: the private model copy, the validated tensors to convert and the names kept, by reason.

    Raises:
        ValueError: a bad ``min_size``, or a proto with external initializers to convert and no ``base_dir``.
        TypeError: ``portable`` is not a bool.
        UnsafeLocationError, ExternalDataError, FileNotFoundError: a bad reference (see :func:`delay_initializers`).
    """
    check_int("min_size", min_size)
    check_bool("portable", portable)
    convertible = is_portable_dtype if portable else is_allowed_dtype
    model, folder = _load(model_or_path, base_dir)
    if len(model.functions) > 0:
        # new_ops never reaches the evaluators onnx builds for model-local functions: inline them so that every
        # node (and every initializer reference) lives in the main graph or its subgraphs.
        model = onnx.inliner.inline_local_functions(model)

    if isinstance(base_dir, ModelFolder):
        resolver: LocationResolver | None = LocationResolver(base_dir)
    else:
        resolver = LocationResolver(folder) if folder is not None else None
    delayed: list[DelayedTensor] = []
    kept_shadowed: list[str] = []
    kept_small: list[str] = []
    kept_dtype: list[str] = []
    kept_shadowing: list[str] = []
    outer_scopes: dict[int, tuple[onnx.GraphProto, frozenset[str]]] = {}
    _outer_scopes(model.graph, frozenset(), outer_scopes)
    shadowed_cache: dict[int, set[str]] = {}
    for site in iter_tensors(model):
        tensor = site.tensor
        if site.kind != "initializer" or site.scope != "model" or not is_external(tensor):
            continue
        graph = site.container
        assert isinstance(graph, onnx.GraphProto)  # initializers only live in graphs
        shadowed = shadowed_cache.setdefault(id(graph), _shadowed_by_inputs(graph))
        if tensor.name in shadowed:
            kept_shadowed.append(tensor.name)
            continue
        scope = outer_scopes.get(id(graph))
        if scope is not None and scope[0] is not graph:
            raise AssertionError("protobuf returned a new object for a live sub-message")  # pragma: no cover
        if scope is not None and tensor.name in scope[1]:
            logger.info(
                "initializer %r in %s stays an external initializer: an enclosing graph defines the same name, and "
                "a node output of that name would break SSA form",
                site.label,
                site.where,
            )
            kept_shadowing.append(tensor.name)
            continue
        size = expected_nbytes(tensor)
        if size is not None and size < min_size:
            kept_small.append(tensor.name)
            continue
        if not convertible(tensor.data_type):
            # Not an error: the evaluator loads such a tensor eagerly, as plain ReferenceEvaluator would.
            logger.info(
                "initializer %r in %s stays an external initializer: %s",
                site.label,
                site.where,
                _kept_reason(tensor.data_type, portable),
            )
            kept_dtype.append(tensor.name)
            continue
        if resolver is None:
            raise ValueError(
                f"base_dir is required when converting an in-memory model with external initializers (first: "
                f"{site.label!r}, location in {site.where}); pass the folder its locations are relative to."
            )
        ref = parse_external_data(tensor, resolver, label=site.label)
        # onnx (>= 1.21) refuses to read a hard-linked data file; the converted model must not be a way around that.
        check_not_hard_linked(ref)
        delayed.append(DelayedTensor(tensor, graph, ref, site.where))
    return ConversionPlan(model, folder or "", delayed, kept_shadowed, kept_small, kept_dtype, kept_shadowing)


def _kept_reason(data_type: int, portable: bool) -> str:
    """Why an initializer of ``data_type`` is not converted, for the log."""
    if portable and is_allowed_dtype(data_type):
        return (
            f"its data type {data_type} ({dtype_name(data_type)}) is outside the portable set (portable=True: "
            f"{', '.join(dtype_name(t) for t in PORTABLE_DTYPES)})"
        )
    reason = refusal_reason(data_type)
    allowed = ", ".join(dtype_name(t) for t in ALLOWED_DTYPES)
    return f"ai.rt::DelayedInitializer cannot produce it ({reason}; it produces {allowed})"


def _make_node(item: DelayedTensor, load_device: str, name: str) -> onnx.NodeProto:
    tensor = item.tensor
    return make_delayed_initializer_node(
        tensor.name,
        shape=list(tensor.dims),
        dtype=tensor.data_type,
        load_device=load_device,
        filename=item.ref.location,
        offset=item.ref.offset,
        name=name,
    )


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def _outer_scopes(
    graph: onnx.GraphProto, outer: frozenset[str], into: dict[int, tuple[onnx.GraphProto, frozenset[str]]]
) -> None:
    """Record, for ``graph`` and every subgraph, the names defined by the graphs enclosing it, keyed by ``id``.

    The graph itself is stored with its names: protobuf hands back the same Python object for a sub-message only
    while one is alive, so keeping it alive keeps the ``id`` valid for the walker's later visits.
    """
    into[id(graph)] = (graph, outer)
    inner = outer | defined_names(graph)
    for node in graph.node:
        for subgraph in _subgraphs(node):
            _outer_scopes(subgraph, inner, into)


def _unique_names(model: onnx.ModelProto) -> set[str]:
    return {node.name for graph in iter_graphs(model.graph) for node in graph.node}


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _declared_names(graph: onnx.GraphProto) -> set[str]:
    return {v.name for v in (*graph.input, *graph.output, *graph.value_info)}


def _set_opset_import(model: onnx.ModelProto) -> None:
    for opset in model.opset_import:
        if opset.domain == DOMAIN:
            if opset.version != SINCE_VERSION:
                raise ValueError(
                    f"the model imports domain {DOMAIN!r} at version {opset.version}; only version {SINCE_VERSION} "
                    f"of {DOMAIN}::{OP_TYPE} exists."
                )
            return
    model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, SINCE_VERSION))


def delay_initializers(
    model_or_path: onnx.ModelProto | PathLike,
    load_device: str = "file",
    *,
    base_dir: PathLike | ModelFolder | None = None,
    min_size: int = 0,
    portable: bool = False,
) -> onnx.ModelProto:
    """Return a new model where every external initializer of at least ``min_size`` bytes is a DelayedInitializer.

    The model then reads each weight from its file when it runs (``load_device="file"``) or once when the evaluator
    is built (``"cpu"``), instead of when it is loaded: what onnx-light runs, and what
    :func:`~onnx_light_ref.reference_evaluator` builds for onnx's evaluator. No weight byte is read or copied.

    Each replaced initializer becomes a node ``ai.rt::DelayedInitializer`` with no inputs, the initializer's name as
    output, and attributes ``shape``, ``dtype``, ``load_device``, ``runtime_device="cpu"``, ``filename`` (the
    location as written, relative) and ``offset``. The node goes at the front of the node list of the graph that
    held the initializer, so it runs before every consumer, including nodes of nested subgraphs that use it as an
    outer-scope value. A ``value_info`` entry with the dtype and shape is added so evaluators checking shape
    annotations verify what the op produces. The ``ai.rt`` opset import (version 1) is added. Initializers the op
    cannot stand for are kept as they are (``docs/lazy_evaluation.md#what-is-not-converted``): graph-input defaults,
    those below ``min_size``, those of a dtype the op cannot produce here (string; float4 on an onnx without it...;
    with ``portable=True`` every type outside the 14 of onnx-light's C++ runtime: bfloat16, float8, int4...),
    subgraph initializers named like an outer value, and training graphs' initializers.

    Every converted reference is validated first (relative, inside ``base_dir``, file present, range in bounds,
    length matching dims and dtype) without reading a byte of weights.

    Args:
        model_or_path: A ``.onnx`` path (parsed without its weights) or a ModelProto (copied, never mutated).
        load_device: ``"file"`` (read at every run) or ``"cpu"`` (read once when the evaluator is built).
        base_dir: Folder the locations are relative to; defaults to the model's folder for a path, and is
            required for a proto with external initializers.
        min_size: Initializers smaller than this many bytes stay initializers.
        portable: Write a model for onnx-light's C++ runtime: only initializers of the 14 element types it reads
            (float, double, float16, the integers, bool, complex) become nodes; bfloat16, float8, int4... stay
            initializers. Default False: every type the installed onnx's evaluator represents is converted.

    Returns:
        The converted model: always a new ModelProto, a copy even when nothing was converted.

    Raises:
        ValueError: an unsupported ``load_device`` or ``min_size``, a proto with external initializers and no
            ``base_dir``, or an ``ai.rt`` opset import of another version.
        TypeError: ``portable`` is not a bool.
        UnsafeLocationError: a location escaping ``base_dir``, or a data file with several hard links (refused as
            onnx refuses it).
        ExternalDataError: a malformed reference (bad entries, range out of the file, length disagreeing with the
            dims and dtype).
        FileNotFoundError: a data file that does not exist.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> from onnx_light_ref import delay_initializers
        >>> model = delay_initializers("model.onnx")
        >>> [node.op_type for node in model.graph.node][:3]
        ['DelayedInitializer', 'DelayedInitializer', 'DelayedInitializer']
        >>> [tensor.name for tensor in model.graph.initializer]  # the inline Reshape shape stays
        ['shape']
    """
    check_load_device(load_device)
    plan = plan_delayed_initializers(model_or_path, base_dir=base_dir, min_size=min_size, portable=portable)
    return convert_planned(plan, load_device)


def check_load_device(load_device: object) -> None:
    """Refuse a ``load_device`` the op does not know (``ValueError``)."""
    if load_device not in LOAD_DEVICES:
        raise ValueError(f"load_device must be one of {list(LOAD_DEVICES)}, got {load_device!r}.")


def convert_planned(plan: ConversionPlan, load_device: str) -> onnx.ModelProto:
    """Rewrite ``plan.model`` as :func:`delay_initializers` documents: each planned initializer becomes a node.

    Args:
        plan: what :func:`plan_delayed_initializers` decided (its private model copy is rewritten and returned).
        load_device: ``"file"`` or ``"cpu"``, checked by the caller.

    Returns:
        The rewritten model.
    """
    model = plan.model
    if not plan.delayed:
        logger.info("no external initializer to delay")
        return model

    taken = _unique_names(model)
    per_graph: dict[int, tuple[onnx.GraphProto, list[DelayedTensor]]] = {}
    for item in plan.delayed:
        per_graph.setdefault(id(item.graph), (item.graph, []))[1].append(item)

    # Children before parents (the walker yields a graph before its subgraphs): rebuilding a parent's node list
    # copies its nodes, subgraphs included, so those subgraphs must already be rewritten.
    for graph, items in reversed(per_graph.values()):
        declared = _declared_names(graph)
        nodes: list[onnx.NodeProto] = []
        for item in items:
            name = f"{OP_TYPE}_{item.tensor.name}"
            suffix = 0
            while name in taken:
                suffix += 1
                name = f"{OP_TYPE}_{item.tensor.name}_{suffix}"
            taken.add(name)
            nodes.append(_make_node(item, load_device, name))
            if item.tensor.name not in declared:
                graph.value_info.append(
                    onnx.helper.make_tensor_value_info(item.tensor.name, item.tensor.data_type, list(item.tensor.dims))
                )
        # Initializer names are unique within a graph; delete by index (protobuf has no insert or remove-by-value).
        converted = {item.tensor.name for item in items}
        for index in reversed(range(len(graph.initializer))):
            if graph.initializer[index].name in converted:
                del graph.initializer[index]
        nodes.extend(_copy(node) for node in graph.node)
        del graph.node[:]
        graph.node.extend(nodes)
        logger.debug("graph %r: %d initializers delayed", graph.name, len(items))

    _set_opset_import(model)
    logger.info(
        "delayed %d initializers (%d bytes); kept %d overridable by graph inputs, %d below min_size, %d of a type "
        "the op cannot produce, %d named like an outer value",
        len(plan.delayed),
        sum(item.ref.length for item in plan.delayed),
        len(plan.kept_shadowed),
        len(plan.kept_small),
        len(plan.kept_dtype),
        len(plan.kept_shadowing),
    )
    return model
