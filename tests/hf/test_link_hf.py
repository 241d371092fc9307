"""``link`` on real exporters' layouts (``tests/fixtures/hf``): names, content, transposes, the map it writes.

The expected numbers are the fixtures' (``make_fixtures.py``): torch's ``optimize=True`` and the legacy exporter
store every Linear weight pre-transposed under a new name, so a link by name reuses only the embedding; content
pairing adds the tied ``lm_head``; ``transpose=True`` links every weight through a ``Transpose`` node.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from safetensors import safe_open

from onnx_light_ref import link_external_data, verify_models
from tests.checks import sha256_of_tree
from tests.cli_runner import run_cli
from tests.hf.fixtures import CHECKPOINTS, copy_fixture, evaluate, run_ort

PLAIN: dict[str, object] = {}
CONTENT: dict[str, object] = {"map_by_content": True}
TRANSPOSE: dict[str, object] = {"map_by_content": True, "transpose": True}

# (model, export, options) -> (linked tensors, linked bytes, written tensors, written bytes, Transpose nodes added)
CASES = {
    ("llama", "dynamo", "plain"): (16, 106496, 0, 0, 0),
    ("llama", "dynamo_optimized", "plain"): (1, 16384, 15, 90112, 0),
    ("llama", "dynamo_optimized", "transpose"): (16, 106496, 0, 0, 15),
    ("llama", "legacy", "plain"): (1, 16384, 15, 90112, 0),
    ("llama", "legacy", "transpose"): (16, 106496, 0, 0, 15),
    ("qwen2", "dynamo", "plain"): (14, 36864, 1, 8192, 0),
    ("qwen2", "dynamo", "content"): (15, 45056, 0, 0, 0),
    ("qwen2", "dynamo_optimized", "plain"): (0, 0, 16, 53248, 0),
    ("qwen2", "dynamo_optimized", "content"): (1, 8192, 15, 45056, 0),
    ("qwen2", "dynamo_optimized", "transpose"): (15, 45056, 0, 0, 15),
    ("bert", "dynamo", "plain"): (14, 90112, 2, 1024, 0),
    ("bert", "dynamo_optimized", "plain"): (1, 16384, 14, 67072, 0),
    ("bert", "dynamo_optimized", "transpose"): (13, 81920, 2, 1536, 12),
}
OPTIONS = {"plain": PLAIN, "content": CONTENT, "transpose": TRANSPOSE}


@pytest.mark.parametrize(("model", "export", "options"), sorted(CASES))
def test_a_real_export_links_to_its_checkpoint_and_computes_the_same_bits(
    tmp_path: Path, model: str, export: str, options: str
) -> None:
    folder = copy_fixture(model, tmp_path)
    checkpoint = folder / CHECKPOINTS[model]
    source = folder / export / "model.onnx"
    before = sha256_of_tree(folder / "checkpoint")
    dst = folder / "checkpoint" / "linked.onnx"
    result = link_external_data(source, checkpoint, dst, durable=False, **OPTIONS[options])  # type: ignore[arg-type]
    facts = (result.linked_tensors, result.linked_bytes, result.written_tensors, result.written_bytes)
    assert (*facts, len(result.transposed_tensors)) == CASES[model, export, options]
    after = sha256_of_tree(folder / "checkpoint")
    assert {name: after[name] for name in before} == before  # the checkpoint is never written
    onnx.checker.check_model(str(dst), full_check=True)
    onnx.load(str(dst))
    for name in before:
        if name.endswith(".safetensors"):
            with safe_open(str(folder / "checkpoint" / name), framework="numpy") as opened:
                assert list(opened.keys())
    if model != "bert":  # onnx's GatherElements fails on this BERT export ("cannot reshape array of size 1")
        for got, want in zip(evaluate(dst), evaluate(source), strict=True):
            np.testing.assert_array_equal(got, want)  # bit-identical, bfloat16 included
    if model != "qwen2":  # onnxruntime has no bfloat16 Mul: the Qwen2 export does not load there at all
        for got, want in zip(run_ort(dst), run_ort(source), strict=True):
            np.testing.assert_array_equal(got, want)


def test_transposed_weights_become_transpose_nodes_over_the_checkpoint_keys(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    dst = folder / "checkpoint" / "linked.onnx"
    result = link_external_data(
        folder / "dynamo_optimized" / "model.onnx", folder / CHECKPOINTS["qwen2"], dst, **TRANSPOSE
    )
    graph = onnx.load(str(dst), load_external_data=False).graph
    transposes = {node.output[0]: node.input[0] for node in graph.node if node.op_type == "Transpose"}
    pairs = {p.name: p.key for p in result.pairings if p.how == "transpose"}
    assert set(result.transposed_tensors) <= set(transposes)
    assert transposes["val_39"] == "model.layers.0.self_attn.q_proj.weight" == pairs["val_39"]
    # the tied lm_head (pre-transposed val_322) reads the initializer already linked to the embedding
    assert pairs["val_322"] == "model.embed_tokens.weight" and transposes["val_322"] == "lm_head.weight"
    initializers = {init.name: init for init in graph.initializer}
    assert not set(result.transposed_tensors) & set(initializers)
    q_proj = {e.key: e.value for e in initializers["model.layers.0.self_attn.q_proj.weight"].external_data}
    assert q_proj["location"] == "model.safetensors"


def test_without_compare_link_names_the_pre_transposed_weights_and_the_fix(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    done = run_cli(
        "link", str(folder / "dynamo_optimized" / "model.onnx"), str(folder / CHECKPOINTS["llama"]),
        str(folder / "checkpoint" / "linked.onnx"), "--no-progress", "--no-fsync",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "note: 15 tensor(s) have the swapped dims of a checkpoint key" in done.stdout
    assert "export with optimize=False" in done.stdout and "--transpose" in done.stdout
    assert "keep the checkpoint's offsets, which are not multiples of --alignment 4096" in done.stdout


def test_write_map_writes_the_content_pairing_that_map_then_reads(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    names = tmp_path / "names.json"
    args = [str(folder / "dynamo" / "model.onnx"), str(folder / CHECKPOINTS["qwen2"])]
    done = run_cli("link", *args, str(folder / "checkpoint" / "a.onnx"), "--map-by-content", "--write-map", str(names),
                   "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "  lm_head.weight -> model.embed_tokens.weight (content)" in done.stdout
    assert json.loads(names.read_text()) == {"lm_head.weight": "model.embed_tokens.weight"}
    again = run_cli("link", *args, str(folder / "checkpoint" / "b.onnx"), "--map", str(names), "--no-progress")
    assert again.returncode == 0, again.stderr
    assert "15 tensors linked to the checkpoint (45056 bytes, none copied), 0 written" in again.stdout
    assert verify_models(folder / "checkpoint" / "a.onnx", folder / "checkpoint" / "b.onnx").equal


def test_write_map_over_an_existing_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    folder = copy_fixture("qwen2", tmp_path)
    names = tmp_path / "names.json"
    names.write_text("mine")
    before = sha256_of_tree(tmp_path)
    done = run_cli(
        "link", str(folder / "dynamo" / "model.onnx"), str(folder / CHECKPOINTS["qwen2"]),
        str(folder / "checkpoint" / "a.onnx"), "--map-by-content", "--write-map", str(names), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 1
    assert "error: link --write-map: output file" in done.stderr and "exists" in done.stderr
    assert sha256_of_tree(tmp_path) == before  # no model, no map, nothing else


def test_align_threshold_packs_the_small_written_tensors(tmp_path: Path) -> None:
    folder = copy_fixture("bert", tmp_path)
    source, checkpoint = folder / "dynamo" / "model.onnx", folder / CHECKPOINTS["bert"]
    aligned = link_external_data(source, checkpoint, folder / "checkpoint" / "a.onnx", durable=False)
    packed = link_external_data(
        source, checkpoint, folder / "checkpoint" / "b.onnx", durable=False, align_threshold=1024 * 1024
    )
    assert (int(aligned), int(packed)) == (4608, 1024)  # two 512-byte int64 buffers: padded to 4096, then packed
    assert verify_models(folder / "checkpoint" / "a.onnx", folder / "checkpoint" / "b.onnx").equal
