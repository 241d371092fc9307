"""Publication of output files with no moment where the destination model is broken, even if the process is killed.

Every file is written under a temp name in its destination folder and fsynced; publication then only *moves names*,
and never creates a second hard link (onnx refuses to load a file with several links). A name that already exists
is swapped with the new file by ``renameat2(RENAME_EXCHANGE)`` (the previous version lands on the temp name, one
link, and is deleted after the commit or swapped back on failure); an absent one is renamed into place.

A model is published by :meth:`OutputTransaction.publish` with the ``.onnx`` rename as the commit point, so that a
process killed at *any* system call leaves the destination ``.onnx`` describing files that hold exactly its bytes:

* weights names the previous ``.onnx`` does not reference are swapped in first (the previous model never reads
  them), then the new ``.onnx`` is swapped in: one commit;
* a weights name the previous ``.onnx`` references (re-writing an output over itself) cannot change under it. The
  new file is first published under a *bridge* name (``.olr~<tag>~<pid>~<random>.bridge``) by a bridge ``.onnx``
  that references it (commit A: the destination computes the new values), then a copy of it (a reflink clone where
  the filesystem can) takes the final name, which nothing references any more, then the final ``.onnx`` is swapped
  in (commit B: same values, final names) and the bridge deleted. Between A and B a killed run leaves a complete
  new model that references its bridge file; the next publication to that destination deletes it.

A family of models sharing one set of weights files is published the same way by
:meth:`FamilyTransaction.publish_models` (the same :class:`_Publication`, with several models): the weights names no
previous member references first, then, when a previous member references one, every member's commit A before the
copies to the final names, then every member's final commit, one after the other (a kill between two members leaves
some new and some previous, each consistent). Before its first move it records the weights names it writes in a
*journal* (``.olr~<tag>~<pid>~<random>.journal`` beside the first weights file, deleted after the last commit): a run
killed after moving a weights name in and before any member references it leaves a file no model uses, and the
journal is what tells the next run that this file is the family's own leftover (:func:`journal_leftovers`, read by
:mod:`~onnx_light_ref.io.write.ownership`). A one-model publication whose weights are not all named after the model
(``--weights w.bin``) writes the same journal, for the same window.

Temp names are ``.olr~<hash of the final name>~<pid>~<random>.tmp`` (at most 50 bytes whatever the final name) and
their writer holds an ``flock`` on them until they are published or deleted. :func:`sweep_dead_writers` removes such
files (every final name's, so a killed sharded run's shards do not stay when later runs write fewer) only when the
name is one of ours, the writer is gone (pid dead *and* the lock free: a writer in another pid namespace still holds
its lock), it is not one of the current job's sources, and no model that can reach the folder references it (none
is swept while such a model cannot be read: it may reference any of them). The sweep holds the file's lock while it
decides and removes it, and a writer that has just created a temp file gives the name up when it finds the lock taken
or the name gone (:func:`_create_locked`): the two never both own it. Temp
files are swept when a job stages its first file in a folder (before space is reserved, so their disk is free
again), unless a publication holds the folder's lock; bridge files only under the destination folder's lock,
before the first move and again after the commit.
All moves of one publication happen under an exclusive ``flock`` on each destination folder, so two jobs writing
the same destination publish one after the other. ``durable=False`` skips every ``fsync`` (files and folders) but
keeps the temp files, the lock and the atomic moves: same bytes, no power-loss durability.

What a publication reports (``docs/durability.md``, "Outcomes"): an ``OSError`` only while nothing is published
(every move undone: the destination is the previous model); after the commit, the steps that follow (the ``fsync``
making it durable, removing previous versions and bridge files that no model uses, releasing the folder locks) all
run even when one fails or is interrupted, and their failures are raised together as
:class:`~onnx_light_ref.errors.PublishedWithErrorsError` (:class:`AfterCommit`); an interrupt is re-raised after
them. With
``durable=True`` an ``fsync`` error (EIO, ENOSPC, EROFS...) of a file or folder is an error (:func:`fsync_or_raise`);
only "not supported" answers (EINVAL, ENOTSUP) are ignored.

This module never writes outside the destination folders, never creates a hard link, and never deletes a file that
is not one of its own temp, bridge or journal files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

import onnx

from onnx_light_ref.errors import InvalidModelError, PublishedWithErrorsError
from onnx_light_ref.io.arguments import check_bool
from onnx_light_ref.io.plan.shard_names import is_named_after_model
from onnx_light_ref.io.posix import pread_exact, pwrite_all
from onnx_light_ref.io.read.locations import FileIdentity
from onnx_light_ref.io.read.model_file import serialize_model
from onnx_light_ref.io.read.sharing import NearbyReferences, files_referenced_near
from onnx_light_ref.io.read.walker import iter_tensors
from onnx_light_ref.io.read.wire import load_model_stripped
from onnx_light_ref.io.write.space import reserve_space

__all__ = [
    "AfterCommit",
    "FamilyTransaction",
    "FolderLock",
    "OutputTransaction",
    "StagedFile",
    "folder_lock",
    "fsync_folder",
    "fsync_or_raise",
    "is_publisher_file",
    "journal_leftovers",
    "publish_all",
    "remove_own_bridge_files",
    "remove_stale_temp_files",
    "staged_files",
    "sweep_dead_writers",
]

logger = logging.getLogger(__name__)

_TEMP_PREFIX = ".olr~"
_TEMP_SUFFIX = ".tmp"
_BRIDGE_SUFFIX = ".bridge"
# Any temp or bridge name of this module, whatever final name it was made for: group 1 the pid, group 2 the suffix.
# Used with fullmatch only (``match`` with ``$`` also takes a name ending in a newline) and with ASCII digits only
# (``\d`` takes Arabic-Indic and other digits, which int() reads): a user's file named almost like ours is not ours.
_ANY_OWN_NAME = re.compile(
    re.escape(_TEMP_PREFIX)
    + r"[0-9a-f]{12}~([0-9]{1,10})~[0-9a-f]{16}("
    + re.escape(_TEMP_SUFFIX)
    + "|"
    + re.escape(_BRIDGE_SUFFIX)
    + ")"
)

# fsync answers meaning "this file or filesystem does not fsync" (some FUSE and special filesystems), as opposed to
# an I/O error: ignored. Anything else (EIO, ENOSPC, EROFS, EDQUOT...) means the data may not be on disk.
_FSYNC_UNSUPPORTED = frozenset((errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)))

# unlink answers that mean "not ours to remove" (another user's file in a sticky folder): a sweep skips the file.
_NOT_OURS = frozenset((errno.EPERM, errno.EACCES))

BeforeCommit = Callable[[], Collection[FileIdentity] | None]
"""A re-check run under the folder lock right before the first move; returns identities never to delete."""

# Test seam for deterministic fault injection: when set, called with a short name of every system call the
# publication is about to make (tests/hardening/test_publish_kill_points.py kills the process at the k-th one).
# Always None in production.
before_syscall: Callable[[str], None] | None = None


def _syscall(name: str) -> None:
    if before_syscall is not None:
        before_syscall(name)


def _name_tag(final_name: str) -> str:
    """A short, stable tag of the final name: temp names stay short and a sweep only sees its own destination's."""
    return hashlib.sha256(os.fsencode(final_name)).hexdigest()[:12]


def _own_name(final_path: str, suffix: str) -> str:
    folder, name = os.path.split(final_path)
    return os.path.join(folder, f"{_TEMP_PREFIX}{_name_tag(name)}~{os.getpid()}~{secrets.token_hex(8)}{suffix}")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


# Base names of the temp and bridge files this process's StagedFile objects own right now (registered before the file
# is created, dropped when it is published or deleted). A name of this pid that is not here is a leftover (a removal
# that failed after a commit): a long-running process must be able to sweep its own, not only a dead one's.
_LIVE_TEMPS: set[str] = set()


def _writer_gone(pid: int, name: str) -> bool:
    """The writer of the temp or bridge file ``name`` (its pid) is gone, or is this process and no longer owns it."""
    if pid == os.getpid():
        return name not in _LIVE_TEMPS
    return not _pid_alive(pid)


@dataclass(frozen=True)
class SweepFailure:
    """A dead writer's file that :func:`sweep_dead_writers` could not remove, and why."""

    path: str
    error: OSError


