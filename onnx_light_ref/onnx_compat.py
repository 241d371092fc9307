"""The one place that knows how the supported onnx releases (1.17 to the newest) differ.

Every difference is detected from the installed onnx's own API (an attribute, a keyword in a signature, what a
helper returns), never from its version string, so a backport or a patched build gets the feature it has. The
version string only appears in messages. What differs:

* ``OpSchema.set_type_and_shape_inference_function`` exists from onnx 1.19: below it a Python schema cannot carry
  a shape-inference function (:data:`HAS_PYTHON_SHAPE_INFERENCE`).
* onnx 1.19 to 1.22 destroy a Python inference function left in the schema registry after the interpreter has
  finalized (hang on 1.19, segfault on 1.21/1.22): :func:`register_schema_until_exit` deregisters it before then.
* ``ReferenceEvaluator(check_shape_annotations=...)`` exists from onnx 1.23 (:func:`evaluator_checks_shapes`).
* ``onnx.helper.tensor_dtype_to_np_dtype`` maps bfloat16 and the float8 types to float32 before onnx 1.19 (their
  numpy dtypes came with ml_dtypes), so an ``itemsize`` read from it is the wrong byte size in ``raw_data``:
  :func:`raw_element_size` gives the stored size of those types whatever onnx says.
* ``numpy_helper.from_array`` refuses an odd number of INT4/UINT4 values on onnx 1.17 ("requires an even
  size"), although ``make_tensor`` writes them and ``to_array`` reads them: :func:`typed_raw_bytes` pads the values
  with zeros to whole bytes (onnx pads the last byte's unused bits with zeros) and keeps the bytes the tensor needs.

This module must never change onnx's behaviour for the newest onnx (on it every shim is a pass-through), and must
never import ``onnx.reference`` at import time (the io tools import this module; the evaluator's signature is
read on first use).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, numpy_helper
from onnx.defs import OpSchema

__all__ = [
    "HAS_PYTHON_SHAPE_INFERENCE",
    "ONNX_VERSION",
    "UnsupportedOnnxFeatureError",
    "attach_inference_function",
    "evaluator_checks_shapes",
    "evaluator_shape_checks",
    "raw_element_size",
    "refuse_unsupported_evaluator_options",
    "register_schema_until_exit",
    "typed_raw_bytes",
]

logger = logging.getLogger(__name__)

ONNX_VERSION: str = onnx.__version__
"""The installed onnx's version, for messages only (features are detected, not compared by version)."""

HAS_PYTHON_SHAPE_INFERENCE: bool = hasattr(OpSchema, "set_type_and_shape_inference_function")
"""True when a Python ``OpSchema`` can carry a shape-inference function (onnx >= 1.19)."""


@functools.cache
def _evaluator_keywords() -> frozenset[str]:
    # Imported on first use: onnx.reference is slow to import and the io tools never need it.
    from onnx.reference import ReferenceEvaluator

    return frozenset(inspect.signature(ReferenceEvaluator.__init__).parameters)


def evaluator_checks_shapes() -> bool:
    """True when ``ReferenceEvaluator`` takes ``check_shape_annotations`` (onnx >= 1.23)."""
    return "check_shape_annotations" in _evaluator_keywords()


# The first onnx release with each evaluator keyword we know of, named in the error when it is missing.
_EVALUATOR_KEYWORD_SINCE = {"check_shape_annotations": "1.23"}


class UnsupportedOnnxFeatureError(NotImplementedError):
    """The installed onnx lacks an API a requested feature needs; the message names the onnx version needed."""


def evaluator_shape_checks() -> dict[str, Any]:
    """Keyword arguments turning on ``ReferenceEvaluator``'s output-shape checks where onnx has them.

    Returns:
        ``{"check_shape_annotations": True}`` on onnx >= 1.23, ``{}`` before (those evaluators do not check the
        declared output shapes, and do not accept the keyword).
    """
    return {"check_shape_annotations": True} if evaluator_checks_shapes() else {}


def refuse_unsupported_evaluator_options(options: dict[str, Any]) -> None:
    """Raise a clear error for a ``ReferenceEvaluator`` keyword this onnx does not take, before it is called.

    Without this, onnx's own ``TypeError`` ("unexpected keyword argument") names neither the keyword's origin
    nor the onnx version that has it.

    Args:
        options: The keyword arguments about to be passed to ``ReferenceEvaluator``.

    Raises:
        UnsupportedOnnxFeatureError: a keyword in :data:`_EVALUATOR_KEYWORD_SINCE` the installed onnx lacks.
    """
    for name, since in _EVALUATOR_KEYWORD_SINCE.items():
        if name in options and name not in _evaluator_keywords():
            raise UnsupportedOnnxFeatureError(
                f"ReferenceEvaluator keyword {name!r} needs onnx >= {since}; the installed onnx {ONNX_VERSION} "
                f"does not have it (drop the keyword or upgrade onnx)."
            )


