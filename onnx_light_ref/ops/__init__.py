"""The ``ai.rt`` operators for onnx's reference evaluator: kernels, schemas, element types, delay/undelay.

Importing this package imports ``onnx.reference`` (through the kernel) but registers no schema: call
:func:`register_schemas` for the checker and shape inference. It must never import ``onnx_light_ref.backend``.
"""

from __future__ import annotations

from onnx_light_ref.ops._convert import delay_initializers
from onnx_light_ref.ops._delay_write import DelayResult, write_delayed_model
from onnx_light_ref.ops._delayed_initializer import DelayedInitializer
from onnx_light_ref.ops._dtypes import ALLOWED_DTYPES, EXTENDED_DTYPES, PORTABLE_DTYPES
from onnx_light_ref.ops._evaluate import LazyReferenceEvaluator, reference_evaluator
from onnx_light_ref.ops._schema import make_delayed_initializer_node, register_schemas
from onnx_light_ref.ops._undelay import undelay_initializers

__all__ = [
    "ALLOWED_DTYPES",
    "EXTENDED_DTYPES",
    "PORTABLE_DTYPES",
    "DelayResult",
    "DelayedInitializer",
    "LazyReferenceEvaluator",
    "delay_initializers",
    "make_delayed_initializer_node",
    "reference_evaluator",
    "register_schemas",
    "undelay_initializers",
    "write_delayed_model",
]