def _dead_writer_files(
    folder: str, suffixes: Collection[str], keep: Collection[FileIdentity]
) -> list[tuple[str, os.stat_result]]:
    """Temp/bridge files of ``folder`` with one of ``suffixes`` whose writer's pid is gone, not in ``keep``, with the
    ``lstat`` seen (their lock is tested by the caller, who holds it while it removes them)."""
    kept = set(keep)
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
        for entry in entries:
            match = _ANY_OWN_NAME.fullmatch(entry.name)
            if not match or match.group(2) not in suffixes or not entry.is_file(follow_symlinks=False):
                continue
            if not _writer_gone(int(match.group(1)), entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if FileIdentity(st.st_dev, st.st_ino) not in kept:
                found.append((entry.path, st))
    return sorted(found, key=lambda item: item[0])


@contextlib.contextmanager
def _lock_of_dead_file(path: str, expected: os.stat_result) -> Iterator[bool]:
    """Hold the ``flock`` of the file at ``path`` (still the file listed) for the block; False when its writer holds
    it, or it cannot be tested.

    A sweep removes a file only inside this block: a writer that creates a temp file locks it right after, and
    gives the name up when the lock is taken (:func:`_create_locked`), so the two never both think they own it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield False
        return
    try:
        st = os.fstat(fd)
        locked = (st.st_dev, st.st_ino) == (expected.st_dev, expected.st_ino) and stat.S_ISREG(st.st_mode)
        if locked:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                locked = False
        yield locked
    finally:
        os.close(fd)  # releases the sweep's lock


def _lock_free(path: str, expected: os.stat_result) -> bool:
    """True when nobody holds the flock of the file at ``path`` (still the file that was listed)."""
    with _lock_of_dead_file(path, expected) as free:
        return free


@contextlib.contextmanager
def _folder_unless_publishing(folder: str) -> Iterator[bool]:
    """The folder's publication lock for the block, when no publication holds it; False when one does.

    A sweep outside a publication runs only then: during a publication, a previous version swapped onto a temp name
    is nobody's lock, and a writer whose pid this process cannot see (another pid namespace) still needs it to undo.
    A folder that cannot be opened or locked here (no ``flock``) is swept as a publication would publish: unlocked.
    """
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:
            pass
        yield True
    finally:
        os.close(fd)


def _identity_of(path: str) -> FileIdentity | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def _referenced(path: str, references: Collection[FileIdentity | str]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return True  # gone or unreadable: nothing to remove
    return FileIdentity(st.st_dev, st.st_ino) in references or os.path.normpath(path) in references


def sweep_dead_writers(
    folder: str,
    *,
    keep: Collection[FileIdentity] = (),
    bridges: bool = False,
    failures: list[SweepFailure] | None = None,
    nearby: Callable[[str], NearbyReferences] = files_referenced_near,
) -> list[str]:
    """Delete the temp files (and, with ``bridges``, the bridge files) that dead writers left in ``folder``.

    Every final name's files are candidates (a killed sharded run leaves one temp file per shard, each a shard of
    disk, whatever the later runs write). A file is removed only when its name is one of this module's, it is a
    regular file, its writer is gone (pid dead, see :func:`_dead_writer_files`, and its lock free: the sweep holds
    that lock while it decides and removes, so a writer that has just created the file and not yet locked it gives
    the name up instead, :func:`_create_locked`), its identity is not in ``keep`` (the current job's sources) and no
    model that can reach ``folder`` references it (the ``.onnx`` files in ``folder`` and its ancestors: a run killed
    between its two commits leaves a model on bridge names, and a variant saved from it references them too). While
    one of those ``.onnx`` files cannot be read as a model, nothing is removed (a warning names it): it may reference
    any of them. Bridge files are only swept under the folder lock (by a publication); temp files also outside it,
    but never while a publication holds it (:func:`remove_stale_temp_files`).

    Args:
        folder: the destination folder.
        keep: identities never removed.
        bridges: also sweep bridge files (only under :func:`folder_lock` of ``folder``).
        failures: when given, a removal that fails is recorded there and the sweep goes on; else it raises.
        nearby: what the models that can reach ``folder`` reference (a publication passes the answer it already
            read under its folder lock, so the models are not parsed twice).

    Returns:
        The paths removed, sorted.

    Raises:
        OSError: a removal failed (without ``failures``). A file another user owns in a sticky folder (EPERM,
            EACCES) is skipped with a warning, never an error: it is not ours to remove.
    """
    suffixes = (_TEMP_SUFFIX, _BRIDGE_SUFFIX) if bridges else (_TEMP_SUFFIX,)
    candidates = _dead_writer_files(folder, suffixes, keep)
    references: NearbyReferences | None = None  # read only when there is something to remove
    removed = []
    for path, listed in candidates:
        with _lock_of_dead_file(path, listed) as held:
            if not held:
                continue
            if references is None:
                references = nearby(folder)
                if references.unreadable:
                    # "Cannot parse" is not "references nothing": such a model may load any of these files.
                    logger.warning(
                        "kept %d file(s) left by a killed run in %s: %s may use them; move it away (or repair it) "
                        "to let the next run remove them",
                        len(candidates),
                        folder,
                        ", ".join(model.describe() for model in references.unreadable),
                    )
                    return []
            if _identity_of(path) != FileIdentity(listed.st_dev, listed.st_ino):
                continue  # renamed meanwhile: not the file whose lock is held
            if _referenced(path, references.keys):
                logger.info("kept %s left by a killed run: a model references it", path)
                continue
            try:
                _syscall("unlink")
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno in _NOT_OURS:
                    logger.warning("cannot remove %s left by a killed run (%s); skipped", path, exc.strerror)
                    continue
                if failures is None:
                    raise
                failures.append(SweepFailure(path, exc))
                continue
        removed.append(path)
        logger.info("removed %s left by a killed run", path)
    return removed


def remove_stale_temp_files(final_path: str, *, keep: Collection[FileIdentity] = ()) -> list[str]:
    """Delete the temp files dead writers left in the folder of ``final_path``; return the names removed.

    :func:`sweep_dead_writers` without bridge files (those are swept under the folder lock by a publication), and
    only when no publication holds the folder's lock (it sweeps under it): a writer in another pid namespace, whose
    pid looks dead here, has the previous versions of its final names on its temp names, unlocked, until its commit.
    """
    folder = os.path.dirname(os.path.abspath(final_path))
    with _folder_unless_publishing(folder) as free:
        if not free:
            return []  # a publication holds the folder: it sweeps under its lock, and so does the next one
        return [os.path.basename(path) for path in sweep_dead_writers(folder, keep=keep)]


def remove_own_bridge_files(folders: Collection[str]) -> list[str]:
    """After an interrupt: delete this process's bridge files in ``folders`` that no model references.

    The publication's own rollback removes its bridge files, or keeps them when a published model references them
    (commit A could not be undone: the model stands on its bridge names). What is left with this pid is a file the
    interrupt caught between two steps (its rename to the bridge name and the record of it), or that an interrupted
    cleanup after the commit did not reach. A file any model that can reach its folder references is never removed
    (the next publication to that destination replaces it). Only while no publication holds the folder's lock (a
    publication sweeps under it: once this process has exited, the next one removes what is left).

    Args:
        folders: the command's destination folders (missing ones are skipped).

    Returns:
        The paths removed.
    """
    removed = []
    for folder in dict.fromkeys(os.path.abspath(folder) for folder in folders):
        with _folder_unless_publishing(folder) as free:
            if not free:
                continue
            candidates = []
            with contextlib.suppress(OSError), os.scandir(folder) as entries:
                for entry in entries:
                    match = _ANY_OWN_NAME.fullmatch(entry.name)
                    own = match is not None and match.group(2) == _BRIDGE_SUFFIX and int(match.group(1)) == os.getpid()
                    if own and entry.is_file(follow_symlinks=False):
                        candidates.append(entry.path)
            if not candidates:
                continue
            references = files_referenced_near(folder)
            if references.unreadable:  # such a model may reference any of them: keep them all
                logger.warning(
                    "kept %d bridge file(s) in %s: %s may use them; the next run removes them once it can be read",
                    len(candidates),
                    folder,
                    ", ".join(model.describe() for model in references.unreadable),
                )
                continue
            for path in sorted(candidates):
                if _referenced(path, references.keys):
                    logger.info("kept %s: a published model references it", path)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    _syscall("unlink")
                    os.unlink(path)
                    removed.append(path)
    return removed


_CREATE_ATTEMPTS = 8  # a sweep takes a name from its creator only in a window of two system calls: 8 misses is a bug


def _create_locked(final_path: str, suffix: str) -> tuple[str, int, int]:
    """A new temp file of ``final_path``: its path, a descriptor to write it, and the descriptor holding its lock.

    Between the exclusive create and the ``flock`` the file is visible and unlocked; a sweep of another process
    (whose pid check cannot see this writer, e.g. from another pid namespace) may judge it dead then. A sweep removes
    a file only while holding its lock (:func:`sweep_dead_writers`), so the creator, once locked, checks that its
    name still names its file, and abandons a name a sweep holds or took (and tries a new one): a temp file that
    exists and is locked by its writer is never swept. Every failure after the create removes the file again.

    Raises:
        OSError: the create, ``dup`` (EMFILE...) or ``fstat`` failed (nothing is left), or a sweep took
            :data:`_CREATE_ATTEMPTS` names in a row.
    """
    for _ in range(_CREATE_ATTEMPTS):
        created = _try_create_locked(final_path, suffix)
        if created is not None:
            return created
    raise OSError(
        errno.EAGAIN,
        f"could not create a temp file beside {final_path!r}: another process removed each of the "
        f"{_CREATE_ATTEMPTS} names tried before it could be locked",
    )


def _try_create_locked(final_path: str, suffix: str) -> tuple[str, int, int] | None:
    """One attempt of :func:`_create_locked`; None when a sweep holds or removed the new name."""
    path = _own_name(final_path, suffix)
    name = os.path.basename(path)
    _LIVE_TEMPS.add(name)  # before it exists: a sweep in another thread of this process skips it
    fd: int | None = None
    lock_fd: int | None = None
    try:
        _syscall("open")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        _syscall("dup")
        lock_fd = os.dup(fd)
        if _lock_new_file(lock_fd, path) and _names_file(path, fd):
            return path, fd, lock_fd
        logger.debug("a sweep of another process took the new temp file %s before it was locked; new name", path)
    except BaseException:
        _abandon(path, fd, lock_fd)
        raise
    _abandon(path, fd, lock_fd)
    return None


def _lock_new_file(lock_fd: int, path: str) -> bool:
    """Lock a temp file just created; False when another process holds its lock (a sweep about to remove it)."""
    try:
        _syscall("flock")
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:  # a filesystem without flock: the pid in the name still protects the file
        logger.debug("cannot lock temp file %s: %s", path, exc)
    return True


def _names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (a sweep may have removed it before it was locked)."""
    try:
        _syscall("stat")
        named, opened = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _abandon(path: str, fd: int | None, lock_fd: int | None) -> None:
    """Undo a failed :func:`_try_create_locked`: remove the file if ``path`` still names it, close, forget the name.

    Runs while an error propagates (the one the caller must see): its own failures are logged, never raised.
    """
    try:
        if fd is not None and _names_file(path, fd):
            _syscall("unlink")
            os.unlink(path)
    except OSError as exc:
        logger.warning("could not remove the temp file %s (%s); a later run sweeps it", path, exc)
    finally:
        for descriptor in (lock_fd, fd):
            if descriptor is not None:
                with contextlib.suppress(OSError):
                    os.close(descriptor)
        _LIVE_TEMPS.discard(os.path.basename(path))


