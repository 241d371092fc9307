"""``onnx-light-ref align-models SRC.onnx... --out DIR``: the family through the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import verify_models
from onnx_light_ref._cli import main
from tests.checks import assert_no_temp_files
from tests.family.family_models import outputs_of, write_family

DECODER, WITH_PAST = "decoder_model.onnx", "decoder_with_past_model.onnx"


def test_the_command_creates_the_folder_and_prints_one_line_per_member_and_one_for_the_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    family = write_family(tmp_path / "exports")
    out = tmp_path / "new" / "family"

    assert main(["align-models", *map(str, family.sources), "--out", str(out), "--no-progress", "--no-fsync"]) == 0

    lines = capsys.readouterr().out.splitlines()
    # Tensors per member (which of them are on bytes another member uses), distinct payloads for the family.
    assert lines[0] == f"{out / DECODER}: 6 tensors, 5 on bytes another member uses"
    assert lines[1] == f"{out / WITH_PAST}: 6 tensors, 5 on bytes another member uses"
    assert lines[2].startswith(f"{out / 'weights.data'}: 2 members, 12 tensors, 28672 bytes written (24576 unique")
    assert "16384 bytes saved against separate copies (5 distinct payloads used by several members)" in lines[2]
    for source in family.sources:
        onnx.checker.check_model(str(out / source.name), full_check=True)
        np.testing.assert_array_equal(outputs_of(out / source.name)[0], outputs_of(source)[0])
        assert verify_models(source, out / source.name).equal
    assert_no_temp_files(out)


@pytest.mark.parametrize(
    ("options", "files"),
    [
        (["--weights", "blobs/shared.bin"], ["blobs/shared.bin"]),
        (["--max-shard-size", "8K", "--shard-names", "hf"], [f"weights-0000{i}-of-00004.data" for i in range(1, 5)]),
        (  # the cap counts each file's 4 KiB header (padded to the alignment): 8 KiB of tensors per file
            ["--format", "safetensors", "--max-shard-size", "12K"],
            [*(f"model-0000{i}-of-00003.safetensors" for i in range(1, 4)), "model.safetensors.index.json"],
        ),
        (["--alignment", "64K", "--align-threshold", "4K", "--chunk-size", "1K"], ["weights.data"]),
    ],
    ids=["weights-in-a-subfolder", "hf-shards", "safetensors-shards", "alignment-options"],
)
def test_the_aligners_options_apply(tmp_path: Path, options: list[str], files: list[str]) -> None:
    family = write_family(tmp_path / "exports")
    out = tmp_path / "family"

    assert main(["align-models", *map(str, family.sources), "--out", str(out), "--no-progress", *options]) == 0

    written = sorted(
        os.path.relpath(os.path.join(root, name), out) for root, _, names in os.walk(out) for name in names
    )
    assert written == sorted([DECODER, WITH_PAST, *files])
    for source in family.sources:
        assert verify_models(source, out / source.name).equal
        np.testing.assert_array_equal(outputs_of(out / source.name)[0], outputs_of(source)[0])


def test_overwrite_and_a_rerun_replace_the_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = write_family(tmp_path / "old", seed=1), write_family(tmp_path / "new", seed=2)
    out = tmp_path / "family"
    out.mkdir()
    (out / "weights.data").write_bytes(b"not a family file")
    base = ["align-models", "--out", str(out), "--no-progress"]

    assert main([*base, *map(str, old.sources)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main([*base, *map(str, old.sources), "--overwrite"]) == 0
    assert main([*base, *map(str, new.sources), "--alignment", "256"]) == 0  # the family's own file: no --overwrite

    for source in new.sources:
        np.testing.assert_array_equal(outputs_of(out / source.name)[0], outputs_of(source)[0])
    assert sorted(p.name for p in out.iterdir()) == [DECODER, WITH_PAST, "weights.data"]


def test_a_note_names_the_file_no_model_uses_any_more(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    family = write_family(tmp_path / "exports")
    out = tmp_path / "family"
    argv = ["align-models", *map(str, family.sources), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()

    assert main([*argv, "--weights", "v2.data"]) == 0

    note = capsys.readouterr().out.splitlines()[-1]
    assert (
        note.startswith("note: 1 file(s) left by an earlier run here are not used by what was written")
        and "weights.data" in note
    )
    assert (out / "weights.data").exists()


def test_the_help_names_its_arguments_like_the_other_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as done:
        patch.setenv("COLUMNS", "1000")
        main(["align-models", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "align-models [-h] --out DIR [--weights NAME] [--alignment N]" in text
        and "SRC.onnx[=NAME] [SRC.onnx[=NAME] ...]" in text
    )
    assert "(default: 4096)" in text and "--no-progress" in text and "--overwrite" in text
    assert text.endswith(
        "exit status: 0 every member and the weights files are written; 1 refused: one 'error: ...' line on stderr, "
        "nothing written; 2 bad arguments (the usage is printed); 3 written, but a step after the commit failed (one "
        "'error: DST is published ..., but ...' line: the fsync that makes it durable, or removing the previous "
        "versions); 70 a bug in onnx-light-ref (one 'error: ...' line asking to report it; --debug prints the "
        "traceback); 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM (temp files and folders the command created "
        "are removed)."
    )


def test_missing_arguments_exit_2_with_the_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["align-models", "a.onnx"], ["align-models", "--out", str(tmp_path)]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
        assert capsys.readouterr().err.startswith("usage: onnx-light-ref align-models")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--alignment", "3", "alignment"),
        ("--alignment", "2G", "alignment"),
        ("--max-shard-size", "0", "max_shard_size must be >= 1, got 0."),
        ("--chunk-size", "0", "chunk_size must be >= 1, got 0."),
    ],
)
def test_a_value_the_library_refuses_is_a_usage_error_in_its_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, words: str
) -> None:
    """As for align: exit 2 with the usage, before anything is read or a folder created."""
    with pytest.raises(SystemExit) as done:
        main(["align-models", "a.onnx", "--out", str(tmp_path / "family"), option, value])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: onnx-light-ref align-models") and words in err and option in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_console_script_runs_the_command(tmp_path: Path) -> None:
    family = write_family(tmp_path / "exports")
    out = tmp_path / "family"
    command = [sys.executable, "-m", "onnx_light_ref", "align-models", *map(str, family.sources), "--out", str(out)]

    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)

    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 3 and (out / "weights.data").is_file()
