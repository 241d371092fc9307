"""Turn a model's external initializers into ``ai.rt::DelayedInitializer`` nodes, so weights load only when used.

:func:`delay_initializers` rewrites the graph (and every If/Loop/Scan body) so that each external initializer
becomes a zero-input node whose output carries the initializer's name. onnx's ``ReferenceEvaluator`` then no longer
needs the weights in the proto: with ``load_device="file"`` the kernel reads each tensor at every run, with
``load_device="cpu"`` once when the evaluator is built.

How ``filename`` is bound: the node stores the ``location`` exactly as the model wrote it (relative to the model's
folder). The kernel resolves a relative filename at evaluation time against the folder its class is bound to,
``DelayedInitializer.bind(folder)``; :func:`onnx_light_ref.ops.reference_evaluator` binds the model's folder for
you. An unbound ``DelayedInitializer`` resolves against the current directory, which is rarely what you want.

What is left as it was:

* initializers also listed in their graph's inputs (overridable defaults, see :func:`_shadowed_by_inputs`);
* initializers smaller than ``min_size`` bytes;
* sparse initializers and tensors held in node attributes (``Constant``'s ``value``...): the op produces dense
  initializers only; onnx's evaluator loads such tensors itself (and refuses sparse initializers outright);
* inline initializers (they already are in memory).

Model-local functions are inlined first (``onnx.inliner.inline_local_functions``) when the model has any, because
onnx's evaluator does not hand ``new_ops`` to the evaluators it builds for functions.

This module must never read weight bytes: every reference is validated with
:func:`onnx_light_ref.io.locations.parse_external_data`, which resolves the location and ``stat``s the file only.
It never mutates the model it is given.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import onnx
import onnx.inliner
from onnx import AttributeProto

from onnx_light_ref.io.locations import (
    ExternalRef,
    LocationResolver,
    check_not_hard_linked,
    expected_nbytes,
    is_external,
    parse_external_data,
)
from onnx_light_ref.io.model_file import load_model_metadata
from onnx_light_ref.io.walker import iter_graphs, iter_tensors
from onnx_light_ref.ops.attributes import LOAD_DEVICES
from onnx_light_ref.ops.dtypes import describe_allowed, dtype_name, is_allowed_dtype
from onnx_light_ref.ops.schema import DOMAIN, OP_TYPE, SINCE_VERSION

__all__ = ["ConversionPlan", "DelayedTensor", "delay_initializers", "plan_delayed_initializers"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

# The op's only runtime device in v1 (the schema and kernel refuse anything else).
_RUNTIME_DEVICE = "cpu"


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


def _shadowed_by_inputs(graph: onnx.GraphProto) -> set[str]:
    """Names of initializers that are also graph inputs.

    Such an initializer is only a default value: the caller may feed the input to override it. Turning it into a
    node would give the name two producers (the graph input and the node), which is invalid SSA, and onnx's
    evaluator would silently let the node's output win over the fed value. So these stay initializers.
    """
    return {value.name for value in graph.input}


def _load(model_or_path: onnx.ModelProto | PathLike, base_dir: PathLike | None) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(model_or_path, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_path)
        return model, os.path.abspath(os.fspath(base_dir)) if base_dir is not None else None
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(model_or_path))
        folder = os.fspath(base_dir) if base_dir is not None else os.path.dirname(path)
        return load_model_metadata(path), os.path.abspath(folder)
    raise TypeError(
        f"model_or_path must be an onnx.ModelProto or a path to a .onnx file, got {type(model_or_path).__name__}."
    )


def plan_delayed_initializers(
    model_or_path: onnx.ModelProto | PathLike, *, base_dir: PathLike | None = None, min_size: int = 0
) -> ConversionPlan:
    """Load (metadata only) or copy the model, inline its functions, and validate every initializer to convert.

    Raises ``ValueError`` (arguments, unsupported dtype, proto without ``base_dir``), the io errors
    (:class:`~onnx_light_ref.errors.UnsafeLocationError`, :class:`~onnx_light_ref.errors.ExternalDataError`,
    ``FileNotFoundError``) for bad references. Nothing is modified.
    """
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise ValueError(f"min_size must be a non-negative int (bytes), got {min_size!r}.")
    model, folder = _load(model_or_path, base_dir)
    if len(model.functions) > 0:
        # new_ops never reaches the evaluators onnx builds for model-local functions: inline them so that every
        # node (and every initializer reference) lives in the main graph or its subgraphs.
        model = onnx.inliner.inline_local_functions(model)

    resolver = LocationResolver(folder) if folder is not None else None
    delayed: list[DelayedTensor] = []
    kept_shadowed: list[str] = []
    kept_small: list[str] = []
    shadowed_cache: dict[int, set[str]] = {}
    for site in iter_tensors(model):
        tensor = site.tensor
        if site.kind != "initializer" or not is_external(tensor):
            continue
        graph = site.container
        assert isinstance(graph, onnx.GraphProto)  # initializers only live in graphs
        shadowed = shadowed_cache.setdefault(id(graph), _shadowed_by_inputs(graph))
        if tensor.name in shadowed:
            kept_shadowed.append(tensor.name)
            continue
        size = expected_nbytes(tensor)
        if size is not None and size < min_size:
            kept_small.append(tensor.name)
            continue
        if not is_allowed_dtype(tensor.data_type):
            raise ValueError(
                f"initializer {site.label!r} in {site.where} has data type {tensor.data_type} "
                f"({dtype_name(tensor.data_type)}), which ai.rt::DelayedInitializer cannot produce (allowed: "
                f"{describe_allowed()}). Raise min_size above its size ({size} bytes) to keep it as an initializer, "
                "or convert it to an allowed type."
            )
        if resolver is None:
            raise ValueError(
                f"base_dir is required when converting an in-memory model with external initializers (first: "
                f"{site.label!r}, location in {site.where}); pass the folder its locations are relative to."
            )
        ref = parse_external_data(tensor, resolver, label=site.label)
        # onnx (>= 1.21) refuses to read a hard-linked data file; the converted model must not be a way around that.
        check_not_hard_linked(ref)
        delayed.append(DelayedTensor(tensor, graph, ref, site.where))
    return ConversionPlan(model, folder or "", delayed, kept_shadowed, kept_small)


def _make_node(item: DelayedTensor, load_device: str, name: str) -> onnx.NodeProto:
    tensor = item.tensor
    node = onnx.helper.make_node(
        OP_TYPE,
        inputs=[],
        outputs=[tensor.name],
        name=name,
        domain=DOMAIN,
        dtype=tensor.data_type,
        load_device=load_device,
        runtime_device=_RUNTIME_DEVICE,
        filename=item.ref.location,
        offset=item.ref.offset,
    )
    # make_attribute cannot infer the type of an empty list (a scalar's shape): say it.
    node.attribute.insert(0, onnx.helper.make_attribute("shape", list(tensor.dims), attr_type=AttributeProto.INTS))
    return node


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
    base_dir: PathLike | None = None,
    min_size: int = 0,
) -> onnx.ModelProto:
    """Return a new model where every external initializer of at least ``min_size`` bytes is a DelayedInitializer.

    ``model_or_path``: a ``.onnx`` path (parsed without its weights; ``base_dir`` defaults to its folder) or a
    ModelProto (copied, never mutated; ``base_dir`` is then required if any initializer is external).
    ``load_device``: ``"file"`` (read at every run) or ``"cpu"`` (read once when the evaluator is built).

    Each replaced initializer becomes a node ``ai.rt::DelayedInitializer`` with no inputs, the initializer's name
    as output, and attributes ``shape``, ``dtype``, ``load_device``, ``runtime_device="cpu"``, ``filename`` (the
    location as written, relative) and ``offset``. The node goes at the front of the node list of the graph that
    held the initializer, so it runs before every consumer, including nodes of nested subgraphs that use it as an
    outer-scope value. A ``value_info`` entry with the dtype and shape is added so evaluators checking shape
    annotations verify what the op produces. The ``ai.rt`` opset import (version 1) is added.

    Every converted reference is validated first (relative, inside ``base_dir``, file present, range in bounds,
    length matching dims and dtype) without reading a byte of weights. Raises ``ValueError`` for an unsupported
    ``load_device``/``min_size``, for an initializer whose dtype the op cannot produce (unless ``min_size``
    excludes it), and for a proto with external initializers but no ``base_dir``; the io errors
    (``UnsafeLocationError``, ``ExternalDataError``, ``FileNotFoundError``) for bad references; a data file with
    several hard links is refused (``UnsafeLocationError``) as onnx refuses it.
    """
    if load_device not in LOAD_DEVICES:
        raise ValueError(f"load_device must be one of {list(LOAD_DEVICES)}, got {load_device!r}.")
    plan = plan_delayed_initializers(model_or_path, base_dir=base_dir, min_size=min_size)
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
        "delayed %d initializers (%d bytes); kept %d overridable by graph inputs, %d below min_size",
        len(plan.delayed),
        sum(item.ref.length for item in plan.delayed),
        len(plan.kept_shadowed),
        len(plan.kept_small),
    )
    return model
