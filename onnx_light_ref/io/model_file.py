"""Read a ``.onnx`` file's metadata (never its external weights) and serialize a model for publication."""

from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError

from onnx_light_ref.errors import InvalidModelError

__all__ = ["load_model_metadata", "serialize_model"]


def load_model_metadata(path: str) -> onnx.ModelProto:
    """Parse ``path`` with ``load_external_data=False``: external tensors keep their entries, no weight is read.

    Raises ``FileNotFoundError`` for a missing file and :class:`InvalidModelError` for one that is not a model.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ONNX model file not found: {path!r}")
    try:
        model = onnx.load_model(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (cannot parse it: {exc}).") from exc
    if not model.HasField("graph"):
        raise InvalidModelError(f"{path!r} is not a valid ONNX model (it has no graph; truncated or not ONNX?).")
    return model


def serialize_model(model: onnx.ModelProto) -> bytes:
    """Serialize ``model``; refuses protos over protobuf's 2 GiB limit with a message that says what to do."""
    try:
        return model.SerializeToString()
    except ValueError as exc:
        raise InvalidModelError(
            f"model {model.graph.name!r} cannot be serialized ({exc}); move large tensors to external data."
        ) from exc
