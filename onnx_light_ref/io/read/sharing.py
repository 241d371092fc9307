"""Which models can reach which files: the scan behind rule 1 of the writer contract, and ``inspect FOLDER``.

A data file may be shared: ``save_model_with_shared_external_data`` (or a user by hand, or ``delay_initializers``,
whose ``ai.rt::DelayedInitializer`` nodes name files by ``filename``) makes several models read one file. Replacing
it (re-aligning one of them, saving a variant over it) silently changes what the others compute;
:mod:`onnx_light_ref.io.write.contract` refuses that with what :func:`scan_users` finds.

Which models can reach a file: under onnx's loader rule a ``location`` is relative and has no ``..``, so a model
reaches a file only from the file's own folder or from an ancestor of it. :func:`folders_reaching` lists those
folders: the file's folder and every ancestor up to ``/``, both along the path as given and along its real path (a
model beside a symlinked folder reaches the file through the link only in onnxruntime, which follows links; the real
path is what onnx's loader walks). ``/`` is the limit on purpose: stopping at the destination model's folder (the
previous rule) missed ``root/top.onnx`` reaching ``root/a/b/w.data``, and any lower limit has the same hole; the
cost is one ``scandir`` per ancestor and a metadata parse of each model found there (the wire reader skips
payloads). Folders this process cannot list are skipped (a model there is invisible to it). A model is any regular
file (or symlink to one) whose name ends with ``.onnx`` in any case (onnx and onnxruntime load ``variant.ONNX``
like any name). One that cannot be read as a model (truncated, a copy still running, refused by our reader or by
protobuf, no permission, metadata over 2 GiB) is an :class:`UnreadableModel`: "cannot parse" never means
"references nothing", since it may be a model someone loads (complete later, or read by another tool), so it is
taken as possibly using every file in its reach (its folder and below) and rule 1 refuses to replace those.

A model references a file when one of its EXTERNAL tensors (anywhere in the model) has a ``location`` (any of its
``location`` entries, if it repeats the key: onnx reads the last, another tool may read the first), or one of its
``ai.rt::DelayedInitializer`` nodes (anywhere: main graph, subgraphs, functions, training graphs) has a
``filename``, that names it from the model's folder (an absolute ``filename`` as it is): the same device and inode
(so a hard link or a symlink to it counts), or, for a file not there, the same normalized path. The op's domain,
type and attribute name are constants here: ``io`` never imports ``ops``.

This module reads model metadata only and never reads a weight byte, never writes.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from onnx_light_ref.io.read.delayed_names import DELAYED_DOMAIN, DELAYED_FILENAME, DELAYED_OP_TYPE
from onnx_light_ref.io.read.entries import is_external
from onnx_light_ref.io.read.locations import FileIdentity

if TYPE_CHECKING:
    import onnx

__all__ = [
    "ModelReference",
    "NearbyReferences",
    "SharedFile",
    "SharingScan",
    "UnreadableModel",
    "file_key",
    "files_referenced_near",
    "folder_sharing",
    "folders_reaching",
    "is_model_name",
    "model_references",
    "models_in",
    "read_model_references",
    "read_references",
    "scan_users",
]

logger = logging.getLogger(__name__)

# Inline payloads at least this long are skipped, not read, when a model is parsed for its references.
_SKIP_PAYLOADS = 4096

_MODEL_SUFFIX = ".onnx"

FileKey = FileIdentity | str
"""An existing file by device and inode; a missing one by its normalized absolute path."""

Via = Literal["external_data", "delayed_initializer"]


@dataclass(frozen=True, slots=True)
class ModelReference:
    """One model using a file: the model's path, the first tensor (or node output) that does, the ``location`` (or
    ``filename``) naming it, how many of its tensors (or nodes) do, and how (``"external_data"`` or
    ``"delayed_initializer"``: a ``filename`` attribute)."""

    model: str
    tensor: str
    location: str
    tensors: int
    via: Via = "external_data"


@dataclass(frozen=True, slots=True)
class UnreadableModel:
    """A model file (``*.onnx``) whose references could not be read, and why: it may use any file in its reach."""

    model: str
    reason: str

    def describe(self) -> str:
        """``'m.onnx', which cannot be read as a model (<reason>)``."""
        return f"{self.model!r}, which cannot be read as a model ({self.reason})"


@dataclass(frozen=True, slots=True)
class SharedFile:
    """A data file of a folder and every model of that folder that uses it (several: the file is shared)."""

    path: str
    users: tuple[ModelReference, ...]


@dataclass(frozen=True, slots=True)
class SharingScan:
    """What :func:`scan_users` found: the users of each target, every file any scanned model references, the models
    scanned, and per target the models that cannot be read and can reach it (they may use it)."""

    users: dict[str, list[ModelReference]]
    referenced: frozenset[FileIdentity]
    models: tuple[str, ...]
    unreadable: dict[str, list[UnreadableModel]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NearbyReferences:
    """What :func:`files_referenced_near` found: the files the models able to reach a folder reference, and the
    models there that cannot be read (any file of the folder may be theirs)."""

    keys: frozenset[FileKey]
    unreadable: tuple[UnreadableModel, ...] = ()


def is_model_name(name: str) -> bool:
    """Whether a file name is a model's: ends with ``.onnx`` in any case (``variant.ONNX`` loads like any name)."""
    return name.lower().endswith(_MODEL_SUFFIX) and len(name) > len(_MODEL_SUFFIX)