class StagedFile:
    """A new file written under a temp name next to ``final_path``; it takes the final name only when published.

    Created with mode ``0o666 & ~umask`` like any file the user creates (``mkstemp`` would give 0600). With
    ``durable=False`` neither the file nor its folder is ever fsynced (the moves stay atomic). ``suffix``: the temp
    name's (``.tmp``; a family publication's journal, which is never published, uses ``.journal``).
    """

    def __init__(
        self,
        final_path: str,
        *,
        durable: bool = True,
        keep: Collection[FileIdentity] = (),
        suffix: str = _TEMP_SUFFIX,
    ) -> None:
        self.durable = check_bool("durable", durable)
        self.final_path = os.path.abspath(final_path)
        folder = os.path.dirname(self.final_path)
        if not os.path.isdir(folder):
            raise FileNotFoundError(errno.ENOENT, f"destination folder does not exist: {folder!r}", folder)
        remove_stale_temp_files(self.final_path, keep=keep)
        self.committed = False
        self.keep_temp = False  # set when a published model references the temp name (see _Publication)
        self.temp_path, fd, lock_fd = _create_locked(self.final_path, suffix)
        self.fd: int | None = fd
        # A second descriptor of the same open file holds the temp file's lock until it is renamed or deleted, so
        # that closing `fd` after the write (flush) does not release it.
        self._lock_fd: int | None = lock_fd

    def rename_temp(self, new_temp_path: str) -> None:
        """Move the temp file to ``new_temp_path`` (a bridge name), still owned by this object."""
        _LIVE_TEMPS.add(os.path.basename(new_temp_path))
        _syscall("rename")
        os.rename(self.temp_path, new_temp_path)
        _LIVE_TEMPS.discard(os.path.basename(self.temp_path))
        self.temp_path = new_temp_path

    def _release_lock(self) -> None:
        """Release the lock and the ownership of the temp name (published or deleted: what is left is not ours)."""
        _LIVE_TEMPS.discard(os.path.basename(self.temp_path))
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            _syscall("close")
            os.close(fd)

    def write_all(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write ``data`` at ``offset`` (positional, loops on short writes)."""
        assert self.fd is not None
        _syscall("pwrite")
        pwrite_all(self.fd, data, offset)

    def set_size(self, size: int) -> None:
        """Set the final file size; gaps never written read as zeros."""
        assert self.fd is not None
        os.ftruncate(self.fd, size)

    def flush(self) -> None:
        """fsync the content (when durable) and close the descriptor (the file keeps its temp name)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                if self.durable:
                    fsync_or_raise(fd, f"{self.final_path!r} (staged as {os.path.basename(self.temp_path)!r})")
            finally:
                _syscall("close")
                os.close(fd)

    def commit(self) -> None:
        """Publish this one file alone: fsync, then move it to the final path (the previous file is deleted)."""
        publish_all([self])

    def discard(self) -> None:
        """Close and delete the temp file (no-op after commit); never raises ``OSError``.

        It runs while another error propagates (the one the caller must see): a removal the filesystem refuses
        (remounted read-only, EIO) is logged and the file left to a later sweep.
        """
        try:
            if self.fd is not None:
                fd, self.fd = self.fd, None
                os.close(fd)
            if not self.committed and not self.keep_temp:
                with contextlib.suppress(FileNotFoundError):
                    _syscall("unlink")
                    os.unlink(self.temp_path)
        except OSError as exc:
            logger.warning("could not remove the temp file %s (%s); a later run sweeps it", self.temp_path, exc)
        finally:
            with contextlib.suppress(OSError):
                self._release_lock()


def fsync_or_raise(fd: int, what: str) -> None:
    """``fsync(fd)`` for ``durable=True``: an I/O error raises, naming ``what``; "not supported" is ignored.

    EIO, ENOSPC, EROFS, EDQUOT... mean the bytes or the names may not be on disk: the publication must not report
    a durable result. EINVAL and ENOTSUP/EOPNOTSUPP mean the file or filesystem does not fsync (some FUSE and
    special filesystems): nothing more can be done there, and the moves stay atomic.

    Raises:
        OSError: the same ``errno``, with a message naming ``what``.
    """
    try:
        _syscall("fsync")
        os.fsync(fd)
    except OSError as exc:
        if exc.errno in _FSYNC_UNSUPPORTED:
            logger.debug("fsync of %s is not supported here: %s", what, exc)
            return
        raise OSError(
            exc.errno,
            f"fsync of {what} failed ({exc.strerror or exc}): its data may not be on disk (durable=False, "
            "--no-fsync, skips every fsync)",
        ) from exc


def fsync_folder(folder: str) -> None:
    """fsync a folder (its names: the moves of a publication), raising on I/O errors as :func:`fsync_or_raise`.

    Raises:
        OSError: the folder cannot be opened (it must be, to be fsynced), or its fsync failed.
    """
    try:
        _syscall("open")
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open the folder {folder!r} to fsync it ({exc.strerror or exc})") from exc
    try:
        fsync_or_raise(fd, f"the folder {folder!r}")
    finally:
        _syscall("close")
        os.close(fd)


def _folders_of(paths: Collection[str]) -> list[str]:
    return list(dict.fromkeys(os.path.dirname(path) for path in paths))


def _fsync_folders(paths: Collection[str], durable: bool) -> None:
    if durable:
        for folder in _folders_of(paths):
            fsync_folder(folder)


class AfterCommit:
    """The steps after a commit point: each runs even when an earlier one fails, and no failure is an ``OSError``.

    Once the new model is in place, an ``OSError`` (which means "destination unchanged") would be a lie, and a
    caller restoring its state on it would undo a published model. Each step's ``OSError`` is recorded instead;
    :meth:`finish` raises them together as :class:`~onnx_light_ref.errors.PublishedWithErrorsError`, naming what is
    published, which fsync failed (the commit may not survive a power loss) and which hidden files are left (a later
    publication into the folder sweeps them). Used by every publication of this module: one model, a family of
    models (``models``: every member now in place), or files that reference nothing (:func:`publish_all`).
    """

    def __init__(self, published: str, *, what: str | None = None, models: Sequence[str] = ()) -> None:
        self.published = published  # the .onnx (or first file) that is now in place
        self.models = tuple(models) or (published,)
        self.what = what if what is not None else ", ".join(repr(path) for path in self.models)
        self.errors: list[OSError] = []
        self.problems: list[str] = []
        self.leftover_files: list[str] = []
        self.sync_failed = False

    def record(self, exc: OSError, problem: str) -> None:
        """Record a failed step: ``problem`` says what failed (logged, and part of :meth:`finish`'s message)."""
        self.errors.append(exc)
        self.problems.append(problem)
        logger.info("%s is published, but %s", self.what, problem)  # the error raised by finish() says it too

    def fsync_folders(self, paths: Collection[str], durable: bool) -> None:
        """fsync the folders of ``paths`` (when ``durable``), every one even when one fails."""
        if not durable:
            return
        for folder in _folders_of(paths):
            try:
                fsync_folder(folder)
            except OSError as exc:
                self.sync_failed = True
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                self.record(exc, f"the fsync of the folder {folder!r} that makes it durable failed ({reason})")

    def remove(self, path: str) -> None:
        """Delete one hidden file of the publication (a previous version, a bridge file); absent is fine."""
        try:
            _syscall("unlink")
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.leftover_files.append(path)
            self.record(exc, f"removing the hidden file {path!r} failed ({exc.strerror or exc})")

    def sweep(
        self,
        folders: Collection[str],
        keep: Collection[FileIdentity],
        nearby: Callable[[str], NearbyReferences] = files_referenced_near,
    ) -> None:
        """:func:`sweep_dead_writers` (bridge files included) of each folder, under the caller's folder lock."""
        # A removal that just failed is reported as left over, not retried here (the report must stay true).
        keep = set(keep) | {identity for path in self.leftover_files if (identity := _identity_of(path)) is not None}
        for folder in dict.fromkeys(folders):
            failures: list[SweepFailure] = []
            try:
                sweep_dead_writers(folder, keep=keep, bridges=True, failures=failures, nearby=nearby)
            except OSError as exc:  # listing the folder or reading a model failed
                self.record(exc, f"sweeping the files killed runs left in {folder!r} failed ({exc.strerror or exc})")
            for failure in failures:
                self.leftover_files.append(failure.path)
                reason = failure.error.strerror or failure.error
                self.record(failure.error, f"removing {failure.path!r}, left by a killed run, failed ({reason})")

    def attempt(self, call: Callable[[], None], problem: str) -> None:
        """Run ``call``; an ``OSError`` is recorded as ``problem`` (e.g. closing a lock descriptor)."""
        try:
            call()
        except OSError as exc:
            self.record(exc, f"{problem} ({exc.strerror or exc})")

    def finish(self) -> None:
        """Raise :class:`~onnx_light_ref.errors.PublishedWithErrorsError` when any step failed; else nothing.

        Raises:
            PublishedWithErrorsError: with every failure, the first one as ``__cause__``.
        """
        if not self.errors:
            return
        several = len(self.models) > 1
        hint = []
        if self.sync_failed:
            hint.append(
                f"the new model{'s are' if several else ' is'} in place but may not survive a power loss: run the job "
                "again or sync"
            )
        if self.leftover_files:
            hint.append(
                f"{len(self.leftover_files)} hidden file(s) are left; the next publication into this folder removes "
                "them"
            )
        published = "are published (every new model is in place and loads)" if several else _PUBLISHED
        message = (
            f"{self.what} {published}, but " + "; ".join(self.problems) + (f" ({'; '.join(hint)})" if hint else "")
        )
        raise PublishedWithErrorsError(
            message,
            model_path=self.published,
            errors=self.errors,
            leftover_files=self.leftover_files,
            sync_failed=self.sync_failed,
            published_models=self.models,
        ) from self.errors[0]


_PUBLISHED = "is published (the new model is in place and loads)"


# ------------------------------------------------------------------------------------------------- atomic moves

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _load_renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, another libc: publication falls back to rename
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def _exchange(first: str, second: str) -> bool:
    """Swap the names ``first`` and ``second`` in one system call; False when the kernel or filesystem cannot.

    Raises:
        FileNotFoundError: one of the two names does not exist.
        OSError: any other failure of ``renameat2``.
    """
    if _renameat2 is None:
        return False
    _syscall("renameat2")
    if _renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), first, None, second)


