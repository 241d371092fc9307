"""Publication: the new files of a plan take their final names with no moment where a destination model is broken.

The executor (:mod:`~onnx_light_ref.io._write.execute`) writes every file under a temp name in its destination folder
(:class:`StagedFile`), then :meth:`OutputTransaction.publish` only *moves names*, under an exclusive ``flock`` of each
destination folder, the writer contract re-checked right before the first move. It never creates a second hard link
(onnx refuses a file with several links): a name that exists is swapped with the new file by
``renameat2(RENAME_EXCHANGE)`` (the previous version lands on the temp name, to be deleted after the commit or
swapped back on failure); an absent one is renamed into place. The order makes every prefix of the moves a state
that loads, previous or new, so a process killed at *any* system call leaves each destination model reading
exactly its bytes:

1. the weights files whose names no previous ``.onnx`` of a destination references (no previous model reads them);
2. when a previous ``.onnx`` references a name this run rewrites (a re-run into the same names), that name cannot
   change under it: the new file stays on its temp name, a *bridge* ``.onnx`` referencing it is committed
   (commit A: the destination computes the new values), then a copy made beforehand (a reflink where the
   filesystem can) takes the final name nothing references any more;
3. each model's ``.onnx``: the commit (commit B after a bridge).

Before its first move a publication whose weights are not all named after a model (``--weights w.bin``, a family's
``weights.data``) records in a *journal* (``.olr~<tag>~<pid>~<random>.journal``) each weights name it moves in and
the identity (device, inode, size, modification time: a rename keeps all four) of the file going there: a run
killed after such a move and before its commit leaves a file no model references, and the journal is the evidence
that the next run of the same weights set may replace it (:func:`journal_leftovers`), only while the file there is
still that one.

Temp names are ``.olr~<hash of the final name>~<pid>~<random>.tmp``; their writer holds an ``flock`` on each until it
is published or deleted. A dead writer's temp file (pid gone, lock free) is swept when a job stages a file in its
folder (unless a publication holds the folder) and under the folder lock of each publication, unless it is one of
the job's sources or a model that can reach the folder references it (a killed run's bridge model does).
SIGINT and SIGTERM are deferred (:mod:`~onnx_light_ref.io._write.interrupts`) while a temp file is created and
registered, while temp files are discarded, and from the first move to the last step after the commit: an interrupt
leaves the previous state (every temp file removed) or the new one, never a model on half its moves.

What a publication reports (``docs/durability.md``): an ``OSError`` only while nothing is published (every move
undone); after a commit every remaining step runs (the ``fsync`` that makes it durable, removing previous versions,
bridges and journals no model uses, the sweep, releasing the locks) and their failures are raised together as
:class:`~onnx_light_ref.errors.PublishedWithErrorsError`. ``durable=False`` skips every ``fsync`` but keeps the temp
files, the locks and the atomic moves. This module never writes outside the destination folders, never creates a
hard link, and never deletes a file but its own temp and journal files.
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
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

import onnx

from onnx_light_ref.errors import InvalidModelError, PublishedWithErrorsError
from onnx_light_ref.io._arguments import check_bool
from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._posix import pwrite_all
from onnx_light_ref.io._read.delayed_nodes import iter_delayed
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._read.sharing import NearbyReferences, files_referenced_near
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._read.wire import load_model_stripped
from onnx_light_ref.io._write.copy_engine import RangeCopier
from onnx_light_ref.io._write.interrupts import deferred_interrupts
from onnx_light_ref.io._write.space import reserve_space

logger = logging.getLogger(__name__)

_TEMP_PREFIX = ".olr~"
_TEMP_SUFFIX = ".tmp"
_JOURNAL_SUFFIX = ".journal"
# Any temp or journal name of this module: group 1 the tag of the final name, group 2 the pid, group 3 the suffix.
# Matched with fullmatch only (``$`` also takes a name ending in a newline) and ASCII digits only (``\d`` takes
# digits int() reads in other scripts): a user's file named almost like ours is not ours.
_ANY_OWN_NAME = re.compile(
    re.escape(_TEMP_PREFIX) + r"([0-9a-f]{12})~([0-9]{1,10})~[0-9a-f]{16}(\.tmp|\.journal|\.bridge)"
)
_SWEPT = (_TEMP_SUFFIX, ".bridge")  # temp files, and the bridge names earlier versions of this module gave them
_COPY_CHUNK = 8 * 1024 * 1024  # the bridge copies' most bytes per call (they clone whole blocks where they can)
_JOURNAL_MAX_BYTES = 1024 * 1024  # a journal lists a few file names; a larger file at such a name is not read

# fsync answers meaning "this file or filesystem does not fsync" (some FUSE and special filesystems): ignored.
_FSYNC_UNSUPPORTED = frozenset((errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)))
_NOT_OURS = frozenset((errno.EPERM, errno.EACCES))  # another user's file in a sticky folder: skipped by a sweep
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)

BeforeCommit = Callable[[], Collection[FileIdentity] | None]
"""The contract's re-check, run under the folder lock right before the first move; returns identities never to
delete (files other models reference)."""

# Test seam for deterministic fault injection: when set, called with a short name of every system call a publication
# is about to make (the kill-point, fault and signal tests act at the k-th one). Always None in production.
before_syscall: Callable[[str], None] | None = None


def serialize_model(model: onnx.ModelProto) -> bytes:
    """Serialize ``model``; refuses protos over protobuf's 2 GiB limit with a message that says what to do.

    Raises:
        InvalidModelError: the model cannot be serialized (too large).
    """
    try:
        return model.SerializeToString()
    except ValueError as exc:
        raise InvalidModelError(
            f"model {model.graph.name!r} cannot be serialized ({exc}); move large tensors to external data."
        ) from exc


def _syscall(name: str) -> None:
    if before_syscall is not None:
        before_syscall(name)


# --------------------------------------------------------------------------------------------------- temp files


def _name_tag(final_name: str) -> str:
    """A short, stable tag of the final name: temp names stay short whatever the final name."""
    return hashlib.sha256(os.fsencode(final_name)).hexdigest()[:12]


def _own_name(final_path: str, suffix: str) -> str:
    folder, name = os.path.split(final_path)
    return os.path.join(folder, f"{_TEMP_PREFIX}{_name_tag(name)}~{os.getpid()}~{secrets.token_hex(8)}{suffix}")


def is_publisher_file(name: str) -> bool:
    """Whether ``name`` (a base name) is one of this module's hidden temp or journal names."""
    return _ANY_OWN_NAME.fullmatch(name) is not None