def attach_inference_function(schema: OpSchema, function: Callable[[Any], None]) -> bool:
    """Attach a Python shape-inference function to an unregistered schema where onnx allows it.

    Args:
        schema: A schema not registered yet (onnx copies it at registration; a function set later is ignored).
        function: Called by onnx with an ``InferenceContext``.

    Returns:
        True when attached; False on onnx < 1.19, whose ``OpSchema`` cannot carry a Python function (the schema
        then serves the checker only, and shape inference leaves the node's outputs untyped).
    """
    if not HAS_PYTHON_SHAPE_INFERENCE:
        return False
    schema.set_type_and_shape_inference_function(function)
    return True


_registered_lock = threading.Lock()
_registered: list[tuple[str, int, str]] = []


def _deregister_all() -> None:
    # Runs at interpreter exit, GIL held: the registry drops its copies (and their Python function) now, not in
    # onnx's static destructors after finalization, where onnx 1.19-1.22 hang or crash taking the GIL.
    with _registered_lock:
        while _registered:
            op_type, version, domain = _registered.pop()
            try:
                onnx.defs.deregister_schema(op_type, version, domain)
            except onnx.defs.SchemaError:
                logger.debug("schema %s::%s v%d already deregistered at exit", domain, op_type, version)


def register_schema_until_exit(schema: OpSchema) -> None:
    """``onnx.defs.register_schema``, plus its deregistration when the interpreter exits.

    A schema holding a Python inference function must leave onnx's registry while Python still runs: otherwise
    onnx 1.19 hangs and 1.21/1.22 segfault at exit, destroying the function without the GIL. Deregistering it in
    an ``atexit`` hook is harmless on every onnx (nothing uses the registry after the hooks).

    Args:
        schema: The schema to register.

    Raises:
        onnx.defs.SchemaError: onnx refused it (for instance, the same op, domain and version is registered).
    """
    onnx.defs.register_schema(schema)
    with _registered_lock:
        first = not _registered
        _registered.append((schema.name, schema.since_version, schema.domain))
    if first:
        atexit.register(_deregister_all)


# Bytes per element in raw_data of the types whose numpy dtype depends on the onnx release (float32 before onnx
# 1.19 for all of these). Looked up by name: a type the installed onnx does not define is simply absent.
_FIXED_RAW_SIZES_BY_NAME = {
    "BFLOAT16": 2,
    "FLOAT8E4M3FN": 1,
    "FLOAT8E4M3FNUZ": 1,
    "FLOAT8E5M2": 1,
    "FLOAT8E5M2FNUZ": 1,
    "FLOAT8E8M0": 1,
}
_FIXED_RAW_SIZES = {
    getattr(TensorProto, name): size for name, size in _FIXED_RAW_SIZES_BY_NAME.items() if hasattr(TensorProto, name)
}


def raw_element_size(data_type: int) -> int | None:
    """Stored byte size of one element in ``raw_data`` for the types onnx releases map to different numpy dtypes.

    Args:
        data_type: A ``TensorProto.DataType`` value.

    Returns:
        2 for bfloat16, 1 for the float8 types, None for any other type (ask onnx's numpy mapping).
    """
    return _FIXED_RAW_SIZES.get(data_type)


def typed_raw_bytes(tensor: TensorProto) -> bytes:
    """The ``raw_data`` bytes of a tensor held in typed fields, as onnx converts them (sub-byte packing included).

    ``numpy_helper.from_array(numpy_helper.to_array(tensor))``; where this onnx's ``from_array`` cannot pack an odd
    count of sub-byte values (INT4/UINT4 on onnx 1.17), the values are padded with zeros (of their own numpy
    type) to whole bytes, packed by onnx, and cut to the bytes the tensor's count needs: the bytes newer onnx writes.

    Args:
        tensor: a tensor whose values are in its typed fields (``float_data``, ``int32_data``...).

    Returns:
        Its little-endian raw bytes.

    Raises:
        ValueError: the typed data do not fit the dims and data type (also ``TypeError`` or ``KeyError``, as onnx
            raises them for an unknown or unconvertible type).
    """
    array = numpy_helper.to_array(tensor)
    try:
        return numpy_helper.from_array(array).raw_data
    except ValueError:
        # Imported here: onnx_light_ref.io's package imports modules that import this one (an import cycle).
        from onnx_light_ref.io.read.dtype_sizes import element_bits, packed_nbytes

        bits = element_bits(tensor.data_type)
        if bits is None or bits >= 8 or (array.size * bits) % 8 == 0:
            raise  # not the odd-count packing refusal: a real mismatch
        count = array.size
        while (count * bits) % 8:
            count += 1
        padded = np.zeros(count, dtype=array.dtype)  # keeps onnx's custom sub-byte dtype, which from_array packs
        padded[: array.size] = array.ravel()
        needed = packed_nbytes(tensor.data_type, array.size)
        assert needed is not None
        return numpy_helper.from_array(padded).raw_data[:needed]
