"""Node count (issue 19): ``undelay_initializers`` of a graph with 100k ``DelayedInitializer`` nodes against
``delay_initializers`` of the same graph with 100k external initializers (the inverse direction, linear from the
start), each writing its model.

undelay was quadratic in the number of nodes per graph (16k nodes: 33.8 s, delay 0.8 s): both directions must now
do the same per-node work. The tensors are 16 bytes each, so the bytes copied are negligible. At ``tiny`` size the
graph has 2,000 nodes (the suite's quick check that the scenario works); at every real size, 100,000.

No assertion here is about time: ``python -m benchmarks.report`` prints the ratio against its target.
"""

from __future__ import annotations

from typing import Any

import onnx

from benchmarks.conftest import BenchConfig, Method, ModelCache
from benchmarks.models import make_many_nodes_model

_NODES = 100_000
_TINY_NODES = 2_000


def test_node_count(compare: Any, models: ModelCache, bench_config: BenchConfig) -> None:
    nodes = _TINY_NODES if bench_config.is_tiny else _NODES
    model = make_many_nodes_model(models.root / "many-nodes", nodes)
    methods = [
        Method("undelay", "undelay", {"model": model.delayed_path, "dst": "{fresh}/out.onnx", "alignment": 0}),
        Method("delay", "delay", {"model": model.external_path, "dst": "{fresh}/out.onnx"}),
    ]
    summary = compare("node-count", methods, nodes=nodes, tensor_bytes=model.tensor_bytes)
    assert summary["undelay"]["extra"]["bytes_written"] == nodes * model.tensor_bytes
    assert summary["delay"]["extra"]["delayed_nodes"] == nodes
    written = onnx.load(model.delayed_path, load_external_data=False)
    assert len(written.graph.node) == nodes + 1  # the source is never touched
