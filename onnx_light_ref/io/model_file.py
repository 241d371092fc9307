"""Read a ``.onnx`` file's metadata (never its external weights) and serialize a model for publication.

This module never reads external weights and never writes a file: publication is :mod:`onnx_light_ref.io.publish`'s.
"""

from __future__ import annotations

import importlib
import os

import onnx

from onnx_light_ref.errors import InvalidModelError

__all__ = ["load_model_metadata", "serialize_model"]

# protobuf ships no type stubs (types-protobuf is not a dependency): looked up by name, so that mypy needs none.
_DecodeError: type[Exception] = importlib.import_module("google.protobuf.message").DecodeError


def load_model_metadata(path: str) -> onnx.ModelProto:
    """Parse ``path`` with ``load_external_data=False``: external tensors keep their entries, no weight is read.

    Args:
        path: the ``.onnx`` file.

    Returns:
        The parsed model, external tensors still EXTERNAL.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        InvalidModelError: ``path`` cannot be parsed as a model, or has no graph.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ONNX model file not found: {path!r}")
    try:
        model = onnx.load_model(path, load_external_data=False)
    except (_DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (cannot parse it: {exc}).") from exc
    if not model.HasField("graph"):
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (it has no graph; truncated or not ONNX?).")
    return model


def serialize_model(model: onnx.ModelProto) -> bytes:
    """Serialize ``model``; refuses protos over protobuf's 2 GiB limit with a message that says what to do.

    Raises:
        InvalidModelError: the model cannot be serialized (too large).
    """
    try:
        return model.SerializeToString()
    except ValueError as exc:
        raise InvalidModelError(
            f"model {model.graph.name!r} cannot be serialized ({exc}); move large tensors to external data."
        ) from exc
