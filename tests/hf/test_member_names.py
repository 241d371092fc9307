"""``align-models a/model.onnx=NAME ...``: every exporter writes ``model.onnx``; members are named, not copied."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnx_light_ref import align_models, verify_models
from onnx_light_ref.errors import DestinationConflictError
from tests.checks import sha256_of_tree
from tests.cli_runner import run_cli
from tests.hf.fixtures import copy_fixture, run_ort


def test_two_model_onnx_become_two_named_members_over_one_weights_file(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    out = tmp_path / "family"
    done = run_cli(
        "align-models", f"{folder / 'dynamo' / 'model.onnx'}=decoder_model.onnx",
        f"{folder / 'dynamo_optimized' / 'model.onnx'}=decoder_optimized.onnx", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in out.iterdir()) == [
        "decoder_model.onnx",
        "decoder_optimized.onnx",
        "weights.data",
    ]
    for source, member in (("dynamo", "decoder_model.onnx"), ("dynamo_optimized", "decoder_optimized.onnx")):
        assert verify_models(folder / source / "model.onnx", out / member).equal
    assert [a.tolist() for a in run_ort(out / "decoder_model.onnx")] == [
        a.tolist() for a in run_ort(folder / "dynamo" / "model.onnx")
    ]


def test_python_takes_pairs_and_mappings(tmp_path: Path) -> None:
    folder = copy_fixture("bert", tmp_path)
    sources = {folder / "dynamo" / "model.onnx": "encoder.onnx", folder / "dynamo_optimized" / "model.onnx": "opt.onnx"}
    (tmp_path / "out").mkdir()
    result = align_models(sources, tmp_path / "out", durable=False)
    assert sorted(Path(member.path).name for member in result.members) == ["encoder.onnx", "opt.onnx"]
    again = align_models(list(sources.items()), tmp_path / "out", durable=False)
    assert sorted(Path(member.path).name for member in again.members) == ["encoder.onnx", "opt.onnx"]


def test_two_sources_of_one_name_are_refused_with_the_way_to_name_them(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    (tmp_path / "out").mkdir()
    before = sha256_of_tree(tmp_path)
    with pytest.raises(DestinationConflictError, match=r"name the members: align-models a/model.onnx=decoder_model"):
        align_models([folder / "dynamo" / "model.onnx", folder / "legacy" / "model.onnx"], tmp_path / "out")
    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("name", ["", "..", "sub/model.onnx"])
def test_a_name_that_is_not_a_plain_file_name_is_refused(tmp_path: Path, name: str) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    (tmp_path / "out").mkdir()
    before = sha256_of_tree(tmp_path)
    with pytest.raises(ValueError, match="is not a plain file name"):
        align_models([(folder / "dynamo" / "model.onnx", name)], tmp_path / "out")
    assert sha256_of_tree(tmp_path) == before
