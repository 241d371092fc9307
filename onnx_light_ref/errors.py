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
    "UnsupportedOnnxFeatureError",
]


class ExternalDataError(ValueError):
    """A model's reference to external data is malformed, inconsistent or out of the bounds of its file.

    The base of every refusal about external data: an ``external_data`` entry with a negative, non-numeric or
    out-of-range ``offset``/``length``, a ``length`` that disagrees with the tensor's dims and data type, a range past
    the end of its file, unknown or repeated keys, a tensor both inline and external, or a data file replaced while
    it was read. A ``ValueError``, so code written against onnx's own checks keeps working. Nothing was written; the
    message names the tensor, the file, the offset and what was expected.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, a model whose first tensor starts past the
        end of its file:

        >>> import onnx
        >>> from onnx_light_ref import verify_models
        >>> model = onnx.load("model.onnx", load_external_data=False)
        >>> model.graph.initializer[0].external_data[1].value = "99999999"  # W0's offset
        >>> onnx.save(model, "broken.onnx")
        >>> verify_models("broken.onnx", "model.onnx")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.ExternalDataError: tensor 'W0': external data range [offset 99999999, +86016 bytes)
        exceeds the size of 'model.onnx.data' (1032256 bytes).
    """


class UnsafeLocationError(ExternalDataError):
    """A file a model names is outside its folder, or reached in a way onnx's own loader refuses.

    Raised for a ``location`` (or a ``DelayedInitializer`` ``filename``) that is empty, absolute, contains ``..``,
    goes through a symbolic link, or names a file with several hard links, and for a destination weights file
    outside the destination model's folder: the location rule (``docs/safety.md#glossary``), which is onnx's. A
    model from a stranger must not make a tool read or overwrite a file elsewhere. Layouts you trust, such as the
    Hugging Face cache, pass with ``allow_outside_folder=True`` (``--allow-outside-folder``). Nothing was written.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> import onnx
        >>> from onnx_light_ref import verify_models
        >>> model = onnx.load("model.onnx", load_external_data=False)
        >>> model.graph.initializer[0].external_data[0].value = "../model.onnx.data"
        >>> onnx.save(model, "escape.onnx")
        >>> verify_models("escape.onnx", "model.onnx")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.UnsafeLocationError: tensor 'W0': external data location '../model.onnx.data' contains
        a '..' component, which the ONNX spec disallows.
    """


class DestinationConflictError(ExternalDataError):
    """A file a writer would write is also one it reads, another output, or a folder.

    Writing a destination that is a source (the same path, a symbolic link to it or a hard link of it) would destroy
    the input while it is copied. Also raised for two outputs that are one file, an output that is a directory, and
    a name too long for its folder. The base of :class:`SharedWeightsError` and :class:`ExistingFileError`. Choose
    another destination; nothing was written.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, writing the weights over the file they
        are read from:

        >>> from onnx_light_ref import align_external_data_streaming
        >>> align_external_data_streaming("model.onnx", "aligned.onnx", "model.onnx.data")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.DestinationConflictError: destination '.../model.onnx.data' is the source file ...
    """


class SafetensorsError(ExternalDataError):
    """A safetensors file cannot be read, or tensors cannot be written as safetensors.

    Raised for a safetensors header that is malformed or hostile (a header size past the file or over the library's
    100,000,000-byte limit, bad JSON, offsets that overlap or leave holes), and, when writing
    ``weights_format="safetensors"``, for tensors the format cannot store: a name that is empty or repeated, a data
    type safetensors has no code for. Nothing was written.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> from onnx_light_ref import verify_checkpoint
        >>> with open("broken.safetensors", "wb") as f:
        ...     _ = f.write(b"\\xff" * 16)  # a header size of 2**64 - 1 bytes
        >>> verify_checkpoint("model.onnx", "broken.safetensors")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.SafetensorsError: '.../broken.safetensors': safetensors header size
        18446744073709551615 at offset 0 exceeds the 100000000-byte limit of the safetensors library ...
    """


class SafetensorsReferenceError(ExternalDataError):
    """A model's reference into a ``.safetensors`` file disagrees with that file's header.

    The range overlaps the header, or it is not exactly the bytes, data type and shape of its tensor's key (or, for a
    name that is no key, of any key): the model would read header text or another tensor's bytes as its weights,
    typically because the checkpoint was saved again after the model was linked to it. Every reader refuses it, and
    ``inspect`` shows it as ``header mismatch``. Link the model again (``link_external_data``).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, a model pointing into a safetensors file's
        header:

        >>> import onnx
        >>> from onnx_light_ref import align_external_data_streaming, verify_models
        >>> _ = align_external_data_streaming("model.onnx", "st.onnx", weights_format="safetensors")
        >>> model = onnx.load("st.onnx", load_external_data=False)
        >>> model.graph.initializer[0].external_data[1].value = "0"  # W0's offset
        >>> onnx.save(model, "overlap.onnx")
        >>> verify_models("overlap.onnx", "model.onnx")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.SafetensorsReferenceError: tensor 'W0': bytes [0, 86016) of 'st.safetensors' overlap
        its safetensors header ...
    """


