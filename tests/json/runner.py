"""Run a command line in text mode and with ``--json``, and check what a pipeline relies on.

:func:`run_both` runs ``onnx_light_ref._cli.main`` twice in this process (stdout and stderr captured by pytest's
``capsys``) and checks: the exit status is the same; stdout in JSON mode is one JSON document made of printable
ASCII only; it matches the shipped schema; the text rebuilt from it (:mod:`tests.json.render`) is exactly the text
output; and an error gives the same ``error:`` line on stderr in both modes, with the error document on stdout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from onnx_light_ref._cli import main
from onnx_light_ref.schemas import SCHEMA_VERSIONS, load_schema
from tests.json.render import inspect_text, path_text, verify_text
from tests.json.schema_check import validate

__all__ = ["SCHEMAS", "Run", "run_both", "run_json"]

SCHEMAS = {name: load_schema(name) for name in ("inspect", "verify")}  # type: ignore[arg-type]


@dataclass(frozen=True)
class Run:
    """One command line run both ways."""

    status: int
    document: dict[str, Any]
    text: str  # stdout in text mode
    errors: str  # stderr in text mode


def run_json(
    argv: list[str], capsys: pytest.CaptureFixture[str], seen: set[str] | None = None
) -> tuple[int, dict[str, Any], str]:
    """Run ``argv`` with ``--json``; return the status, the parsed document (checked against the schema) and
    stderr."""
    status = main([*argv, "--json"])
    captured = capsys.readouterr()
    out = captured.out
    assert out.endswith("\n") and all(" " <= char <= "~" for char in out[:-1].replace("\n", " ")), out[:200]
    document = json.loads(out)  # exactly one document: json.loads refuses trailing data
    validate(document, SCHEMAS[argv[0]], seen)
    assert document["command"] == argv[0] and document["schema_version"] == SCHEMA_VERSIONS[argv[0]]
    return status, document, captured.err


def run_both(argv: list[str], capsys: pytest.CaptureFixture[str], seen: set[str] | None = None) -> Run:
    """Run ``argv`` in text mode and with ``--json``; check that both say the same (see the module docstring)."""
    status = main(argv)
    captured = capsys.readouterr()
    json_status, document, json_errors = run_json(argv, capsys, seen)
    assert json_status == status, (argv, status, json_status)
    assert json_errors == captured.err  # the same error line (or none) on stderr in both modes
    if document["kind"] == "error":
        assert status == 1 and captured.out == ""
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
        from onnx_light_ref._commands.text import printable

        assert captured.err == f"error: {printable(path_text(document['error']['message']))}\n"
    else:
        render = inspect_text if argv[0] == "inspect" else verify_text
        assert render(document) == captured.out
        assert document["ok"] == (status == 0)
    return Run(status, document, captured.out, captured.err)
