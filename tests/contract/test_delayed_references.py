"""Every reference is a site of the plan: what ``ai.rt::DelayedInitializer`` nodes read, through every writer.

A node reads ``filename`` at ``offset`` as an external tensor reads its ``location``. A writer that writes such a
model into another folder relocates what the nodes read (the ranges copied into the destination's weights,
``filename``/``offset`` rewritten: the aligners, ``align_models``, ``link``), or checks the file from the destination
as it checks a reused reference, refusing one the variant could not reach (the shared saver); it never publishes a
model that reads a file of the source's folder. ``verify`` compares what the nodes read.

The oracle is the model itself: onnx's reference evaluator (bound to the destination's folder, confined to it) must
compute the source's outputs, and ``verify_models`` must compare every node's bytes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import safetensors.numpy as st_numpy

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    align_models,
    link_external_data,
    reference_evaluator,
    save_model_with_shared_external_data,
    verify_models,
)
from onnx_light_ref.errors import DanglingReferenceError, ExternalDataError
from onnx_light_ref.ops import delay_initializers
from tests.checks import sha256_of_tree, temp_files_under
from tests.models import write_external_model

ARRAYS = {"a": np.arange(300, dtype=np.float32), "b": np.linspace(-1, 1, 500, dtype=np.float32)}


def _delayed(folder: Path) -> Path:
    """``folder/light.onnx``: every weight of ``folder/model.onnx`` read by a DelayedInitializer node."""
    write_external_model(folder, ARRAYS)
    onnx.save(delay_initializers(folder / "model.onnx"), folder / "light.onnx")
    return folder / "light.onnx"


def _outputs(path: Path) -> list[np.ndarray]:
    evaluator = reference_evaluator(str(path))  # confined to the model's folder
    try:
        return list(evaluator.run(None, {}))
    finally:
        evaluator.close()


def _assert_computes(path: Path, expected: list[np.ndarray]) -> None:
    got = _outputs(path)
    assert len(got) == len(expected)
    for value, wanted in zip(got, expected, strict=True):
        np.testing.assert_array_equal(value, wanted)


def _node_files(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        os.fsdecode(attribute.s)
        for node in model.graph.node
        if node.op_type == "DelayedInitializer"
        for attribute in node.attribute
        if attribute.name == "filename"
    }


@pytest.fixture
def light(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    return _delayed(tmp_path / "src")


@pytest.mark.parametrize(
    "align", [align_external_data_streaming, align_external_data_in_memory], ids=["streaming", "in-memory"]
)
@pytest.mark.parametrize("weights_format", ["onnx", "safetensors"])
def test_an_aligner_relocates_what_the_nodes_read_into_the_destination(
    light: Path, align: object, weights_format: str
) -> None:
    expected = _outputs(light)
    source = sha256_of_tree(light.parent)
    dst = light.parent.parent / "out" / "light.onnx"
    result = align(light, dst, alignment=64, weights_format=weights_format)  # type: ignore[operator]
    # The source folder is gone from the destination's world: move it away and the destination still runs.
    assert sha256_of_tree(light.parent) == source
    shutil.move(light.parent, light.parent.parent / "moved-away")
    assert _node_files(dst) == {os.path.basename(result.weights_files[0])}
    _assert_computes(dst, expected)
    found = verify_models(light.parent.parent / "moved-away" / "light.onnx", dst)
    assert found.equal and found.tensors == 2 and found.bytes_compared == sum(a.nbytes for a in ARRAYS.values())
    if weights_format == "safetensors":  # the nodes' keys are their outputs: the kernel's header check holds
        with st_numpy.safe_open(result.weights_files[0], "np") as opened:  # type: ignore[attr-defined]
            assert sorted(opened.keys()) == ["a", "b"]


def test_align_models_relocates_a_member_read_through_delayed_nodes_and_stores_shared_bytes_once(light: Path) -> None:
    out = light.parent.parent / "out"
    result = align_models([light.parent / "model.onnx", light], out)
    shutil.move(light.parent, light.parent.parent / "moved-away")
    assert _node_files(out / "light.onnx") == {"weights.data"}
    _assert_computes(out / "light.onnx", [ARRAYS["a"], ARRAYS["b"]])
    # The member with initializers and the member with nodes hold the same bytes: stored once.
    assert result.unique_bytes == sum(a.nbytes for a in ARRAYS.values())
    found = verify_models(out / "model.onnx", out / "light.onnx", by_name=False)
    assert not found.equal  # initializers against nodes: other kinds of tensors, said so
    assert verify_models(light.parent.parent / "moved-away" / "light.onnx", out / "light.onnx").equal


def test_link_copies_what_the_nodes_read_into_its_own_weights(light: Path) -> None:
    out = light.parent.parent / "out"
    st_numpy.save_file({"unrelated": np.zeros(4, np.float32)}, str(out / "ck.safetensors"))
    result = link_external_data(light, out / "ck.safetensors", out / "light.onnx", alignment=64)
    shutil.move(light.parent, light.parent.parent / "moved-away")
    assert result.written_tensors == 2 and _node_files(out / "light.onnx") == {"light.onnx.data"}
    _assert_computes(out / "light.onnx", [ARRAYS["a"], ARRAYS["b"]])


def test_the_shared_saver_keeps_nodes_that_read_a_file_of_the_destination(light: Path) -> None:
    variant = onnx.load(str(light), load_external_data=False)
    result = save_model_with_shared_external_data(variant, light.parent / "variant.onnx")
    assert result.reused_tensors == 2 and result == 0
    _assert_computes(light.parent / "variant.onnx", [ARRAYS["a"], ARRAYS["b"]])


def test_the_shared_saver_refuses_a_variant_whose_nodes_read_a_file_it_cannot_reach(light: Path) -> None:
    out = light.parent.parent / "out"
    variant = onnx.load(str(light), load_external_data=False)
    before = sha256_of_tree(light.parent.parent)
    with pytest.raises(DanglingReferenceError, match=r"'a' would read a file that does not resolve from .*out"):
        save_model_with_shared_external_data(variant, out / "variant.onnx")
    assert sha256_of_tree(light.parent.parent) == before and not list(out.iterdir())


def test_a_node_whose_bytes_cannot_be_located_is_refused_naming_it(light: Path) -> None:
    model = onnx.load(str(light), load_external_data=False)
    for attribute in model.graph.node[0].attribute:
        if attribute.name == "shape":
            attribute.ints[:] = [-1]
    onnx.save(model, light.parent / "broken.onnx")
    before = sha256_of_tree(light.parent.parent)
    with pytest.raises(ExternalDataError, match=r"node .a. .* cannot be located; nothing was written"):
        align_external_data_streaming(light.parent / "broken.onnx", light.parent.parent / "out" / "m.onnx")
    assert sha256_of_tree(light.parent.parent) == before and temp_files_under(light.parent.parent) == []


def test_verify_compares_what_the_nodes_read(light: Path) -> None:
    other = light.parent.parent / "other"
    other.mkdir()
    write_external_model(other, {"a": ARRAYS["a"], "b": ARRAYS["b"] + 1})
    onnx.save(delay_initializers(other / "model.onnx"), other / "light.onnx")
    found = verify_models(light, other / "light.onnx")
    assert not found.equal and found.tensors == 1
    assert found.differences[0].kind == "bytes" and found.differences[0].a.kind == "delayed_initializer"
    assert "'b' (delayed initializer in graph" in str(found.first_difference)
