"""Attributes of a package imported on first use (PEP 562), so that importing the package, or one of its submodules,
does not import every module its public names come from.

``onnx_light_ref`` and ``onnx_light_ref.io`` use it: ``import onnx_light_ref.io._arguments`` (what the command
line's option parsing does) runs ``onnx_light_ref/io/__init__.py`` first, which must not import onnx, numpy and
every writer with it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, modules: Mapping[str, str], names: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose public names are imported on first use.

    Args:
        package: the package's ``__name__`` (for the error message).
        modules: each public name -> the module it is imported from.
        names: the package's ``__all__``.

    Returns:
        ``(__getattr__, __dir__)``: the first imports the name's module and caches the value in the package's
        namespace, so the next lookup is an ordinary attribute.

    Example:
        >>> __getattr__, __dir__ = lazy_attributes(__name__, {"verify_models": "onnx_light_ref.io._verify"}, __all__)
    """

    def attribute(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def listing() -> list[str]:
        return sorted(names)

    return attribute, listing