class SharedWeightsError(DestinationConflictError):
    """A writer would replace a file that another model references: that model would silently compute other values.

    Before replacing a file, a writer looks for every ``.onnx`` that can reach it (in the file's folder and in each
    ancestor folder, through external data or ``DelayedInitializer`` filenames), as the writer contract promises
    (``docs/safety.md#glossary``). The message names each such model and one of its tensors. Write under another
    name, or pass ``replace_shared=True`` (``--replace-shared``) to replace the file anyway; nothing was written.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, where ``new_head.onnx`` reads
        ``new_head.onnx.data``:

        >>> from onnx_light_ref import align_external_data_streaming
        >>> align_external_data_streaming("model.onnx", "aligned.onnx", "new_head.onnx.data")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.SharedWeightsError: align (streaming): file '.../new_head.onnx.data' is used by
        '.../new_head.onnx' (1 tensor, e.g. 'head.weight'): replacing it would silently change what those models
        compute. ...
    """


class ExistingFileError(DestinationConflictError):
    """A writer would replace an existing file its destination does not own: a checkpoint, another tool's data, yours.

    A destination owns its ``.onnx``, the files its previous version references and its own leftovers
    (``docs/safety.md#glossary``); any other existing file at an output name is refused, every one named, before
    anything is written. Write under another name, or pass ``overwrite=True`` (``--overwrite``) to replace it.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> from onnx_light_ref import align_external_data_streaming
        >>> with open("notes.txt", "w") as f:
        ...     _ = f.write("my notes")
        >>> align_external_data_streaming("model.onnx", "aligned.onnx", "notes.txt")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.ExistingFileError: align (streaming): weights file '.../notes.txt' exists and is not
        an output of '.../aligned.onnx' ...
    """


class DanglingReferenceError(ExternalDataError):
    """A variant's reused reference would not resolve from the folder it is saved to.

    :func:`~onnx_light_ref.save_model_with_shared_external_data` keeps a variant's external tensors pointing at the
    files they already use; a location is relative to the model's folder, so saved elsewhere it would name a file
    that is not there (or one the location rule refuses). Save the variant in the folder of the model that owns the
    weights, or pass ``check_references=False`` to write references to files that will exist later. Nothing was
    written.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> import os, onnx
        >>> from onnx_light_ref import save_model_with_shared_external_data
        >>> os.mkdir("elsewhere")
        >>> model = onnx.load("model.onnx", load_external_data=False)
        >>> save_model_with_shared_external_data(model, "elsewhere/variant.onnx")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.DanglingReferenceError: reused tensor 'W0' would dangle from '.../elsewhere': ...
    """


class ConfigFileError(ValueError):
    """A ``config.json`` a writer was asked to update (``update_config``, ``--update-config``) cannot be updated.

    Missing keys are added; a file that is not a UTF-8 JSON object, a ``transformers.js_config`` entry of another
    type, or a file changed while the run worked is refused, and nothing was written.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> from onnx_light_ref import align_external_data_streaming
        >>> with open("config.json", "w") as f:
        ...     _ = f.write("not JSON")
        >>> align_external_data_streaming(
        ...     "model.onnx", "web.onnx", shard_names="transformers.js", update_config="config.json"
        ... )
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.ConfigFileError: align (streaming): '.../config.json' is not JSON (Expecting value at
        line 1, column 1); nothing was written.
    """


class InvalidModelError(ValueError):
    """A ``.onnx`` file is not an ONNX model: truncated, garbage, empty, or without a graph.

    Also raised for a string field that is not UTF-8 (a tensor name, a ``location``) and for a model too large to
    serialize. The file is always parsed as binary protobuf, whatever its name.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> from onnx_light_ref import verify_models
        >>> with open("garbage.onnx", "wb") as f:
        ...     _ = f.write(b"garbage")
        >>> verify_models("garbage.onnx", "model.onnx")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.InvalidModelError: '.../garbage.onnx' is not a valid ONNX model (cannot parse it:
        ...).
    """


