"""Which models can reach which files: the scan behind rule 1 of the writer contract, and ``inspect FOLDER``.

A data file may be shared: ``save_model_with_shared_external_data`` (or a user by hand, or ``delay_initializers``,
whose ``ai.rt::DelayedInitializer`` nodes name files by ``filename``) makes several models read one file. Replacing
it (re-aligning one of them, saving a variant over it) silently changes what the others compute;
:mod:`onnx_light_ref.io._write.contract` refuses that with what :func:`scan_users` finds.

Which models can reach a file: under onnx's loader rule a ``location`` is relative and has no ``..``, so a model
reaches a file only from the file's own folder or from an ancestor of it. :func:`folders_reaching` lists those
folders: the file's folder and every ancestor up to ``/``, both along the path as given and along its real path (a
model beside a symlinked folder reaches the file through the link only in onnxruntime, which follows links; the real
path is what onnx's loader walks). ``/`` is the limit on purpose: stopping at the destination model's folder (the
previous rule) missed ``root/top.onnx`` reaching ``root/a/b/w.data``, and any lower limit has the same hole; the
cost is one ``scandir`` per ancestor and a read of each model found there, bounded whatever the model holds
(:mod:`~onnx_light_ref.io._read.reference_scan` streams its wire format, reading only what can name a file, and seeks
over the rest: a 2 GiB ``.onnx`` is read in milliseconds and a few hundred KiB of memory). Folders this process
cannot list are skipped (a model there is invisible to it). A model is any regular file (or symlink to one) whose
name ends with ``.onnx`` in any case (onnx and onnxruntime load ``variant.ONNX`` like any name).

What a model found there can be:

- a model: the files it references (below);
- a file protobuf refuses (truncated, garbage, not protobuf at all: broken where the scan reads, at a byte offset
  it names) is a :class:`NotAModel`: ``onnx.load`` refuses it too, so it cannot load any file. The guard logs a
  warning naming it and goes on;
- a file that may be a model but whose references cannot be read (no permission, an I/O error, nested deeper than
  protobuf's 100 levels, more fields to walk than the scan's bound, changed while read) is an
  :class:`UnreadableModel`: "cannot read" never means "references nothing", so it is taken as possibly using every
  file in its reach (its folder and below) and rule 1 refuses to replace those (the message names it and
  ``replace_shared``).

A model references a file when one of its EXTERNAL tensors (anywhere in the model) has a ``location`` (any of its
``location`` entries, if it repeats the key: onnx reads the last, another tool may read the first), or one of its
``ai.rt::DelayedInitializer`` nodes (anywhere: main graph, subgraphs, functions and their default attributes,
training graphs) has a ``filename``, that names it from the model's folder (an absolute ``filename`` as it is): the
same device and inode (so a hard link or a symlink to it counts), or, for a file not there, the same normalized path.
A name of 4096 bytes or more (``PATH_MAX``) names no file. The op's domain, type and attribute name are constants
here: ``io`` never imports ``ops``.

Each model is read once per write when the write runs inside :func:`reading_references` (a
:class:`ReferenceReader` keyed by the file's identity: device, inode, size, modification and change times); outside
one, each call reads afresh.

This module reads model metadata only and never reads a weight byte, never writes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import stat
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._read.reference_scan import CannotScanError, MalformedModelError, NamedFile, Via, named_files

logger = logging.getLogger(__name__)

_MODEL_SUFFIX = ".onnx"

FileKey = FileIdentity | str
"""An existing file by device and inode; a missing one by its normalized absolute path."""


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
class NotAModel:
    """A ``*.onnx`` file protobuf refuses (truncated, garbage, not protobuf), and where: ``onnx.load`` refuses it too,
    so it loads no file."""

    model: str
    reason: str

    def describe(self) -> str:
        """``'m.onnx', which is not an ONNX model (<reason>)``."""
        return f"{self.model!r}, which is not an ONNX model ({self.reason})"


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
        filenames), or None when the file is missing, cannot be read or is not an ONNX model.
    """
    found = read_model_references(model_path)
    return None if isinstance(found, (UnreadableModel, NotAModel)) else found


def read_model_references(model_path: str) -> dict[FileKey, ModelReference] | UnreadableModel | NotAModel | None:
    """:func:`read_references` for a guard: a :class:`NotAModel` for a file protobuf refuses, an
    :class:`UnreadableModel` (with the reason) for one that may be a model but cannot be read, None only when it is
    gone (or is no regular file: no loader opens it). Read once per :func:`reading_references` context.

    Args:
        model_path: a file (usually a ``.onnx``).

    Returns:
        The references, a :class:`NotAModel`, an :class:`UnreadableModel`, or None.
    """
    return _reader().read(model_path)


