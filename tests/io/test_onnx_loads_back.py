"""Writers externalize a tensor only where onnx's loader reads it back (issue 18, section 3).

Sparse initializers, sparse attribute tensors, function default attribute tensors and ``training_info``
initializers stay inline for ``align(size_threshold=...)`` and the shared saver, and the result counts them; every
output loads in ``onnx.load(load_external_data=True)`` with no tensor left EXTERNAL, passes
``check_model(full_check=True)`` and runs in onnxruntime with the source's outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref.io._align import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._shared_save import save_model_with_shared_external_data
from onnx_light_ref.io._verify import verify_models
from tests.models import OPSET, make_model, value_info


def _model_with_places_onnx_does_not_load() -> onnx.ModelProto:
    """A runnable model whose large inline tensors sit in every place: loaded back by onnx or not."""
    weights = numpy_helper.from_array(np.arange(64, dtype=np.float32), "W")
    constant = numpy_helper.from_array(np.full(64, 2.0, dtype=np.float32), "C")
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.arange(1, 33, dtype=np.float32), "S"),
        numpy_helper.from_array(np.arange(0, 64, 2, dtype=np.int64), "S_indices"),
        [64],
    )
    sparse_attr = helper.make_sparse_tensor(
        numpy_helper.from_array(np.arange(1, 17, dtype=np.float32), "SA"),
        numpy_helper.from_array(np.arange(16, dtype=np.int64), "SA_indices"),
        [64],
    )
    function = helper.make_function(
        "ai.test",
        "AddConst",
        ["X"],
        ["Y"],
        [
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones(64, np.float32), "FK")),
            helper.make_node("Add", ["X", "k"], ["Y"]),
        ],
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    function.attribute_proto.append(
        helper.make_attribute("unused_default", numpy_helper.from_array(np.zeros(64, np.float32), "FD"))
    )
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=constant),
            helper.make_node("Constant", [], ["sa"], sparse_value=sparse_attr),
            helper.make_node("Add", ["x", "W"], ["a"]),
            helper.make_node("Add", ["a", "c"], ["b"]),
            helper.make_node("AddConst", ["b"], ["y"], domain="ai.test"),
            helper.make_node("Add", ["y", "sa"], ["z"]),
        ],
        "places",
        [value_info("x", TensorProto.FLOAT, [64])],
        [value_info("z", TensorProto.FLOAT, [64])],
        initializer=[weights],
        sparse_initializer=[sparse],
    )
    model = make_model(graph, domains={"ai.test": 1}, functions=[function])
    training = model.training_info.add()
    training.initialization.CopyFrom(
        helper.make_graph(
            [], "init", [], [], initializer=[numpy_helper.from_array(np.arange(64, dtype=np.float32), "T")]
        )
    )
    return model


FEEDS = {"x": np.arange(64, dtype=np.float32)}
KEPT = {"sparse tensor": 4, "function default attribute": 1, "training_info": 1}


def _run(path: Path) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, FEEDS)


def _assert_three_loaders_accept(path: Path, expected: list[np.ndarray]) -> None:
    loaded = onnx.load(str(path), load_external_data=True)
    still = [s.label for s in iter_tensors(loaded) if s.tensor.data_location == TensorProto.EXTERNAL]
    assert still == [], f"onnx.load left {still} EXTERNAL"
    onnx.checker.check_model(str(path), full_check=True)
    for got, want in zip(_run(path), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def _storage(path: Path) -> dict[str, str]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        s.label: "external" if s.tensor.data_location == TensorProto.EXTERNAL else "inline" for s in iter_tensors(model)
    }


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(_model_with_places_onnx_does_not_load(), str(path))
    onnx.checker.check_model(str(path), full_check=True)  # the source itself is valid
    return path


@pytest.mark.parametrize("aligner", [align_external_data_streaming, align_external_data_in_memory])
@pytest.mark.parametrize("threshold", [0, 16])
def test_aligners_keep_inline_what_onnx_would_not_load_back(source, tmp_path, aligner, threshold):
    expected = _run(source)
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()

    result = aligner(source, dst, alignment=64, size_threshold=threshold)

    assert result.externalized_tensors == 3  # W, C and the function's Constant FK
    assert result.kept_inline_reasons == KEPT and result.kept_inline_tensors == 6
    assert _storage(dst) == {
        "W": "external",
        "S": "inline",
        "S_indices": "inline",
        "C": "external",
        "SA": "inline",
        "SA_indices": "inline",
        "FK": "external",
        "FD": "inline",
        "T": "inline",
    }
    _assert_three_loaders_accept(dst, expected)
    assert verify_models(source, dst).equal


def test_shared_saver_keeps_inline_what_onnx_would_not_load_back(source, tmp_path):
    expected = _run(source)
    model = onnx.load(str(source))
    dst = tmp_path / "src" / "variant.onnx"

    result = save_model_with_shared_external_data(model, dst, alignment=64, size_threshold=0)

    assert result.new_tensors == 3 and result.kept_inline_reasons == KEPT and result.kept_inline_tensors == 6
    assert _storage(dst) == {
        "W": "external",
        "S": "inline",
        "S_indices": "inline",
        "C": "external",
        "SA": "inline",
        "SA_indices": "inline",
        "FK": "external",
        "FD": "inline",
        "T": "inline",
    }
    _assert_three_loaders_accept(dst, expected)
    assert verify_models(source, dst).equal


def test_cli_align_names_the_tensors_kept_inline(source, tmp_path):
    import subprocess
    import sys

    dst = tmp_path / "cli" / "model.onnx"
    done = subprocess.run(
        [sys.executable, "-m", "onnx_light_ref", "align", str(source), str(dst), "--size-threshold", "16"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "6 left in the .onnx" in done.stdout
    note = next(line for line in done.stdout.splitlines() if line.startswith("note: 6 tensor(s) stay in the .onnx"))
    assert "function default attribute: " in note and "sparse tensor: " in note and "training_info: " in note
