"""One consistent command line (issue 22): names, help, relative ``--weights``, exit statuses, notes."""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors.numpy import save_file

from onnx_light_ref._cli import EPILOG, build_parser, main
from onnx_light_ref.backend import seed_weights_paths
from tests.checks import snapshot_tree
from tests.models import make_external_model
from tests.test_cli_undelay import delayed_model

WEIGHTS = {"w": np.arange(300, dtype=np.float32), "v": np.ones(700, np.float32)}


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as done:
        patch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens too: "--size-" / "threshold"
        main([command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare words


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ("align", "align [-h] [--weights PATH]"),
        ("undelay", "undelay [-h] [--weights PATH] [--alignment N]"),
        ("inspect", "inspect [-h] [--allow-outside-folder] [--json] MODEL.onnx"),
        ("verify", "A.onnx B.onnx"),
        ("run", "MODEL.onnx"),
        ("generate-tests", "OUTPUT_DIR"),
    ],
)
def test_every_help_names_its_arguments_alike_and_ends_with_its_exit_statuses(command, usage, capsys) -> None:
    text = help_of(command, capsys)
    assert usage in text
    assert "exit status: 0 " in text and " ".join(EPILOG.split()) not in text  # its own statuses, not the list of all
    if command in ("align", "undelay"):
        assert "SRC.onnx DST.onnx" in text
        assert "relative to DST.onnx's folder" in text
        assert "(default: 4096)" in text and "--no-progress" in text


def test_the_top_level_help_ends_with_the_exit_statuses(capsys) -> None:
    assert " ".join(EPILOG.split()) in " ".join(build_parser().format_help().split())


def test_align_help_is_findable_for_moving_inline_weights_out(capsys) -> None:
    text = help_of("align", capsys)
    assert "move inline weights out of a .onnx" in text.lower() or "To move inline weights out of a .onnx" in text
    assert "--size-threshold 1K" in text


@pytest.mark.parametrize(
    "argv",
    [["align", "only-one.onnx"], ["undelay", "a.onnx", "b.onnx", "--alignment", "lots"], ["verify"], ["nope"]],
)
def test_argument_errors_exit_2_with_the_usage(argv, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: onnx-light-ref") and "error:" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["align", "m.onnx", "out/m.onnx", "--alignment", "3000"], "alignment must be a power of two"),
        (["align", "m.onnx", "out/m.onnx", "--alignment", "2G"], "alignment must be at most 1073741824"),
        (["align", "m.onnx", "out/m.onnx", "--max-shard-size", "0"], "max_shard_size must be >= 1, got 0."),
        (["align", "m.onnx", "out/m.onnx", "--chunk-size", "0"], "chunk_size must be >= 1, got 0."),
        (["undelay", "m.onnx", "out/m.onnx", "--alignment", "48"], "alignment must be a power of two"),
        (["link", "m.onnx", "c.safetensors", "out/m.onnx", "--alignment", "3"], "alignment must be a power of two"),
        (["verify", "m.onnx", "m.onnx", "--chunk-size", "0"], "chunk_size must be >= 1, got 0."),
        (["verify", "m.onnx", "m.onnx", "--chunk-size", "2G"], "chunk_size must be <= 1073741824, got 2147483648."),
        (["demo", "--size", "1K", "--keep", "out"], "size must be at least 65536 bytes (64K), got 1024."),
    ],
)
def test_a_bad_option_value_is_a_usage_error_in_the_library_s_words(argv, message, capsys, tmp_path, monkeypatch):
    """Exit 2 with the usage, as for a malformed value (issue 29: these exited 1), before anything is written."""
    monkeypatch.chdir(tmp_path)
    make_external_model(tmp_path, WEIGHTS, name="m.onnx", size_threshold=0)
    before = snapshot_tree(tmp_path)

    with pytest.raises(SystemExit) as done:
        main(argv)

    assert done.value.code == 2
    err = capsys.readouterr().err
    option = next(arg for arg in reversed(argv) if arg.startswith("--") and arg != "--keep")
    assert err.startswith(f"usage: onnx-light-ref {argv[0]}") and f"error: argument {option}" in err
    assert message in err
    assert snapshot_tree(tmp_path) == before