@dataclass(frozen=True)
class _Move:
    """One name moved by a publication, and how to undo it.

    ``kind``: ``"exchanged"`` (``temp`` now holds the previous file at ``final``), ``"renamed"`` (``final`` was
    absent; ``temp`` is now free) or ``"replaced"`` (no exchange support: the previous file is gone).
    """

    kind: str
    temp: str
    final: str


def _move(temp: str, final: str) -> _Move:
    """Give ``final`` the file at ``temp`` atomically; the previous file at ``final`` (if any) goes to ``temp``."""
    try:
        if _exchange(temp, final):
            return _Move("exchanged", temp, final)
    except FileNotFoundError:
        if not os.path.lexists(temp):
            raise
        _syscall("rename")
        os.replace(temp, final)  # `final` is absent (the folder lock keeps our own writers away)
        return _Move("renamed", temp, final)
    logger.debug("this filesystem cannot exchange names; %s replaces %s without a way back", temp, final)
    _syscall("rename")
    os.replace(temp, final)
    return _Move("replaced", temp, final)


def _undo(move: _Move) -> None:
    if move.kind == "exchanged":
        if not _exchange(move.temp, move.final):
            raise OSError(errno.EINVAL, f"cannot swap {move.final!r} back")
    else:
        _syscall("rename")
        os.rename(move.final, move.temp)


def _undo_all(moves: Sequence[_Move]) -> int:
    """Undo ``moves`` from the last one; return how many stay done (0: everything is as before).

    Every prefix of a publication's moves is a state a crash may leave (the previous or the new model), so undoing
    stops, leaving that prefix, at the first move that cannot be undone: one that replaced a file without an
    exchange (the previous file is gone), or whose undoing fails.
    """
    for index in range(len(moves) - 1, -1, -1):
        move = moves[index]
        if move.kind == "replaced":
            logger.error("%s was replaced (no RENAME_EXCHANGE here) and cannot be restored", move.final)
            return index + 1
        try:
            _undo(move)
        except OSError as exc:  # keep the original error; say what could not be undone
            logger.error("could not restore %s after a failed publication: %s", move.final, exc)
            return index + 1
    return 0


class _InUse:
    """What the models that can reach a folder reference (:func:`files_referenced_near`), read once per folder."""

    def __init__(self) -> None:
        self._by_folder: dict[str, NearbyReferences] = {}

    def references(self, path: str) -> NearbyReferences:
        """For the folder of ``path``."""
        return self.of_folder(os.path.dirname(path))

    def of_folder(self, folder: str) -> NearbyReferences:
        if folder not in self._by_folder:
            self._by_folder[folder] = files_referenced_near(folder)
        return self._by_folder[folder]


