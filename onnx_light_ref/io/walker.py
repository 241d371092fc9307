"""The one tensor walker: every ``TensorProto`` of a model, with where it lives.

All io functions (and the op converter) iterate tensors through :func:`iter_tensors`, so they agree on which tensors
exist and in which order; the order decides destination offsets, hence byte-identical outputs between the streaming
and in-memory aligners.

Order (deterministic, depth-first, in proto field order):

1. the main graph, visited as below;
2. ``model.functions`` in order, each visited like a graph that has no initializers.

Visiting a graph yields its ``initializer`` list, then each ``sparse_initializer``'s ``values`` and ``indices``,
then for each node in order and each attribute in order: ``t``, ``tensors``, ``sparse_tensor`` (values, indices),
``sparse_tensors``, and finally the subgraphs ``g`` and ``graphs``, visited recursively right there.

The walker yields the live protos: callers may mutate them. It never reads external data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import onnx

__all__ = ["TensorKind", "TensorSite", "iter_graphs", "iter_tensors"]

TensorKind = Literal[
    "initializer",
    "sparse_initializer_values",
    "sparse_initializer_indices",
    "attribute",
    "sparse_attribute_values",
    "sparse_attribute_indices",
]


@dataclass(frozen=True, slots=True)
class TensorSite:
    """A tensor and its place in the model.

    ``container`` is the GraphProto or FunctionProto that holds it; ``node`` the node whose attribute holds it (None
    for initializers); ``where`` a readable path such as ``graph 'main' / node 'If_0' (If) / then_branch``.
    """

    tensor: onnx.TensorProto
    kind: TensorKind
    container: onnx.GraphProto | onnx.FunctionProto
    node: onnx.NodeProto | None
    where: str

    @property
    def label(self) -> str:
        """The tensor's name, or a description of its place when it has none (sparse indices often do not)."""
        return self.tensor.name or f"<unnamed {self.kind.replace('_', ' ')} in {self.where}>"


def iter_tensors(model: onnx.ModelProto) -> Iterator[TensorSite]:
    """Yield every tensor of ``model`` (graphs, subgraphs, attributes, sparse tensors, functions) in the order above."""
    yield from _iter_graph(model.graph, f"graph {model.graph.name!r}")
    for function in model.functions:
        yield from _iter_nodes(function, function.node, f"function {function.domain}::{function.name}")


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Yield ``graph`` and every subgraph of its nodes (``g`` and ``graphs`` attributes), depth-first, in the order
    :func:`iter_tensors` visits them."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from iter_graphs(attribute.g)
            for subgraph in attribute.graphs:
                yield from iter_graphs(subgraph)


def _iter_graph(graph: onnx.GraphProto, where: str) -> Iterator[TensorSite]:
    for tensor in graph.initializer:
        yield TensorSite(tensor, "initializer", graph, None, where)
    for sparse in graph.sparse_initializer:
        yield TensorSite(sparse.values, "sparse_initializer_values", graph, None, where)
        yield TensorSite(sparse.indices, "sparse_initializer_indices", graph, None, where)
    yield from _iter_nodes(graph, graph.node, where)


def _iter_nodes(
    container: onnx.GraphProto | onnx.FunctionProto, nodes: list[onnx.NodeProto], where: str
) -> Iterator[TensorSite]:
    for index, node in enumerate(nodes):
        node_where = f"{where} / node {node.name or f'#{index}'!r} ({node.op_type})"
        for attribute in node.attribute:
            attr_where = f"{node_where} / {attribute.name}"
            if attribute.HasField("t"):
                yield TensorSite(attribute.t, "attribute", container, node, attr_where)
            for tensor in attribute.tensors:
                yield TensorSite(tensor, "attribute", container, node, attr_where)
            sparse_tensors = list(attribute.sparse_tensors)
            if attribute.HasField("sparse_tensor"):
                sparse_tensors.insert(0, attribute.sparse_tensor)
            for sparse in sparse_tensors:
                yield TensorSite(sparse.values, "sparse_attribute_values", container, node, attr_where)
                yield TensorSite(sparse.indices, "sparse_attribute_indices", container, node, attr_where)
            if attribute.HasField("g"):
                yield from _iter_graph(attribute.g, attr_where)
            for subgraph in attribute.graphs:
                yield from _iter_graph(subgraph, attr_where)