def test_verify_s_chunk_cap_is_the_library_s() -> None:
    from onnx_light_ref._commands import verify as command
    from onnx_light_ref.io import _verify as library

    assert command.MAX_CHUNK_SIZE == library.MAX_CHUNK_SIZE


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "D"],
        ["verify", "D", "D"],
        ["run", "D"],
        ["align", "D", "out/m.onnx"],
        ["align", "D", "out/m.onnx", "--size-threshold", "1K"],
        ["undelay", "D", "out/m.onnx"],
    ],
)
def test_a_directory_given_as_the_model_is_called_a_directory(argv, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "D").mkdir()
    before = snapshot_tree(tmp_path)

    assert main(argv) == 1

    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "is a directory" in err[0], err
    assert snapshot_tree(tmp_path) == before  # no output folder left behind


@pytest.mark.parametrize("command", ["align", "undelay"])
def test_a_relative_weights_path_is_relative_to_the_destination_folder(command, tmp_path, monkeypatch) -> None:
    (tmp_path / "src").mkdir()
    if command == "align":
        src = make_external_model(tmp_path / "src", WEIGHTS, size_threshold=0)
    else:
        src, _ = delayed_model(tmp_path / "src")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    dst = tmp_path / "out" / "m.onnx"

    assert main([command, str(src), str(dst), "--weights", "w.bin", "--no-progress", "--no-fsync"]) == 0

    assert (tmp_path / "out" / "w.bin").is_file()
    assert list(cwd.iterdir()) == []  # not written relative to the current folder
    locations = {
        e.value
        for t in onnx.load_model(str(dst), load_external_data=False).graph.initializer
        for e in t.external_data
        if e.key == "location"
    }
    assert locations == {"w.bin"}
    ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])  # loads


def test_undelay_of_a_model_without_delayed_initializers_says_so(tmp_path, capsys) -> None:
    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", WEIGHTS, size_threshold=0)
    dst = tmp_path / "out" / "m.onnx"

    assert main(["undelay", str(src), str(dst), "--no-fsync", "--no-progress"]) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote {dst} and {dst}.data")
    assert out[1].startswith(f"note: {src} has no ai.rt::DelayedInitializer node")


