"""Atomic publication of output files: temp file in the destination folder, fsync, rename, fsync the folder.

A destination path is therefore always either absent, its previous version, or the complete new file; never
half-written. Temp files are named ``.olr~<hash of the final name>~<pid>~<random>.tmp`` (at most 50 bytes whatever the
final name, so any legal destination name works) and their writer holds an ``flock`` on them until they are renamed
or deleted. A later run removes such a file only when it is one of ours for the same destination (the name pattern),
its writer is gone (pid dead *and* the lock free: a writer in another pid namespace still holds its lock), and it is
not one of the current job's sources.

Every writer publishes through :class:`OutputTransaction`: stage the weights file(s), write them, then
:meth:`OutputTransaction.publish` stages the ``.onnx`` last and renames everything as one transaction (rolled back on
failure). The renames of one publication happen under an exclusive ``flock`` on each destination folder, so two jobs
writing the same destination (a retried job) publish one after the other: the ``.onnx`` left in place always
describes the weights beside it. ``durable=False`` skips every ``fsync`` (files and folders) but keeps the temp file,
the lock and the atomic rename: same bytes, no crash durability. This module never writes outside the destination
folders and never deletes a file that is not one of its own temp files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import stat
from collections.abc import Collection, Iterator, Sequence
from types import TracebackType

from onnx_light_ref.io.arguments import check_bool
from onnx_light_ref.io.locations import FileIdentity
from onnx_light_ref.io.posix import pwrite_all

__all__ = [
    "OutputTransaction",
    "StagedFile",
    "folder_lock",
    "publish_all",
    "remove_stale_temp_files",
    "staged_files",
]

logger = logging.getLogger(__name__)

_TEMP_PREFIX = ".olr~"
_TEMP_SUFFIX = ".tmp"


def _name_tag(final_name: str) -> str:
    """A short, stable tag of the final name: temp names stay short and a sweep only sees its own destination's."""
    return hashlib.sha256(os.fsencode(final_name)).hexdigest()[:12]


def _temp_pattern(final_name: str) -> re.Pattern[str]:
    return re.compile(
        re.escape(f"{_TEMP_PREFIX}{_name_tag(final_name)}~")
        + r"(\d{1,10})~[0-9a-f]{16}"
        + re.escape(_TEMP_SUFFIX)
        + "$"
    )


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


