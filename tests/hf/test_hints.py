"""The notes that say what would help, once per run: inline-only sources, files over ``--max-shard-size``."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli_runner import run_cli
from tests.hf.fixtures import copy_fixture


def _align(source: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    done = run_cli("align", str(source), str(out / "model.onnx"), *options, "--no-progress")
    assert done.returncode == 0, done.stderr
    return done


def test_an_inline_export_is_told_what_size_threshold_would_move(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    done = _align(folder / "legacy" / "model.onnx", tmp_path / "out", "--max-shard-size", "64K")
    lines = done.stdout.splitlines()
    assert lines[0].endswith("no external tensor, nothing to align (model written, no weights file).")
    assert lines[1] == (
        "note: every tensor of the source is inline in the .onnx, so the options that act on external weights "
        "(--max-shard-size, --format, --dedup, --alignment) had nothing to act on: --size-threshold 1K would move 16 "
        "tensor(s), 106496 bytes; --size-threshold 64K would move 0 tensor(s), 0 bytes; --size-threshold 1M would "
        "move 0 tensor(s), 0 bytes"
    )
    family = run_cli("align-models", str(folder / "legacy" / "model.onnx"), "--out", str(tmp_path / "family"))
    assert family.returncode == 0 and "--size-threshold 1K would move 16 tensor(s)" in family.stdout


def test_files_over_the_shard_cap_are_counted_once(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    done = _align(folder / "dynamo" / "model.onnx", tmp_path / "out", "--max-shard-size", "10K")
    notes = [line for line in done.stdout.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: 2 file(s) hold a single tensor larger than --max-shard-size 10240 (a tensor is never split): "
        "model.onnx.data.9 (16384 bytes), model.onnx.data (16384 bytes)"
    ]


def test_transformers_js_is_given_the_exact_use_external_data_format(tmp_path: Path) -> None:
    folder = copy_fixture("llama", tmp_path)
    done = _align(
        folder / "dynamo" / "model.onnx",
        tmp_path / "out",
        "--max-shard-size",
        "40K",
        "--shard-names",
        "transformers.js",
    )
    files = sorted(path.name for path in (tmp_path / "out").iterdir() if path.name != "model.onnx")
    assert files == ["model.onnx_data", "model.onnx_data_1", "model.onnx_data_2"]
    assert (
        'note: transformers.js: set "use_external_data_format": {"model.onnx": 3} in config.json\'s '
        '"transformers.js_config" (--update-config config.json writes it)'
    ) in done.stdout.splitlines()
