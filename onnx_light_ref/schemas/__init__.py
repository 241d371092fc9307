"""The JSON Schemas (draft 2020-12) of the documents ``inspect --json`` and ``verify --json`` write.

``inspect-2.json`` and ``verify-1.json`` describe the documents this release writes (``schema_version`` 2 for
``inspect``, 1 for ``verify``: :data:`SCHEMA_VERSIONS`), every member and every type; ``docs/json.md`` says the same
in words. ``inspect-1.json`` stays, for documents written by earlier releases. They ship in the wheel as package data,
so a pipeline can validate what the installed version writes::

    from onnx_light_ref.schemas import load_schema
    schema = load_schema("inspect")  # a dict, for any JSON Schema validator

This module only reads the files shipped with the package; it never validates anything itself (the package has no
JSON Schema dependency).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Literal

__all__ = ["SCHEMA_NAMES", "SCHEMA_VERSIONS", "load_schema"]

SCHEMA_NAMES: tuple[str, ...] = ("inspect", "verify")
"""The commands with a ``--json`` document."""

SCHEMA_VERSIONS: dict[str, int] = {"inspect": 2, "verify": 1}
"""The ``schema_version`` of the documents each command writes (``docs/json.md`` says what raises it). inspect's 2:
the DelayedInitializer nodes' reads (``delayed``), which count in ``ok``, ``error_count`` and each file's
``tensors``."""


def load_schema(command: Literal["inspect", "verify"], version: int | None = None) -> dict[str, Any]:
    """The schema of ``command``'s document at ``version``, parsed (a dict for any JSON Schema validator).

    Args:
        command: ``"inspect"`` or ``"verify"``.
        version: a ``schema_version`` (None: the one this release writes, :data:`SCHEMA_VERSIONS`).

    Returns:
        The schema, as ``json.loads`` parses the shipped file.

    Raises:
        ValueError: no such command or version.

    Example:
        In any folder (the schemas ship with the package):

        >>> from onnx_light_ref.schemas import load_schema
        >>> load_schema("verify")["title"]
        'onnx-light-ref verify --json, schema version 1'
    """
    if command not in SCHEMA_NAMES:
        raise ValueError(f"command must be one of {', '.join(SCHEMA_NAMES)}, got {command!r}.")
    current = SCHEMA_VERSIONS[command]
    resource = resources.files(__package__).joinpath(f"{command}-{current if version is None else version}.json")
    if not resource.is_file():
        raise ValueError(f"no schema version {version!r} for {command!r} (this release writes version {current}).")
    schema: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return schema