def test_undelay_of_a_delayed_model_prints_no_note(tmp_path, capsys) -> None:
    src, _ = delayed_model(tmp_path)

    assert main(["undelay", str(src), str(tmp_path / "out.onnx"), "--no-fsync", "--alignment", "64K"]) == 0

    out = capsys.readouterr().out
    assert "note:" not in out and f"{tmp_path / 'out.onnx'}.data" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["align", "m.onnx", "m.onnx/out.onnx"], "exists and is not a folder"),
        (["undelay", "m.onnx", "m.onnx/out.onnx"], "exists and is not a folder"),
        (["run", "m.onnx", "--input", "x=m.onnx/x.npy"], "a component of its path is a file, not a folder"),
        (["run", "m.onnx", "--input", "x=missing.npy"], "from 'missing.npy': the file does not exist"),
        (["link", "m.onnx", "m.onnx/c.safetensors", "linked.onnx"], "does not exist"),
        (["inspect", "m.onnx/x.onnx"], "cannot be opened: Not a directory"),
        (["verify", "m.onnx/x.onnx", "m.onnx"], "cannot be opened: Not a directory"),
    ],
)
def test_an_os_error_is_one_line_in_words_without_errno(argv, message, capsys, tmp_path, monkeypatch) -> None:
    """``error: [Errno 20] Not a directory: ...`` leaked Python's errno (issue 29), and inspect printed a traceback."""
    monkeypatch.chdir(tmp_path)
    make_external_model(tmp_path, WEIGHTS, name="m.onnx", size_threshold=0)
    before = snapshot_tree(tmp_path)

    assert main(argv) == 1

    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("error: ") and message in line and "Errno" not in line, line
    assert snapshot_tree(tmp_path) == before


ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/[^\s,():']+")


def printed_paths(text: str) -> list[str]:
    """Every absolute path a command printed (paths end at a space, comma, colon or parenthesis)."""
    return ABSOLUTE_PATH.findall(text)


@pytest.mark.parametrize(
    ("options", "first_file"),
    [
        (["--max-shard-size", "40K", "--weights", "w.bin", "--shard-names", "hf"], "w-00001-of-00003.bin"),
        (["--max-shard-size", "40K", "--weights", "w.bin"], "w.bin"),
        (
            ["--max-shard-size", "44K", "--format", "safetensors"],
            "m-00001-of-00003.safetensors",
        ),  # the cap counts the 4 KiB header
        (["--format", "safetensors"], "m.safetensors"),
        (["--max-shard-size", "40K", "--shard-names", "transformers.js"], "m.onnx_data"),
    ],
)
def test_the_align_summary_names_the_files_written_by_absolute_path(options, first_file, tmp_path, monkeypatch, capsys):
    """``--weights w.bin`` with hub names printed ``w.bin``, a file that does not exist (issue 29)."""
    monkeypatch.chdir(tmp_path)
    make_external_model(tmp_path, {f"t{i}": np.full(4096 * 5, i, np.uint8) for i in range(5)}, name="src.onnx")

    assert main(["align", "src.onnx", "hub/m.onnx", "--no-progress", *options]) == 0

    out = capsys.readouterr().out
    assert out.startswith(f"{tmp_path / 'hub' / first_file}")
    paths = printed_paths(out)
    assert paths and all(os.path.exists(path) for path in paths), paths
    assert " hub/" not in out and not out.startswith("hub/")  # one style: absolute


def test_every_command_prints_paths_one_way_absolute(tmp_path, monkeypatch, capsys):
    """Relative arguments, absolute paths printed, each of them a file the command wrote or read."""
    monkeypatch.chdir(tmp_path)
    make_external_model(tmp_path, WEIGHTS, name="m.onnx", size_threshold=0)
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    delayed, _ = delayed_model(tmp_path)
    save_file({"w": WEIGHTS["w"], "v": WEIGHTS["v"]}, str(tmp_path / "ckpt.safetensors"))
    runs = [
        ["align", "m.onnx", "aligned/m.onnx", "--no-progress"],
        ["undelay", delayed.name, "standard/m.onnx", "--no-progress"],
        ["link", "m.onnx", "ckpt.safetensors", "linked.onnx", "--no-progress"],
        ["generate-tests", "cases"],
    ]
    for argv in runs:
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        paths = printed_paths(out)
        elsewhere = [path for path in paths if not path.startswith(str(tmp_path))]
        assert paths and all(os.path.exists(path) for path in paths), (argv, out)
        assert elsewhere == (seed_weights_paths() if argv[0] == "generate-tests" else []), (argv, out)
        assert not re.search(r"(^| )(aligned/|standard/|cases/|linked\.onnx)", out), (argv, out)


@pytest.mark.parametrize("command", ["align", "undelay", "link"])
def test_a_destination_without_the_onnx_suffix_is_warned_about(command, tmp_path, monkeypatch, capsys):
    """``align model.onnx x`` silently wrote a model named ``x``: it still does, with a warning naming a fix."""
    monkeypatch.chdir(tmp_path)
    make_external_model(tmp_path, WEIGHTS, name="m.onnx", size_threshold=0)
    delayed, _ = delayed_model(tmp_path)
    save_file({"w": WEIGHTS["w"]}, str(tmp_path / "ckpt.safetensors"))
    argv = {
        "align": ["align", "m.onnx", "x"],
        "undelay": ["undelay", delayed.name, "x"],
        "link": ["link", "m.onnx", "ckpt.safetensors", "x"],
    }[command]

    assert main([*argv, "--no-progress"]) == 0

    err = capsys.readouterr().err
    assert f"warning: the destination model {tmp_path / 'x'} does not end in .onnx" in err
    assert "e.g. x/model.onnx" in err
    assert onnx.load_model(str(tmp_path / "x"), load_external_data=False).graph.initializer  # written, as asked
    assert main([*argv[:-1], "y.ONNX", "--no-progress"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_unaligned_tensors_are_counted_and_a_few_named(tmp_path, monkeypatch, capsys, caplog):
    """199 names on one line were unreadable (issue 29): the summary and the library's warning count them."""
    monkeypatch.chdir(tmp_path)
    make_external_model(tmp_path, {f"t{i}": np.full(4100 + i, i, np.uint8) for i in range(10)}, name="odd.onnx")

    with caplog.at_level(logging.WARNING, logger="onnx_light_ref"):
        assert main(["align", "odd.onnx", "st/odd.onnx", "--format", "safetensors", "--no-progress"]) == 0

    out = capsys.readouterr().out
    assert re.search(r"\(9 large tensor\(s\) not aligned: t\d, t\d, t\d and 6 more\)", out), out
    (record,) = [r for r in caplog.records if "could not start aligned" in r.getMessage()]
    assert record.getMessage().startswith("9 tensor(s) of at least align_threshold bytes")
    assert record.getMessage().endswith(" and 6 more")
