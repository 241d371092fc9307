"""Which models in a folder use which weights files: the guard every writer runs before replacing a weights file.

A weights file may be shared: ``save_model_with_shared_external_data`` (or a user by hand) makes several ``.onnx``
files point at one file. Replacing it (re-aligning one of the models, saving a variant over it) silently changes what
the others compute. :func:`check_not_shared` refuses that, naming the other models, unless the caller opts in
(``replace_shared=True`` / ``--replace-shared``). :func:`folder_sharing` lists, for ``inspect`` on a folder, which
files are used by which models.

The other models are the ``.onnx`` files in the destination model's folder and in every folder between it and the
weights file (a location has no ``..``, so only those folders can reach the file). A model references a file when
one of its EXTERNAL tensors (anywhere in the model) has a location that, joined to the model's folder, is that file:
the same device and inode (so a hard link or a symlink to it counts), or, for a file not there yet, the same name.

This module reads model metadata only (large inline payloads are skipped by the wire reader, never read) and never
reads a weight byte, never writes. A file that is not a parsable model is not a model: it is skipped.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from onnx_light_ref.errors import SharedWeightsError
from onnx_light_ref.io.read.entries import is_external
from onnx_light_ref.io.read.locations import FileIdentity

__all__ = [
    "ModelReference",
    "SharedFile",
    "check_not_shared",
    "files_referenced_near",
    "folder_sharing",
    "model_references",
]

logger = logging.getLogger(__name__)

# Inline payloads at least this long are skipped, not read, when a sibling model is parsed.
_SKIP_PAYLOADS = 4096

_MODEL_SUFFIX = ".onnx"


@dataclass(frozen=True, slots=True)
class ModelReference:
    """One model using a file: the model's path, the first tensor that does, and how many of its tensors do."""

    model: str
    tensor: str
    location: str
    tensors: int


@dataclass(frozen=True, slots=True)
class SharedFile:
    """A data file of a folder and every model of that folder that uses it (several: the file is shared)."""

    path: str
    users: tuple[ModelReference, ...]


def model_references(model_path: str) -> dict[FileIdentity | str, ModelReference]:
    """The files ``model_path`` references, keyed by identity (existing files) or by absolute path (missing ones).

    Args:
        model_path: a ``.onnx`` file.

    Returns:
        One :class:`ModelReference` per referenced file; empty when the file is not a parsable model.
    """
    from onnx_light_ref.io.read.wire import load_model_stripped  # the wire reader imports much; only writers need it

    try:
        model = load_model_stripped(model_path, min_length=_SKIP_PAYLOADS).model
    except (OSError, ValueError) as exc:  # InvalidModelError is a ValueError
        logger.debug("not a model, skipped: %s (%s)", model_path, exc)
        return {}
    from onnx_light_ref.io.read.walker import iter_tensors

    folder = os.path.dirname(os.path.abspath(model_path))
    found: dict[FileIdentity | str, ModelReference] = {}
    keys: dict[str, FileIdentity | str] = {}  # one stat per distinct location, not per tensor
    counts: dict[FileIdentity | str, int] = {}
    for site in iter_tensors(model):
        if not is_external(site.tensor):
            continue
        location = _location(site.tensor)
        if not location:
            continue
        key = keys.get(location)
        if key is None:
            path = os.path.normpath(os.path.join(folder, location))
            key = keys[location] = _identity(path) or path
        counts[key] = counts.get(key, 0) + 1
        if key not in found:
            found[key] = ModelReference(model_path, site.label, location, 0)
    return {key: ModelReference(ref.model, ref.tensor, ref.location, counts[key]) for key, ref in found.items()}


