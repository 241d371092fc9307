"""``link --map``: a name map that does not say what its author meant is refused before anything is written.

Before this rule, a map sending two model tensors to one checkpoint key, or naming a tensor the model does not have
(a typo: the tensor it meant was then linked by its own name), linked silently and the model computed other
outputs; a map file repeating a name kept the last one; a deeply nested one raised a bare ``RecursionError``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as st_numpy

from onnx_light_ref import link_external_data, verify_models
from onnx_light_ref.io._arguments import ArgumentTypeError
from onnx_light_ref.io._plan.name_map import MAX_NAME_MAP_SIZE, parse_name_map
from tests.checks import assert_no_temp_files, run_onnxruntime, sha256_of_tree
from tests.cli_runner import run_cli
from tests.models import make_external_model

A = np.arange(4, dtype=np.float32)
B = np.arange(4, dtype=np.float32) * -10
OTHER = np.full(4, 99, dtype=np.float32)


def _setup(folder: Path, checkpoint: dict[str, np.ndarray]) -> Path:
    """A model of two float32 [4] tensors 'a' and 'b' (Identity to its outputs), and a checkpoint next to it."""
    src = make_external_model(folder, {"a": A, "b": B}, name="src.onnx")
    st_numpy.save_file(checkpoint, str(folder / "ckpt.safetensors"))
    return src


def _cli(folder: Path, src: Path, name_map: bytes) -> subprocess.CompletedProcess[str]:
    (folder / "names.json").write_bytes(name_map)
    return run_cli("link", str(src), str(folder / "ckpt.safetensors"), str(folder / "linked.onnx"), "--map",
                   str(folder / "names.json"), "--no-progress")  # fmt: skip


REFUSED = {
    # Both tensors would read A: 'b' would compute with 'a''s weights.
    "two tensors mapped to one key": ({"k": A}, {"a": "k", "b": "k"}, "checkpoint key 'k' would be read by 2"),
    "a mapped tensor and one by its own name": ({"b": A}, {"a": "b"}, "'a' (mapped), 'b' (by its own name)"),
    # The typo 'A': tensor 'a' was linked to the checkpoint's own 'a' (OTHER), not to 'k' as meant.
    "a name the model lacks": ({"a": OTHER, "k": A}, {"A": "k"}, "'A' names no tensor of the model"),
    "a key the checkpoint lacks": ({"a": A}, {"b": "missing"}, "'b' -> 'missing': the checkpoint has no key"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_map_that_does_not_fit_is_refused_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    checkpoint, name_map, message = REFUSED[case]
    src = _setup(tmp_path, checkpoint)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(ValueError, match="the name map does not fit the model and the checkpoint") as info:
        link_external_data(src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", name_map=name_map)
    assert not isinstance(info.value, ArgumentTypeError)
    assert message in str(info.value) and str(info.value).endswith("Nothing written.")
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)

    out = _cli(tmp_path, src, json.dumps(name_map).encode())
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("error: the name map does not fit") and message in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "linked.onnx").exists() and not (tmp_path / "linked.onnx.data").exists()
    assert_no_temp_files(tmp_path)


def test_every_problem_of_a_map_is_listed_in_one_message(tmp_path: Path) -> None:
    src = _setup(tmp_path, {"k": A})
    with pytest.raises(ValueError) as info:
        link_external_data(
            src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", name_map={"a": "k", "b": "k", "c": "k"}
        )
    message = str(info.value)
    assert "'c' names no tensor of the model" in message and "checkpoint key 'k' would be read by 2" in message


def test_a_map_that_swaps_two_names_is_refused_since_every_reader_would_refuse_the_linked_model(
    tmp_path: Path,
) -> None:
    """``{"a": "b", "b": "a"}`` over a checkpoint holding both keys: tensor 'a' would read key 'b' while key 'a'
    exists, what a checkpoint re-saved with its tensors moved looks like; every reader refuses such a reference
    (``SafetensorsReferenceError``), so ``link`` refuses the map instead of writing that model."""
    src = _setup(tmp_path, {"a": B, "b": A})  # the checkpoint calls them the other way round
    before = sha256_of_tree(tmp_path)
    with pytest.raises(ValueError, match="the name map does not fit the model and the checkpoint") as info:
        link_external_data(src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", name_map={"a": "b", "b": "a"})
    message = str(info.value)
    assert "'a' -> 'b': the checkpoint also has a key 'a'" in message
    assert "'b' -> 'a': the checkpoint also has a key 'b'" in message
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_a_map_onto_keys_no_tensor_is_named_after_links_each_tensor_to_its_own_bytes(tmp_path: Path) -> None:
    src = _setup(tmp_path, {"layers.0": B, "layers.1": A})
    result = link_external_data(
        src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", name_map={"a": "layers.1", "b": "layers.0"}
    )
    assert result.linked_tensors == 2 and result.written_tensors == 0
    out_a, out_b = run_onnxruntime(tmp_path / "linked.onnx", {})
    np.testing.assert_array_equal(out_a, A)
    np.testing.assert_array_equal(out_b, B)
    assert verify_models(src, tmp_path / "linked.onnx").equal


MAP_FILES = {
    "repeated name": (b'{"a": "k", "a": "j"}', "repeats the model tensor name 'a'"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "deep nesting in a value": (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    "not an object": (b'["a", "k"]', "must be one JSON object"),
    "a value that is no string": (b'{"a": 1}', "must be one JSON object"),
    "an empty key": (b'{"a": ""}', "(non-empty strings)"),
    "not UTF-8": (b'{"a": "\xff"}', "is not UTF-8 JSON"),
    "not JSON": (b'{"a": "k",}', "is not UTF-8 JSON"),
}


@pytest.mark.parametrize("case", sorted(MAP_FILES))
def test_a_malformed_map_file_is_one_error_line_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    text, message = MAP_FILES[case]
    src = _setup(tmp_path, {"k": A})
    with pytest.raises(ValueError, match=r"--map 'names\.json'") as info:
        parse_name_map(text, "--map 'names.json'")
    assert message in str(info.value)
    (tmp_path / "names.json").write_bytes(text)
    before = sha256_of_tree(tmp_path)
    out = _cli(tmp_path, src, text)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("error: --map ") and message in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert sha256_of_tree(tmp_path) == before
    assert not (tmp_path / "linked.onnx").exists()


def test_a_map_file_above_the_size_cap_is_refused_without_being_parsed() -> None:
    with pytest.raises(ValueError, match=f"larger than {MAX_NAME_MAP_SIZE} bytes"):
        parse_name_map(b" " * (MAX_NAME_MAP_SIZE + 1), "--map 'big.json'")


def test_a_map_of_the_wrong_type_is_an_argument_type_error(tmp_path: Path) -> None:
    src = _setup(tmp_path, {"k": A})
    before = sha256_of_tree(tmp_path)
    with pytest.raises(ArgumentTypeError, match="name_map must map model tensor names"):
        link_external_data(src, tmp_path / "ckpt.safetensors", tmp_path / "linked.onnx", name_map={"a": 1})  # type: ignore[dict-item]
    assert sha256_of_tree(tmp_path) == before
