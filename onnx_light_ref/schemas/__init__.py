"""The JSON Schemas (draft 2020-12) of the documents ``inspect --json`` and ``verify --json`` write.

``inspect-1.json`` and ``verify-1.json`` describe version 1 of the documents (``schema_version``: 1), every member
and every type; ``docs/json.md`` says the same in words. They ship in the wheel as package data, so a pipeline can
validate what the installed version writes::

    from onnx_light_ref.schemas import load_schema
    schema = load_schema("inspect")  # a dict, for any JSON Schema validator

This module only reads the files shipped with the package; it never validates anything itself (the package has no
JSON Schema dependency).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Literal

__all__ = ["SCHEMA_NAMES", "load_schema", "schema_text"]

SCHEMA_NAMES: tuple[str, ...] = ("inspect", "verify")
"""The commands with a ``--json`` document."""


def schema_text(command: Literal["inspect", "verify"], version: int = 1) -> str:
    """The text of the schema of ``command``'s document at ``version``.

    Args:
        command: ``"inspect"`` or ``"verify"``.
        version: the ``schema_version`` (1, the only one so far).

    Returns:
        The JSON text of the schema file.

    Raises:
        ValueError: no such command or version.
    """
    if command not in SCHEMA_NAMES:
        raise ValueError(f"command must be one of {', '.join(SCHEMA_NAMES)}, got {command!r}.")
    resource = resources.files(__package__).joinpath(f"{command}-{version}.json")
    if not resource.is_file():
        raise ValueError(f"no schema version {version!r} for {command!r} (this release writes version 1).")
    return resource.read_text(encoding="utf-8")


def load_schema(command: Literal["inspect", "verify"], version: int = 1) -> dict[str, Any]:
    """The schema of ``command``'s document at ``version``, parsed (see :func:`schema_text`)."""
    schema: dict[str, Any] = json.loads(schema_text(command, version))
    return schema
