"""The one way to open a file named by a model: relative to a descriptor of the model's folder, held since the start.

A reader (kernel bind, evaluator construction, the start of align / verify / undelay / inspect / shared save) opens
the model's folder once with :meth:`ModelFolder.open` and keeps the descriptor. Every file the model names is then
opened relative to that descriptor, never by an absolute path, so renaming the folder away, or swapping it or one of
its subfolders for a symbolic link, cannot redirect a read to another file:

* ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` (Linux >= 5.6, called through
  ``ctypes``): the kernel itself refuses any symbolic link and any escape, atomically. onnx 1.23's loader opens
  external data the same way (``try_kernel_contained_open`` in ``onnx/checker.cc``);
* else a walk, one component at a time, each opened with ``O_NOFOLLOW`` relative to the previous one (the same
  guarantee, built from calls every POSIX system has).

The opened file is then checked on its descriptor (``fstat``): a regular file, with one hard link (onnx refuses
several: ``open_external_data`` in ``onnx/checker.cc``). ``allow_outside_folder=True`` is the opt-in for trusted
layouts (the Hugging Face cache, whose ``snapshots/<rev>/model.onnx.data`` is a symlink into ``../../blobs/``):
symbolic links are followed and absolute names allowed, but the file must still be a regular file with one link.
See ``docs/safety.md`` for the rule and the citations.

Errors are typed and name the file, the tensor or node, and the folder: ``FileNotFoundError`` (missing),
:class:`~onnx_light_ref.errors.UnsafeLocationError` (symlink, escape, hard link), otherwise
:class:`~onnx_light_ref.errors.ExternalDataError`. No other ``OSError`` leaves this module.

This module must never open a file by an absolute path in the confined mode, never use ``realpath`` to decide what
may be read, never read file contents, and never write.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from dataclasses import dataclass
from types import TracebackType

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io.posix import check_single_link

__all__ = ["FileIdentity", "ModelFolder", "OpenedFile", "open_model_file", "openat2_available", "relative_below"]

# What a data file is opened with. O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused right after
# by the fstat check); no effect on regular files. O_NOCTTY: a terminal device never becomes our controlling tty.
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
# What a folder is held with: O_PATH needs no read permission and cannot read anything; elsewhere O_RDONLY.
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
# openat2 is syscall 437 on every architecture that has the unified syscall table (x86_64, aarch64, riscv64...).
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437, "riscv64": 437, "ppc64le": 437, "s390x": 437}
# How often openat2 may answer EAGAIN (a rename raced the lookup) before the walk takes over.
_OPENAT2_RETRIES = 8


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_syscall = None
_SYS_OPENAT2_NUMBER = _SYS_OPENAT2.get(platform.machine(), -1)
if platform.system() == "Linux" and _SYS_OPENAT2_NUMBER > 0:
    try:
        _syscall = ctypes.CDLL(None, use_errno=True).syscall
        _syscall.restype = ctypes.c_long
        _syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_OpenHow), ctypes.c_size_t]
    except (OSError, AttributeError):
        _syscall = None


class _Openat2Probe:
    """What is known of ``openat2`` in this process.

    ``works``: None until the first call; False after ENOSYS/EPERM (an old kernel, a seccomp filter). Tests set
    ``force_walk`` to exercise the walk on kernels that have ``openat2``.
    """

    works: bool | None = None
    force_walk = False


PROBE = _Openat2Probe()


def openat2_available() -> bool:
    """Whether :class:`ModelFolder` opens with ``openat2`` here (False: the ``O_NOFOLLOW`` walk is used)."""
    return _syscall is not None and PROBE.works is not False and not PROBE.force_walk


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What makes two paths the same file: device and inode (catches hard links and symlinks; stays the same when
    the file is renamed, changes when it is replaced)."""

    device: int
    inode: int


