"""Checks on the files a writer is about to create: where they really land, and that none is a source or another.

The writer contract (:mod:`~onnx_light_ref.io._write.contract`) runs :func:`weights_location` for every file a
destination model will reference and :func:`check_output_files` on every file a writer creates or replaces, before
its first byte is written and again under the folder lock; writers get their ``location`` strings from
:func:`weights_location` too. Destinations are compared by real identity, never by path
string: a folder is identified by its device and inode (so ``out/self -> .`` and ``out`` are the same folder), a file
by the folder it lands in and its name (publication renames over the name, so a symlink *at* the name is replaced,
not followed) and, when it already exists, by its own device and inode (hard links, symlinks to a source).

This module only ``stat``s; it never opens, creates or deletes a file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from onnx_light_ref.errors import DestinationConflictError, UnsafeLocationError
from onnx_light_ref.io._read.locations import FileIdentity, check_location_syntax, is_inside

_DEFAULT_NAME_MAX = 255


@dataclass(frozen=True, slots=True)
class DestinationKey:
    """Where a published file lands: its real folder (device, inode) and its name in that folder."""

    device: int
    inode: int
    name: str


def destination_key(path: str) -> DestinationKey | None:
    """The :class:`DestinationKey` of ``path``, or None when its folder does not exist (or is not a folder)."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        st = os.stat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return DestinationKey(st.st_dev, st.st_ino, name)


def weights_location(dst_onnx: str, dst_weights: str) -> str:
    """The ``location`` to store for ``dst_weights``: relative to the folder of ``dst_onnx``, ``/`` separators.

    Args:
        dst_onnx: the ``.onnx`` to write.
        dst_weights: its weights file.

    Returns:
        The location, valid for :func:`~onnx_light_ref.io._read.locations.check_location_syntax` (the rule every reader
        applies).

    Raises:
        UnsafeLocationError: ``dst_weights`` ends with ``/`` or ``/.``; it is outside the folder of ``dst_onnx``
            (by path, or by real path through a symlinked subfolder: the weights would land elsewhere and the model
            would not load); its location goes through a symbolic link (a subfolder that is a symlink, even one
            staying inside the folder: onnx's loader refuses any symlink on a data path, "kernel rejected path");
            or the location would contain ``..``, not be UTF-8, or break another location rule.
    """
    raw = os.fspath(dst_weights)
    if raw.endswith(("/", "/.")) or os.path.basename(raw) in ("", ".", ".."):
        raise UnsafeLocationError(f"weights file {raw!r} names a folder, not a file (it ends with '/', '/.' or '..').")
    onnx_path = os.path.abspath(os.fspath(dst_onnx))
    weights_path = os.path.abspath(raw)
    folder = os.path.dirname(onnx_path)
    location = os.path.relpath(weights_path, folder).replace(os.sep, "/")
    if location == ".." or location.startswith("../") or os.path.isabs(location):
        raise UnsafeLocationError(
            f"weights file {raw!r} is outside the destination model's folder {folder!r}: it must be inside the folder "
            f"of the destination model (it would be stored as location {location!r}), since loaders only read "
            "external data next to (or below) the model."
        )
    try:
        location.encode("utf-8")
    except UnicodeEncodeError:  # a name of undecodable bytes (surrogate escapes): a protobuf string must be UTF-8
        raise UnsafeLocationError(
            f"weights file {raw!r} has a name that is not valid UTF-8; a model's location must be UTF-8 text "
            "(onnx cannot store it): choose another name."
        ) from None
    try:
        check_location_syntax(location, tensor_name="<destination weights>")
    except UnsafeLocationError as exc:
        raise UnsafeLocationError(
            f"weights file {raw!r} cannot be referenced from {onnx_path!r}: it would be stored as location "
            f"{location!r}, which loaders refuse ({exc})"
        ) from None
    real_folder = os.path.realpath(folder)
    real_weights_folder = os.path.realpath(os.path.dirname(weights_path))
    if not is_inside(real_folder, real_weights_folder):
        raise UnsafeLocationError(
            f"weights file {raw!r} reaches {real_weights_folder!r}, outside the destination model's folder "
            f"{real_folder!r}, through a symbolic link: the weights would land elsewhere and loaders would refuse "
            "the model."
        )
    _refuse_symlinked_folders(folder, location, raw)
    return location