class TensorAllocationError(MemoryError):
    """A tensor needs more memory than this machine can give it (its file and its shape may both be valid).

    A ``MemoryError`` (it is one: callers that catch memory exhaustion keep working), raised before the allocation
    when the tensor is larger than the machine's memory and swap (or the process's address-space limit), or when
    numpy's allocation itself fails; the message names the tensor, its shape, dtype and byte size. A sparse weights
    file can be terabytes long and take no disk space: only the allocation can tell that such a tensor cannot be
    read, and this error says so before the process is killed filling it.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, a ``DelayedInitializer`` node reading
        8 TiB of float32 from a sparse file:

        >>> import onnx
        >>> from onnx import TensorProto, helper
        >>> from onnx_light_ref import reference_evaluator
        >>> with open("huge.bin", "wb") as f:
        ...     _ = f.truncate(2**43)  # 8 TiB, no disk block used
        >>> node = helper.make_node("DelayedInitializer", [], ["y"], domain="ai.rt", filename="huge.bin", offset=0,
        ...     shape=[2**41], dtype=TensorProto.FLOAT, load_device="file", runtime_device="cpu")
        >>> graph = helper.make_graph([node], "huge", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        >>> onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.rt", 1)]), "huge.onnx")
        >>> with reference_evaluator("huge.onnx") as sess:
        ...     sess.run(None, {})
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.TensorAllocationError: DelayedInitializer node with output 'y': a tensor of shape
        [2199023255552] and dtype float32 needs 8796093022208 bytes, more than this machine can allocate ...
    """


class PublishedWithErrorsError(RuntimeError):
    """The new model is in place and loads, but a step after it was put in place failed.

    A writer puts the new ``.onnx`` at the destination name last (the commit, ``docs/safety.md#glossary``); this
    error means that happened, so the destination is the new model and every file it references holds its bytes.
    What failed is one of the steps after it: the ``fsync`` that makes it durable (``sync_failed`` is then True: after
    a power loss the destination may come back as the previous model), or removing the previous versions, left on
    hidden ``.olr~...`` names (``leftover_files``; the next write into that folder removes them). Not an ``OSError``
    on purpose: an ``OSError`` from a writer means nothing was published, and code that restores or retries on it
    must not undo this model (``docs/durability.md#outcomes-what-a-writers-answer-means``).

    Attributes:
        model_path: the published ``.onnx`` (absolute); for a family, the first member published.
        errors: each ``OSError`` that a step after the commit raised, in order (the first is also ``__cause__``).
        leftover_files: hidden files that could not be removed (previous versions), absolute paths.
        sync_failed: True when an ``fsync`` after the commit failed (the commit may not survive a power loss); False
            when only removals failed (the model is published, and durable when ``durable=True`` was asked).
        result: what the writer returns on success (an ``AlignResult``, ``SaveResult``, ``LinkResult``,
            ``FamilyResult`` or the ``int`` of ``undelay_initializers``); None when raised by the publisher alone.
        published_models: every ``.onnx`` whose new version is in place (``(model_path,)`` for a one-model writer;
            a family's members that are new).
        previous_models: the ``.onnx`` files of the same publication still at their previous version (a family
            whose publication failed between two members' commits, without ``RENAME_EXCHANGE`` to undo them);
            empty for a one-model writer. Each of them loads and computes its previous values.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, the answer every writer may give: the
        model is published, and what it wrote is ``error.result``:

        >>> from onnx_light_ref import align_external_data_streaming
        >>> from onnx_light_ref.errors import PublishedWithErrorsError
        >>> try:
        ...     result = align_external_data_streaming("model.onnx", "aligned.onnx")
        ... except PublishedWithErrorsError as error:  # published: do not retry nor restore
        ...     result = error.result
        >>> int(result), result.tensors
        (1032256, 8)
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
    """An element type ``ai.rt::DelayedInitializer`` cannot produce with the installed onnx.

    Not raw bytes (STRING), not an ONNX type, or one the installed onnx does not define or cannot represent (float4
    on onnx 1.17). The message names the type, the reason and the types that are accepted; :attr:`data_type` is the
    refused value.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``light.onnx`` with its first node's
        ``dtype`` changed to STRING:

        >>> import onnx
        >>> from onnx_light_ref import reference_evaluator
        >>> model = onnx.load("light.onnx")
        >>> next(a for a in model.graph.node[0].attribute if a.name == "dtype").i = onnx.TensorProto.STRING
        >>> onnx.save(model, "strings.onnx")
        >>> reference_evaluator("strings.onnx")
        Traceback (most recent call last):
        ...
        onnx_light_ref.errors.UnsupportedElementTypeError: DelayedInitializer node 'DelayedInitializer_W0': dtype 8
        (string) is not supported: ...
    """

    def __init__(self, message: str, data_type: object = None) -> None:
        super().__init__(message)
        self.data_type = data_type


class UnsupportedOnnxFeatureError(NotImplementedError):
    """The installed onnx lacks an API a requested feature needs; the message names the onnx version needed.

    Raised before anything runs, by :func:`~onnx_light_ref.reference_evaluator` and the conformance backend, for an
    evaluator option the installed onnx does not take (``check_shape_annotations`` needs onnx 1.23): upgrade onnx, or
    call without the option. A ``NotImplementedError``.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, on any onnx:

        >>> from onnx_light_ref import reference_evaluator
        >>> from onnx_light_ref.errors import UnsupportedOnnxFeatureError
        >>> try:
        ...     session = reference_evaluator("model.onnx", check_shape_annotations=True)
        ... except UnsupportedOnnxFeatureError:  # onnx < 1.23
        ...     session = reference_evaluator("model.onnx")
        >>> session.close()
    """