def file_key(path: str) -> FileKey:
    """The key :func:`model_references` uses for ``path``: its identity when it exists, else its normalized path."""
    absolute = os.path.normpath(os.path.abspath(path))
    return _identity(absolute) or absolute


def read_references(model_path: str) -> dict[FileKey, ModelReference] | None:
    """The files the model at ``model_path`` references, by :func:`file_key`; None when it is not a parsable model.

    For a writer's own destination (rule 3: what it owns), where None is the safe answer (it owns nothing by
    reference). A guard reading *another* model uses :func:`read_model_references`, which tells "gone" from
    "cannot be read".

    Args:
        model_path: a file (usually a ``.onnx``).

    Returns:
        One :class:`ModelReference` per referenced file (external data locations and ``DelayedInitializer``
        filenames), or None when the file is missing, unreadable or not an ONNX model.
    """
    found = read_model_references(model_path)
    return None if isinstance(found, UnreadableModel) else found


def read_model_references(model_path: str) -> dict[FileKey, ModelReference] | UnreadableModel | None:
    """:func:`read_references` for a guard: an :class:`UnreadableModel` (with the reason) for a file that exists
    but cannot be read as a model, None only when it is gone (or is no regular file: no loader opens it).

    Args:
        model_path: a file (usually a ``.onnx``).

    Returns:
        The references, an :class:`UnreadableModel`, or None.
    """
    from onnx_light_ref.io.read.wire import load_model_stripped  # the wire reader imports much; only writers need it

    try:
        model = load_model_stripped(model_path, min_length=_SKIP_PAYLOADS).model
    except FileNotFoundError as exc:  # gone since it was listed, or not a regular file (a FIFO, a folder)
        logger.debug("no model file, skipped: %s (%s)", model_path, exc)
        return None
    except (OSError, ValueError) as exc:  # InvalidModelError is a ValueError; OSError: EACCES, EIO, EMFILE...
        logger.debug("cannot read %s as a model (%s): it may use any file in its reach", model_path, exc)
        return UnreadableModel(model_path, _reason(exc))
    folder = os.path.dirname(os.path.abspath(model_path))
    found: dict[FileKey, ModelReference] = {}
    counts: dict[FileKey, int] = {}
    keys: dict[str, FileKey] = {}  # one stat per distinct name, not per tensor
    for label, location, via in _named_files(model):
        key = keys.get(location)
        if key is None:
            key = keys[location] = file_key(os.path.join(folder, location))  # an absolute filename stays as it is
        counts[key] = counts.get(key, 0) + 1
        if key not in found:
            found[key] = ModelReference(model_path, label, location, 0, via)
    return {
        key: ModelReference(ref.model, ref.tensor, ref.location, counts[key], ref.via) for key, ref in found.items()
    }


