"""Exception types raised by onnx_light_ref.

Every problem with a model's external data is an :class:`ExternalDataError`, a ``ValueError`` so that code written
against onnx's own checks (which raise ``ValueError``) keeps working. A file that does not exist raises the builtin
``FileNotFoundError`` instead: ``OSError`` and ``ValueError`` cannot share a subclass (their C layouts conflict), and
callers already know how to handle a missing file. Messages always say which tensor, which file, which offset and
what was expected.
"""

from __future__ import annotations

__all__ = [
    "DanglingReferenceError",
    "DestinationConflictError",
    "ExternalDataError",
    "InvalidModelError",
    "SharedWeightsError",
    "UnsafeLocationError",
]


class ExternalDataError(ValueError):
    """An ``external_data`` entry is malformed, inconsistent or out of the bounds of its file."""


class UnsafeLocationError(ExternalDataError):
    """A ``location`` is absolute, contains ``..``, is empty, or resolves (through a symlink) outside its folder."""


class DestinationConflictError(ExternalDataError):
    """A destination file is also a source (same path, symlink or hard link): writing it would destroy the input."""


class SharedWeightsError(DestinationConflictError):
    """A writer would replace a weights file that another model in the folder references (``replace_shared=True``
    opts in): replacing it would silently change what that model computes."""


class DanglingReferenceError(ExternalDataError):
    """A reused external reference would not resolve from the destination model's folder."""


class InvalidModelError(ValueError):
    """A ``.onnx`` file cannot be parsed as a ModelProto (truncated, garbage, or not an ONNX model)."""