def check_not_shared(
    weights_paths: Sequence[str],
    dst_onnx: str,
    *,
    replace_shared: bool,
    writer_models: Collection[str] = (),
) -> None:
    """Refuse to replace an existing weights file that another model of the folder references.

    Args:
        weights_paths: the weights files about to be written (only those that exist now are replaced).
        dst_onnx: the ``.onnx`` being written (it is replaced too: its own references do not count).
        replace_shared: True to replace shared files anyway (the caller accepts that the other models change).
        writer_models: further ``.onnx`` files this writer rewrites itself (their references do not count).

    Raises:
        SharedWeightsError: a weights file that exists is referenced by another model, named in the message with
            the tensor that uses it, unless ``replace_shared``.
    """
    if replace_shared:
        return
    targets: dict[FileIdentity | str, str] = {}
    for path in weights_paths:
        absolute = os.path.abspath(path)
        identity = _identity(absolute)
        if identity is not None:
            targets[identity] = absolute
        elif os.path.lexists(absolute):
            targets[os.path.normpath(absolute)] = absolute
    if not targets:
        return
    own = {key for key in (_identity(os.path.abspath(p)) for p in (dst_onnx, *writer_models)) if key is not None}
    own_paths = {os.path.abspath(p) for p in (dst_onnx, *writer_models)}
    users: dict[str, list[ModelReference]] = {}
    for model_path in _models_in(_folders(dst_onnx, weights_paths)):
        if model_path in own_paths or _identity(model_path) in own:
            continue
        for key, reference in model_references(model_path).items():
            target = targets.get(key)
            if target is not None:
                users.setdefault(target, []).append(reference)
    if users:
        raise SharedWeightsError(_message(users))


def folder_sharing(folder: str) -> list[SharedFile]:
    """Every data file the models of ``folder`` reference, with the models that do, for ``inspect`` on a folder.

    Args:
        folder: a folder holding ``.onnx`` files.

    Returns:
        One :class:`SharedFile` per referenced file, in order of first reference (models sorted by name); a file
        with several users is shared.
    """
    files: dict[FileIdentity | str, list[ModelReference]] = {}
    paths: dict[FileIdentity | str, str] = {}
    for model_path in _models_in([os.path.abspath(folder)]):
        for key, reference in model_references(model_path).items():
            files.setdefault(key, []).append(reference)
            paths.setdefault(key, os.path.normpath(os.path.join(os.path.dirname(model_path), reference.location)))
    return [SharedFile(paths[key], tuple(users)) for key, users in files.items()]


def files_referenced_near(folder: str) -> set[FileIdentity | str]:
    """Every file that a model able to reach ``folder`` references (keys as in :func:`model_references`).

    Those models are the ``.onnx`` files directly in ``folder`` and in each of its ancestors: a location has no
    ``..``, so no other model can name a file of ``folder``. The publisher asks this before sweeping a dead writer's
    temp or bridge file, so that a file some model loads is never deleted.

    Args:
        folder: the folder whose files are about to be removed.

    Returns:
        Identities of the referenced files that exist, absolute normalized paths of those that do not.
    """
    current = os.path.abspath(folder)
    folders = [current]
    while os.path.dirname(current) != current:
        current = os.path.dirname(current)
        folders.append(current)
    found: set[FileIdentity | str] = set()
    for model_path in _models_in(folders):
        found.update(model_references(model_path))
    return found


def _message(users: dict[str, list[ModelReference]]) -> str:
    parts = []
    for path, references in users.items():
        named = ", ".join(
            f"{r.model!r} ({r.tensors} tensor{'s' if r.tensors != 1 else ''}, e.g. {r.tensor!r})" for r in references
        )
        parts.append(f"weights file {path!r} is used by {named}")
    return (
        "; ".join(parts) + ": replacing it would silently change what those models compute. Write the weights under "
        "another name (dst_weights_path / --weights, location=), or pass replace_shared=True (--replace-shared) to "
        "replace it anyway; nothing was written."
    )


def _folders(dst_onnx: str, weights_paths: Iterable[str]) -> list[str]:
    """The destination's folder and every folder from it down to each weights file's folder."""
    base = os.path.dirname(os.path.abspath(dst_onnx))
    folders = [base]
    for path in weights_paths:
        current = os.path.dirname(os.path.abspath(path))
        while current not in folders and current.startswith(base + os.sep):
            folders.append(current)
            current = os.path.dirname(current)
    return folders


def _models_in(folders: Iterable[str]) -> list[str]:
    models: list[str] = []
    for folder in folders:
        try:
            with os.scandir(folder) as entries:
                names = sorted(e.name for e in entries if e.name.endswith(_MODEL_SUFFIX))
        except OSError:
            continue
        models.extend(os.path.join(folder, name) for name in names)
    return models


def _identity(path: str) -> FileIdentity | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def _location(tensor: object) -> str:
    for entry in getattr(tensor, "external_data", ()):
        key, value = entry.key, entry.value
        if isinstance(key, bytes) or isinstance(value, bytes):
            continue
        if key == "location":
            return str(value)
    return ""