def _remove_unless_used(after: AfterCommit, path: str, in_use: _InUse) -> None:
    """After a commit: delete a hidden file of the publication (a previous version, a bridge file) unless a model
    that can reach its folder references it, e.g. a variant another process saved from the model while it stood on
    its bridge names: deleting that would break the variant. Kept files are logged; a later sweep removes them once
    no model uses them."""
    if not os.path.lexists(path):
        return
    try:
        near = in_use.references(path)
    except OSError as exc:  # listing a folder or reading a model failed: what uses the file is unknown
        after.leftover_files.append(path)
        after.record(exc, f"checking which models use the hidden file {path!r} failed ({exc.strerror or exc})")
        return
    if near.unreadable:  # "cannot parse" is not "references nothing": it may use this file
        logger.warning(
            "kept the hidden file %s: %s cannot be read as a model and may reference it; a later publication into "
            "the folder removes it once that model is readable or gone",
            path,
            ", ".join(model.describe() for model in near.unreadable),
        )
        return
    if _referenced(path, near.keys):
        logger.warning(
            "kept the hidden file %s: a model that can reach its folder references it (saved from the model while "
            "it was being published); a later publication into the folder removes it once no model uses it",
            path,
        )
        return
    after.remove(path)


def _remove_dead_journals(after: AfterCommit, weights_base: str) -> None:
    """After the last commit: the journals dead runs of the same weights set left (their files are this run's now)."""
    for path in _dead_journals(weights_base):
        after.remove(path)


def _run_every_step(steps: Sequence[Callable[[], None]]) -> None:
    """Run each step; an interrupt (``KeyboardInterrupt``) does not stop the ones after it, and is re-raised at the
    end: after a commit, stopping half-way would leave hidden files no later step of this process removes."""
    interrupted: BaseException | None = None
    for step in steps:
        try:
            step()
        except KeyboardInterrupt as exc:
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def _delete_previous(moves: Sequence[_Move], after: AfterCommit) -> None:
    """After the commit: delete the previous versions the exchanges left under temp names."""
    for move in moves:
        if move.kind == "exchanged":
            after.remove(move.temp)


# ------------------------------------------------------------------------------------------- the transaction


class OutputTransaction:
    """The output files of one job, published together: N weights files, then the ``.onnx`` that points at them.

    Use as a context manager. :meth:`stage` creates each weights file under a temp name; the caller writes it (through
    :attr:`StagedFile.fd` or :meth:`StagedFile.write_all`) and sets its size. :meth:`publish` then stages the
    ``.onnx`` from its serialized bytes and publishes everything with the ``.onnx`` as the commit point (see the
    module docstring). Leaving the block on an exception deletes every temp file, so a failed job leaves each
    destination exactly as it was.

    Example::

        with OutputTransaction(durable=True) as outputs:
            weights = outputs.stage("out/model.onnx.data")
            weights.write_all(payload, 0)
            outputs.publish("out/model.onnx", model.SerializeToString())

    Args:
        durable: fsync every file and folder before and after each commit (default). ``False`` skips every fsync but
            keeps the temp files and the atomic moves: the same bytes, without power-loss durability.
        keep: identities of the job's source files; the stale-temp sweep never removes them.
    """

    def __init__(self, *, durable: bool = True, keep: Collection[FileIdentity] = ()) -> None:
        self.durable = check_bool("durable", durable)
        self.keep = frozenset(keep)
        self.files: list[StagedFile] = []
        self._published = False

    @property
    def committed(self) -> bool:
        """True once the new model is in place (even when a later step failed or was interrupted)."""
        return self._published

    def __enter__(self) -> OutputTransaction:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc_type is not None:
            _discard_all(self.files)

    def stage(self, final_path: str) -> StagedFile:
        """Create the temp file of ``final_path`` (a weights file); it is published by :meth:`publish`."""
        staged = StagedFile(final_path, durable=self.durable, keep=self.keep)
        self.files.append(staged)
        return staged

    def publish(
        self,
        model_path: str,
        model_bytes: bytes,
        *,
        before_commit: BeforeCommit | None = None,
        result: object = None,
        weights_set: str | None = None,
    ) -> StagedFile:
        """Write the ``.onnx`` under a temp name, then publish the staged weights and it, the ``.onnx`` rename last.

        ``before_commit`` (when given) runs after every file is flushed, under the folder lock, right before the first
        move: the writer contract's re-check (:func:`~onnx_light_ref.io.write.contract.recheck_plan`: sharers saved
        meanwhile, files that appeared at an output name, ``link``'s checkpoint). What it raises leaves every
        destination as it was; the identities it returns are files other models reference, which this publication
        never deletes (a bridge file a variant was saved against), on top of ``keep``. ``result`` (the writer's
        return value) is attached to a :class:`~onnx_light_ref.errors.PublishedWithErrorsError`, so its caller still
        learns what was written.

        When a staged weights file is not named after the model (``--weights w.bin``), the names of the weights files
        are first recorded in a journal (as :meth:`FamilyTransaction.publish_models` does), named after
        ``weights_set`` (the first file of the weights set, the writer contract's ``ShardSet.base``; default: the
        first staged file): a run killed after moving such a name in and before its commit leaves a file no model
        references, which the next run of the same job recognizes as its own through the journal.

        Returns the ``.onnx``'s :class:`StagedFile` (committed).

        Raises:
            OSError: writing, an fsync or a move failed before the commit; every move is undone (the destination is
                the previous model).
            PublishedWithErrorsError: the new model is published, but a step after the commit failed (or the final
                names failed and the new model stays published on bridge names); see :class:`AfterCommit`.
        """
        weights = [staged.final_path for staged in self.files]
        journal = _journal_for(weights, model_path, weights_set)
        return self._publish([(model_path, model_bytes)], before_commit, result, journal)[0]

    def publish_models(
        self,
        models: Sequence[tuple[str, bytes]],
        *,
        before_commit: BeforeCommit | None = None,
        result: object = None,
        journal: str | None = None,
    ) -> list[StagedFile]:
        """Write each model's ``.onnx`` under a temp name, then publish the staged files and every model.

        As :meth:`publish` with several models (a family over shared weights files): ``journal`` (when given: the
        first weights file's path) records the names of the weights files before the first move. Returns the
        models' :class:`StagedFile` objects (committed), in the order given.
        """
        return self._publish(models, before_commit, result, journal)

    def _publish(
        self,
        models: Sequence[tuple[str, bytes]],
        before_commit: BeforeCommit | None,
        result: object,
        journal: str | None = None,
    ) -> list[StagedFile]:
        """Stage every model after the weights, then publish them all under the folder lock (:class:`_Publication`);
        ``journal``: the first weights file beside which the names of the weights files are recorded first."""
        model_files = []
        for path, data in models:
            model_file = self.stage(path)
            model_file.write_all(data, 0)
            model_files.append(model_file)
        weights = self.files[: len(self.files) - len(model_files)]
        for staged in self.files:
            staged.flush()
        try:
            with folder_lock([os.path.dirname(staged.final_path) for staged in self.files]) as lock:
                protected = before_commit() if before_commit is not None else None
                record = _write_journal(journal, weights, self.durable) if journal is not None else None
                publication = _Publication(
                    weights,
                    model_files,
                    [data for _, data in models],
                    self.keep | frozenset(protected or ()),
                    record,
                    lock,
                )
                try:
                    publication.run()
                finally:
                    self._published = bool(publication.published)
        except PublishedWithErrorsError as exc:
            if exc.result is None:
                exc.result = result
            raise
        return model_files


_RELEASE_FOLDERS = "releasing the lock of the destination folder(s) failed"


def _journal_for(weights: Sequence[str], model_path: str, weights_set: str | None) -> str | None:
    """The path a one-model publication's journal is named after (``weights_set``, else the first weights file) when
    it needs one (:func:`_write_journal`), else None.

    Rule 3 of the writer contract (:mod:`~onnx_light_ref.io.write.ownership`) recognizes a weights file named after
    the model (``m.onnx.data``) as the destination's own leftover whatever happened; any other name (``--weights
    w.bin``) moved in before a kill, while no model references it yet, is only recognized through the journal.
    """
    model = os.path.normpath(os.path.abspath(model_path))
    if all(is_named_after_model(os.path.normpath(os.path.abspath(path)), model) for path in weights):
        return None
    return os.path.abspath(weights_set) if weights_set is not None else weights[0]


def _discard_all(files: Sequence[StagedFile]) -> None:
    for staged in files:
        staged.discard()


@contextlib.contextmanager
def staged_files() -> Iterator[list[StagedFile]]:
    """Collect :class:`StagedFile` objects; on any exception every uncommitted one is deleted.

    The lower-level form of :class:`OutputTransaction`, for writers of files that are not models (no file
    references another): see :func:`publish_all`.
    """
    files: list[StagedFile] = []
    try:
        yield files
    except BaseException:
        _discard_all(files)
        raise


