"""The one tensor walker: every ``TensorProto`` of a model, with where it lives.

All io functions (and the op converter) iterate tensors through :func:`iter_tensors`, so they agree on which tensors
exist and in which order; the order decides destination offsets, hence byte-identical outputs between the streaming
and in-memory aligners.

Every place ``onnx.proto`` lets a model hold a tensor is visited: graph initializers and sparse initializers, node
attributes (``t``, ``tensors``, ``sparse_tensor``, ``sparse_tensors``, and the graphs in ``g``/``graphs``), the
default attribute values of model-local functions (``FunctionProto.attribute_proto``) and the graphs of
``ModelProto.training_info``. Nothing else in the format holds one: ``TypeProto``, ``value_info``,
``quantization_annotation``, metadata and the training bindings only hold names and strings.

Order (deterministic, depth-first, in proto field order; places added later come after the older ones, so a model
without them keeps the order, and the outputs, it always had):

1. the main graph, visited as below;
2. ``model.functions`` in order: each function's nodes (as a graph's nodes), then its default attribute values
   (``attribute_proto`` in order, each visited like a node attribute);
3. ``model.training_info`` in order: each entry's ``initialization`` graph, then its ``algorithm`` graph.

Visiting a graph yields its ``initializer`` list, then each ``sparse_initializer``'s ``values`` and ``indices``,
then for each node in order and each attribute in order: ``t``, ``tensors``, ``sparse_tensor`` (values, indices),
``sparse_tensors``, and finally the subgraphs ``g`` and ``graphs``, visited recursively right there.

Each :class:`TensorSite` says what the tensor is (``kind``), which part of the model it belongs to (``scope``:
the main graph, a function, or training information), a readable path (``where``) and two structural ones:
``place`` (every index on the way to the tensor: unique in the model, what positional ``verify`` compares) and
``key`` (the graph it lives in, named by node names where it can, and its slot there by name: what pairs tensors of
two models by place and name rather than by position, ``verify --by-name``). Both are built here, in one walk, so
that every comparison of places has one source of truth.

Each site also says whether onnx's own loader reads its external data back (:attr:`TensorSite.onnx_loads`):
``onnx.load(load_external_data=True)`` (``onnx.external_data_helper.load_external_data_for_model``, which walks
``_get_all_tensors``) visits only the initializers of the main graph and of the subgraphs reached from it through
attributes of type ``GRAPH``/``GRAPHS``, and the ``t``/``tensors`` of every node attribute of the main graph, of
model-local functions' nodes, and of their subgraphs. It never visits sparse tensors, function default attributes,
initializers of subgraphs inside functions, nor ``training_info``: a tensor there that is EXTERNAL stays EXTERNAL
after ``onnx.load``. Writers externalize only tensors with ``onnx_loads`` set (``docs/align.md``).

The walker yields the live protos: callers may mutate them. It never reads external data.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from onnx_light_ref.io._read.proto import AttributeProto

if TYPE_CHECKING:
    import onnx

SiteKey = tuple[tuple[object, ...], tuple[object, ...]]
"""``(graph path, slot)``. The graph path names a graph by its place: ``("graph",)`` for the main graph, then for a
subgraph the path of its parent, the holding node (``("node", name)``; ``("node", name, k)`` for the k-th of several
nodes of one name; ``("node #", index)`` when unnamed), the attribute name and ``"g"`` or ``("graphs", i)``;
``("function", domain, name, overload)``; ``("training", i, field)``. The slot names the tensor in that graph:
``("initializer", name)``, a sparse initializer's kind and values name, or a node attribute's node, attribute name
and position (``"t"``, ``("tensors", i)``, sparse values/indices); function defaults use ``"default"`` as their
node."""

SitePlace = tuple[object, ...]
"""Where a tensor is, by position: unique within a model, so two tensors of one model never share a place, and a
tensor moved anywhere else (another graph of a ``graphs`` attribute, another node of the same name, another overload
of a function, ``t`` to ``tensors[0]``) has another place. A flat tuple of steps, each a tuple: ``("graph",)``,
``("function", index, domain, name, overload)``, ``("training", index, field)``, then per subgraph ``("node", index)``,
``("attribute", index, name)``, ``("g",)`` or ``("graphs", i)``; last the slot: ``("initializer", i)``,
``("sparse_initializer", i, "values" | "indices")``, or ``("node", index)`` / ``("default",)`` (a function's default
attributes), ``("attribute", index, name)`` and ``("t",)``, ``("tensors", i)``, ``("sparse_tensor", "values" |
"indices")``, ``("sparse_tensors", i, "values" | "indices")``. :func:`describe_place` says it in words."""

TensorKind = Literal[
    "initializer",
    "sparse_initializer_values",
    "sparse_initializer_indices",
    "attribute",
    "sparse_attribute_values",
    "sparse_attribute_indices",
    "function_default",
    "sparse_function_default_values",
    "sparse_function_default_indices",
    "delayed_initializer",
]
"""What a tensor is in its container. ``delayed_initializer``: the tensor an ``ai.rt::DelayedInitializer`` node
reads (named after its output, with its ``dtype`` and ``shape``), which readers such as ``verify`` compare as one;
:func:`iter_tensors` never yields it. ``function_default*``: a default attribute value of a model-local function
(``FunctionProto.attribute_proto``); such a tensor has no node. Initializers of a subgraph are ``initializer`` too:
``scope`` and ``container`` tell them apart."""

TensorScope = Literal["model", "function", "training"]
"""Which part of the model holds the tensor: ``model`` (the main graph and its subgraphs, what inference runs),
``function`` (a model-local function, its subgraphs and default attributes) or ``training``
(``ModelProto.training_info``: initialization and algorithm graphs, which inference never runs)."""

# The kinds an attribute's tensors get, for node attributes and for function default attributes.
_NODE_ATTRIBUTE_KINDS: tuple[TensorKind, TensorKind, TensorKind] = (
    "attribute",
    "sparse_attribute_values",
    "sparse_attribute_indices",
)
_FUNCTION_DEFAULT_KINDS: tuple[TensorKind, TensorKind, TensorKind] = (
    "function_default",
    "sparse_function_default_values",
    "sparse_function_default_indices",
)


class TensorSite(NamedTuple):
    """A tensor and its place in the model (a named tuple: a walk builds one per tensor, 100,000 of them for a
    mixture-of-experts export, and a frozen dataclass cost four times as much to build).

    ``container`` is the GraphProto or FunctionProto that holds it; ``node`` the node whose attribute holds it (None
    for initializers and function default attributes); ``where`` a readable path such as
    ``graph 'main' / node 'If_0' (If) / then_branch``; ``scope`` the part of the model (see :data:`TensorScope`);
    ``sparse`` the SparseTensorProto whose ``values`` or ``indices`` the tensor is (None for a dense tensor): its
    ``dims`` (the dense shape) belong to no TensorProto, so a comparison of tensors must look there too;
    ``place`` a structural path unique in the model; ``onnx_loads`` whether onnx's loader reads this tensor's
    external data back (see the module docstring).
    """

    tensor: onnx.TensorProto
    kind: TensorKind
    container: onnx.GraphProto | onnx.FunctionProto
    node: onnx.NodeProto | None
    where: str
    scope: TensorScope = "model"
    sparse: onnx.SparseTensorProto | None = None
    key: SiteKey = ((), ())
    place: SitePlace = ()
    onnx_loads: bool = True  # onnx.load(load_external_data=True) reads this tensor's external data back

    @property
    def label(self) -> str:
        """The tensor's name, or a description of its place when it has none (sparse indices often do not).

        Always a ``str``: a name that is not UTF-8 (protobuf then hands back ``bytes``) is decoded with backslash
        escapes, so that messages can name it.
        """
        name: str | bytes = self.tensor.name
        if isinstance(name, bytes):
            name = name.decode("utf-8", errors="backslashreplace")
        return name or f"<unnamed {self.kind.replace('_', ' ')} in {self.where}>"


def iter_tensors(model: onnx.ModelProto) -> Iterator[TensorSite]:
    """Yield every tensor of ``model``, in the order documented in this module.

    Args:
        model: the model to walk; its protos are yielded live, not copied.

    Returns:
        An iterator of :class:`TensorSite`, one per ``TensorProto`` (sparse tensors yield their values, then their
        indices).
    """
    yield from _iter_graph(model.graph, f"graph {model.graph.name!r}", "model", ("graph",), (("graph",),), _LOADS_ALL)
    for index, function in enumerate(model.functions):
        # ``overload`` exists from IR version 10 (onnx 1.16) on.
        overload = getattr(function, "overload", "")
        where = f"function {function.domain}::{function.name}" + (f" (overload {overload!r})" if overload else "")
        path: tuple[object, ...] = ("function", function.domain, function.name, overload)
        place: SitePlace = (("function", index, function.domain, function.name, overload),)
        yield from _iter_nodes(function, function.node, where, "function", path, place, _LOADS_ATTRIBUTES)
        for attribute_index, attribute in enumerate(function.attribute_proto):
            yield from _iter_attribute(
                _Holder(function, None, "function", path, "default", _LOADS_NONE),
                attribute,
                f"{where} / default of attribute {attribute.name!r}",
                (*place, ("default",), ("attribute", attribute_index, attribute.name)),
            )
    for index, training in enumerate(model.training_info):
        for field in ("initialization", "algorithm"):
            if training.HasField(field):
                graph = getattr(training, field)
                where = f"training_info[{index}] {field} graph {graph.name!r}"
                step = ("training", index, field)
                yield from _iter_graph(graph, where, "training", step, (step,), _LOADS_NONE)


def describe_place(place: SitePlace) -> str:
    """A :data:`SitePlace` in words, every index included: ``graph / node #0 / attribute #1 'graphs' / graphs[1] /
    initializer #0``.

    Args:
        place: a :attr:`TensorSite.place`.

    Returns:
        The steps joined by ``" / "``.
    """
    return " / ".join(_describe_step(step) for step in place)


def _describe_step(step: object) -> str:
    assert isinstance(step, tuple) and step
    head, *rest = step
    if head == "function":
        index, domain, name, overload = rest
        return f"function #{index} {domain}::{name}" + (f" overload {overload!r}" if overload else "")
    if head == "training":
        return f"training_info[{rest[0]}] {rest[1]}"
    if head == "attribute":
        return f"attribute #{rest[0]} {rest[1]!r}"
    if head in ("graphs", "tensors", "sparse_tensors"):
        return f"{head}[{rest[0]}]" + "".join(f" {part}" for part in rest[1:])
    if head in ("node", "initializer", "sparse_initializer"):
        return f"{head.replace('_', ' ')} #{rest[0]}" + "".join(f" {part}" for part in rest[1:])
    return " ".join(str(part) for part in step)


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """Names a graph defines in its own scope: inputs, initializers, sparse initializers and node outputs.

    Args:
        graph: the graph (a subgraph's outer names are not included).

    Returns:
        The set of names.
    """
    names = {v.name for v in graph.input}
    names.update(t.name for t in graph.initializer)
    names.update(t.values.name for t in graph.sparse_initializer)
    names.update(output for node in graph.node for output in node.output)
    return names


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Yield ``graph`` and every subgraph of its nodes (``g`` and ``graphs`` attributes), depth-first.

    The order is the one :func:`iter_tensors` visits them in. Training graphs and function bodies are not reached
    from a graph: walk ``model.training_info`` or ``model.functions`` for those.

    Args:
        graph: the graph to start from (usually ``model.graph``).

    Returns:
        An iterator of the live GraphProtos, ``graph`` first.
    """
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from iter_graphs(attribute.g)
            for subgraph in attribute.graphs:
                yield from iter_graphs(subgraph)


def inline_reason(site: TensorSite) -> str | None:
    """Why a writer must keep this tensor inline even above ``size_threshold``: None when onnx loads it back.

    Args:
        site: a tensor of the walk.

    Returns:
        A short reason (used as a key in writers' results and in messages), or None when the tensor may be
        externalized.
    """
    if site.onnx_loads:
        return None
    if site.sparse is not None:
        return "sparse tensor"
    if site.kind == "function_default":
        return "function default attribute"
    if site.scope == "training":
        return "training_info"
    if site.kind == "initializer" and site.scope == "function":
        return "initializer of a subgraph in a function"
    return "subgraph not reached by onnx's loader"


class _Loads(NamedTuple):
    """Which tensors of a graph onnx's loader visits: its initializers, its node attributes' tensors."""

    initializers: bool
    attributes: bool


_LOADS_ALL = _Loads(True, True)
_LOADS_ATTRIBUTES = _Loads(False, True)
_LOADS_NONE = _Loads(False, False)


@dataclass(frozen=True, slots=True)
class _Holder:
    """What an attribute's tensors belong to: their container, node (None: a function's default attribute), scope,
    the key's graph path and the key's name for the node."""

    container: onnx.GraphProto | onnx.FunctionProto
    node: onnx.NodeProto | None
    scope: TensorScope
    path: tuple[object, ...]
    node_part: object
    loads: _Loads


def _iter_graph(
    graph: onnx.GraphProto, where: str, scope: TensorScope, path: tuple[object, ...], place: SitePlace, loads: _Loads
) -> Iterator[TensorSite]:
    onnx_loads = loads.initializers
    for i, tensor in enumerate(graph.initializer):
        # Built as a tuple with every field given: TensorSite(...) runs the named tuple's Python-level __new__, a
        # fifth of the walk per tensor.
        yield tuple.__new__(
            TensorSite,
            (
                tensor,
                "initializer",
                graph,
                None,
                where,
                scope,
                None,
                (path, ("initializer", tensor.name)),
                (*place, ("initializer", i)),
                onnx_loads,
            ),
        )
    for i, sparse in enumerate(graph.sparse_initializer):
        # A sparse initializer is named by its values (onnx.proto); its indices usually have no name.
        name = sparse.values.name
        for part, tensor in (("values", sparse.values), ("indices", sparse.indices)):
            kind: TensorKind = "sparse_initializer_values" if part == "values" else "sparse_initializer_indices"
            key = (path, (kind, name))
            yield TensorSite(
                tensor, kind, graph, None, where, scope, sparse, key, (*place, ("sparse_initializer", i, part)), False
            )
    yield from _iter_nodes(graph, graph.node, where, scope, path, place, loads)


def _iter_nodes(
    container: onnx.GraphProto | onnx.FunctionProto,
    nodes: Iterable[onnx.NodeProto],
    where: str,
    scope: TensorScope,
    path: tuple[object, ...],
    place: SitePlace,
    loads: _Loads,
) -> Iterator[TensorSite]:
    nodes = list(nodes)
    names = [node.name for node in nodes]
    shared_names = {name for name, count in Counter(name for name in names if name).items() if count > 1}
    seen: Counter[str] = Counter()
    for index, node in enumerate(nodes):
        name = names[index]
        occurrence = 0
        if name in shared_names:  # counted on every node of that name, tensors or not
            occurrence = seen[name]
            seen[name] += 1
        holder: _Holder | None = None
        for attribute_index, attribute in enumerate(node.attribute):
            if not _holds_tensors(attribute):  # most attributes (ints, strings): no site, nothing built for them
                continue
            if holder is None:
                node_where = f"{where} / node {name or f'#{index}'!r} ({node.op_type})"
                node_part = _node_key(index, name, name in shared_names, occurrence)
                holder = _Holder(container, node, scope, path, node_part, loads)
            yield from _iter_attribute(
                holder,
                attribute,
                f"{node_where} / {attribute.name}",
                (*place, ("node", index), ("attribute", attribute_index, attribute.name)),
            )


def _holds_tensors(attribute: onnx.AttributeProto) -> bool:
    """Whether an attribute holds a tensor or a graph, whatever its ``type`` says (onnx's loader reads ``t`` and
    ``tensors`` of any attribute)."""
    return bool(
        attribute.HasField("t")
        or attribute.HasField("g")
        or attribute.HasField("sparse_tensor")
        or len(attribute.tensors)
        or len(attribute.graphs)
        or len(attribute.sparse_tensors)
    )


def _node_key(index: int, name: str, shared: bool, occurrence: int) -> tuple[object, ...]:
    """How a key names a node: by name; an unnamed node by its index (reordering unnamed nodes changes their keys);
    a name several nodes of the container share by the name and its occurrence (the first 'k', the second 'k'...),
    so that a tensor moved between two same-named nodes changes its key."""
    if not name:
        return ("node #", index)
    if not shared:
        return ("node", name)
    return ("node", name, occurrence)


def _iter_attribute(
    holder: _Holder, attribute: onnx.AttributeProto, where: str, place: SitePlace
) -> Iterator[TensorSite]:
    """One attribute's tensors; ``place`` ends with the attribute's step; a holder without node is a function's
    default attribute value.

    onnx's loader yields ``t`` and ``tensors`` whatever the attribute's ``type``, but descends into ``g`` only when
    the type is ``GRAPH`` and into ``graphs`` only when it is ``GRAPHS`` (``_recursive_attribute_processor``).
    """
    container, node, scope, path = holder.container, holder.node, holder.scope, holder.path
    dense, values, indices = _NODE_ATTRIBUTE_KINDS if node is not None else _FUNCTION_DEFAULT_KINDS
    slot = (holder.node_part, attribute.name)
    dense_loads = holder.loads.attributes and node is not None
    if attribute.HasField("t"):
        key: SiteKey = (path, (*slot, "t"))
        yield TensorSite(attribute.t, dense, container, node, where, scope, None, key, (*place, ("t",)), dense_loads)
    for i, tensor in enumerate(attribute.tensors):
        key = (path, (*slot, "tensors", i))
        yield TensorSite(tensor, dense, container, node, where, scope, None, key, (*place, ("tensors", i)), dense_loads)
    sparse_tensors: list[tuple[tuple[object, ...], tuple[object, ...], onnx.SparseTensorProto]] = [
        ((*slot, "sparse_tensors", i), ("sparse_tensors", i), sparse)
        for i, sparse in enumerate(attribute.sparse_tensors)
    ]
    if attribute.HasField("sparse_tensor"):
        sparse_tensors.insert(0, ((*slot, "sparse_tensor"), ("sparse_tensor",), attribute.sparse_tensor))
    for sparse_slot, sparse_step, sparse in sparse_tensors:
        for part, kind, tensor in (("values", values, sparse.values), ("indices", indices, sparse.indices)):
            key = (path, (*sparse_slot, part))
            yield TensorSite(
                tensor, kind, container, node, where, scope, sparse, key, (*place, (*sparse_step, part)), False
            )
    if attribute.HasField("g"):
        subpath = (*path, holder.node_part, attribute.name, "g")
        sub = holder.loads if node is not None and attribute.type == AttributeProto.GRAPH else _LOADS_NONE
        yield from _iter_graph(attribute.g, where, scope, subpath, (*place, ("g",)), sub)
    many = holder.loads if node is not None and attribute.type == AttributeProto.GRAPHS else _LOADS_NONE
    for i, subgraph in enumerate(attribute.graphs):
        subpath = (*path, holder.node_part, attribute.name, "graphs", i)
        yield from _iter_graph(subgraph, f"{where}[{i}]", scope, subpath, (*place, ("graphs", i)), many)
