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

Temp names are ``.olr~<hash of the final name>~<pid>~<random>.tmp`` (at most 50 bytes whatever the final name) and
their writer holds an ``flock`` on them until they are published or deleted. A later run removes such a file only
when it is one of ours for the same destination (the name pattern), its writer is gone (pid dead *and* the lock
free: a writer in another pid namespace still holds its lock), and it is not one of the current job's sources.
Bridge files are removed only under the destination folder's lock, by a publication to a ``.onnx`` that does not
reference them. All moves of one publication happen under an exclusive ``flock`` on each destination folder, so two
jobs writing the same destination publish one after the other. ``durable=False`` skips every ``fsync`` (files and
folders) but keeps the temp files, the lock and the atomic moves: same bytes, no power-loss durability.

This module never writes outside the destination folders, never creates a hard link, and never deletes a file that
is not one of its own temp or bridge files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

import onnx
from google.protobuf.message import DecodeError

from onnx_light_ref.io.arguments import check_bool
from onnx_light_ref.io.posix import pread_exact, pwrite_all
from onnx_light_ref.io.read.locations import FileIdentity
from onnx_light_ref.io.read.model_file import serialize_model
from onnx_light_ref.io.read.walker import iter_tensors
from onnx_light_ref.io.write.space import reserve_space

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
_BRIDGE_SUFFIX = ".bridge"
_ANY_BRIDGE = re.compile(
    re.escape(_TEMP_PREFIX) + r"[0-9a-f]{12}~(\d{1,10})~[0-9a-f]{16}" + re.escape(_BRIDGE_SUFFIX) + "$"
)

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


def _temp_pattern(final_name: str, suffix: str = _TEMP_SUFFIX) -> re.Pattern[str]:
    return re.compile(
        re.escape(f"{_TEMP_PREFIX}{_name_tag(final_name)}~") + r"(\d{1,10})~[0-9a-f]{16}" + re.escape(suffix) + "$"
    )


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


def _writer_gone(pid: int, *, ours_too: bool = False) -> bool:
    """The pid of a temp or bridge name is not running (``ours_too``: or is this process, see :class:`_Publication`)."""
    return (ours_too and pid == os.getpid()) or not _pid_alive(pid)


def _remove_stale(final_path: str, suffix: str, keep: Collection[FileIdentity], *, ours_too: bool = False) -> list[str]:
    folder, name = os.path.split(os.path.abspath(final_path))
    pattern = _temp_pattern(name, suffix)
    kept = set(keep)
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(folder):
            match = pattern.match(entry.name)
            if not match or not entry.is_file(follow_symlinks=False):
                continue
            if not _writer_gone(int(match.group(1)), ours_too=ours_too):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if FileIdentity(st.st_dev, st.st_ino) in kept or not _lock_free(entry.path, st):
                continue
            with contextlib.suppress(FileNotFoundError):
                _syscall("unlink")
                os.unlink(entry.path)
                removed.append(entry.name)
                logger.info("removed %s left by a killed run", entry.path)
    return removed


def remove_stale_temp_files(final_path: str, *, keep: Collection[FileIdentity] = ()) -> list[str]:
    """Delete temp files of ``final_path`` left by dead writers; return the names removed.

    A file is removed only when its name is one of this module's temp names for ``final_path``, it is a regular
    file, its writer's pid is dead and its lock is free, and its identity is not in ``keep`` (the current job's
    sources: a source that happens to be named like a temp file is never touched). Bridge files are not temp files:
    a published model may reference one (see the module docstring); only a publication removes them.
    """
    return _remove_stale(final_path, _TEMP_SUFFIX, keep)