def model_references(model_path: str) -> dict[FileKey, ModelReference]:
    """:func:`read_references`, empty when the file is not a parsable model (for reports: ``inspect FOLDER``; a
    guard must use :func:`read_model_references` instead)."""
    return read_references(model_path) or {}


def _reason(exc: BaseException) -> str:
    """An exception's message without the path the caller names already."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def folders_reaching(paths: Iterable[str]) -> list[str]:
    """Every folder from which a model can reach one of ``paths``: each file's folder and all its ancestors up to
    ``/``, along the path as given and along its real path (module docstring); each folder once, deepest first."""
    folders: list[str] = []
    seen: set[FileIdentity | str] = set()
    for path in paths:
        folder = os.path.dirname(os.path.abspath(path))
        for start in dict.fromkeys((folder, os.path.realpath(folder))):
            for current in _ancestors(start):
                key = _folder_identity(current) or current
                if key not in seen:
                    seen.add(key)
                    folders.append(current)
    return folders


def models_in(folders: Iterable[str]) -> list[str]:
    """The model files directly in each folder (:func:`is_model_name`, regular files or symlinks to one), sorted by
    name per folder; folders that cannot be listed are skipped."""
    models: list[str] = []
    for folder in folders:
        try:
            with os.scandir(folder) as entries:
                names = sorted(e.name for e in entries if is_model_name(e.name) and _is_file(e))
        except OSError as exc:
            logger.debug("cannot list %s for models (%s): skipped", folder, exc)
            continue
        models.extend(os.path.join(folder, name) for name in names)
    return models


def scan_users(targets: Collection[str], *, exclude: Collection[str] = ()) -> SharingScan:
    """Find every model that can reach one of ``targets`` and references it.

    Args:
        targets: files about to be replaced (only those that exist, or are symlinks, can have users).
        exclude: models that do not count (the writer's destination models, which it replaces).

    Returns:
        A :class:`SharingScan`: per target path, the models referencing it (in folder order); the identities of every
        existing file any scanned model (not excluded) references, wherever it is; and the models scanned.
    """
    wanted: dict[FileKey, str] = {}
    for path in targets:
        absolute = os.path.normpath(os.path.abspath(path))
        identity = _identity(absolute)
        if identity is not None:
            wanted[identity] = absolute
        elif os.path.lexists(absolute):
            wanted[absolute] = absolute
    excluded_paths = {os.path.normpath(os.path.abspath(p)) for p in exclude}
    excluded = {key for key in (_identity(p) for p in excluded_paths) if key is not None}
    users: dict[str, list[ModelReference]] = {}
    unreadable: dict[str, list[UnreadableModel]] = {}
    referenced: set[FileIdentity] = set()
    scanned: list[str] = []
    reach: dict[FileIdentity | str, list[str]] | None = None  # folder -> existing targets it reaches, when needed
    for model_path in models_in(folders_reaching(targets)):
        if os.path.normpath(model_path) in excluded_paths or _identity(model_path) in excluded:
            continue
        scanned.append(model_path)
        found = read_model_references(model_path)
        if isinstance(found, UnreadableModel):
            if reach is None:
                reach = _reach(wanted.values())
            folder = os.path.dirname(model_path)
            for reached in reach.get(_folder_identity(folder) or os.path.normpath(folder), []):
                unreadable.setdefault(reached, []).append(found)
            continue
        for key, reference in (found or {}).items():
            if isinstance(key, FileIdentity):
                referenced.add(key)
            target = wanted.get(key)
            if target is not None:
                users.setdefault(target, []).append(reference)
    return SharingScan(users, frozenset(referenced), tuple(scanned), unreadable)


def _reach(targets: Iterable[str]) -> dict[FileIdentity | str, list[str]]:
    """For each folder that can reach one of ``targets`` (:func:`folders_reaching`), the targets it reaches."""
    reach: dict[FileIdentity | str, list[str]] = {}
    for target in targets:
        for folder in folders_reaching([target]):
            reach.setdefault(_folder_identity(folder) or folder, []).append(target)
    return reach


def folder_sharing(folder: str) -> list[SharedFile]:
    """Every data file the models of ``folder`` reference, with the models that do, for ``inspect`` on a folder.

    Args:
        folder: a folder holding ``.onnx`` files.

    Returns:
        One :class:`SharedFile` per referenced file (external data and ``DelayedInitializer`` filenames), in order of
        first reference (models sorted by name); a file with several users is shared.
    """
    files: dict[FileKey, list[ModelReference]] = {}
    paths: dict[FileKey, str] = {}
    for model_path in models_in([os.path.abspath(folder)]):
        for key, reference in model_references(model_path).items():
            files.setdefault(key, []).append(reference)
            paths.setdefault(key, os.path.normpath(os.path.join(os.path.dirname(model_path), reference.location)))
    return [SharedFile(paths[key], tuple(users)) for key, users in files.items()]


def files_referenced_near(folder: str) -> NearbyReferences:
    """Every file that a model able to reach ``folder`` references (keys as in :func:`model_references`), and the
    models able to reach it that cannot be read (any file of ``folder`` may be theirs).

    Those models are the ``.onnx`` files (any case) directly in ``folder`` and in each of its ancestors, along the
    path as given and along its real path (:func:`folders_reaching`): a location has no ``..``, so no other model
    can name a file of ``folder``. The publisher asks this before sweeping a dead writer's temp or bridge file, so
    that a file some model loads, or may load, is never deleted.

    Args:
        folder: the folder whose files are about to be removed.

    Returns:
        A :class:`NearbyReferences`: identities of the referenced files that exist, absolute normalized paths of
        those that do not, and the unreadable models.
    """
    found: set[FileKey] = set()
    unreadable: list[UnreadableModel] = []
    for model_path in models_in(folders_reaching([os.path.join(os.path.abspath(folder), "_")])):
        references = read_model_references(model_path)
        if isinstance(references, UnreadableModel):
            unreadable.append(references)
        elif references is not None:
            found.update(references)
    return NearbyReferences(frozenset(found), tuple(unreadable))


def _named_files(model: onnx.ModelProto) -> Iterator[tuple[str, str, Via]]:
    """(tensor or node label, location or filename, how) for every file the model names."""
    from onnx_light_ref.io.read.walker import iter_tensors

    for site in iter_tensors(model):
        if is_external(site.tensor):
            for location in _locations(site.tensor):
                yield site.label, location, "external_data"
    for node in _all_nodes(model):
        if node.domain != DELAYED_DOMAIN or node.op_type != DELAYED_OP_TYPE:
            continue
        for attribute in node.attribute:
            if attribute.name == DELAYED_FILENAME and attribute.s:
                label = node.output[0] if node.output else (node.name or DELAYED_OP_TYPE)
                yield label, os.fsdecode(attribute.s), "delayed_initializer"


def _all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of the model: main graph, functions, training graphs, and every subgraph of those, at any depth."""
    pending: list[onnx.GraphProto | onnx.FunctionProto] = [model.graph, *model.functions]
    for training in model.training_info:
        pending.extend(getattr(training, name) for name in ("initialization", "algorithm") if training.HasField(name))
    while pending:
        container = pending.pop()
        for node in container.node:
            yield node
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    pending.append(attribute.g)
                pending.extend(attribute.graphs)


def _ancestors(folder: str) -> Iterator[str]:
    current = os.path.normpath(folder)
    while True:
        yield current
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # follows a symlink: a linked model resolves its locations from this folder
    except OSError:
        return False


def _folder_identity(path: str) -> FileIdentity | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return FileIdentity(st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _identity(path: str) -> FileIdentity | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def _locations(tensor: onnx.TensorProto) -> list[str]:
    """Every file a ``location`` entry names, each once: onnx's loader opens the last one, another tool may open the
    first, so the guard counts all of them. A value that is not UTF-8 names a file by its bytes (onnxruntime opens
    it so): decoded with the file system's encoding, which gives those bytes back."""
    found: list[str] = []
    for entry in tensor.external_data:
        key, value = entry.key, entry.value
        if key != "location" or not value:  # a key that is not UTF-8 is bytes, never "location"
            continue
        text = os.fsdecode(value) if isinstance(value, bytes) else value
        if text not in found:
            found.append(text)
    return found
