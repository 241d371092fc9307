"""Argument types and checks shared by every public function: path type, int64 bound, int and bool checks.

One place for them, so every entry point refuses the same bad values with the same wording. A wrong *type* raises
:class:`ArgumentTypeError`, which is both a ``TypeError`` (Python's convention) and a ``ValueError`` (what the public
API documents for every invalid argument, and what the CLI's error handling catches).
"""

from __future__ import annotations

import os
from typing import Literal

PathLike = str | os.PathLike[str]
"""Paths accepted by the public API; converted once at the boundary with ``os.fspath``."""

WeightsFormat = Literal["onnx", "safetensors"]
"""The weights files' format (``weights_format=``, ``--format``): raw external data, or safetensors files."""

INT64_MAX = 2**63 - 1
"""Largest ``offset``/``length``/size an ONNX loader can address (int64 in onnx, onnxruntime and onnx-light):
anything above cannot come from a valid writer and would overflow C++ consumers (OpenVINO #34070)."""


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type: a ``TypeError`` by convention and the documented ``ValueError``."""


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """Return ``value`` if it is an int (not a bool) within ``[minimum, maximum]``; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}.")
    return value


def check_optional_int(name: str, value: object, *, minimum: int = 0, maximum: int = INT64_MAX) -> int | None:
    """Like :func:`check_int`, but ``None`` is accepted and returned as is."""
    return None if value is None else check_int(name, value, minimum=minimum, maximum=maximum)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool; ``ArgumentTypeError`` otherwise (``0``/``1``/``"yes"`` are refused)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}.")
    return value


def check_weights_file(name: str, value: PathLike) -> str:
    """``value``, a weights file a writer is asked to write, as an absolute path; refused when it names a folder.

    A trailing ``/`` (or ``/.``, ``.``, ``..``) names a folder, and ``os.path.abspath`` would silently drop it (a
    file named ``sub`` was written for ``--weights sub/``); an existing directory is no file either.

    Raises:
        ValueError: ``value`` names a folder.
    """
    raw = os.fspath(value)
    if raw.endswith(("/", "/.")) or os.path.basename(raw) in ("", ".", "..") or os.path.isdir(raw):
        raise ValueError(
            f"{name} {raw!r} names a folder, not a file: give the weights file's name (e.g. "
            f"{os.path.join(raw.rstrip('/.') or '.', 'model.onnx.data')!r}); nothing was written."
        )
    return os.path.abspath(raw)