class StagedFile:
    """A new file written under a temp name next to ``final_path``; it takes the final name only when published.

    Created with mode ``0o666 & ~umask`` like any file the user creates (``mkstemp`` would give 0600). With
    ``durable=False`` neither the file nor its folder is ever fsynced (the moves stay atomic).
    """

    def __init__(self, final_path: str, *, durable: bool = True, keep: Collection[FileIdentity] = ()) -> None:
        self.durable = check_bool("durable", durable)
        self.final_path = os.path.abspath(final_path)
        folder = os.path.dirname(self.final_path)
        if not os.path.isdir(folder):
            raise FileNotFoundError(errno.ENOENT, f"destination folder does not exist: {folder!r}", folder)
        remove_stale_temp_files(self.final_path, keep=keep)
        self.temp_path = _own_name(self.final_path, _TEMP_SUFFIX)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        _syscall("open")
        self.fd: int | None = os.open(self.temp_path, flags, 0o666)
        self.committed = False
        self.keep_temp = False  # set when a published model references the temp name (see _Publication)
        # A second descriptor of the same open file holds the temp file's lock until it is renamed or deleted, so
        # that closing `fd` after the write (flush) does not release it.
        _syscall("dup")
        self._lock_fd: int | None = os.dup(self.fd)
        try:
            _syscall("flock")
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:  # a filesystem without flock: the pid in the name still protects the file
            logger.debug("cannot lock temp file %s: %s", self.temp_path, exc)

    def _release_lock(self) -> None:
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
                    _syscall("fsync")
                    os.fsync(fd)
            finally:
                _syscall("close")
                os.close(fd)

    def commit(self) -> None:
        """Publish this one file alone: fsync, then move it to the final path (the previous file is deleted)."""
        publish_all([self])

    def discard(self) -> None:
        """Close and delete the temp file (no-op after commit)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
        if not self.committed and not self.keep_temp:
            with contextlib.suppress(FileNotFoundError):
                _syscall("unlink")
                os.unlink(self.temp_path)
        self._release_lock()


def _fsync_folder(folder: str) -> None:
    try:
        _syscall("open")
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # e.g. a folder we may not open; the moves are still atomic
        return
    try:
        _syscall("fsync")
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on folders
        logger.debug("fsync of folder %s failed: %s", folder, exc)
    finally:
        _syscall("close")
        os.close(fd)


def _fsync_folders(paths: Collection[str], durable: bool) -> None:
    if durable:
        for folder in dict.fromkeys(os.path.dirname(path) for path in paths):
            _fsync_folder(folder)


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


def _delete_previous(moves: Sequence[_Move]) -> None:
    """After the commit: delete the previous versions the exchanges left under temp names."""
    for move in moves:
        if move.kind == "exchanged":
            with contextlib.suppress(FileNotFoundError):
                _syscall("unlink")
                os.unlink(move.temp)


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

    def publish(self, model_path: str, model_bytes: bytes, *, before_commit: BeforeCommit | None = None) -> StagedFile:
        """Write the ``.onnx`` under a temp name, then publish the staged weights and it, the ``.onnx`` rename last.

        ``before_commit`` (when given) runs after every file is flushed, under the folder lock, right before the first
        move: the writer contract's re-check (:func:`~onnx_light_ref.io.write.contract.recheck_plan`: sharers saved
        meanwhile, files that appeared at an output name, ``link``'s checkpoint). What it raises leaves every
        destination as it was; the identities it returns are files other models reference, which this publication
        never deletes (a bridge file a variant was saved against), on top of ``keep``.

        Returns the ``.onnx``'s :class:`StagedFile` (committed). Raises what writing or moving raises, after
        undoing every move already done (the destinations are then as before the call).
        """
        model_file = self.stage(model_path)
        model_file.write_all(model_bytes, 0)
        weights = self.files[:-1]
        for staged in self.files:
            staged.flush()
        with folder_lock([os.path.dirname(staged.final_path) for staged in self.files]):
            protected = before_commit() if before_commit is not None else None
            _Publication(weights, model_file, model_bytes, self.keep | frozenset(protected or ())).run()
        return model_file


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


@contextlib.contextmanager
def folder_lock(folders: Collection[str]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on each folder (by real identity, in a fixed order) for the block.

    Two publications into the same folder therefore never interleave their moves. Folders are locked in
    (device, inode) order, so two jobs sharing several folders cannot deadlock. A filesystem that refuses ``flock``
    (some network filesystems) is logged and publication goes on unlocked: the moves stay atomic, only concurrent
    jobs are no longer serialized.
    """
    opened: dict[tuple[int, int], int] = {}
    try:
        for folder in folders:
            _syscall("open")
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key in opened:
                os.close(fd)
            else:
                opened[key] = fd
        for key in sorted(opened):
            try:
                _syscall("flock")
                fcntl.flock(opened[key], fcntl.LOCK_EX)
            except OSError as exc:
                logger.warning("cannot lock destination folder for publication (%s); publishing unlocked", exc)
        yield
    finally:
        for fd in opened.values():
            _syscall("close")
            os.close(fd)  # releases the lock


