"""The protobuf classes of ``io/_read/proto.py``: onnx's own, without importing the onnx package.

Each check runs in a fresh interpreter: which of the two (this module or ``onnx``) is imported first is the point.
"""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

from onnx_light_ref.io._read import proto

_PROTO_FIRST = """
import json, sys
from onnx_light_ref.io._read import proto
before = sorted(name for name in ("onnx", "numpy", "ml_dtypes") if name in sys.modules)
tensor = proto.TensorProto(name="w", data_type=proto.TensorProto.FLOAT, dims=[1], raw_data=bytes(4))
import onnx
import onnx.onnx_ml_pb2
model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [], [tensor]))  # onnx takes our tensor
print(json.dumps({
    "heavy_before": before,
    "same_classes": all(getattr(proto, n) is getattr(onnx, n) for n in dir(proto) if n.endswith("Proto")),
    "isinstance": isinstance(model, onnx.ModelProto) and isinstance(model.graph.initializer[0], onnx.TensorProto),
    "onnx_attribute": onnx.onnx_ml_pb2.ModelProto is onnx.ModelProto,
    "checker": onnx.checker.check_model(model) is None,
}))
"""


def test_the_classes_are_onnx_s_own_when_onnx_is_imported_after() -> None:
    done = subprocess.run([sys.executable, "-c", _PROTO_FIRST], capture_output=True, text=True, check=False)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "heavy_before": [],
        "same_classes": True,
        "isinstance": True,
        "onnx_attribute": True,  # onnx's import created its own onnx.onnx_ml_pb2, bound on the package
        "checker": True,
    }


def test_the_classes_are_onnx_s_own_when_onnx_was_imported_first() -> None:
    # This process imported onnx long before: the classes come from it.
    assert proto.TensorProto is onnx.TensorProto
    assert proto.ModelProto is onnx.ModelProto


@pytest.mark.parametrize(
    "data_type", [value for name, value in onnx.TensorProto.DataType.items() if name != "UNDEFINED"]
)
def test_data_type_name_is_onnx_s(data_type: int) -> None:
    assert proto.data_type_name(data_type) == onnx.helper.tensor_dtype_to_string(data_type).removeprefix("TensorProto.")


def test_data_type_name_of_undefined_and_unknown_numbers_is_none() -> None:
    assert proto.data_type_name(onnx.TensorProto.UNDEFINED) is None
    assert proto.data_type_name(10_000) is None
    assert proto.data_type_name(-1) is None