class FolderLock:
    """The exclusive ``flock`` of a publication's destination folders (see :func:`folder_lock`).

    :meth:`release` closes the descriptors (which releases the locks): a publication calls it as its last step
    after the commit, so that a failing ``close`` is reported as a step after the commit, never as an ``OSError``
    that would say nothing is published.
    """

    def __init__(self, folders: Collection[str]) -> None:
        self._fds: dict[tuple[int, int], int] = {}
        try:
            for folder in folders:
                _syscall("open")
                fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                if key in self._fds:
                    os.close(fd)
                else:
                    self._fds[key] = fd
            for key in sorted(self._fds):
                try:
                    _syscall("flock")
                    fcntl.flock(self._fds[key], fcntl.LOCK_EX)
                except OSError as exc:
                    logger.warning("cannot lock destination folder for publication (%s); publishing unlocked", exc)
        except BaseException:
            self.release(quiet=True)
            raise

    def release(self, *, quiet: bool = False) -> None:
        """Close every descriptor (each one even when one fails); later calls do nothing.

        Raises:
            OSError: the first ``close`` that failed (unless ``quiet``: logged, for a release while another error
                propagates).
        """
        errors = []
        while self._fds:
            _, fd = self._fds.popitem()
            try:
                try:
                    _syscall("close")
                finally:
                    os.close(fd)  # Linux frees the descriptor even when close reports an error (an injected one too)
            except OSError as exc:
                errors.append(exc)
        if errors and quiet:
            logger.warning("closing a destination folder's lock failed: %s", errors[0])
        elif errors:
            raise errors[0]


@contextlib.contextmanager
def folder_lock(folders: Collection[str]) -> Iterator[FolderLock]:
    """Hold an exclusive ``flock`` on each folder (by real identity, in a fixed order) for the block.

    Two publications into the same folder therefore never interleave their moves. Folders are locked in
    (device, inode) order, so two jobs sharing several folders cannot deadlock. A filesystem that refuses ``flock``
    (some network filesystems) is logged and publication goes on unlocked: the moves stay atomic, only concurrent
    jobs are no longer serialized. The block may release the lock early (:meth:`FolderLock.release`); leaving it
    releases what is still held (a failing ``close`` raises, unless an exception is already propagating).
    """
    lock = FolderLock(folders)
    try:
        yield lock
    except BaseException:
        lock.release(quiet=True)
        raise
    lock.release()


def publish_all(files: Sequence[StagedFile], *, before_commit: BeforeCommit | None = None) -> None:
    """Flush every file, then move each to its final name in order, under :func:`folder_lock`.

    ``before_commit`` runs under the lock right before the first move, as for :meth:`OutputTransaction.publish`
    (what it raises leaves every destination as it was; what it returns is not needed: nothing but the previous
    versions is deleted here).

    For files that do not reference each other (e.g. ``.npy`` outputs): each destination is always absent, its
    previous version or the new file. A failure part-way (a move raising) swaps back every file already moved, so
    the destinations are exactly as before the call; the previous versions are deleted only after the last move. A
    model (an ``.onnx`` and the weights it references) is published by :meth:`OutputTransaction.publish` instead.

    Raises:
        OSError: an fsync or a move failed; every move is undone (the destinations are as before).
        PublishedWithErrorsError: every file is published, but the folder fsync or removing a previous version
            failed (:class:`AfterCommit`).
    """
    if not files:
        return
    for staged in files:
        staged.flush()
    with folder_lock([os.path.dirname(staged.final_path) for staged in files]) as lock:
        if before_commit is not None:
            before_commit()
        moves: list[_Move] = []
        try:
            for staged in files:
                moves.append(_move(staged.temp_path, staged.final_path))
                staged.committed = True
        except BaseException:
            kept = _undo_all(moves)
            for staged in files[kept:]:
                staged.committed = False
            raise
        after = AfterCommit(files[0].final_path, what=_describe([staged.final_path for staged in files]))
        after.fsync_folders([staged.final_path for staged in files if staged.durable], True)
        _delete_previous(moves, after)
        for staged in files:
            after.attempt(staged._release_lock, f"releasing the lock of {staged.final_path!r} failed")
        after.attempt(lock.release, _RELEASE_FOLDERS)
        after.finish()


def _describe(paths: Sequence[str]) -> str:
    return repr(paths[0]) + (f" (and {len(paths) - 1} more output(s))" if len(paths) > 1 else "")


# ------------------------------------------------------------------------------------- what a model references


@dataclass(frozen=True)
class _References:
    """The files an existing ``.onnx`` references: normalized paths and the identities of those that exist.

    ``known=False``: the ``.onnx`` exists but could not be read (e.g. no permission); every existing name is then
    treated as referenced (the safe side: it is bridged rather than replaced under a model). The destination's own
    previous ``.onnx`` that is read but does not parse references nothing *here*: no loader can load it now, and this
    publication replaces it, so no reader of it is left to keep loading (any other ``.onnx`` that cannot be read is
    the sharing guard's, :mod:`~onnx_light_ref.io.read.sharing`: it may use anything in its reach).
    """

    known: bool
    paths: frozenset[str] = frozenset()
    identities: frozenset[FileIdentity] = frozenset()

    def has(self, path: str) -> bool:
        if not self.known:
            return os.path.lexists(path)
        if os.path.normpath(path) in self.paths:
            return True
        try:
            st = os.stat(path)
        except OSError:
            return False
        return FileIdentity(st.st_dev, st.st_ino) in self.identities


def _locations(model: onnx.ModelProto) -> Iterator[tuple[onnx.StringStringEntryProto, str]]:
    """Each ``location`` entry of an EXTERNAL tensor of ``model``, with its value as text."""
    for site in iter_tensors(model):
        if site.tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        for entry in site.tensor.external_data:
            if entry.key == "location":
                value: str | bytes = entry.value
                yield entry, value if isinstance(value, str) else os.fsdecode(value)


def _read_references(model_path: str) -> _References:
    """What the ``.onnx`` now at ``model_path`` references (reads its metadata, writes nothing).

    Through the wire reader with every inline payload skipped: a previous ``.onnx`` holding 384 MiB inline (an
    in-place externalization) costs its metadata in memory, not three copies of the file. The file parsed must be
    the regular file ``lstat`` saw (a symlink, or a name swapped meanwhile, is "unknown": the safe side).
    """
    try:
        _syscall("lstat")
        st = os.lstat(model_path)
    except FileNotFoundError:
        return _References(known=True)
    except OSError:  # no permission on the folder...: what it references is unknown
        return _References(known=False)
    if not stat.S_ISREG(st.st_mode):  # a symlink, a folder...
        return _References(known=False)
    try:
        _syscall("read")
        stripped = load_model_stripped(model_path, 0)
    except InvalidModelError:
        # Not a model any loader reads now, and this publication replaces it: no reader of it to keep loading.
        # (Another .onnx that cannot be read is the sharing guard's: it may use anything in its reach.)
        return _References(known=True)
    except OSError:  # gone or swapped for a non-file meanwhile, unreadable: unknown
        return _References(known=False)
    if (stripped.device, stripped.inode) != (st.st_dev, st.st_ino):
        return _References(known=False)
    folder = os.path.dirname(model_path)
    paths = frozenset(os.path.normpath(os.path.join(folder, location)) for _, location in _locations(stripped.model))
    identities = set()
    for path in paths:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            identities.add(FileIdentity(st.st_dev, st.st_ino))
    return _References(known=True, paths=paths, identities=frozenset(identities))


def _bridge_model(model_bytes: bytes, model_path: str, bridges: dict[str, str]) -> bytes:
    """The new model with every location naming a key of ``bridges`` (a final weights path) pointing at its value."""
    model = onnx.ModelProto()
    model.ParseFromString(model_bytes)
    folder = os.path.dirname(model_path)
    for entry, location in _locations(model):
        target = os.path.normpath(os.path.join(folder, location))
        if target in bridges:
            entry.value = os.path.relpath(bridges[target], folder)
    return serialize_model(model)


_FICLONE = 0x40049409


