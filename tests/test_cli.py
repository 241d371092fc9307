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
