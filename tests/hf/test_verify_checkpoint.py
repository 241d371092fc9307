"""``verify_checkpoint`` / ``verify MODEL.onnx CHECKPOINT`` on real exports: what a model holds of its checkpoint."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from onnx_light_ref import link_external_data, verify_checkpoint
from tests.checks import sha256_of_tree
from tests.cli_runner import run_cli
from tests.hf.fixtures import CHECKPOINTS, FIXTURES, copy_fixture

# (model, export) -> (holds, how many keys by each way, missing keys)
EXPECTED = {
    ("llama", "dynamo"): (True, {"name": 21}, ()),
    ("llama", "dynamo_optimized"): (True, {"transpose": 15, "content": 4, "name": 2}, ()),
    ("llama", "legacy"): (True, {"transpose": 15, "content": 4, "name": 2}, ()),
    ("qwen2", "dynamo"): (True, {"name": 25, "content": 1}, ()),
    ("bert", "dynamo"): (True, {"name": 37}, ()),
    # torch's optimizer folded the position embedding into a slice of it: the model lacks the whole table
    ("bert", "dynamo_optimized"): (
        False,
        {"content": 19, "transpose": 12, "name": 5},
        ("embeddings.position_embeddings.weight",),
    ),
}


@pytest.mark.parametrize(("model", "export"), sorted(EXPECTED))
def test_an_export_holds_its_checkpoint_by_name_content_or_transpose(model: str, export: str) -> None:
    before = sha256_of_tree(FIXTURES / model)
    result = verify_checkpoint(FIXTURES / model / export / "model.onnx", FIXTURES / model / "checkpoint")
    holds, ways, missing = EXPECTED[model, export]
    assert (result.holds, dict(Counter(p.how for p in result.pairings)), result.missing_keys) == (holds, ways, missing)
    assert result.differing == ()
    assert sha256_of_tree(FIXTURES / model) == before


def test_a_linked_transposed_export_still_holds_the_checkpoint(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    linked = folder / "checkpoint" / "linked.onnx"
    link_external_data(
        folder / "dynamo_optimized" / "model.onnx", folder / CHECKPOINTS["qwen2"], linked, map_by_content=True,
        transpose=True, durable=False,
    )  # fmt: skip
    result = verify_checkpoint(linked, folder / "checkpoint" / "model.safetensors")
    assert result.holds and result.checkpoint_keys == 26


def test_a_changed_weight_is_reported_different_and_the_status_is_1(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    data = folder / "dynamo" / "model.onnx.data"
    payload = bytearray(data.read_bytes())
    payload[20480] ^= 0x01  # the first byte of model.layers.0.self_attn.k_proj.weight
    data.write_bytes(bytes(payload))
    done = run_cli("verify", str(folder / "dynamo" / "model.onnx"), str(folder / "checkpoint"))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "different: model tensor 'model.layers.0.self_attn.k_proj.weight' and checkpoint key "
        "'model.layers.0.self_attn.k_proj.weight' have the same name, data type and shape but other bytes",
        "extra: model weight 'model.rotary_emb.inv_freq' is not in the checkpoint",
        "incomplete: the model lacks 1 of the 21 checkpoint tensors",
    ]


def test_a_folder_with_two_checkpoints_is_refused_naming_them(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    (folder / "checkpoint" / "other.safetensors").write_bytes((folder / CHECKPOINTS["qwen2"]).read_bytes())
    done = run_cli("verify", str(folder / "dynamo" / "model.onnx"), str(folder / "checkpoint"))
    assert done.returncode == 1 and done.stdout == ""
    assert "holds several checkpoints (model.safetensors, other.safetensors); name the file" in done.stderr


def test_options_that_compare_two_models_are_refused_with_a_checkpoint() -> None:
    done = run_cli("verify", "--by-name", str(FIXTURES / "bert/dynamo/model.onnx"), str(FIXTURES / "bert/checkpoint"))
    assert done.returncode == 1
    assert "error: --by-name compares two models; it does not apply to a checkpoint" in done.stderr