def publish_all(files: Sequence[StagedFile], *, before_commit: BeforeCommit | None = None) -> None:
    """Flush every file, then move each to its final name in order, under :func:`folder_lock`.

    ``before_commit`` runs under the lock right before the first move, as for :meth:`OutputTransaction.publish`
    (what it raises leaves every destination as it was; what it returns is not needed: nothing but the previous
    versions is deleted here).

    For files that do not reference each other (e.g. ``.npy`` outputs): each destination is always absent, its
    previous version or the new file. A failure part-way (a move raising) swaps back every file already moved, so
    the destinations are exactly as before the call; the previous versions are deleted only after the last move. A
    model (an ``.onnx`` and the weights it references) is published by :meth:`OutputTransaction.publish` instead.
    """
    for staged in files:
        staged.flush()
    with folder_lock([os.path.dirname(staged.final_path) for staged in files]):
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
        _fsync_folders([staged.final_path for staged in files if staged.durable], True)
        _delete_previous(moves)
        for staged in files:
            staged._release_lock()


# ------------------------------------------------------------------------------------- what a model references


@dataclass(frozen=True)
class _References:
    """The files an existing ``.onnx`` references: normalized paths and the identities of those that exist.

    ``known=False``: the ``.onnx`` exists but could not be read (e.g. no permission); every existing name is then
    treated as referenced (the safe side: it is bridged rather than replaced under a model). A file that is read but
    does not parse as a model references nothing: no loader can load it, there is nothing to keep loadable.
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
    """What the ``.onnx`` now at ``model_path`` references (reads it, writes nothing)."""
    try:
        _syscall("open")
        fd = os.open(model_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return _References(known=True)
    except OSError:  # a symlink (ELOOP), no permission...: what it references is unknown
        return _References(known=False)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _References(known=False)
        size = st.st_size
        buffer = bytearray(size)
        _syscall("read")
        if pread_exact(fd, memoryview(buffer), 0) < size:
            return _References(known=False)
    finally:
        os.close(fd)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(bytes(buffer))
        found = list(_locations(model))
    except (DecodeError, ValueError, RuntimeError):
        return _References(known=True)  # not a model any loader reads: nothing of it to keep loadable
    folder = os.path.dirname(model_path)
    paths = frozenset(os.path.normpath(os.path.join(folder, location)) for _, location in found)
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
    """One model publication, run under the folder lock (see the module docstring for the order of the moves)."""

    def __init__(
        self, weights: Sequence[StagedFile], model: StagedFile, model_bytes: bytes, keep: Collection[FileIdentity]
    ) -> None:
        self.weights = weights
        self.model = model
        self.model_bytes = model_bytes
        self.keep = keep
        self.durable = model.durable
        self.moves: list[_Move] = []
        self.extra: list[StagedFile] = []  # temp files of the bridge step
        self.bridges: list[str] = []
        self.previous = _References(known=False)
        self.bridge_commit: int | None = None  # index of commit A in `moves`

    def run(self) -> None:
        previous = _read_references(self.model.final_path)
        self.previous = previous
        self._sweep_bridges(previous)
        clashing = [staged for staged in self.weights if previous.has(staged.final_path)]
        try:
            for staged in self.weights:
                if staged not in clashing:
                    self.moves.append(_move(staged.temp_path, staged.final_path))
            if clashing:
                self._bridge(clashing)
            _fsync_folders([staged.final_path for staged in self.weights], self.durable)
            self.moves.append(_move(self.model.temp_path, self.model.final_path))  # the commit
        except BaseException:
            kept = _undo_all(self.moves)
            if kept and self.bridge_commit is not None and kept > self.bridge_commit:
                # Commit A could not be undone (no RENAME_EXCHANGE): the destination is the new model through its
                # bridge files, which must stay; the next publication to it removes them.
                for staged in self.weights:
                    staged.keep_temp = True
            _discard_all(self.extra)
            # A bridge file is its weights file's temp name now (the caller may still read it back; its cleanup
            # deletes it unless kept above).
            raise
        for staged in [*self.weights, self.model]:
            staged.committed = True
        _fsync_folders([self.model.final_path], self.durable)
        _delete_previous(self.moves)
        for path in [*self.bridges, *self._previous_bridges()]:
            with contextlib.suppress(FileNotFoundError):
                _syscall("unlink")
                os.unlink(path)
        for staged in [*self.weights, self.model, *self.extra]:
            staged._release_lock()
        if self.bridges:
            _fsync_folders(self.bridges, self.durable)

    def _bridge(self, clashing: Sequence[StagedFile]) -> None:
        """Commit A (a bridge ``.onnx`` referencing the new files under bridge names), then the final names."""
        mapping = {}
        for staged in clashing:
            bridge = _own_name(staged.final_path, _BRIDGE_SUFFIX)
            _syscall("rename")
            os.rename(staged.temp_path, bridge)
            self.bridges.append(bridge)
            staged.temp_path = bridge  # after a failure the caller's cleanup deletes it (unless a model uses it)
            mapping[os.path.normpath(staged.final_path)] = bridge
        bridge_model = StagedFile(self.model.final_path, durable=self.durable, keep=self.keep)
        self.extra.append(bridge_model)
        bridge_model.write_all(_bridge_model(self.model_bytes, self.model.final_path, mapping), 0)
        bridge_model.flush()
        _fsync_folders([*self.bridges, *(staged.final_path for staged in self.weights)], self.durable)
        self.bridge_commit = len(self.moves)
        self.moves.append(_move(bridge_model.temp_path, self.model.final_path))  # commit A
        _fsync_folders([self.model.final_path], self.durable)
        for staged, bridge in zip(clashing, self.bridges, strict=True):
            copy = StagedFile(staged.final_path, durable=self.durable, keep=self.keep)
            self.extra.append(copy)
            assert copy.fd is not None
            _copy_file(bridge, copy.fd, os.stat(bridge).st_size, staged.final_path)
            copy.flush()
            self.moves.append(_move(copy.temp_path, staged.final_path))  # its temp name now holds the previous file

    def _previous_bridges(self) -> list[str]:
        """Bridge files the replaced ``.onnx`` referenced (a run killed between its two commits), now unreferenced.

        Only those in a folder this publication holds locked, whose writer is dead (or is this process: every
        publication of ours holds the folder lock, so none of ours is in flight there) and whose lock is free.
        """
        locked = {os.path.dirname(staged.final_path) for staged in [*self.weights, self.model]}
        found = []
        for path in sorted(self.previous.paths):
            match = _ANY_BRIDGE.match(os.path.basename(path))
            if not match or os.path.dirname(path) not in locked or not _writer_gone(int(match.group(1)), ours_too=True):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if (
                stat.S_ISREG(st.st_mode)
                and FileIdentity(st.st_dev, st.st_ino) not in self.keep
                and _lock_free(path, st)
            ):
                found.append(path)
        return found

    def _sweep_bridges(self, previous: _References) -> None:
        """Delete bridge files of this job's weights names left by a dead run, unless the current model uses them."""
        if not previous.known:
            return
        keep = set(self.keep) | set(previous.identities)
        for staged in self.weights:
            _remove_stale(staged.final_path, _BRIDGE_SUFFIX, keep, ours_too=True)
