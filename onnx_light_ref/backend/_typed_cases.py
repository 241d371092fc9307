"""Conformance cases for the element types beyond numpy's: bfloat16, float8, int4/uint4, float4, int2/uint2, float6.

One case per type the installed onnx represents (:data:`~onnx_light_ref.ops._dtypes.EXTENDED_DTYPES`) and per
``load_device``, whose weights file holds **every bit pattern** of the type, so that every bit matters: all 65,536
bfloat16 values, all 256 of each 8-bit float (NaN payloads, both zeros, subnormals, the extremes, E8M0's 2**-127
and 2**127), and for packed types every code at an **odd count** (33 four-bit values: the last byte's high nibble is
padding; 14 two-bit values; 65 six-bit values, a partial three-byte group), packed as onnx.proto lays them out
(:func:`onnx_light_ref.ops._codes.every_code`).

The expected output of every case is what onnx's own evaluator computes for the same tensor stored as an
initializer (``numpy_helper.to_array``, or ``ReferenceEvaluator`` running the case's graph), never our kernel's:
the cases are onnx's oracle written down.

onnx's Runner compares bfloat16 with a tolerance of two bfloat16 ulps (onnx >= 1.21), and any float comparison
calls ``-0.0`` equal to ``+0.0``: the float types also get a *bits* case whose graph is the op followed by
``Cast(to=FLOAT)`` (exact for every type here) and ``Reciprocal`` of that, concatenated, compared exactly (a
changed mantissa bit changes the float32 value, a lost sign of zero turns ``-inf`` into ``+inf``). NaN payloads
stay invisible to any ``assert_allclose``; our own suite compares bytes.

This module only describes cases; it must never write a file (see ``generate``).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.backend._expect import DEFAULT_IR_VERSION, CaseRegistry, SideFile
from onnx_light_ref.io._read.onnx_compat import onnx_readable_tensor
from onnx_light_ref.ops._codes import every_code
from onnx_light_ref.ops._dtypes import EXTENDED_DTYPES, EXTENDED_TYPE_NAMES, dtype_name
from onnx_light_ref.ops._schema import DOMAIN, SINCE_VERSION, make_delayed_initializer_node

# Cases compared exactly, as every DelayedInitializer case (see cases.EXACT_RTOL).
_EXACT = 0.0
_WEIGHTS = "weights.bin"

FLOAT_LIKE_TYPE_NAMES = tuple(name for name in EXTENDED_TYPE_NAMES if "INT" not in name)
"""The extended types holding real numbers: they also get a bits case (Cast to float32, Reciprocal)."""


def _is_float_like(dtype: int) -> bool:
    return any(getattr(TensorProto, name, None) == dtype for name in FLOAT_LIKE_TYPE_NAMES)


def _probe_nodes(source: str) -> list[onnx.NodeProto]:
    """``y = Concat(Cast(x, FLOAT), Reciprocal(Cast(x, FLOAT)))``: every bit of x, and the sign of its zeros."""
    return [
        oh.make_node("Cast", [source], ["as_float"], to=TensorProto.FLOAT),
        oh.make_node("Reciprocal", ["as_float"], ["reciprocal"]),
        oh.make_node("Concat", ["as_float", "reciprocal"], ["y"], axis=0),
    ]


def _probe_opsets() -> list[tuple[str, int]]:
    # Cast of int4/float4/float8e8m0/float6 needs a recent opset: the newest this onnx knows.
    return [("", onnx.defs.onnx_opset_version()), (DOMAIN, SINCE_VERSION)]


def _onnx_evaluates(dtype: int, shape: tuple[int, ...], raw: bytes, nodes: list[onnx.NodeProto]) -> np.ndarray:
    """What onnx's own ReferenceEvaluator computes when the tensor is an initializer ``x`` of the graph."""
    initializer = onnx_readable_tensor(dtype, list(shape), raw, "x")
    graph = oh.make_graph(nodes, "oracle", [], [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], [initializer])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in _probe_opsets() if d == ""])
    model.ir_version = DEFAULT_IR_VERSION
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        (output,) = ReferenceEvaluator(model).run(None, {})
    return np.asarray(output)


def _filename(root: str | None, name: str) -> str:
    return _WEIGHTS if root is None else os.path.join(root, name, _WEIGHTS)


def add_extended_cases(registry: CaseRegistry, root: str | None) -> None:
    """Register the cases of every extended type this onnx represents (see the module docstring).

    Args:
        registry: where to add them.
        root: the absolute folder of the case directories (absolute filenames), or None (relative ``weights.bin``).
    """
    for dtype in EXTENDED_DTYPES:
        shape, raw = every_code(dtype)
        expected = numpy_helper.to_array(onnx_readable_tensor(dtype, list(shape), raw))
        side = [SideFile(_WEIGHTS, raw)]
        for mode in ("cpu", "file"):
            name = f"test_cc_delayedinitializer_{dtype_name(dtype)}_{mode}"
            node = make_delayed_initializer_node(
                "y", shape=list(shape), dtype=dtype, load_device=mode, filename=_filename(root, name), offset=0
            )
            registry.expect(node, [], [expected], name=name, side_files=side, rtol=_EXACT, atol=_EXACT)
        if not _is_float_like(dtype):
            continue
        probe = _onnx_evaluates(dtype, shape, raw, _probe_nodes("x"))
        for mode in ("cpu", "file"):
            name = f"test_cc_delayedinitializer_{dtype_name(dtype)}_bits_{mode}"
            node = make_delayed_initializer_node(
                "x", shape=list(shape), dtype=dtype, load_device=mode, filename=_filename(root, name), offset=0
            )
            registry.expect(
                node,
                [],
                [probe],
                name=name,
                side_files=side,
                rtol=_EXACT,
                atol=_EXACT,
                opset_imports=_probe_opsets(),
                followed_by=_probe_nodes("x"),
            )
