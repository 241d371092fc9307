"""``onnx-light-ref align``: what a user types, what they see, and the files they get."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref._cli import main
from onnx_light_ref._commands.sizes import parse_size, size_argument


@pytest.mark.parametrize(
    ("text", "size"),
    [("7", 7), ("4096", 4096), ("64K", 65536), ("64k", 65536), ("4M", 4194304), ("4MiB", 4194304), ("1G", 2**30)],
)
def test_sizes_accept_binary_suffixes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "4X", "-1", "1.5M", "M", "\u0664K", "4\u0660\u0669\u0666", "\uff14M"])
def test_invalid_sizes_are_usage_errors(text):
    # Also digits that are not ASCII (Arabic-Indic, fullwidth), which ``\d`` and ``int()`` take.
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        size_argument(text)
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_align_writes_the_aligned_pair_and_prints_one_summary_line(
    tmp_path, make_external_model, reference_tensors, capsys
):
    src = make_external_model(tmp_path, reference_tensors())
    dst = tmp_path / "out.onnx"

    status = main(["align", str(src), str(dst), "--alignment", "64", "--chunk-size", "7"])

    assert status == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "3 tensors, 196 bytes written (88 padding)" in out
    assert "MiB/s" in out
    assert (tmp_path / "out.onnx.data").stat().st_size == 196
    loaded = onnx.load_model(str(dst))
    for tensor in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), reference_tensors()[tensor.name])


def test_weights_path_and_size_suffixes(tmp_path, make_external_model, reference_tensors, capsys):
    src = make_external_model(tmp_path, reference_tensors())
    (tmp_path / "sub").mkdir()

    status = main(["align", str(src), str(src), "--weights", str(tmp_path / "sub" / "w.bin"), "--alignment", "64K"])

    assert status == 0
    model = onnx.load_model(str(src), load_external_data=False)
    assert [(t.external_data[0].value, t.external_data[1].value) for t in model.graph.initializer] == [
        ("sub/w.bin", "0"),
        ("sub/w.bin", "65536"),
        ("sub/w.bin", "131072"),
    ]
    assert "sub/w.bin: 3 tensors" in capsys.readouterr().out


def test_a_model_without_external_tensors_is_reported(tmp_path, build_identity_model, capsys):
    src = tmp_path / "inline.onnx"
    onnx.save_model(build_identity_model({"w": np.ones(2, dtype=np.float32)}), str(src))

    assert main(["align", str(src), str(tmp_path / "out.onnx")]) == 0

    assert "no external tensor" in capsys.readouterr().out
    assert not (tmp_path / "out.onnx.data").exists()


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--weights", "SRC_WEIGHTS"], "is the source file"),
        (["--weights", "OUTSIDE"], "outside the destination model"),
    ],
)
def test_library_errors_print_one_line_and_exit_1(
    tmp_path, make_external_model, reference_tensors, sha256_of_tree, capsys, extra, fragment
):
    folder = tmp_path / "model"
    folder.mkdir()
    src = make_external_model(folder, reference_tensors())
    substitutions = {"SRC_WEIGHTS": str(folder / "model.onnx.data"), "OUTSIDE": str(tmp_path / "w.bin")}
    extra = [substitutions.get(arg, arg) for arg in extra]
    before = sha256_of_tree(tmp_path)

    status = main(["align", str(src), str(folder / "out.onnx"), *extra])

    assert status == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ")
    assert captured.err.count("\n") == 1
    assert fragment in captured.err
    assert "Traceback" not in captured.err
    assert sha256_of_tree(tmp_path) == before


def test_a_missing_source_is_one_error_line(tmp_path, capsys):
    assert main(["align", str(tmp_path / "nope.onnx"), str(tmp_path / "out.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ONNX model file not found")
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_size_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["align", "a.onnx", "b.onnx", "--chunk-size", "4X"])
    assert raised.value.code == 2
    assert "invalid size '4X'" in capsys.readouterr().err


def test_the_installed_command_exits_1_without_traceback(tmp_path, make_external_model, reference_tensors):
    src = make_external_model(tmp_path, reference_tensors())

    done = subprocess.run(
        [sys.executable, "-m", "onnx_light_ref", "align", str(src), str(src)],  # default weights = the source's
        capture_output=True,
        text=True,
        check=False,
    )

    assert done.returncode == 1
    assert done.stderr.startswith("error: ")
    assert "Traceback" not in done.stderr
    assert "is the source file" in done.stderr


def test_the_progress_bar_follows_the_bytes_to_the_total(
    tmp_path, make_external_model, reference_tensors, monkeypatch, capsys
):
    """On a terminal the bar is shown; here it is forced on, as if stderr were one."""
    import tqdm

    import onnx_light_ref._commands.progress as command

    bars = []

    class RecordedBar(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(tqdm, "tqdm", RecordedBar)
    monkeypatch.setattr(command, "_is_terminal", lambda stream: True)
    src = make_external_model(tmp_path, reference_tensors())

    assert main(["align", str(src), str(tmp_path / "out.onnx"), "--chunk-size", "5"]) == 0

    (bar,) = bars
    assert (bar.n, bar.total) == (108, 108)
    assert "108/108" in capsys.readouterr().err


def test_missing_destination_folders_are_created(tmp_path, make_external_model, reference_tensors, capsys):
    src = make_external_model(tmp_path, reference_tensors())
    dst = tmp_path / "new" / "deeper" / "out.onnx"
    weights = tmp_path / "new" / "deeper" / "weights" / "w.bin"

    status = main(["align", str(src), str(dst), "--weights", str(weights), "--alignment", "64"])

    assert status == 0, capsys.readouterr().err
    assert weights.stat().st_size == 196
    loaded = onnx.load_model(str(dst))
    for tensor in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), reference_tensors()[tensor.name])


def test_folders_created_for_a_failed_run_are_removed(tmp_path, make_external_model, reference_tensors, capsys):
    src = make_external_model(tmp_path, reference_tensors())
    before = sorted(p.name for p in tmp_path.iterdir())

    status = main(
        ["align", str(src), str(tmp_path / "new" / "out.onnx"), "--weights", str(tmp_path / "model.onnx.data")]
    )

    assert status == 1
    assert "is outside the destination model's folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_destination_folder_that_is_a_file_is_one_error_line(
    tmp_path, make_external_model, reference_tensors, capsys
):
    src = make_external_model(tmp_path, reference_tensors())
    (tmp_path / "blocker").write_bytes(b"not a folder")

    status = main(["align", str(src), str(tmp_path / "blocker" / "sub" / "out.onnx")])

    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert (tmp_path / "blocker").read_bytes() == b"not a folder"


def test_no_fsync_writes_the_same_files_without_any_fsync(
    tmp_path, make_external_model, reference_tensors, monkeypatch, capsys
):
    src = make_external_model(tmp_path, reference_tensors())
    assert main(["align", str(src), str(tmp_path / "durable" / "out.onnx"), "--alignment", "64"]) == 0
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)

    status = main(["align", str(src), str(tmp_path / "fast" / "out.onnx"), "--alignment", "64", "--no-fsync"])

    assert status == 0
    assert synced == []
    for name in ("out.onnx", "out.onnx.data"):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "durable" / name).read_bytes()
    assert "3 tensors, 196 bytes written (88 padding)" in capsys.readouterr().out


def test_layout_options_with_size_suffixes(tmp_path, build_identity_model, capsys):
    from onnx_light_ref.io._verify import verify_models

    big = np.arange(3000, dtype=np.float32)  # 12,000 bytes
    tensors = {"a": big, "a_copy": big.copy(), "b": np.arange(5000, dtype=np.float32), "tiny": np.ones(3, np.int64)}
    src = tmp_path / "src.onnx"
    onnx.save_model(build_identity_model(tensors), str(src))  # every tensor inline
    dst = tmp_path / "out" / "model.onnx"

    status = main(
        [
            "align",
            str(src),
            str(dst),
            "--align-threshold",
            "1K",
            "--max-shard-size",
            "16K",
            "--dedup",
            "--size-threshold",
            "1K",
            "--no-progress",
        ]
    )

    assert status == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 2  # the summary, and the note on the file over the cap (issue 41)
    assert out.splitlines()[1] == (
        "note: 1 file(s) hold a single tensor larger than --max-shard-size 16384 (a tensor is never split): "
        "model.onnx.data.1 (20000 bytes)"
    )
    assert "(+1 shards: 2 files)" in out
    assert "3 tensors (3 moved out of the .onnx, 1 deduplicated: 12000 bytes saved)," in out  # no nested parentheses
    assert sorted(p.name for p in dst.parent.iterdir()) == ["model.onnx", "model.onnx.data", "model.onnx.data.1"]
    # a (12,000 bytes) fits the cap; b (20,000 bytes) is larger, so it gets a file of its own; tiny stays inline
    assert (dst.parent / "model.onnx.data").stat().st_size == 12000
    assert (dst.parent / "model.onnx.data.1").stat().st_size == 20000
    assert verify_models(src, dst).equal


def test_align_names_the_shards_an_earlier_run_left_and_keeps_them(tmp_path, build_identity_model, capsys):
    from onnx_light_ref.io._verify import verify_models

    tensors = {f"t{i}": np.full(1000, i, dtype=np.float32) for i in range(3)}  # 4000 bytes each
    src = tmp_path / "src.onnx"
    onnx.save_model(build_identity_model(tensors), str(src))
    dst = tmp_path / "out" / "model.onnx"
    common = [str(src), str(dst), "--alignment", "0", "--size-threshold", "1K", "--no-progress", "--no-fsync"]
    assert main(["align", *common, "--max-shard-size", "4000"]) == 0
    assert "note:" not in capsys.readouterr().out
    left = (dst.parent / "model.onnx.data.2").read_bytes()

    status = main(["align", *common, "--max-shard-size", "8000"])  # two shards now: W and W.1

    assert status == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 2 and "(+1 shards: 2 files)" in lines[0]
    stale = str(dst.parent / "model.onnx.data.2")
    assert lines[1] == (
        f"note: 1 file(s) left by an earlier run here are not used by what was written and were not deleted: "
        f"{stale} (--delete-stale removes those no other model uses)"
    )
    assert (dst.parent / "model.onnx.data.2").read_bytes() == left
    assert {
        e.value
        for t in onnx.load_model(str(dst), load_external_data=False).graph.initializer
        for e in t.external_data
        if e.key == "location"
    } == {"model.onnx.data", "model.onnx.data.1"}
    assert verify_models(src, dst).equal


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--max-shard-size", "0", "argument --max-shard-size: max_shard_size must be >= 1, got 0."),
        ("--max-shard-size", "1.5G", "invalid size"),
        ("--alignment", "3", "argument --alignment: alignment must be a power of two (or 0/1 for packed), got 3."),
        ("--chunk-size", "0", "argument --chunk-size: chunk_size must be >= 1, got 0."),
    ],
)
def test_bad_option_values_are_usage_errors(
    tmp_path, make_external_model, reference_tensors, capsys, option, value, fragment
):
    src = make_external_model(tmp_path, reference_tensors())
    before = sorted(p.name for p in tmp_path.iterdir())

    with pytest.raises(SystemExit) as done:
        main(["align", str(src), str(tmp_path / "new" / "out.onnx"), option, value])

    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: onnx-light-ref align") and fragment in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