# Names of the temp files this process's StagedFile objects own right now: a name with this pid that is not here is
# a leftover (a removal that failed after a commit), which a long-running process must be able to sweep too.
_LIVE_TEMPS: set[str] = set()


def _writer_gone(pid: int, name: str) -> bool:
    """Whether the writer of the hidden file ``name`` (its ``pid``) is gone, or is this process and let it go."""
    if pid == os.getpid():
        return name not in _LIVE_TEMPS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


@contextlib.contextmanager
def _locked(path: str, expected: os.stat_result | None = None) -> Iterator[bool]:
    """Hold the ``flock`` of the file at ``path`` for the block (False: taken, or not the ``expected`` file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield False
        return
    try:
        yield _lock_if(fd, expected)
    finally:
        os.close(fd)  # releases the lock


def _lock_if(fd: int, expected: os.stat_result | None) -> bool:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (
        expected is not None and (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino)
    ):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


class StagedFile:
    """A new file under a temp name beside ``final_path``; it takes the final name only when published.

    Created with mode ``0o666 & ~umask`` like any file the user creates, and locked (``flock``) by its writer until
    it is published or deleted: a sweep never removes a locked file, and a writer whose new name a sweep took tries
    another one. Dead writers' temp files of the folder are swept first (unless ``sweep`` is False: the job swept
    the folder for an earlier file), unless a publication holds the folder (``keep``: the job's sources, never
    removed). With ``durable=False`` it is never fsynced. ``suffix``: ``.tmp``, or ``.journal`` for a journal.
    """

    def __init__(
        self,
        final_path: str,
        *,
        durable: bool = True,
        keep: Collection[FileIdentity] = (),
        suffix: str = _TEMP_SUFFIX,
        sweep: bool = True,
    ) -> None:
        self.durable = check_bool("durable", durable)
        self.final_path = os.path.abspath(final_path)
        folder = os.path.dirname(self.final_path)
        if not os.path.isdir(folder):
            raise FileNotFoundError(errno.ENOENT, f"destination folder does not exist: {folder!r}", folder)
        with _unless_publishing(folder) if sweep else contextlib.nullcontext(False) as free:
            if free:  # dead writers' files first: their disk is free again before space is reserved
                sweep_dead_writers(folder, keep=keep)
        self.committed = False
        self.keep_temp = False  # a published model references the temp name (a bridge): never deleted by us
        for _ in range(8):  # a sweep takes a name from its creator only in a window of two system calls
            created = self._create(_own_name(self.final_path, suffix))
            if created is not None:
                self.temp_path = created[0]
                self.fd: int | None = created[1]
                self._lock_fd: int | None = created[2]
                return
        raise OSError(errno.EAGAIN, f"could not create a temp file beside {final_path!r}: another process removed "
                      "each of the 8 names tried before it could be locked")  # fmt: skip

    @staticmethod
    def _create(path: str) -> tuple[str, int, int] | None:
        """The new file at ``path``, its descriptor and the one holding its lock; None when a sweep of another
        process (whose pid check cannot see this writer: another pid namespace) holds or took the name first."""
        _LIVE_TEMPS.add(os.path.basename(path))  # before it exists: a sweep of this process skips it
        fd = lock_fd = None
        try:
            _syscall("open")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            _syscall("dup")
            lock_fd = os.dup(fd)
            try:
                _syscall("flock")
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _abandon(path, fd, lock_fd)
                return None
            except OSError as exc:  # a filesystem without flock: the pid in the name still protects the file
                logger.debug("cannot lock temp file %s: %s", path, exc)
            if not _names_file(path, fd):
                _abandon(path, fd, lock_fd)
                return None
            return path, fd, lock_fd
        except BaseException:
            _abandon(path, fd, lock_fd)
            raise

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
        """fsync the content (when durable) and close the descriptor (the file keeps its temp name and lock)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                if self.durable:
                    fsync_or_raise(fd, f"{self.final_path!r} (staged as {os.path.basename(self.temp_path)!r})")
            finally:
                _syscall("close")
                os.close(fd)

    def release(self) -> None:
        """Give the temp name up (published or deleted: what is left there is not this writer's)."""
        _LIVE_TEMPS.discard(os.path.basename(self.temp_path))
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            _syscall("close")
            os.close(fd)

    def discard(self) -> None:
        """Close and delete the temp file unless published or kept; never raises ``OSError`` (it runs while
        another error propagates: a removal the filesystem refuses is logged, the file left to a later sweep)."""
        with deferred_interrupts():
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
                    self.release()


