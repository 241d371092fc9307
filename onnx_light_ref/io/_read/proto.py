"""onnx's protobuf message classes (``ModelProto``, ``TensorProto``...) without importing the ``onnx`` package.

``import onnx`` runs onnx's ``__init__``, which imports numpy, ml_dtypes, the helpers and the checker: 0.15 to 0.7 s
depending on the machine and the ml_dtypes release, paid by every command that touches a model. Reading a model's
metadata (``inspect``, most of ``verify``, the sharing scan) needs only the message classes, which live in onnx's
generated ``onnx_ml_pb2.py`` and need nothing but protobuf. This module runs that one file under a private module
name when ``onnx`` is not imported yet; otherwise it takes the classes from ``onnx``.

The classes are the same objects either way: the generated code registers ``onnx/onnx-ml.proto`` in protobuf's
default descriptor pool, which returns the file already there when onnx registers it again, and protobuf keeps one
class per message descriptor (``onnx.ModelProto is ModelProto`` holds whichever was imported first;
``tests/io/test_proto.py`` checks it in a fresh interpreter). If the generated file is not where onnx 1.17 to 1.23
keep it, or does not run, the ``onnx`` package is imported as before.

This module must never import numpy or the ``onnx`` package when it can avoid it, and never define a message class
of its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

_PRIVATE_NAME = "onnx_light_ref.io._read._onnx_ml_pb2"
"""The name the generated module runs under here: not ``onnx.onnx_ml_pb2``, which onnx's own import must create
(it binds the attribute ``onnx.onnx_ml_pb2`` only when it loads the module itself)."""


def _generated_module() -> ModuleType:
    """onnx's ``onnx_ml_pb2``: onnx's own when ``onnx`` is imported, else the same file run without ``onnx``."""
    if "onnx" in sys.modules:
        return importlib.import_module("onnx.onnx_ml_pb2")
    loaded = sys.modules.get(_PRIVATE_NAME)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("onnx")  # locates the package without running its __init__
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, "onnx_ml_pb2.py")
        generated = importlib.util.spec_from_file_location(_PRIVATE_NAME, path)
        if generated is None or generated.loader is None or not os.path.isfile(path):
            continue
        module = importlib.util.module_from_spec(generated)
        try:
            generated.loader.exec_module(module)
        except Exception:  # another layout or protobuf: onnx's own import says what is wrong, if anything
            break
        sys.modules[_PRIVATE_NAME] = module
        return module
    return importlib.import_module("onnx.onnx_ml_pb2")


if TYPE_CHECKING:
    from onnx import (
        AttributeProto,
        FunctionProto,
        GraphProto,
        ModelProto,
        NodeProto,
        SparseTensorProto,
        StringStringEntryProto,
        TensorProto,
        TrainingInfoProto,
    )
else:
    _pb2 = _generated_module()
    AttributeProto = _pb2.AttributeProto
    FunctionProto = _pb2.FunctionProto
    GraphProto = _pb2.GraphProto
    ModelProto = _pb2.ModelProto
    NodeProto = _pb2.NodeProto
    SparseTensorProto = _pb2.SparseTensorProto
    StringStringEntryProto = _pb2.StringStringEntryProto
    TensorProto = _pb2.TensorProto
    TrainingInfoProto = _pb2.TrainingInfoProto


def data_type_name(data_type: int) -> str | None:
    """``TensorProto.FLOAT`` (1) -> ``"FLOAT"``: the name onnx gives the element type; None for UNDEFINED and for
    a number the installed onnx does not define (as ``onnx.helper.tensor_dtype_to_string`` refuses both).

    Args:
        data_type: a ``TensorProto.DataType`` value (any int).

    Returns:
        The name without ``TensorProto.``, or None.

    Example:
        >>> data_type_name(16)
        'BFLOAT16'
    """
    if data_type == TensorProto.UNDEFINED:
        return None
    try:
        return str(TensorProto.DataType.Name(data_type))
    except ValueError:
        return None