@dataclass(slots=True)
class OpenedFile:
    """A data file opened read-only through a :class:`ModelFolder`, checked on its descriptor.

    ``stat`` is the ``fstat`` taken right after the open: identity, size and modification time of exactly the file
    the descriptor reads. Close it (or use ``with``); the folder does not track it.
    """

    fd: int
    location: str  # as the model wrote it
    path: str  # the folder's path joined with the location: for messages only, never reopened
    stat: os.stat_result

    @property
    def identity(self) -> FileIdentity:
        return FileIdentity(self.stat.st_dev, self.stat.st_ino)

    @property
    def size(self) -> int:
        return self.stat.st_size

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> OpenedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ModelFolder:
    """A model's folder, held by a descriptor from :meth:`open` until :meth:`close`; opens the files it names.

    Use as a context manager, or keep it for the lifetime of a reader (a kernel, an evaluator) and close it then.
    """

    def __init__(self, path: str, fd: int, identity: FileIdentity, allow_outside_folder: bool) -> None:
        self.path = path
        self._fd = fd
        self.identity = identity
        self.allow_outside_folder = allow_outside_folder

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, allow_outside_folder: bool = False) -> ModelFolder:
        """Open and hold the folder ``path`` (symbolic links in ``path`` itself are the caller's choice: followed).

        Args:
            path: the model's folder.
            allow_outside_folder: trust the model: follow symbolic links and allow absolute names in
                :meth:`open_file` (see the module docstring).

        Returns:
            The held folder.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            ExternalDataError: ``path`` is not a folder or cannot be opened.
        """
        shown = os.path.abspath(os.fspath(path))
        try:
            fd = os.open(shown, _DIR_FLAGS)
        except FileNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, f"model folder {shown!r} does not exist", shown) from exc
        except OSError as exc:
            raise ExternalDataError(f"model folder {shown!r} cannot be opened: {exc.strerror or exc}.") from exc
        st = os.fstat(fd)
        return cls(shown, fd, FileIdentity(st.st_dev, st.st_ino), bool(allow_outside_folder))

    @property
    def fd(self) -> int:
        """The held descriptor (``O_PATH`` where available): use it only as a ``dir_fd``."""
        if self._fd < 0:
            raise ValueError(f"model folder {self.path!r} was closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> ModelFolder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to report to
            self.close()

    def __repr__(self) -> str:
        return f"ModelFolder({self.path!r}, allow_outside_folder={self.allow_outside_folder})"

    def display_path(self, location: str) -> str:
        """``location`` joined to the folder's path and normalized, for messages (never opened by that name)."""
        return os.path.normpath(os.path.join(self.path, location))

    def open_file(
        self, location: str, *, tensor_name: str | None = None, subject: str | None = None, check_links: bool = True
    ) -> OpenedFile:
        """Open ``location`` read-only relative to the held folder and check the descriptor.

        Confined (the default): no component may be a symbolic link (inside or outside the folder: onnx refuses
        both), no absolute name, no ``..``; the kernel guarantees it when it has ``openat2``, the walk otherwise.
        With ``allow_outside_folder``: symbolic links are followed, absolute names used as they are. Both modes: the
        descriptor must be a regular file with exactly one hard link.

        Args:
            location: the name as the model wrote it (already through
                :func:`~onnx_light_ref.io.read.locations.check_location_syntax` for external data).
            tensor_name: the tensor the file is for; messages start ``tensor '<name>': external data file ...``.
            subject: the start of every message instead (a kernel names its node), e.g. ``"node 'w': file 'x'"``.
            check_links: refuse several hard links here (False: the caller checks ``stat.st_nlink`` itself, after
                reporting a more useful error first, such as "the destination is this source").

        Returns:
            The open file; the caller closes it.

        Raises:
            FileNotFoundError: the file or a folder on the way does not exist (or a component is a file).
            UnsafeLocationError: a symbolic link on the way, an absolute or ``..`` name, several hard links.
            ExternalDataError: not a regular file, or not accessible (permissions, name too long...).
        """
        what = subject or f"tensor {tensor_name!r}: external data file {location!r}"
        opener = self._open_following if self.allow_outside_folder else self._open_beneath
        fd = opener(location, what)
        shown = self.display_path(location)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ExternalDataError(f"{what} ({shown!r}) is not a regular file; expected a file of weights.")
            if check_links:
                check_single_link(st, what=f"{what} ({shown!r})")
        except BaseException:
            os.close(fd)
            raise
        return OpenedFile(fd, location, shown, st)

    def stat_file(self, location: str, *, tensor_name: str | None = None, subject: str | None = None) -> os.stat_result:
        """:meth:`open_file`, ``fstat``, close: the checked ``stat`` of the file ``location`` names now."""
        with self.open_file(location, tensor_name=tensor_name, subject=subject) as opened:
            return opened.stat

    # ------------------------------------------------------------------------------------------------ confined

    def _open_beneath(self, location: str, what: str) -> int:
        if not location or location.startswith("/") or "\x00" in location:
            raise UnsafeLocationError(
                f"{what} is not a relative name inside the model's folder {self.path!r}; refused before opening."
            )
        if ".." in location.split("/"):
            raise UnsafeLocationError(f"{what} contains a '..' component; refused before opening.")
        if not location.strip("/."):
            raise UnsafeLocationError(f"{what} names the model's folder itself, not a file.")
        if openat2_available():
            fd = self._openat2(location, what)
            if fd is not None:
                return fd
        return self._walk(location, what)

    def _openat2(self, location: str, what: str) -> int | None:
        """The kernel's contained open; None when it cannot be used (the walk takes over)."""
        assert _syscall is not None
        how = _OpenHow(_FILE_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
        name = os.fsencode(location)
        for _ in range(_OPENAT2_RETRIES):
            fd = _syscall(_SYS_OPENAT2_NUMBER, self.fd, name, ctypes.byref(how), ctypes.sizeof(how))
            if fd >= 0:
                PROBE.works = True
                return int(fd)
            err = ctypes.get_errno()
            if err in (errno.EINTR, errno.EAGAIN):
                continue
            if err in (errno.ENOSYS, errno.EPERM) and PROBE.works is None:
                PROBE.works = False  # no openat2 here (old kernel, seccomp): walk from now on
                return None
            if err in (errno.ENOSYS, errno.E2BIG, errno.EINVAL):
                return None
            raise self._open_error(err, location, what)
        return None  # renames kept racing the lookup: the walk gives the same guarantee

    def _walk(self, location: str, what: str) -> int:
        """Component by component from the held folder, each with ``O_NOFOLLOW``."""
        parts = [part for part in location.split("/") if part not in ("", ".")]
        current = self.fd
        try:
            for index, part in enumerate(parts):
                last = index == len(parts) - 1
                flags = (_FILE_FLAGS if last else _DIR_FLAGS) | os.O_NOFOLLOW
                try:
                    opened = os.open(part, flags, dir_fd=current)
                except OSError as exc:
                    err = exc.errno or errno.EIO
                    if err in (errno.ENOTDIR, errno.ELOOP, errno.EMLINK) and _is_symlink(part, current):
                        err = errno.ELOOP
                    raise self._open_error(err, location, what) from exc
                # O_PATH | O_NOFOLLOW opens a symbolic link itself rather than failing: refuse it here.
                if not last and stat.S_ISLNK(os.fstat(opened).st_mode):
                    os.close(opened)
                    raise self._open_error(errno.ELOOP, location, what)
                if current != self._fd:
                    os.close(current)
                current = opened
        except BaseException:
            if current != self._fd:
                os.close(current)
            raise
        return current

    # ------------------------------------------------------------------------------------------------ trusted

    def _open_following(self, location: str, what: str) -> int:
        if not location or "\x00" in location:
            raise UnsafeLocationError(f"{what} is empty or contains a NUL byte.")
        try:
            return os.open(location, _FILE_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise self._open_error(exc.errno or errno.EIO, location, what) from exc

    def _open_error(self, err: int, location: str, what: str) -> Exception:
        shown = self.display_path(location)
        if err in (errno.ENOENT, errno.ENOTDIR):
            return FileNotFoundError(
                errno.ENOENT, f"{what} does not exist in the model's folder {self.path!r} (looked for {shown!r})", shown
            )
        if err in (errno.ELOOP, errno.EMLINK):
            return UnsafeLocationError(
                f"{what} ({shown!r}) is a symbolic link or goes through one; refused as onnx's loader refuses any "
                "symbolic link in a data path, inside or outside the model's folder. Pass allow_outside_folder=True "
                "(CLI: --allow-outside-folder) for a trusted layout such as the Hugging Face cache."
            )
        if err == errno.EXDEV:
            return UnsafeLocationError(
                f"{what} ({shown!r}) leads outside the model's folder {self.path!r}; refused before reading anything."
            )
        return ExternalDataError(f"{what} ({shown!r}) cannot be accessed: {os.strerror(err)}.")


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def relative_below(folder: str, absolute: str) -> str | None:
    """The name of ``absolute`` relative to ``folder``, compared by name; None when it is not below it.

    For a confined reader given an absolute name (a ``DelayedInitializer`` filename): the name is then opened
    relative to the held folder like any other, so this only computes a name, it never decides what may be read.
    ``folder`` is compared as given and with its symbolic links resolved (the user may have bound it through an
    alias); a name with ``..`` components is not below anything (onnx refuses ``..``).
    """
    if "/../" in f"{absolute}/" or not os.path.isabs(absolute):
        return None
    name = os.path.normpath(absolute)
    try:
        real_folder = os.path.realpath(folder)
    except OSError:  # a folder renamed during the lookup: compare by the name as given only
        real_folder = os.path.normpath(folder)
    for base in dict.fromkeys((os.path.normpath(folder), real_folder)):
        prefix = os.path.join(base, "")
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix) :]
    return None


def open_model_file(path: str, folder: ModelFolder | None) -> int:
    """Open the model file ``path`` read-only, relative to ``folder``'s descriptor when given (then by its base
    name: the file the held folder has under that name, a final symlink followed as for any path the user names)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    if folder is None:
        return os.open(path, flags)
    return os.open(os.path.basename(path), flags, dir_fd=folder.fd)