def _names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (a sweep may have removed it before it was locked)."""
    try:
        _syscall("stat")
        named, opened = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _abandon(path: str, fd: int | None, lock_fd: int | None) -> None:
    """Give up a temp name: remove the file if ``path`` still names it, close both descriptors, forget the name.
    Runs while an error propagates: its own failures are logged, never raised."""
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


# -------------------------------------------------------------------------------------------------------- sweep


@contextlib.contextmanager
def _unless_publishing(folder: str) -> Iterator[bool]:
    """The folder's publication lock for the block when no publication holds it (False when one does): during a
    publication, a previous version exchanged onto a temp name is nobody's lock, and its writer needs it to undo."""
    try:
        fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY)
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:  # no flock here: swept as a publication would publish, unlocked
            pass
        yield True
    finally:
        os.close(fd)


def sweep_dead_writers(
    folder: str,
    *,
    keep: Collection[FileIdentity] = (),
    failures: list[tuple[str, OSError]] | None = None,
    nearby: Callable[[str], NearbyReferences] = files_referenced_near,
) -> list[str]:
    """Delete the temp files dead writers left in ``folder`` (every final name's: a killed sharded run leaves one per
    shard); return the paths removed.

    A file goes only when its name is this module's, it is a regular file, its writer is gone (pid dead or this
    process's leftover, and its lock free: the sweep holds that lock while it decides and removes), it is not in
    ``keep`` (the job's sources) and no model that can reach ``folder`` references it (a killed run's bridge model
    does). While one of those models cannot be read, nothing is removed: it may reference any of them.

    Args:
        folder: the folder to sweep.
        keep: identities never removed.
        failures: when given, a removal that fails is recorded there and the sweep goes on; else it raises.
        nearby: what the models that can reach ``folder`` reference (a publication passes the answer it read).

    Raises:
        OSError: a removal failed (without ``failures``); EPERM/EACCES (another user's file) is skipped.
    """
    candidates = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
        for entry in entries:
            match = _ANY_OWN_NAME.fullmatch(entry.name)
            if not match or match.group(3) not in _SWEPT or not entry.is_file(follow_symlinks=False):
                continue
            if _writer_gone(int(match.group(2)), entry.name):
                with contextlib.suppress(FileNotFoundError):
                    candidates.append((entry.path, entry.stat(follow_symlinks=False)))
    kept = set(keep)
    references: NearbyReferences | None = None  # read only when there is something to remove
    removed = []
    for path, listed in sorted(candidates, key=lambda item: item[0]):
        if FileIdentity(listed.st_dev, listed.st_ino) in kept:
            continue
        with _locked(path, listed) as held:
            if not held:
                continue
            if references is None:
                references = nearby(folder)
                if references.unreadable:
                    logger.warning(
                        "kept %d file(s) left by a killed run in %s: %s may use them; move it away (or repair it) to "
                        "let the next run remove them",
                        len(candidates),
                        folder,
                        ", ".join(model.describe() for model in references.unreadable),
                    )
                    return []
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
                failures.append((path, exc))
                continue
        removed.append(path)
        logger.info("removed %s left by a killed run", path)
    return removed