def _lock_free(path: str, expected: os.stat_result) -> bool:
    """True when nobody holds the flock of the temp file at ``path`` (still the file that was listed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino) or not stat.S_ISREG(st.st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True  # closing the descriptor releases the probe's lock
    finally:
        os.close(fd)


def remove_stale_temp_files(final_path: str, *, keep: Collection[FileIdentity] = ()) -> list[str]:
    """Delete temp files of ``final_path`` left by dead writers; return the names removed.

    A file is removed only when its name is one of this module's temp names for ``final_path``, it is a regular
    file, its writer's pid is dead and its lock is free, and its identity is not in ``keep`` (the current job's
    sources: a source that happens to be named like a temp file is never touched).
    """
    folder, name = os.path.split(os.path.abspath(final_path))
    pattern = _temp_pattern(name)
    kept = set(keep)
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(folder):
            match = pattern.match(entry.name)
            if not match or not entry.is_file(follow_symlinks=False) or _pid_alive(int(match.group(1))):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if FileIdentity(st.st_dev, st.st_ino) in kept or not _lock_free(entry.path, st):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(entry.name)
                logger.info("removed stale temp file %s left by a killed run", entry.path)
    return removed


class StagedFile:
    """A new file written under a temp name next to ``final_path``; it takes the final name only in :meth:`commit`.

    Created with mode ``0o666 & ~umask`` like any file the user creates (``mkstemp`` would give 0600). With
    ``durable=False`` neither the file nor its folder is ever fsynced (the rename stays atomic).
    """

    def __init__(self, final_path: str, *, durable: bool = True, keep: Collection[FileIdentity] = ()) -> None:
        self.durable = check_bool("durable", durable)
        self.final_path = os.path.abspath(final_path)
        folder = os.path.dirname(self.final_path)
        if not os.path.isdir(folder):
            raise FileNotFoundError(errno.ENOENT, f"destination folder does not exist: {folder!r}", folder)
        remove_stale_temp_files(self.final_path, keep=keep)
        self.temp_path = self._temp_name()
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self.fd: int | None = os.open(self.temp_path, flags, 0o666)
        self.committed = False
        # A second descriptor of the same open file holds the temp file's lock until it is renamed or deleted, so
        # that closing `fd` after the write (flush) does not release it.
        self._lock_fd: int | None = os.dup(self.fd)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:  # a filesystem without flock: the pid in the name still protects the file
            logger.debug("cannot lock temp file %s: %s", self.temp_path, exc)

    def _temp_name(self) -> str:
        folder, name = os.path.split(self.final_path)
        temp = f"{_TEMP_PREFIX}{_name_tag(name)}~{os.getpid()}~{secrets.token_hex(8)}{_TEMP_SUFFIX}"
        return os.path.join(folder, temp)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)

    def write_all(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write ``data`` at ``offset`` (positional, loops on short writes)."""
        assert self.fd is not None
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
                    os.fsync(fd)
            finally:
                os.close(fd)

    def commit(self) -> None:
        """fsync (if not done yet) and rename over the final path; :func:`publish_all` fsyncs the folder after."""
        self.flush()
        os.replace(self.temp_path, self.final_path)
        self.committed = True
        self._release_lock()

    def keep_previous(self) -> str | None:
        """Hard-link the file now at the final path (if any) to a temp name, so :meth:`roll_back` can restore it.

        The backup is named like a temp file, so one left by a killed run is removed as stale like any other.
        Returns None when there is no previous file, or when the filesystem cannot hard-link (then a failed batch
        cannot restore the previous version; the failure is logged).
        """
        backup = self._temp_name()
        try:
            os.link(self.final_path, backup, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("cannot keep the previous %s to restore it on failure: %s", self.final_path, exc)
            return None
        return backup

    def roll_back(self, backup: str | None) -> None:
        """Undo :meth:`commit`: the new file goes back to its temp name, ``backup`` (if any) back to the final path."""
        # Each rename target is known to be absent: the temp name was freed by commit, the final name by the first
        # rename (or it still holds the previous version, and then only the backup goes).
        if self.committed:
            os.rename(self.final_path, self.temp_path)
            self.committed = False
            if backup is None:
                self._fsync_folder()
        if backup is not None:
            if os.path.lexists(self.final_path):
                os.unlink(backup)  # this file's own commit failed: the previous version never left
            else:
                os.rename(backup, self.final_path)
            self._fsync_folder()

    def _fsync_folder(self) -> None:
        if self.durable:
            _fsync_folder(os.path.dirname(self.final_path))

    def discard(self) -> None:
        """Close and delete the temp file (no-op after commit)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
        if not self.committed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.temp_path)
        self._release_lock()


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. a folder we may not open; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on folders
        logger.debug("fsync of folder %s failed: %s", folder, exc)
    finally:
        os.close(fd)


class OutputTransaction:
    """The output files of one job, published together: N weights files, then the ``.onnx`` that points at them.

    Use as a context manager. :meth:`stage` creates each weights file under a temp name; the caller writes it (through
    :attr:`StagedFile.fd` or :meth:`StagedFile.write_all`) and sets its size. :meth:`publish` then stages the
    ``.onnx`` from its serialized bytes and renames every file with :func:`publish_all` (weights in staging order,
    ``.onnx`` last; all renames undone if one fails). Leaving the block on an exception deletes every temp file, so
    a failed job leaves each destination exactly as it was.

    Example::

        with OutputTransaction(durable=True) as outputs:
            weights = outputs.stage("out/model.onnx.data")
            weights.write_all(payload, 0)
            outputs.publish("out/model.onnx", model.SerializeToString())

    Args:
        durable: fsync every file and folder before and after the renames (default). ``False`` skips every fsync but
            keeps the temp files and the atomic renames: the same bytes, without crash durability.
        keep: identities of the job's source files; the stale-temp sweep never removes them.
    """

    def __init__(self, *, durable: bool = True, keep: Collection[FileIdentity] = ()) -> None:
        self.durable = check_bool("durable", durable)
        self.keep = frozenset(keep)
        self.files: list[StagedFile] = []

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

    def publish(self, model_path: str, model_bytes: bytes) -> StagedFile:
        """Write the ``.onnx`` under a temp name, then publish every staged file and it, the ``.onnx`` last.

        Returns the ``.onnx``'s :class:`StagedFile` (committed). Raises what writing or renaming raises, after
        undoing every rename already done.
        """
        model_file = self.stage(model_path)
        model_file.write_all(model_bytes, 0)
        publish_all(self.files)
        return model_file


def _discard_all(files: Sequence[StagedFile]) -> None:
    for staged in files:
        staged.discard()


@contextlib.contextmanager
def staged_files() -> Iterator[list[StagedFile]]:
    """Collect :class:`StagedFile` objects; on any exception every uncommitted one is deleted.

    The lower-level form of :class:`OutputTransaction`, for writers that order their files themselves.
    """
    files: list[StagedFile] = []
    try:
        yield files
    except BaseException:
        _discard_all(files)
        raise


@contextlib.contextmanager
def folder_lock(folders: Collection[str]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on each folder (by real identity, in a fixed order) for the block.

    Two publications into the same folder therefore never interleave their renames. Folders are locked in
    (device, inode) order, so two jobs sharing several folders cannot deadlock. A filesystem that refuses ``flock``
    (some network filesystems) is logged and publication goes on unlocked: the renames stay atomic, only concurrent
    jobs are no longer serialized.
    """
    opened: dict[tuple[int, int], int] = {}
    try:
        for folder in folders:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key in opened:
                os.close(fd)
            else:
                opened[key] = fd
        for key in sorted(opened):
            try:
                fcntl.flock(opened[key], fcntl.LOCK_EX)
            except OSError as exc:
                logger.warning("cannot lock destination folder for publication (%s); publishing unlocked", exc)
        yield
    finally:
        for fd in opened.values():
            os.close(fd)  # releases the lock


def publish_all(files: Sequence[StagedFile]) -> None:
    """Flush every file first, then rename them in order (weights before the ``.onnx`` that points at them).

    The backups, renames and folder fsyncs happen under :func:`folder_lock` on every destination folder: a concurrent
    publication into the same folder waits, so the files end up all from one job or all from the other, never mixed.

    Several renames cannot be one atomic step, so a failure part-way (a rename or folder fsync raising) undoes the
    renames already done: each published file goes back to its temp name (the caller's cleanup deletes it) and the
    file it replaced, kept as a hard-linked backup, takes its name again. The destinations are then exactly as
    before the call, so an old ``.onnx`` never ends up beside new weights it does not describe. Only a crash (the
    process killed between two renames) can still leave the new weights beside the previous ``.onnx``: so the renames
    follow each other with nothing in between (backups are made before the first, folders are fsynced once after
    the last), which keeps that window to one ``rename`` system call. Folders are fsynced only for durable files.
    """
    for staged in files:
        staged.flush()
    with folder_lock([os.path.dirname(staged.final_path) for staged in files]):
        _publish_locked(files)


def _publish_locked(files: Sequence[StagedFile]) -> None:
    backups: list[str | None] = []
    try:
        for staged in files:
            backups.append(staged.keep_previous())
        for staged in files:
            staged.commit()
    except BaseException:
        for staged, backup in reversed(list(zip(files, backups, strict=False))):  # backups may be shorter
            try:
                staged.roll_back(backup)
            except OSError as exc:  # keep the original error; say what could not be undone
                logger.error("could not restore %s after a failed publication: %s", staged.final_path, exc)
        raise
    for folder in dict.fromkeys(os.path.dirname(staged.final_path) for staged in files if staged.durable):
        _fsync_folder(folder)
    for backup in backups:
        if backup is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(backup)