def _refuse_symlinked_folders(folder: str, location: str, raw: str) -> None:
    """Refuse a location whose subfolders (below the destination model's folder) include a symbolic link.

    onnx's loader opens a data file from the model's folder with ``RESOLVE_NO_SYMLINKS`` semantics: a symlinked
    subfolder makes it fail even when the link stays inside the folder. The file name itself may be a symlink now:
    publication renames the new file over the name, so the link is replaced, never followed. A missing subfolder
    ends the walk (the writer reports it before writing).
    """
    parts = location.split("/")[:-1]
    current = folder
    for index, part in enumerate(parts):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            through = "/".join(parts[: index + 1])
            raise UnsafeLocationError(
                f"weights file {raw!r} would be written through the symbolic link {through!r} in {folder!r} "
                f"(location {location!r}): onnx refuses to load a data file through any symlink, even one staying "
                "inside the model's folder. Write to the real folder instead; nothing was written."
            )


def _name_max(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return _DEFAULT_NAME_MAX


def check_outputs(dst_onnx: str, weights_paths: Sequence[str], sources: Mapping[FileIdentity, str]) -> None:
    """:func:`check_output_files` of the ``.onnx`` and its weights files (``dst_onnx`` first)."""
    check_output_files([dst_onnx, *weights_paths], sources)


def check_output_files(
    paths: Sequence[str],
    sources: Mapping[FileIdentity, str],
    source_names: Mapping[DestinationKey, str] | None = None,
) -> None:
    """Refuse outputs that alias each other or a source, before anything is written.

    Args:
        paths: every file the job creates or replaces (``.onnx`` files, weights, indexes, arrays).
        sources: identity -> path of every file the job reads (the source ``.onnx`` included), or a description
            of it starting with ``"the "`` (``"the file of --input 'x'"``).
        source_names: where files the outputs will be read through land (real folder and name), with a
            description: names that do not exist yet (an unchecked reused reference) but will be read.

    Raises:
        FileNotFoundError: the folder of an output does not exist (or is not a folder).
        DestinationConflictError: two outputs are the same file (same real folder and name, or existing files with
            the same device and inode); an output is a source (same device and inode: the same path, a hard link, a
            symlink to it); an output exists and is a directory; an output name is longer than its folder allows.
    """
    outputs = [os.path.abspath(os.fspath(path)) for path in paths]
    keys: dict[DestinationKey, str] = {}
    identities: dict[FileIdentity, str] = {}
    for path in outputs:
        folder, name = os.path.split(path)
        key = destination_key(path)
        if key is None:
            raise FileNotFoundError(
                f"destination folder does not exist: {folder!r} (the folder of destination {path!r} does not exist "
                "or is not a folder)."
            )
        if len(os.fsencode(name)) > _name_max(folder):
            raise DestinationConflictError(
                f"destination {path!r}: its name is {len(os.fsencode(name))} bytes, longer than the "
                f"{_name_max(folder)} bytes its folder allows; nothing was written."
            )
        other = keys.get(key)
        if other is not None:
            raise DestinationConflictError(
                f"destinations {other!r} and {path!r} are the same file (same real folder and name, e.g. through a "
                "symlinked folder): one would overwrite the other."
            )
        keys[key] = path
        for identity, is_dir in _existing_identities(path):
            if is_dir:
                raise DestinationConflictError(
                    f"destination {path!r} exists and is a directory; it is never replaced (nothing was written)."
                )
            source = sources.get(identity)
            if source is not None:
                what = source if source.startswith("the ") else f"the source file {source!r}"
                raise DestinationConflictError(
                    f"destination {path!r} is {what} (the same file, a hard link of it or a symlink to it): writing "
                    "it would destroy the source. Choose another destination; nothing was written."
                )
            other = identities.get(identity)
            if other is not None and other != path:
                raise DestinationConflictError(
                    f"destinations {other!r} and {path!r} are the same existing file (a hard link or a symlink)."
                )
            identities[identity] = path
        read_as = (source_names or {}).get(key)
        if read_as is not None:
            raise DestinationConflictError(
                f"destination {path!r} is where {read_as} (same real folder and name): it would read the new bytes. "
                "Choose another destination; nothing was written."
            )


def _existing_identities(path: str) -> list[tuple[FileIdentity, bool]]:
    """(identity, is a directory) of the name itself and of what it points to, for what exists."""
    found: list[tuple[FileIdentity, bool]] = []
    for follow in (False, True):
        try:
            st = os.stat(path, follow_symlinks=follow)
        except OSError:  # absent, a dangling or looping symlink: nothing there to protect
            continue
        identity = (FileIdentity(st.st_dev, st.st_ino), stat.S_ISDIR(st.st_mode))
        if identity not in found:
            found.append(identity)
    return found