def _referenced(path: str, references: Collection[FileIdentity | str]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return True  # gone or unreadable: nothing to remove
    return FileIdentity(st.st_dev, st.st_ino) in references or os.path.normpath(path) in references


# -------------------------------------------------------------------------------------------------------- fsync


def fsync_or_raise(fd: int, what: str) -> None:
    """``fsync(fd)``: an I/O error (EIO, ENOSPC, EROFS, EDQUOT...) raises naming ``what``, since the bytes may not be
    on disk; "not supported" (EINVAL, ENOTSUP: some FUSE and special filesystems) is ignored.

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
    """fsync a folder (its names: the moves of a publication), raising as :func:`fsync_or_raise`.

    Raises:
        OSError: the folder cannot be opened, or its fsync failed.
    """
    try:
        _syscall("open")
        fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open the folder {folder!r} to fsync it ({exc.strerror or exc})") from exc
    try:
        fsync_or_raise(fd, f"the folder {folder!r}")
    finally:
        _syscall("close")
        os.close(fd)


def _folders_of(paths: Collection[str]) -> list[str]:
    return list(dict.fromkeys(os.path.dirname(path) for path in paths))


# -------------------------------------------------------------------------------------------------------- moves

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
    """One name moved, and how to undo it: ``"exchanged"`` (``temp`` now holds the previous file), ``"renamed"``
    (``final`` was absent) or ``"replaced"`` (no exchange support: the previous file is gone, no way back)."""

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


def _undo_all(moves: Sequence[_Move]) -> int:
    """Undo ``moves`` from the last one; return how many stay done (0: everything is as before).

    Every prefix of a publication's moves is a state a crash may leave (previous or new models), so undoing stops,
    leaving that prefix, at the first move that cannot be undone (replaced without exchange, or failing to undo).
    """
    for index in range(len(moves) - 1, -1, -1):
        move = moves[index]
        try:
            if move.kind == "replaced" or (move.kind == "exchanged" and not _exchange(move.temp, move.final)):
                raise OSError(errno.EINVAL, "no way back without RENAME_EXCHANGE")
            if move.kind == "renamed":
                _syscall("rename")
                os.rename(move.final, move.temp)
        except OSError as exc:  # keep the original error; say what could not be undone
            logger.error("could not restore %s after a failed publication: %s", move.final, exc)
            return index + 1
    return 0


# -------------------------------------------------------------------------------------------------- folder lock


class FolderLock:
    """The exclusive ``flock`` of a publication's destination folders, taken in (device, inode) order so two jobs
    sharing folders cannot deadlock. A filesystem that refuses ``flock`` is logged and publication goes on unlocked
    (the moves stay atomic; concurrent jobs are no longer serialized). :meth:`release` is a publication's last step.
    """

    def __init__(self, folders: Collection[str]) -> None:
        self._fds: dict[tuple[int, int], int] = {}
        try:
            for folder in folders:
                _syscall("open")
                fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY)
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) in self._fds:
                    os.close(fd)
                else:
                    self._fds[(st.st_dev, st.st_ino)] = fd
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
            OSError: the first ``close`` that failed (unless ``quiet``: logged).
        """
        errors = []
        while self._fds:
            _, fd = self._fds.popitem()
            try:
                try:
                    _syscall("close")
                finally:
                    os.close(fd)  # Linux frees the descriptor even when close reports an error
            except OSError as exc:
                errors.append(exc)
        if errors and quiet:
            logger.warning("closing a destination folder's lock failed: %s", errors[0])
        elif errors:
            raise errors[0]


@contextlib.contextmanager
def folder_lock(folders: Collection[str]) -> Iterator[FolderLock]:
    """Hold :class:`FolderLock` on ``folders`` for the block (released on the way out if still held)."""
    lock = FolderLock(folders)
    try:
        yield lock
    except BaseException:
        lock.release(quiet=True)
        raise
    lock.release()


# ------------------------------------------------------------------------------------------ what a model references


@dataclass(frozen=True)
class _References:
    """The files the ``.onnx`` now at a destination references (normalized paths, identities of those that exist).

    ``known=False``: it exists but could not be read; every existing name is then taken as referenced (bridged
    rather than replaced under a model). The destination's own previous ``.onnx`` that does not parse references
    nothing: no loader loads it now, and this publication replaces it.
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


def _named_files(model: onnx.ModelProto, folder: str) -> Iterator[tuple[str, Callable[[str], None]]]:
    """Each file the model names (an EXTERNAL tensor's ``location`` entries, a ``DelayedInitializer`` node's
    ``filename``) as a normalized path from ``folder``, with how to make that reference name another one."""
    for site in iter_tensors(model):
        if site.tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in site.tensor.external_data:
                if entry.key == "location":
                    value: str | bytes = entry.value
                    text = value if isinstance(value, str) else os.fsdecode(value)
                    yield os.path.normpath(os.path.join(folder, text)), functools.partial(setattr, entry, "value")
    for node in iter_delayed(model):
        if node.filename is not None:
            path = os.path.normpath(os.path.join(folder, node.filename))
            yield path, functools.partial(node.point_at, offset=node.offset)


def _read_references(model_path: str) -> _References:
    """What the ``.onnx`` now at ``model_path`` references, read without its payloads; the file parsed must be the
    regular file ``lstat`` saw (a symlink, or a name swapped meanwhile, is "unknown": the safe side)."""
    try:
        _syscall("lstat")
        st = os.lstat(model_path)
    except FileNotFoundError:
        return _References(known=True)
    except OSError:
        return _References(known=False)
    if not stat.S_ISREG(st.st_mode):
        return _References(known=False)
    try:
        _syscall("read")
        stripped = load_model_stripped(model_path, 0)
    except InvalidModelError:
        return _References(known=True)
    except OSError:
        return _References(known=False)
    if (stripped.device, stripped.inode) != (st.st_dev, st.st_ino):
        return _References(known=False)
    paths = frozenset(path for path, _ in _named_files(stripped.model, os.path.dirname(model_path)))
    identities = set()
    for path in paths:
        with contextlib.suppress(OSError):
            found = os.stat(path)
            identities.add(FileIdentity(found.st_dev, found.st_ino))
    return _References(known=True, paths=paths, identities=frozenset(identities))


def _bridge_model(model_bytes: bytes, model_path: str, bridges: dict[str, str]) -> bytes:
    """The new model with every reference naming a key of ``bridges`` (a final weights path) naming its value."""
    model = onnx.ModelProto()
    model.ParseFromString(model_bytes)
    folder = os.path.dirname(model_path)
    for target, rename in list(_named_files(model, folder)):
        if target in bridges:
            rename(os.path.relpath(bridges[target], folder))
    return serialize_model(model)


# ------------------------------------------------------------------------------------------------------ journals


def _write_journal(journal: StagedFile, names: Sequence[tuple[str, str]]) -> None:
    """Fill the journal of one publication: each weights name it moves in and the identity (device, inode, size,
    modification time) of each file that is the destination's there until the commit (``names``: final path, path
    of such a file now: the new one, and for a name a previous model references the file there now), durable
    before the first move."""
    folder = os.path.dirname(journal.temp_path)
    files = []
    for final, now in names:
        st = os.stat(now)
        identity = {"device": st.st_dev, "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        files.append({"name": os.path.relpath(final, folder), **identity})
    journal.write_all(json.dumps({"files": files}).encode("utf-8"), 0)
    journal.flush()
    if journal.durable:
        fsync_folder(folder)


def _dead_journals(weights_base: str) -> list[str]:
    """The journals of ``weights_base``'s set whose writer is gone (pid dead or let go, lock free)."""
    folder, name = os.path.split(os.path.abspath(weights_base))
    tag = _name_tag(name)
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
        for entry in entries:
            match = _ANY_OWN_NAME.fullmatch(entry.name)
            if not match or match.group(1) != tag or match.group(3) != _JOURNAL_SUFFIX:
                continue
            if entry.is_file(follow_symlinks=False) and _writer_gone(int(match.group(2)), entry.name):
                with _locked(entry.path) as free:
                    if free:
                        found.append(entry.path)
    return sorted(found)


