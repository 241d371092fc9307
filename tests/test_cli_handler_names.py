"""Every sub-command's handler is named one way: ``<command>_command``, defined in its module."""

from __future__ import annotations

import argparse
import importlib

from onnx_light_ref import _cli as cli


def test_every_handler_is_named_after_its_command():
    parser = cli.build_parser()
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    checked = []
    for command, subparser in subparsers.choices.items():
        module_name = command.replace("-", "_")
        handler = subparser.get_default("func")
        module = importlib.import_module(f"onnx_light_ref._commands.{module_name}")
        assert handler.__name__ == f"{module_name}_command", command
        assert handler.__module__ == module.__name__, command
        assert getattr(module, handler.__name__) is handler, command
        checked.append(command)
    assert {"align", "run", "verify", "demo", "generate-tests"} <= set(checked)
