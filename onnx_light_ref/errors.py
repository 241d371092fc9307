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
    "SafetensorsError",
    "SharedWeightsError",
    "TensorAllocationError",
    "UnsafeLocationError",
    "UnsupportedElementTypeError",
]


class ExternalDataError(ValueError):
    """An ``external_data`` entry is malformed, inconsistent or out of the bounds of its file."""


class UnsafeLocationError(ExternalDataError):
    """A ``location`` is absolute, contains ``..``, is empty, or resolves (through a symlink) outside its folder."""


class DestinationConflictError(ExternalDataError):
    """A destination file is also a source (same path, symlink or hard link): writing it would destroy the input."""


class SafetensorsError(ExternalDataError):
    """A safetensors header is malformed (hostile input), or tensors cannot be stored as safetensors (a name that is
    empty or repeated, a data type safetensors has no code for)."""


class SharedWeightsError(DestinationConflictError):
    """A writer would replace a weights file that another model in the folder references (``replace_shared=True``
    opts in): replacing it would silently change what that model computes."""


class DanglingReferenceError(ExternalDataError):
    """A reused external reference would not resolve from the destination model's folder."""


class InvalidModelError(ValueError):
    """A ``.onnx`` file cannot be parsed as a ModelProto (truncated, garbage, or not an ONNX model)."""


class TensorAllocationError(MemoryError):
    """A tensor needs more memory than this machine can give it (its file and its shape may both be valid).

    A ``MemoryError`` (it is one: callers that catch memory exhaustion keep working), raised before the allocation
    when the tensor is larger than the machine's memory and swap (or the process's address-space limit), or when
    numpy's allocation itself fails; the message names the tensor, its shape, dtype and byte size.
    """


class UnsupportedElementTypeError(ValueError):
    """An element type ``ai.rt::DelayedInitializer`` cannot produce here: not raw bytes (STRING), not an ONNX type,
    or one the installed onnx does not define or cannot represent (float4 on onnx 1.17). The message names the
    type, the reason and the types that are accepted; :attr:`data_type` is the refused value."""

    def __init__(self, message: str, data_type: object = None) -> None:
        super().__init__(message)
        self.data_type = data_type