def journal_leftovers(weights_base: str) -> frozenset[str]:
    """Files a killed publication of the weights set ``weights_base`` moved in, as its journal recorded them.

    Only a file still there with the device, inode, size and modification time the journal recorded: a file put at
    that name since
    (``rm`` and a file of one's own, a copy) is someone else's. Only journals of this module's pattern for
    ``weights_base``'s name, whose writer is gone, at most 1 MiB, naming files of their own folder. Reads only.

    Args:
        weights_base: the first weights file of the set.

    Returns:
        Absolute normalized paths of the files that are the set's own leftovers.
    """
    folder = os.path.dirname(os.path.abspath(weights_base))
    found: set[str] = set()
    for path in _dead_journals(weights_base):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            if os.lstat(path).st_size > _JOURNAL_MAX_BYTES:
                continue
            with open(path, encoding="utf-8") as handle:
                listed = json.load(handle).get("files", [])
            for item in listed:
                name = item["name"]
                if not isinstance(name, str) or not name or name != os.path.basename(name):
                    continue
                target = os.path.normpath(os.path.join(folder, name))
                with contextlib.suppress(OSError):
                    st = os.lstat(target)
                    now = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                    if stat.S_ISREG(st.st_mode) and now == (
                        item["device"],
                        item["inode"],
                        item["size"],
                        item["mtime_ns"],
                    ):
                        found.add(target)
    return frozenset(found)


# -------------------------------------------------------------------------------------------------- after commit


class _AfterCommit:
    """The steps after a commit: each runs even when an earlier one fails; their ``OSError``s are raised together
    by :meth:`finish` as :class:`~onnx_light_ref.errors.PublishedWithErrorsError` (an ``OSError`` would say that
    nothing is published, and a caller restoring its state on it would undo a published model)."""

    def __init__(self, models: Sequence[str]) -> None:
        self.models = models
        self.errors: list[OSError] = []
        self.problems: list[str] = []
        self.leftover_files: list[str] = []
        self.sync_failed = False

    def attempt(self, call: Callable[[], object], problem: str, *, leftover: str | None = None) -> None:
        try:
            call()
        except OSError as exc:
            self.errors.append(exc)
            self.problems.append(f"{problem} ({exc.strerror or exc})")
            if leftover is not None:
                self.leftover_files.append(leftover)

    def fsync_folders(self, paths: Collection[str], durable: bool) -> None:
        for folder in _folders_of(paths) if durable else []:
            try:
                fsync_folder(folder)
            except OSError as exc:
                self.sync_failed = True
                self.errors.append(exc)
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                self.problems.append(f"the fsync of the folder {folder!r} that makes it durable failed ({reason})")

    def remove(self, path: str) -> None:
        def unlink() -> None:
            with contextlib.suppress(FileNotFoundError):
                _syscall("unlink")
                os.unlink(path)

        self.attempt(unlink, f"removing the hidden file {path!r} failed", leftover=path)

    def finish(self, result: object, *, files: bool = False) -> None:
        """Raise the failures together (``files``: the outputs are files that reference nothing, not models)."""
        if not self.errors:
            return
        what = ", ".join(repr(path) for path in self.models)
        several = len(self.models) > 1 and not files
        if files and len(self.models) > 1:
            what = f"{self.models[0]!r} (and {len(self.models) - 1} more output(s))"
        hints = []
        if self.sync_failed:
            hints.append(f"the new model{'s are' if several else ' is'} in place but may not survive a power loss: "
                         "run the job again or sync")  # fmt: skip
        if self.leftover_files:
            hints.append(f"{len(self.leftover_files)} hidden file(s) are left; the next publication into this folder "
                         "removes them")  # fmt: skip
        published = "are published (every new model is in place and loads)" if several else _PUBLISHED
        raise PublishedWithErrorsError(
            f"{what} {published}, but " + "; ".join(self.problems) + (f" ({'; '.join(hints)})" if hints else ""),
            model_path=self.models[0],
            errors=self.errors,
            leftover_files=self.leftover_files,
            sync_failed=self.sync_failed,
            published_models=self.models,
            result=result,
        ) from self.errors[0]


