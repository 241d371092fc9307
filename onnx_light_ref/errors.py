"""Exception types raised by onnx_light_ref.

Every problem with a model's external data is an :class:`ExternalDataError`, a ``ValueError`` so that code written
against onnx's own checks (which raise ``ValueError``) keeps working. A file that does not exist raises the builtin
``FileNotFoundError`` instead: ``OSError`` and ``ValueError`` cannot share a subclass (their C layouts conflict), and
callers already know how to handle a missing file. Messages always say which tensor, which file, which offset and
what was expected.

An ``OSError`` from a writer means "the destination model is the previous one": nothing was published. A failure
*after* the commit point (the new ``.onnx`` is in place) is a :class:`PublishedWithErrorsError` instead, never an
``OSError``: a caller that retries or restores on ``OSError`` must not undo a published model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "ConfigFileError",
    "DanglingReferenceError",
    "DestinationConflictError",
    "ExistingFileError",
    "ExternalDataError",
    "InvalidModelError",
    "PublishedWithErrorsError",
    "SafetensorsError",
    "SafetensorsReferenceError",
    "SharedWeightsError",
    "TensorAllocationError",
    "UnsafeLocationError",
    "UnsupportedElementTypeError",
    "WriterContractError",
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


class SafetensorsReferenceError(ExternalDataError):
    """A reference into a ``.safetensors`` file disagrees with the file's header: it overlaps the header, or it is
    not exactly the bytes, dtype and shape of its tensor's key (or, for a name that is no key, of any key). Every
    reader refuses it with the message ``inspect`` shows as ``header mismatch``: the model would read header text or
    another tensor's bytes as its weights (a checkpoint re-saved after it was linked)."""


class SharedWeightsError(DestinationConflictError):
    """A writer would replace a weights file that another model in the folder references (``replace_shared=True``
    opts in): replacing it would silently change what that model computes."""


class ExistingFileError(DestinationConflictError):
    """A writer would replace an existing file its destination does not own (not the destination ``.onnx``, not a
    file the previous ``.onnx`` references, not one of its own leftovers): a checkpoint, another tool's data, a
    user's ``.npy``. ``overwrite=True`` (``--overwrite``) opts in; nothing was written."""


class DanglingReferenceError(ExternalDataError):
    """A reused external reference would not resolve from the destination model's folder."""


class ConfigFileError(ValueError):
    """A ``config.json`` a writer was asked to update (``update_config``) cannot be: missing keys are added, but a
    file that is not a UTF-8 JSON object, an entry of another type, or a file changed while the run worked is
    refused; nothing was written."""


class InvalidModelError(ValueError):
    """A ``.onnx`` file cannot be parsed as a ModelProto (truncated, garbage, or not an ONNX model)."""


class TensorAllocationError(MemoryError):
    """A tensor needs more memory than this machine can give it (its file and its shape may both be valid).

    A ``MemoryError`` (it is one: callers that catch memory exhaustion keep working), raised before the allocation
    when the tensor is larger than the machine's memory and swap (or the process's address-space limit), or when
    numpy's allocation itself fails; the message names the tensor, its shape, dtype and byte size.
    """


class PublishedWithErrorsError(RuntimeError):
    """The new model is published, but a step after the commit point failed (docs/durability.md, "Outcomes").

    The destination ``.onnx`` is the new one and it loads: every file it references holds its bytes. What failed is
    one of the steps that follow the commit: the ``fsync`` that makes the commit durable (``sync_failed`` is then
    True: after a power loss the destination may come back as the previous model), or the removal of the previous
    versions and bridge files, left on hidden ``.olr~...`` names (``leftover_files``; the next publication into
    that folder removes them). Not an ``OSError`` on purpose: an ``OSError`` from a writer means nothing was
    published, and code that restores or retries on it must not undo this model.

    Attributes:
        model_path: the published ``.onnx`` (absolute); for a family, the first member published.
        errors: each ``OSError`` that a step after the commit raised, in order (the first is also ``__cause__``).
        leftover_files: hidden files that could not be removed (previous versions, bridge files), absolute paths.
        sync_failed: True when an ``fsync`` after the commit failed (the commit may not survive a power loss); False
            when only removals failed (the model is published, and durable when ``durable=True`` was asked).
        result: what the writer returns on success (an ``AlignResult``, ``SaveResult``, ``LinkResult``,
            ``FamilyResult`` or the ``int`` of ``undelay_initializers``); None when raised by the publisher alone.
        published_models: every ``.onnx`` whose new version is in place (``(model_path,)`` for a one-model writer;
            a family's members that are new).
        previous_models: the ``.onnx`` files of the same publication still at their previous version (a family
            whose publication failed between two members' commits, without ``RENAME_EXCHANGE`` to undo them);
            empty for a one-model writer. Each of them loads and computes its previous values.
    """

    def __init__(
        self,
        message: str,
        *,
        model_path: str,
        errors: Iterable[OSError] = (),
        leftover_files: Iterable[str] = (),
        sync_failed: bool = False,
        result: Any = None,
        published_models: Iterable[str] = (),
        previous_models: Iterable[str] = (),
    ) -> None:
        super().__init__(message)
        self.model_path = model_path
        self.errors = tuple(errors)
        self.leftover_files = tuple(leftover_files)
        self.sync_failed = sync_failed
        self.result = result
        self.published_models = tuple(published_models) or (model_path,)
        self.previous_models = tuple(previous_models)

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {
            "model_path": self.model_path,
            "errors": self.errors,
            "leftover_files": self.leftover_files,
            "sync_failed": self.sync_failed,
            "result": self.result,
            "published_models": self.published_models,
            "previous_models": self.previous_models,
        }
        return (_rebuild_published, (str(self), fields))


def _rebuild_published(message: str, fields: dict[str, Any]) -> PublishedWithErrorsError:
    return PublishedWithErrorsError(message, **fields)


class UnsupportedElementTypeError(ValueError):
    """An element type ``ai.rt::DelayedInitializer`` cannot produce here: not raw bytes (STRING), not an ONNX type,
    or one the installed onnx does not define or cannot represent (float4 on onnx 1.17). The message names the
    type, the reason and the types that are accepted; :attr:`data_type` is the refused value."""

    def __init__(self, message: str, data_type: object = None) -> None:
        super().__init__(message)
        self.data_type = data_type


class WriterContractError(AssertionError):
    """A writer's plan breaks rule 2 of the writer contract (``docs/safety.md``): a reference of the model has no
    site, the sites drifted from the model's walk (another order, a model changed after planning), a site is placed
    where no loader reads it, or externalized where rule 2 keeps it inline. A bug in the writer, never in the
    model: an ``AssertionError``, and nothing was written."""
