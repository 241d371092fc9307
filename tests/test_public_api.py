"""The public surface is the documented API: six public modules, each exporting exactly what docs/api.md lists.

A module is public when no part of its dotted name starts with ``_``; everything else is internal, and declares no
``__all__`` (an ``__all__`` would advertise names nobody documents).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import onnx_light_ref

REPO = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = [
    "onnx_light_ref",
    "onnx_light_ref.backend",
    "onnx_light_ref.errors",
    "onnx_light_ref.io",
    "onnx_light_ref.ops",
    "onnx_light_ref.schemas",
]


def _all_modules() -> list[str]:
    found = ["onnx_light_ref"]
    for info in pkgutil.walk_packages(onnx_light_ref.__path__, "onnx_light_ref."):
        found.append(info.name)
    return sorted(found)


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


def _documented() -> dict[str, set[str]]:
    """The names of each ``## `module` `` section of docs/api.md: the backticked names of its tables' first column."""
    sections: dict[str, set[str]] = {}
    current = None
    for line in (REPO / "docs" / "api.md").read_text(encoding="utf-8").splitlines():
        heading = re.fullmatch(r"## `([\w.]+)`", line)
        if heading:
            current = heading.group(1)
            sections[current] = set()
        elif current and line.startswith("| `"):
            first = line.split("|")[1]
            sections[current].update(re.findall(r"`(\w+)`", first))
    return sections


def test_the_public_modules_are_the_documented_six() -> None:
    public = [module for module in _all_modules() if not _is_private(module)]

    assert public == PUBLIC_MODULES
    assert sorted(_documented()) == PUBLIC_MODULES


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_each_public_module_exports_exactly_what_the_docs_list(module: str) -> None:
    exported = set(importlib.import_module(module).__all__)

    documented = _documented()[module]

    assert exported - documented == set(), "exported but not in docs/api.md"
    assert documented - exported == set(), "in docs/api.md but not exported"
    for name in exported:
        assert getattr(importlib.import_module(module), name) is not None


def test_no_internal_module_declares_all() -> None:
    declaring = []
    for module in _all_modules():
        if not _is_private(module):
            continue
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
                declaring.append(module)

    assert declaring == []


def test_the_same_object_under_every_public_name() -> None:
    """``onnx_light_ref.X`` is ``onnx_light_ref.io.X`` or ``onnx_light_ref.ops.X``: one object, two addresses."""
    for name in onnx_light_ref.__all__:
        if name == "__version__":
            continue
        homes = [importlib.import_module(m) for m in ("onnx_light_ref.io", "onnx_light_ref.ops")]
        owners = [home for home in homes if name in home.__all__]
        assert owners, name
        assert all(getattr(owner, name) is getattr(onnx_light_ref, name) for owner in owners)