_PUBLISHED = "is published (the new model is in place and loads)"


# ------------------------------------------------------------------------------------------------ the transaction


class OutputTransaction:
    """The output files of one job, published together; use as a context manager.

    :meth:`stage` creates each file under a temp name; the caller writes it and sets its size; :meth:`publish` then
    publishes every file and model (module docstring). Leaving the block on an exception deletes every temp file,
    so a failed job leaves each destination exactly as it was. ``keep``: the job's sources, never swept.
    """

    def __init__(self, *, durable: bool = True, keep: Collection[FileIdentity] = ()) -> None:
        self.durable = check_bool("durable", durable)
        self.keep = frozenset(keep)
        self.files: list[StagedFile] = []
        self.committed = False  # True once a new model (or file) is in place, even when a later step failed
        self._swept: set[str] = set()  # folders this job swept when it staged its first file there

    def __enter__(self) -> OutputTransaction:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            with deferred_interrupts():
                for staged in self.files:
                    staged.discard()

    def stage(self, final_path: str, suffix: str = _TEMP_SUFFIX) -> StagedFile:
        """A new temp file of ``final_path``, registered at once (no interrupt between the two)."""
        folder = os.path.dirname(os.path.abspath(final_path))
        with deferred_interrupts():
            sweep = folder not in self._swept  # once per folder and job (the publication sweeps again under its lock)
            staged = StagedFile(final_path, durable=self.durable, keep=self.keep, suffix=suffix, sweep=sweep)
            self.files.append(staged)
            self._swept.add(folder)
        return staged

    def publish(
        self,
        models: Sequence[tuple[str, bytes]],
        *,
        before_commit: BeforeCommit | None = None,
        result: object = None,
        journal: str | None = None,
        removals: Callable[[], Mapping[str, FileIdentity]] | None = None,
    ) -> None:
        """Stage each model's ``.onnx`` (none: files that reference nothing, e.g. ``run``'s outputs), then publish
        every staged file and every model under the folder lock, the models last.

        ``before_commit`` runs under the lock right before the first move (what it raises leaves every destination
        as it was; the identities it returns are never deleted). ``journal`` (the first weights file): record the
        weights names before the first move (module docstring). ``removals``, called right after
        ``before_commit``: files to delete after the last commit (those still the file of that identity: an
        earlier layout's files the caller checked). ``result`` is attached to a
        :class:`~onnx_light_ref.errors.PublishedWithErrorsError`.

        Raises:
            OSError: a write, an fsync or a move failed before any commit; every move is undone.
            PublishedWithErrorsError: something is published, but a later step failed, or a failure could not be
                undone (its ``published_models`` and ``previous_models`` say which models are new).
        """
        weights = list(self.files)
        staged_models = []
        for path, data in models:
            staged = self.stage(path)
            staged.write_all(data, 0)
            staged_models.append(staged)
        for staged in self.files:
            staged.flush()
        with folder_lock(_folders_of([staged.final_path for staged in self.files])) as lock:
            protected = before_commit() if before_commit is not None else None
            publication = _Publication(self, weights, staged_models, list(models), self.keep | set(protected or ()))
            publication.removals = dict(removals()) if removals is not None else {}
            publication.prepare(journal)
            with deferred_interrupts():
                try:
                    publication.commit()
                except PublishedWithErrorsError as exc:
                    exc.result = result
                    raise
                finally:
                    self.committed = publication.standing > 0
                publication.after_commit(lock, result)