def _copy_file(src_path: str, dst_fd: int, size: int, final_path: str) -> None:
    """Copy ``size`` bytes of ``src_path`` into ``dst_fd``: a reflink clone where possible, else an in-kernel copy."""
    _syscall("open")
    src = os.open(src_path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            _syscall("ioctl")
            fcntl.ioctl(dst_fd, _FICLONE, src)
            return
        except OSError:
            pass
        reserve_space(dst_fd, size, path=final_path)
        done = 0
        while done < size:
            _syscall("copy_file_range")
            try:
                count = os.copy_file_range(src, dst_fd, size - done, done, done)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                count = 0
            if count == 0:
                break
            done += count
        while done < size:  # no copy_file_range here: read and write
            chunk = bytearray(min(size - done, 8 * 1024 * 1024))
            got = pread_exact(src, memoryview(chunk), done)
            if got == 0:
                raise OSError(errno.EIO, f"{src_path!r} ended at offset {done} while {size} bytes were expected")
            pwrite_all(dst_fd, memoryview(chunk)[:got], done)
            done += got
        os.ftruncate(dst_fd, size)
    finally:
        os.close(src)


class _Publication:
    """One publication under the folder lock: the weights files, then every model that references them (one for
    :meth:`OutputTransaction.publish`, every member of a family for :meth:`FamilyTransaction.publish_models`).

    The order of the moves is the module docstring's; with several models, every model's commit A comes before the
    copies to the final names (no previous model may read a final name that changes), and every model's final
    commit after them. ``commits[i]`` lists where model ``i``'s commits are in ``moves``, so that after a failure
    that could not be undone (no ``RENAME_EXCHANGE``) the models whose new version stands are known.
    """

    def __init__(
        self,
        weights: Sequence[StagedFile],
        models: Sequence[StagedFile],
        model_bytes: Sequence[bytes],
        keep: Collection[FileIdentity],
        journal: StagedFile | None = None,
        lock: FolderLock | None = None,
    ) -> None:
        self.weights = weights
        self.models = models
        self.model_bytes = model_bytes
        self.keep = keep
        self.journal = journal
        self.lock = lock
        self.durable = models[0].durable
        self.moves: list[_Move] = []
        self.extra: list[StagedFile] = []  # temp files of the bridge step
        self.bridges: list[str] = []
        self.previous: list[_References] = []
        self.commits: list[list[int]] = [[] for _ in models]  # per model, the index in `moves` of each commit
        self.bridge_commit: int | None = None  # index of the first commit A in `moves`
        self.bridge_synced = False  # the folder fsync after the commits A succeeded
        self.standing = 0  # moves done and not undone

    @property
    def published(self) -> list[StagedFile]:
        """The models whose new version is in place (a commit done and not undone), in order."""
        return [
            model for model, done in zip(self.models, self.commits, strict=True) if done and done[0] < self.standing
        ]

    def run(self) -> None:
        self.previous = [_read_references(model.final_path) for model in self.models]
        clashing = [staged for staged in self.weights if any(p.has(staged.final_path) for p in self.previous)]
        try:
            self._sweep_before()
            for staged in self.weights:
                if staged not in clashing:
                    self.moves.append(_move(staged.temp_path, staged.final_path))
                    self.standing = len(self.moves)
            if clashing:
                self._bridge(clashing)
            _fsync_folders([staged.final_path for staged in self.weights], self.durable)
            for index, model in enumerate(self.models):
                self._commit(index, model.temp_path)  # commit B, or the only commit
        except BaseException as exc:
            self.standing = _undo_all(self.moves)
            if self.bridge_commit is not None and self.standing > self.bridge_commit:
                # A commit A could not be undone (no RENAME_EXCHANGE, or the undo failed): that model is the new one
                # through its bridge files, which must stay; the next publication to it removes them.
                for staged in self.weights:
                    staged.keep_temp = True
            _discard_all(self.extra)
            # A bridge file is its weights file's temp name now (the caller may still read it back; its cleanup
            # deletes it unless kept above).
            self._journal_after_failure()
            if self.published and isinstance(exc, Exception):
                raise self._published_partly(exc) from exc
            if self.published:  # interrupted (KeyboardInterrupt): it propagates, but what stands must be said
                self._warn_published_on_interrupt()
            raise
        self._after_commit()

    def _warn_published_on_interrupt(self) -> None:
        on_bridges = self.bridge_commit is not None and self.standing > self.bridge_commit
        logger.warning(
            "interrupted after a commit that cannot be undone here: %s %s published (the new model is in place and "
            "loads%s)",
            ", ".join(repr(model.final_path) for model in self.published),
            "are" if len(self.published) > 1 else "is",
            "; on hidden bridge names, which the next publication to it replaces" if on_bridges else "",
        )

    def _commit(self, index: int, temp_path: str) -> None:
        self.commits[index].append(len(self.moves))
        self.moves.append(_move(temp_path, self.models[index].final_path))
        self.standing = len(self.moves)

    def _published_partly(self, exc: Exception) -> PublishedWithErrorsError:
        """A failure that could not be undone left new models in place: published, never an ``OSError``."""
        published = [model.final_path for model in self.published]
        previous = [model.final_path for model in self.models if model.final_path not in published]
        on_bridges = self.bridge_commit is not None and self.standing > self.bridge_commit
        names = ", ".join(repr(os.path.basename(b)) for b in self.bridges)
        if len(self.models) == 1:
            message = (
                f"{published[0]!r} {_PUBLISHED}, but on hidden bridge names ({names}): moving its weights to their "
                f"final names failed ({exc}) and could not be undone. The next publication to this destination "
                "removes them."
            )
        else:
            where = f" (some on hidden bridge names: {names}, which the next publication removes)" if on_bridges else ""
            message = (
                f"{', '.join(map(repr, published))} {'are' if len(published) > 1 else 'is'} published (each new "
                f"model is in place and loads){where}, but the publication failed ({exc}) and could not be undone: "
                + (
                    f"{', '.join(map(repr, previous))} {'are' if len(previous) > 1 else 'is'} still the previous "
                    "version (each loads and computes its previous values)"
                    if previous
                    else "every member is new"
                )
                + ". Run the job again to publish the whole family."
            )
        return PublishedWithErrorsError(
            message,
            model_path=published[0],
            errors=[exc] if isinstance(exc, OSError) else [],
            sync_failed=self.durable and not self.bridge_synced,
            published_models=published,
            previous_models=previous,
        )

    def _sweep_before(self) -> None:
        """Under the lock, before the first move: what dead writers left in the destination folders (bridges too).

        Frees their disk before the bridge copies; a file a previous ``.onnx`` (or any model that can reach the
        folder) references is kept. A removal that fails raises: nothing is moved yet.
        """
        if not all(previous.known for previous in self.previous):
            return  # what a destination uses is unknown: sweep nothing it might reference
        keep = set(self.keep)
        for previous in self.previous:
            keep |= previous.identities
        for folder in _folders_of([staged.final_path for staged in [*self.weights, *self.models]]):
            sweep_dead_writers(folder, keep=keep, bridges=True)

    def _after_commit(self) -> None:
        """Every step after the last commit, each run even when one fails or is interrupted; failures raised together
        (:class:`AfterCommit`), an interrupt (``KeyboardInterrupt``) re-raised once every step has run.

        The previous versions and this run's bridge files are deleted unless a model that can reach their folder
        references them (a variant saved by another process from the model while it stood on its bridge names):
        those are kept, with a warning, and a later sweep removes them once no model uses them. The bridge files of
        a replaced ``.onnx`` (a run killed between its two commits) are unreferenced now: the sweep removes them with
        every other dead writer's file, unless another model references them. The folder lock is released last.
        """
        for staged in [*self.weights, *self.models]:
            staged.committed = True
        paths = [model.final_path for model in self.models]
        after = AfterCommit(paths[0], models=paths)
        hidden = [move.temp for move in self.moves if move.kind == "exchanged"] + self.bridges
        in_use = _InUse()
        steps: list[Callable[[], None]] = [lambda: after.fsync_folders(paths, self.durable)]
        steps += [functools.partial(_remove_unless_used, after, path, in_use) for path in hidden]
        if self.journal is not None:  # this run's journal, and those of dead runs of the same weights set
            base = self.journal.final_path
            steps.append(functools.partial(after.remove, self.journal.temp_path))
            problem = f"listing the journals killed runs left beside {base!r} failed"
            steps.append(
                functools.partial(after.attempt, functools.partial(_remove_dead_journals, after, base), problem)
            )
        journal = [self.journal] if self.journal is not None else []
        for staged in [*self.weights, *self.models, *self.extra, *journal]:
            problem = f"releasing the lock of {staged.final_path!r} failed"
            steps.append(functools.partial(after.attempt, staged._release_lock, problem))
        folders = _folders_of([staged.final_path for staged in [*self.weights, *self.models]])
        steps.append(lambda: after.sweep(folders, self.keep, in_use.of_folder))
        if self.bridges or journal:
            synced = [*self.bridges, *(staged.temp_path for staged in journal)]
            steps.append(lambda: after.fsync_folders(synced, self.durable))
        if self.lock is not None:
            steps.append(functools.partial(after.attempt, self.lock.release, _RELEASE_FOLDERS))
        _run_every_step(steps)
        after.finish()

    def _journal_after_failure(self) -> None:
        """Nothing of this run stands: its journal goes; else it stays, naming what this run left at final names."""
        if self.journal is not None:
            self.journal.keep_temp = self.standing > 0
            self.journal.discard()

    def _bridge(self, clashing: Sequence[StagedFile]) -> None:
        """Every model's commit A (a bridge ``.onnx`` referencing the new files under bridge names), then the
        final names."""
        mapping = {}
        for staged in clashing:
            bridge = _own_name(staged.final_path, _BRIDGE_SUFFIX)
            staged.rename_temp(bridge)  # after a failure the caller's cleanup deletes it (unless a model uses it)
            self.bridges.append(bridge)
            mapping[os.path.normpath(staged.final_path)] = bridge
        bridge_models = []
        for model, model_bytes in zip(self.models, self.model_bytes, strict=True):
            bridge_model = StagedFile(model.final_path, durable=self.durable, keep=self.keep)
            self.extra.append(bridge_model)
            bridge_model.write_all(_bridge_model(model_bytes, model.final_path, mapping), 0)
            bridge_model.flush()
            bridge_models.append(bridge_model)
        _fsync_folders([*self.bridges, *(staged.final_path for staged in self.weights)], self.durable)
        self.bridge_commit = len(self.moves)
        for index, bridge_model in enumerate(bridge_models):
            self._commit(index, bridge_model.temp_path)  # commit A of this model
        _fsync_folders([model.final_path for model in self.models], self.durable)
        self.bridge_synced = True
        for staged, bridge in zip(clashing, self.bridges, strict=True):
            copy = StagedFile(staged.final_path, durable=self.durable, keep=self.keep)
            self.extra.append(copy)
            assert copy.fd is not None
            _copy_file(bridge, copy.fd, os.stat(bridge).st_size, staged.final_path)
            copy.flush()
            self.moves.append(_move(copy.temp_path, staged.final_path))  # its temp name now holds the previous file
            self.standing = len(self.moves)


# ------------------------------------------------------------------------------------------ a family of models


class FamilyTransaction(OutputTransaction):
    """The outputs of a family of models, published together: shared weights files, then every member's ``.onnx``.

    Stage the weights files with :meth:`stage` as for :class:`OutputTransaction`, then call :meth:`publish_models`
    once with every member's path and serialized bytes. The publication is :class:`OutputTransaction`'s with
    several models (module docstring): a process killed at *any* system call leaves every member loadable,
    computing its previous or its new values (members are committed one after the other, so some may be new and
    others previous); a failure that raises before any member is new undoes every move, leaving the whole family as
    it was (an ``OSError``); one that leaves some member new is a
    :class:`~onnx_light_ref.errors.PublishedWithErrorsError` naming which members are published and which are
    still previous.
    """

    def __enter__(self) -> FamilyTransaction:
        return self

    def publish_models(
        self,
        models: Sequence[tuple[str, bytes]],
        *,
        before_commit: BeforeCommit | None = None,
        result: object = None,
        journal: str | None = None,
    ) -> list[StagedFile]:
        """Write each member's ``.onnx`` under a temp name, then publish the staged weights and every member.

        ``before_commit`` runs after every file is flushed, under the folder locks, right before the first move, as
        for :meth:`OutputTransaction.publish` (the writer contract's
        :func:`~onnx_light_ref.io.write.contract.recheck_plan`): what it raises leaves every destination as it was;
        the identities it returns are never deleted. ``result`` is attached to a
        :class:`~onnx_light_ref.errors.PublishedWithErrorsError`.

        ``journal`` (when given: the first weights file's path) records, before the first move, the names of the
        staged weights files in a hidden file beside it, deleted after the last commit: a run killed in between
        leaves it, and :func:`journal_leftovers` tells the next run which files at those names a dead run of this
        weights set wrote (they are its own leftovers, rule 3 of the writer contract, though no member references
        them yet). Dead runs' journals of the same weights set are deleted after the last commit too.

        Returns:
            The members' :class:`StagedFile` objects (committed), in the order given.

        Raises:
            OSError: writing, an fsync or a move failed while no member is new; every move is undone.
            PublishedWithErrorsError: some or every member is published, but a step after its commit failed (its
                ``published_models`` and ``previous_models`` say which are new and which are previous).
        """
        return self._publish(models, before_commit, result, journal)


_JOURNAL_SUFFIX = ".journal"
_JOURNAL_MAX_BYTES = 1024 * 1024  # a journal lists a few file names; a larger file at such a name is not read
# A journal of this module, whatever weights set it was made for: group 1 the tag of the first weights file's name,
# group 2 the pid. Not a temp or bridge name: sweep_dead_writers leaves it (it is evidence, until the set is
# published again).
_ANY_JOURNAL = re.compile(  # fullmatch only, ASCII digits only (see _ANY_OWN_NAME)
    re.escape(_TEMP_PREFIX) + r"([0-9a-f]{12})~([0-9]{1,10})~[0-9a-f]{16}" + re.escape(_JOURNAL_SUFFIX)
)


def _write_journal(weights_base: str, weights: Sequence[StagedFile], durable: bool) -> StagedFile:
    """The journal of one publication (module docstring): the names of the weights files it moves in, durable
    before the first move, locked by its writer while it lives (a :class:`StagedFile` that is never published)."""
    journal = StagedFile(weights_base, durable=durable, suffix=_JOURNAL_SUFFIX)
    try:
        folder = os.path.dirname(journal.temp_path)
        content = json.dumps({"files": [os.path.relpath(staged.final_path, folder) for staged in weights]})
        journal.write_all(content.encode("utf-8"), 0)
        journal.flush()
        _fsync_folders([journal.temp_path], durable)
    except BaseException:
        journal.discard()
        raise
    return journal


def is_publisher_file(name: str) -> bool:
    """Whether ``name`` (a base name) is one of this module's hidden names: a temp, bridge or journal file.

    Such files are the publisher's (swept, or deleted after the commit), never a user's file left to delete.
    """
    return bool(_ANY_OWN_NAME.fullmatch(name) or _ANY_JOURNAL.fullmatch(name))


def _dead_journals(weights_base: str) -> list[str]:
    """The journals of ``weights_base``'s set whose writer is gone (pid dead or no longer owning it, lock free)."""
    folder, name = os.path.split(os.path.abspath(weights_base))
    tag = _name_tag(name)
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
        for entry in entries:
            match = _ANY_JOURNAL.fullmatch(entry.name)
            if not match or match.group(1) != tag or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if _writer_gone(int(match.group(2)), entry.name) and _lock_free(entry.path, st):
                    found.append(entry.path)
    return sorted(found)


def journal_leftovers(weights_base: str) -> frozenset[str]:
    """Files a publication of the weights set ``weights_base`` named in its journal before its process died.

    A run killed after moving a weights name into place and before any of its models referenced it leaves a file no
    model uses; its journal (module docstring) says the file is that set's. Only journals of this module's pattern
    for ``weights_base``'s name, whose writer is gone (pid dead, lock free), at most 1 MiB, naming files of their
    own folder. Reads, never deletes.

    Args:
        weights_base: the first weights file of the set (absolute or relative).

    Returns:
        Absolute normalized paths of the files those journals name (existing or not).
    """
    folder = os.path.dirname(os.path.abspath(weights_base))
    found: set[str] = set()
    for path in _dead_journals(weights_base):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if os.lstat(path).st_size > _JOURNAL_MAX_BYTES:
                continue
            with open(path, encoding="utf-8") as handle:
                listed = json.load(handle).get("files", [])
            found.update(
                os.path.normpath(os.path.join(folder, item))
                for item in listed
                if isinstance(item, str) and item and item == os.path.basename(item)
            )
    return frozenset(found)
