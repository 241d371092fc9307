"""The ``onnx-light-ref`` dispatcher: every command module is wired in, and a broken one is never skipped silently."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import onnx_light_ref.commands
from onnx_light_ref import __version__, cli


def test_every_command_module_is_registered():
    # A command module is one that has `register`; the others (sizes, progress...) are helpers the commands share.
    folder = Path(onnx_light_ref.commands.__file__).parent
    names = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    modules = {
        name for name in names if hasattr(importlib.import_module(f"onnx_light_ref.commands.{name}"), "register")
    }

    assert set(cli._COMMAND_MODULES) == modules
    parser = cli.build_parser()
    subparsers = next(action for action in parser._actions if action.dest == "command")
    # One sub-command per module, named after it (dashes on the command line).
    assert list(subparsers.choices) == [name.replace("_", "-") for name in cli._COMMAND_MODULES]


def test_a_command_that_fails_to_import_is_loud(monkeypatch):
    real_import = importlib.import_module

    def broken(name: str, package: str | None = None):
        if name == "onnx_light_ref.commands.verify":
            raise ModuleNotFoundError("No module named 'some_missing_dependency'", name="some_missing_dependency")
        return real_import(name, package)

    monkeypatch.setattr(cli.importlib, "import_module", broken)

    with pytest.raises(ModuleNotFoundError, match="some_missing_dependency"):
        cli.main(["inspect", "model.onnx"])


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage: onnx-light-ref" in capsys.readouterr().err


def test_version_comes_from_the_package(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])

    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"onnx-light-ref {__version__}"


# What a command that only prints (``--version``, every ``--help``) may import: onnx, numpy and onnxruntime take most
# of a second and 40+ MiB to import, so the CLI imports them only when a command runs (benchmarks/test_bench_startup.py
# measures the start-up itself).
_HEAVY_MODULES = ("onnx", "numpy", "onnxruntime", "google.protobuf", "onnx_light_ref.io.align", "onnx_light_ref.ops")
_PRINT_ONLY = """
import contextlib, io, json, sys
from onnx_light_ref.cli import build_parser, main
commands = list(next(a for a in build_parser()._actions if a.dest == "command").choices)
for argv in (["--version"], ["--help"], *([name, "--help"] for name in commands)):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        main(argv)
    assert out.getvalue(), argv
print(json.dumps({"commands": commands, "modules": sorted(sys.modules)}))
"""


def test_version_and_every_help_import_neither_onnx_nor_numpy() -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PRINT_ONLY], capture_output=True, text=True, check=False, timeout=60)

    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert len(printed["commands"]) == len(cli._COMMAND_MODULES)
    heavy = [name for name in printed["modules"] if any(name == m or name.startswith(f"{m}.") for m in _HEAVY_MODULES)]
    assert heavy == []