class _Publication:
    """One publication under the folder lock (module docstring): its moves, bridges and journal."""

    def __init__(
        self,
        transaction: OutputTransaction,
        weights: Sequence[StagedFile],
        models: Sequence[StagedFile],
        model_bytes: Sequence[tuple[str, bytes]],
        keep: Collection[FileIdentity],
    ) -> None:
        self.transaction = transaction
        self.weights = weights
        self.models = models
        self.model_bytes = [data for _, data in model_bytes]
        self.keep = keep
        self.durable = transaction.durable
        self.moves: list[_Move] = []
        self.standing = 0  # moves done and not undone
        self.commits: list[int] = []  # index in `moves` of each model's first commit
        self.bridged: list[StagedFile] = []  # new files published on their temp names by commit A
        self.copies: list[StagedFile] = []  # their copies, for the final names
        self.bridge_models: list[StagedFile] = []
        self.previous: list[_References] = []
        self.journal: StagedFile | None = None
        self.bridge_synced = False  # the folders were fsynced after the commits A
        self.removals: dict[str, FileIdentity] = {}

    def prepare(self, journal: str | None) -> None:
        """Under the lock, before the first move: what the previous models reference, the bridges and their copies
        when a previous model references a name this run rewrites, the journal, and the dead writers' files."""
        self.previous = [_read_references(model.final_path) for model in self.models]
        self.bridged = [staged for staged in self.weights if any(p.has(staged.final_path) for p in self.previous)]
        for staged in self.bridged:
            copy = self.transaction.stage(staged.final_path)
            assert copy.fd is not None
            whole = [CopyRange(staged.temp_path, 0, 0, os.stat(staged.temp_path).st_size)]
            with RangeCopier(copy.fd, _COPY_CHUNK, durable=self.durable) as copier:  # a reflink where possible
                reserve_space(
                    copy.fd, whole[0].length, path=staged.final_path, clone_bytes=copier.plan_clone_bytes(whole)
                )
                copier.copy(whole)
            copy.set_size(whole[0].length)
            copy.flush()
            self.copies.append(copy)
        bridges = {staged.final_path: staged.temp_path for staged in self.bridged}
        for model, data in zip(self.models, self.model_bytes, strict=True) if bridges else ():
            bridge = self.transaction.stage(model.final_path)
            bridge.write_all(_bridge_model(data, model.final_path, bridges), 0)
            bridge.flush()
            self.bridge_models.append(bridge)
        if journal is not None and self.weights:
            at_final = {staged.final_path: staged.temp_path for staged in self.weights}
            at_final.update({copy.final_path: copy.temp_path for copy in self.copies})
            # A name a previous model references holds the destination's own file until the copy replaces it, and
            # after commit A no model references it any more: the journal vouches for it too.
            names = [*at_final.items(), *((staged.final_path, staged.final_path) for staged in self.bridged)]
            self.journal = self.transaction.stage(journal, _JOURNAL_SUFFIX)
            _write_journal(self.journal, names)
        if all(previous.known for previous in self.previous):  # else what a destination uses is unknown
            keep = set(self.keep).union(*(previous.identities for previous in self.previous))
            for folder in _folders_of([staged.final_path for staged in self.transaction.files]):
                sweep_dead_writers(folder, keep=keep)

    def _fsync(self, paths: Sequence[str]) -> None:
        if self.durable:
            for folder in _folders_of(paths):
                fsync_folder(folder)

    def _moved(self, temp: str, final: str) -> None:
        self.moves.append(_move(temp, final))
        self.standing = len(self.moves)

    def commit(self) -> None:
        """Every move, in the module docstring's order; on failure every move is undone, or what stands is said."""
        try:
            for staged in self.weights:
                if staged not in self.bridged:
                    self._moved(staged.temp_path, staged.final_path)
            self._fsync([staged.final_path for staged in self.weights])
            if self.bridged:
                for bridge in self.bridge_models:  # commit A of each model: the new values, on the bridge files
                    self.commits.append(len(self.moves))
                    self._moved(bridge.temp_path, bridge.final_path)
                self._fsync([model.final_path for model in self.models])
                self.bridge_synced = True
                for copy in self.copies:
                    self._moved(copy.temp_path, copy.final_path)
                self._fsync([copy.final_path for copy in self.copies])
            for model in self.models:  # commit B, or the only commit
                if not self.bridged:
                    self.commits.append(len(self.moves))
                self._moved(model.temp_path, model.final_path)
        except Exception as exc:
            self.standing = _undo_all(self.moves)
            published = self._published()
            for staged in self.bridged if published else []:
                staged.keep_temp = True  # a commit A stands: a model reads its bridge files
            if self.journal is not None:
                self.journal.keep_temp = self.standing > 0  # it names what this run left at final names
            if published or (self.standing and not self.models):
                raise self._published_partly(exc, published) from exc
            raise

    def _published(self) -> list[str]:
        """The models whose new version stands (a commit done and not undone)."""
        count = len(self.models)
        firsts = self.commits[:count]
        return [self.models[i].final_path for i, at in enumerate(firsts) if at < self.standing]

    def _published_partly(self, exc: Exception, published: list[str]) -> PublishedWithErrorsError:
        """A failure that could not be undone left new models (or files) in place: published, never an OSError."""
        previous = [model.final_path for model in self.models if model.final_path not in published]
        names = ", ".join(repr(os.path.basename(staged.temp_path)) for staged in self.bridged)
        on_bridges = any(staged.keep_temp for staged in self.bridged)
        if not self.models:  # files that reference nothing: those moved stand, the others are as before
            published = [move.final for move in self.moves[: self.standing]]
            message = f"{', '.join(map(repr, published))} {'are' if len(published) > 1 else 'is'} published, but "
            message += f"the publication failed ({exc}) and could not be undone; the other outputs are as before."
        elif len(self.models) == 1:
            message = (
                f"{published[0]!r} {_PUBLISHED}, but on hidden bridge names ({names}): moving its weights to their "
                f"final names failed ({exc}) and could not be undone. The next publication to this destination "
                "removes them."
            )
        else:
            where = f" (some on hidden bridge names: {names}, which the next publication removes)" if on_bridges else ""
            state = "every member is new"
            if previous:
                verb = "are" if len(previous) > 1 else "is"
                state = f"{', '.join(map(repr, previous))} {verb} still the previous version (each loads and computes "
                state += "its previous values)"
            message = (
                f"{', '.join(map(repr, published))} {'are' if len(published) > 1 else 'is'} published (each new "
                f"model is in place and loads){where}, but the publication failed ({exc}) and could not be undone: "
                f"{state}. Run the job again to publish the whole family."
            )
        return PublishedWithErrorsError(
            message,
            model_path=published[0],
            errors=[exc] if isinstance(exc, OSError) else [],
            sync_failed=self.durable and not self.bridge_synced,
            published_models=published,
            previous_models=previous,
        )

    def after_commit(self, lock: FolderLock, result: object) -> None:
        """Every step after the last commit, each run even when one fails; failures raised together."""
        for staged in self.transaction.files:
            staged.committed = True
        paths = [model.final_path for model in self.models] or [staged.final_path for staged in self.weights]
        after = _AfterCommit(paths)
        after.fsync_folders(paths, self.durable)
        hidden = [move.temp for move in self.moves if move.kind == "exchanged"]
        hidden += [staged.temp_path for staged in self.bridged]
        in_use: dict[str, NearbyReferences] = {}

        def nearby(folder: str) -> NearbyReferences:
            if folder not in in_use:
                in_use[folder] = files_referenced_near(folder)
            return in_use[folder]

        for path, identity in self.removals.items():  # an earlier layout's files, checked under this lock
            if _identity_of(path) == identity:
                after.attempt(functools.partial(os.unlink, path), f"removing the earlier file {path!r} failed")
        for path in hidden:
            remove = functools.partial(self._remove_unless_used, after, path, nearby)
            after.attempt(remove, f"checking which models use the hidden file {path!r} failed", leftover=path)
        if self.journal is not None:  # this run's, and those of dead runs of the same weights set
            base = self.journal.final_path
            after.remove(self.journal.temp_path)
            problem = f"listing the journals killed runs left beside {base!r} failed"
            after.attempt(lambda: list(map(after.remove, _dead_journals(base))), problem)
            # No folder fsync for these removals: a journal a power loss brings back vouches for the files it names
            # only while they keep their identity, and those are now the published model's (rule 3's own anyway).
        for staged in self.transaction.files:
            after.attempt(staged.release, f"releasing the lock of {staged.final_path!r} failed")
        keep = set(self.keep) | {FileIdentity(s.st_dev, s.st_ino) for s in _stats(after.leftover_files)}
        for folder in _folders_of([staged.final_path for staged in self.transaction.files]):
            self._sweep(after, folder, keep, nearby)
        after.fsync_folders(hidden, self.durable)
        after.attempt(lock.release, "releasing the lock of the destination folder(s) failed")
        after.finish(result, files=not self.models)

    @staticmethod
    def _sweep(
        after: _AfterCommit, folder: str, keep: Collection[FileIdentity], nearby: Callable[[str], NearbyReferences]
    ) -> None:
        failures: list[tuple[str, OSError]] = []
        problem = f"sweeping the files killed runs left in {folder!r} failed"
        after.attempt(lambda: sweep_dead_writers(folder, keep=keep, failures=failures, nearby=nearby), problem)
        for path, error in failures:
            after.leftover_files.append(path)
            after.errors.append(error)
            after.problems.append(f"removing {path!r}, left by a killed run, failed ({error.strerror or error})")

    @staticmethod
    def _remove_unless_used(after: _AfterCommit, path: str, nearby: Callable[[str], NearbyReferences]) -> None:
        """Delete a hidden file of the publication unless a model that can reach its folder references it (a variant
        another process saved from the model while it stood on its bridge names): kept, a later sweep removes it."""
        if not os.path.lexists(path):
            return
        near = nearby(os.path.dirname(path))
        if near.unreadable or _referenced(path, near.keys):
            logger.warning("kept the hidden file %s: a model that can reach its folder references it, or may; a "
                           "later publication into the folder removes it once no model uses it", path)  # fmt: skip
            return
        after.remove(path)


def _identity_of(path: str) -> FileIdentity | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def _stats(paths: Sequence[str]) -> list[os.stat_result]:
    found = []
    for path in paths:
        with contextlib.suppress(OSError):
            found.append(os.lstat(path))
    return found
