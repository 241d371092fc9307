"""The names of a family's members: ``align_models`` writes each source as ``<folder>/<its name>``.

Every exporter writes ``model.onnx``, and a decoder and its decoder-with-past come from two runs in two folders, so
a member may be named: ``align_models([("a/model.onnx", "decoder_model.onnx"), ("b/model.onnx",
"decoder_with_past_model.onnx")], out)``, or a mapping ``{source: name}`` (CLI: ``SRC.onnx=NAME``). A source given
alone keeps its file name. A name is a plain file name (no folder, not ``.`` or ``..``, no NUL), and two members
never share one. Pure: this module never touches a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from onnx_light_ref.errors import DestinationConflictError
from onnx_light_ref.io._arguments import ArgumentTypeError

_NAMING_HINT = (
    "name the members: align-models a/model.onnx=decoder_model.onnx b/model.onnx=decoder_with_past_model.onnx "
    '(Python: align_models([("a/model.onnx", "decoder_model.onnx"), ...], ...))'
)


def member_sources(src_onnx_paths: object) -> tuple[list[str], list[str]]:
    """The sources (absolute paths) and the members' file names, in order.

    Args:
        src_onnx_paths: an iterable of paths or ``(path, name)`` pairs, or a mapping ``{path: name}``.

    Returns:
        ``(sources, names)``.

    Raises:
        ArgumentTypeError: not such an iterable; an item neither a path nor a pair; a name that is not a ``str``.
        ValueError: no source; a name that is not a plain file name.
        DestinationConflictError: one source given twice, or two members with one name (the message says how to
            name them).
    """
    items = src_onnx_paths.items() if isinstance(src_onnx_paths, Mapping) else src_onnx_paths
    if isinstance(src_onnx_paths, (str, bytes, os.PathLike)) or not isinstance(items, Iterable):
        raise ArgumentTypeError(
            f"src_onnx_paths must be a list of model paths, got {type(src_onnx_paths).__name__} {src_onnx_paths!r}."
        )
    sources: list[str] = []
    names: list[str] = []
    for item in items:
        path, name = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"src_onnx_paths must hold paths or (path, name) pairs, got {item!r}.")
        sources.append(os.path.abspath(os.fspath(path)))
        names.append(os.path.basename(sources[-1]) if name is None else _check_name(name))
    if not sources:
        raise ValueError("src_onnx_paths is empty: align_models needs at least one source model.")
    _refuse_shared_names(sources, names)
    return sources, names


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise ArgumentTypeError(f"a member's name must be a str, got {type(name).__name__} {name!r}.")
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"member name {name!r} is not a plain file name (no folder, not '.' or '..').")
    return name


def _refuse_shared_names(sources: list[str], names: list[str]) -> None:
    seen: dict[str, str] = {}
    for source, name in zip(sources, names, strict=True):
        if name in seen and seen[name] == source:
            raise DestinationConflictError(
                f"source {source!r} is given twice: each member is written once, as <folder>/{name}; nothing was "
                "written."
            )
        if name in seen:
            raise DestinationConflictError(
                f"sources {seen[name]!r} and {source!r} would both be written as {name!r}: align_models writes "
                f"each member as <folder>/<its name>, so one would overwrite the other; {_NAMING_HINT}. Nothing was "
                "written."
            )
        seen[name] = source