class ReferenceReader:
    """Reads each model's references once: the passes of one write (rule 1 before the first byte and again under the
    lock, rule 3, the publication's sweep and its "does a model use this file?") share one, so that a model
    unchanged in between is read once. Keyed by the file's identity (device, inode, size, modification and change
    times): a model replaced or rewritten meanwhile is read again.

    Example:
        >>> reader = ReferenceReader()
        >>> reader.read("model.onnx")  # doctest: +SKIP
        {FileIdentity(device=2049, inode=1234): ModelReference(model='model.onnx', tensor='w', ...)}
    """

    def __init__(self) -> None:
        self._read: dict[tuple[int, ...], list[NamedFile] | UnreadableModel | NotAModel] = {}
        self._warned: set[str] = set()

    def read(self, model_path: str) -> dict[FileKey, ModelReference] | UnreadableModel | NotAModel | None:
        """What :func:`read_model_references` returns for ``model_path``, read from the file at most once."""
        found = self._named(model_path)
        if found is None or isinstance(found, list):
            return None if found is None else _references(model_path, found)
        return dataclasses.replace(found, model=model_path)  # read through another name: name this one

    def warn_once(self, found: NotAModel) -> None:
        """Log that ``found`` is not counted as a model (once per file per reader)."""
        if found.model in self._warned:
            return
        self._warned.add(found.model)
        logger.warning(
            "%r is not an ONNX model: %s; onnx.load refuses it too, so it loads no file, and the writer does not "
            "count it (if it is a model still being written, let it finish and run again)",
            found.model,
            found.reason,
        )

    def _named(self, model_path: str) -> list[NamedFile] | UnreadableModel | NotAModel | None:
        try:
            st = os.stat(model_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError) as exc:  # no permission on a folder on the way, a name too long...
            return UnreadableModel(model_path, _reason(exc))
        if not stat.S_ISREG(st.st_mode):
            return None
        known = self._read.get(_read_key(st))
        if known is not None:
            return known
        try:
            fd = _open_model(model_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # EACCES, EMFILE...
            return UnreadableModel(model_path, _reason(exc))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            found = _scan(fd, st, model_path)
        finally:
            os.close(fd)
        self._read[_read_key(st)] = found
        return found


def _open_model(path: str) -> int:
    # O_NONBLOCK: a FIFO put there since the stat must not hang the open (it is refused after it).
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def _scan(fd: int, st: os.stat_result, model_path: str) -> list[NamedFile] | UnreadableModel | NotAModel:
    try:
        found = named_files(fd, st.st_size, model_path)
    except MalformedModelError as exc:
        return NotAModel(model_path, exc.problem)
    except CannotScanError as exc:
        return UnreadableModel(model_path, f"its references could not be read: {exc}")
    except OSError as exc:  # EIO...: the disk's problem, not proof the file is no model
        return UnreadableModel(model_path, _reason(exc))
    if not found.graph and not found.files:  # empty, or protobuf without a graph: it runs nothing, names nothing
        return NotAModel(model_path, "it has no graph")
    return found.files


def _read_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_current: contextvars.ContextVar[ReferenceReader | None] = contextvars.ContextVar("reference_reader", default=None)


@contextlib.contextmanager
def reading_references() -> Iterator[ReferenceReader]:
    """Within the block, every read of a model's references (:func:`scan_users`, :func:`files_referenced_near`,
    :func:`read_model_references`, rule 3's ownership) shares one :class:`ReferenceReader`: each model is read once.
    Wrap one write in it (a plan's check, its re-check under the lock and its publication); nested blocks share the
    outer reader.

    Example:
        >>> with reading_references():  # doctest: +SKIP
        ...     check_plan(plan)
        ...     publish(..., before_commit=lambda: recheck_plan(plan))
    """
    reader = _current.get()
    if reader is not None:
        yield reader
        return
    reader = ReferenceReader()
    token = _current.set(reader)
    try:
        yield reader
    finally:
        _current.reset(token)


def _reader() -> ReferenceReader:
    """The reader of the current :func:`reading_references` block, else a fresh one (each call reads afresh)."""
    return _current.get() or ReferenceReader()


def _references(model_path: str, named: list[NamedFile]) -> dict[FileKey, ModelReference]:
    """Each named file by :func:`file_key` from the model's folder, with the first tensor or node naming it and how
    many do (several names may be one file: ``w.bin``, ``./w.bin``, a hard link)."""
    folder = os.path.dirname(os.path.abspath(model_path))
    found: dict[FileKey, ModelReference] = {}
    for name in named:  # in order of the first tensor naming each: the first one wins
        key = file_key(os.path.join(folder, name.location))  # an absolute filename stays as it is
        known = found.get(key)
        count = name.count + (known.tensors if known else 0)
        first = known or ModelReference(model_path, name.label, name.location, 0, name.via)
        found[key] = dataclasses.replace(first, tensors=count)
    return found


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
    reader = _reader()
    for model_path in models_in(folders_reaching(targets)):
        if os.path.normpath(model_path) in excluded_paths or _identity(model_path) in excluded:
            continue
        scanned.append(model_path)
        found = reader.read(model_path)
        if isinstance(found, NotAModel):
            reader.warn_once(found)
            continue
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
    reader = _reader()
    for model_path in models_in(folders_reaching([os.path.join(os.path.abspath(folder), "_")])):
        references = reader.read(model_path)
        if isinstance(references, NotAModel):
            reader.warn_once(references)
        elif isinstance(references, UnreadableModel):
            unreadable.append(references)
        elif references is not None:
            found.update(references)
    return NearbyReferences(frozenset(found), tuple(unreadable))


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
