"""What ``--help`` and a bad command line tell a newcomer: each command's own exit statuses, links that work from a
wheel, ``run``'s required ``--input``, and a usage error in the words of the command that was typed."""

from __future__ import annotations

import argparse
import re
import string
from collections import defaultdict
from typing import get_args

import pytest

from onnx_light_ref import _cli as cli
from onnx_light_ref._commands.help_text import DOCS_URL
from onnx_light_ref._commands.options import SHARED_OPTIONS
from onnx_light_ref.io._arguments import WeightsFormat
from onnx_light_ref.io._plan.shard_names import ShardScheme
from onnx_light_ref.io._read.delayed_names import LOAD_DEVICES
from tests.cli_runner import run_cli

COMMANDS = [name.replace("_", "-") for name in cli._COMMAND_MODULES]
WRITERS = ["align", "align-models", "link", "run", "undelay", "delay", "demo"]


def help_of(command: str) -> str:
    done = run_cli(command, "--help")
    assert done.returncode == 0
    return " ".join(done.stdout.split())  # argparse wraps lines at the terminal's width


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_ends_with_the_exit_statuses_of_its_own_command(command: str) -> None:
    text = help_of(command)
    statuses = text[text.index("exit status: ") :]
    assert statuses.startswith("exit status: 0 ") and "2 bad arguments" in statuses and "130 interrupted" in statuses
    assert ("3 written, but a step after the commit failed" in statuses) == (command in WRITERS)
    assert ("verify" in statuses) == (command == "verify" and "verify" in statuses)  # no other command's meaning
    if command == "inspect":
        assert "1 a reference is broken" in statuses and "difference" not in statuses
    if command == "verify":
        assert "1 a difference or a wrong checksum" in statuses and "written" not in statuses


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_links_point_where_a_wheel_user_can_read_them(command: str) -> None:
    text = help_of(command) if command else " ".join(run_cli("--help").stdout.split())
    for mention in re.finditer(r"\S*docs/\S+\.md", text):
        assert mention.group().lstrip("(").startswith(DOCS_URL), mention.group()  # never a bare docs/*.md


def test_run_shows_input_as_required() -> None:
    usage = run_cli("run", "--help").stdout.split("\n\n")[0]
    assert "--input NAME=FILE.npy ..." in usage and "[--input" not in usage


def test_an_unknown_option_is_reported_with_the_command_s_usage_and_a_hint(tmp_path) -> None:
    done = run_cli("align-models", "a.onnx", "b.onnx", "--out", str(tmp_path / "family"), "--dedup")

    assert done.returncode == 2
    assert done.stderr.startswith("usage: onnx-light-ref align-models ")
    assert done.stderr.splitlines()[-1] == (
        "onnx-light-ref align-models: error: unrecognized arguments: --dedup (--dedup: a family always stores "
        "identical payloads once; no option is needed)"
    )
    assert not (tmp_path / "family").exists()


def test_an_option_of_the_program_after_the_command_says_where_it_goes() -> None:
    done = run_cli("inspect", "model.onnx", "-v")

    assert done.returncode == 2 and done.stderr.startswith("usage: onnx-light-ref inspect ")
    assert done.stderr.splitlines()[-1] == (
        "onnx-light-ref inspect: error: unrecognized arguments: -v (-v goes before the command: onnx-light-ref -v "
        "inspect ...)"
    )


def test_an_option_of_another_command_names_it() -> None:
    done = run_cli("verify", "a.onnx", "b.onnx", "--max-shard-size", "4M")

    assert done.returncode == 2 and done.stderr.startswith("usage: onnx-light-ref verify ")
    assert "(--max-shard-size is an option of align, align-models, not of verify)" in done.stderr


def test_an_unknown_command_keeps_argparse_s_message() -> None:
    done = run_cli("aline", "a.onnx")

    assert done.returncode == 2 and "invalid choice: 'aline'" in done.stderr


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options_by_flag() -> dict[str, dict[str, argparse.Action]]:
    """Flag -> command -> its action, for every ``--`` option but ``--help``."""
    found: dict[str, dict[str, argparse.Action]] = defaultdict(dict)
    for name, command in _commands().items():
        for action in command._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    found[flag][name] = action
    return found


def test_every_option_two_commands_have_is_defined_once():
    """Issue 39: ``--allow-outside-folder`` was written in 7 commands, each with its own help; now an option two
    commands have is a shared one (``_commands/options.py``), and every shared one is used by two commands."""
    shared = {flag for flag, commands in _options_by_flag().items() if len(commands) > 1}
    assert shared == set(SHARED_OPTIONS)


def _template_pattern(template: str) -> re.Pattern[str]:
    """The help ``template`` as a pattern: its literal text as it is, each ``{word}`` any text."""
    parts = [
        re.escape(text) + ("" if word is None else "(.*?)") for text, word, _, _ in string.Formatter().parse(template)
    ]
    return re.compile("".join(parts))


@pytest.mark.parametrize("flag", sorted(SHARED_OPTIONS))
def test_a_shared_option_says_the_same_sentence_in_every_command_modulo_its_words(flag):
    pattern = _template_pattern(SHARED_OPTIONS[flag].help)
    commands = _options_by_flag()[flag]
    for name, action in commands.items():
        assert pattern.fullmatch(action.help), f"{name} {flag}: {action.help!r}"
        assert "{" not in action.help and "}" not in action.help  # every word given
    # In the words of the printed --help too (argparse wraps the lines): one command's, to check the wiring.
    name, action = next(iter(commands.items()))
    assert " ".join(action.help.split()) in help_of(name)


def test_the_choices_are_the_library_s_vocabulary():
    """One source: ``--format``, ``--shard-names`` and ``--load-device`` accept exactly what the library does."""
    by_flag = _options_by_flag()
    for flag, values in (
        ("--format", get_args(WeightsFormat)),
        ("--shard-names", get_args(ShardScheme)),
        ("--load-device", LOAD_DEVICES),
    ):
        assert {tuple(action.choices) for action in by_flag[flag].values()} == {tuple(values)}
