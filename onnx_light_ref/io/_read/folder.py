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

Look before opening: the name is first opened with ``O_PATH`` (a descriptor that designates the file and can read
nothing: opening a FIFO this way releases no writer blocked on it, and a device node's driver is never called) and
checked on that descriptor with ``fstat``: a regular file, with one hard link (onnx refuses several:
``open_external_data`` in ``onnx/checker.cc``). Only then is that very file opened for reading, through
``/proc/self/fd/N`` (the inode the ``O_PATH`` descriptor holds, not the name again; without ``/proc`` the name is
opened again and must be the same device and inode, which the ``O_PATH`` descriptor keeps from being reused). Where
``O_PATH`` does not exist (not Linux) the name is opened ``O_RDONLY | O_NONBLOCK | O_NOCTTY`` and checked right after.

One outcome per name, in both openers and both modes: before any system call, :func:`check_file_name` refuses an
empty name, a NUL byte, a name of ``PATH_MAX`` bytes or more (``openat2`` would refuse it while the walk, opening
one component at a time, would not), and a name whose last component is empty or ``.`` (``w.bin/``, ``w.bin/.``,
``w.bin//``: a folder, not a file; the walk would otherwise drop the empty components and open ``w.bin``).

``allow_outside_folder=True`` is the opt-in for trusted layouts (the Hugging Face cache, whose
``snapshots/<rev>/model.onnx.data`` is a symlink into ``../../blobs/``): symbolic links are followed and absolute
names allowed, but the file must still be a regular file with one link. See ``docs/safety.md`` for the rule and the
citations.

Errors are typed and name the file, the tensor or node, and the folder: ``FileNotFoundError`` (missing),
:class:`~onnx_light_ref.errors.UnsafeLocationError` (symlink, escape, hard link), ``OSError`` with ``errno``
``EMFILE``/``ENFILE`` when the process or the system is out of descriptors (:func:`descriptor_limit_error`: what it
is, and what to do), otherwise :class:`~onnx_light_ref.errors.ExternalDataError`. No other ``OSError`` leaves this
module.

This module must never open a file by an absolute path in the confined mode, never use ``realpath`` to decide what
may be read, never open anything but a regular file for reading, never read file contents, and never write.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._posix import check_single_link

PATH_MAX = 4096
"""Linux's ``PATH_MAX``, terminating NUL included: the kernel refuses a name of this many bytes or more
(``ENAMETOOLONG``), so every opener refuses it before any system call, whatever it would do with the components."""

_O_PATH: int | None = getattr(os, "O_PATH", None)
# What a data file is opened for reading with. O_NONBLOCK: where there is no O_PATH to look first, opening a FIFO
# must not wait for a writer (it is refused right after by the fstat check); no effect on regular files. O_NOCTTY:
# a terminal device never becomes our controlling tty.
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
# What a name is looked at with before it is opened for reading: O_PATH designates the file and can read nothing.
_LOOK_FLAGS = (_O_PATH | os.O_CLOEXEC) if _O_PATH is not None else _FILE_FLAGS
# What a folder is held with: O_PATH needs no read permission and cannot read anything; elsewhere O_RDONLY.
_DIR_FLAGS = (_O_PATH if _O_PATH is not None else os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
# Where the inode an O_PATH descriptor designates is opened for reading (not the name again).
_PROC_FD = "/proc/self/fd"

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
# openat2 is syscall 437 on every architecture that has the unified syscall table (x86_64, aarch64, riscv64...).
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437, "riscv64": 437, "ppc64le": 437, "s390x": 437}
# How often openat2 may answer EAGAIN (a rename raced the lookup) before the walk takes over.
_OPENAT2_RETRIES = 8

_FILE_TYPES = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


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
    ``force_walk`` to exercise the walk on kernels that have ``openat2``, and ``no_proc`` to exercise the reopen by
    name that is used where ``/proc`` is not mounted.
    """

    works: bool | None = None
    force_walk = False
    no_proc = False


PROBE = _Openat2Probe()


def openat2_available() -> bool:
    """Whether :class:`ModelFolder` opens with ``openat2`` here (False: the ``O_NOFOLLOW`` walk is used)."""
    return _syscall is not None and PROBE.works is not False and not PROBE.force_walk


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What makes two paths the same file: device and inode (catches hard links and symlinks; stays the same when
    the file is renamed, changes when it is replaced).

    An inode number is unique only while the file exists: a file system hands a freed number to the next file it
    creates (ext4 does at once). Two identities compared across time designate the same file only if something
    kept the first file alive meanwhile, such as an open descriptor (the kernel's held weights files).
    """

    device: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        """The identity of the file ``st`` describes."""
        return cls(st.st_dev, st.st_ino)


@dataclass(slots=True)
class OpenedFile:
    """A data file opened read-only through a :class:`ModelFolder`, checked on its descriptor.

    ``stat`` is the ``fstat`` of exactly the file the descriptor reads. Close it (or use ``with``); the folder does
    not track it.
    """

    fd: int
    location: str  # as the model wrote it
    path: str  # the folder's path joined with the location: for messages only, never reopened
    stat: os.stat_result

    @property
    def identity(self) -> FileIdentity:
        return FileIdentity.of(self.stat)

    @property
    def size(self) -> int:
        return self.stat.st_size

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def detach(self) -> int:
        """Hand the descriptor over to the caller, who closes it from now on."""
        fd, self.fd = self.fd, -1
        return fd

    def __enter__(self) -> OpenedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe_file_type(st: os.stat_result) -> str:
    """What ``st`` is, for messages: ``"a regular file"``, ``"a folder"``, ``"a FIFO (named pipe)"``, ..."""
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    for test, name in _FILE_TYPES:
        if test(st.st_mode):
            return name
    return f"a special file (mode {stat.S_IFMT(st.st_mode):#o})"


def descriptor_limit_error(err: int, what: str) -> OSError:
    """``EMFILE`` / ``ENFILE`` said as what they are: out of descriptors, not a file that "cannot be opened".

    Returns an ``OSError`` with that ``errno`` whose message gives the limit and what to do: close the evaluators
    no longer used (``close()`` or a ``with`` block: each holds its model's folder and, in file mode, its weights
    files) or raise the limit.
    """
    if err == errno.ENFILE:
        reason = "the system's table of open files is full (ENFILE)"
    else:
        reason = "this process has too many open files (EMFILE"
        try:
            import resource

            reason += f": its limit, RLIMIT_NOFILE, is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} descriptors)"
        except (ImportError, OSError, ValueError):
            reason += ")"
    return OSError(
        err,
        f"{what}: {reason}. Nothing was read. Close the evaluators you no longer use (evaluator.close(), or build "
        "them in a 'with' block: each holds its model's folder and, in file mode, its weights files), or raise the "
        "limit (ulimit -n).",
    )


def check_file_name(name: str, what: str) -> None:
    """Refuse, before any system call, a name no opener may answer differently from another.

    Empty or with a NUL byte (:class:`UnsafeLocationError`); ``PATH_MAX`` bytes or more
    (:class:`ExternalDataError`: ``openat2`` refuses it, a walk of short components would not); a last component
    that is empty or ``.`` (``w.bin/``, ``w.bin/.``, ``w.bin//``, ``/``, ``.``: :class:`UnsafeLocationError`, it
    names a folder, not a file). The same rule for relative and absolute names, confined or trusted.
    """
    if not name or "\x00" in name:
        raise UnsafeLocationError(f"{what} is empty or contains a NUL byte; refused before opening.")
    size = len(os.fsencode(name))
    if size >= PATH_MAX:
        raise ExternalDataError(
            f"{what} cannot be accessed: the name is {size} bytes long, and a path must be shorter than PATH_MAX "
            f"({PATH_MAX} bytes with its terminating NUL). Refused before opening."
        )
    if not name.strip("/."):
        raise UnsafeLocationError(
            f"{what} names a folder itself ('.', '/' or './'), not a file; refused before opening."
        )
    if name.endswith(("/", "/.")):
        raise UnsafeLocationError(
            f"{what} does not name a file: it names a folder (it ends with '/' or '/.', or is '.'); refused before "
            "opening."
        )


def _check_regular(st: os.stat_result, what: str, shown: str, expected: str = "a file of weights") -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ExternalDataError(
            f"{what} ({shown!r}) is not a regular file: it is {describe_file_type(st)}, which was not opened; "
            f"expected {expected}."
        )


def _check_looked(
    look_fd: int, what: str, shown: str, folder: str | None, check_links: bool, expected: str = "a file of weights"
) -> os.stat_result:
    """The ``fstat`` of a looked-up (``O_PATH``) descriptor, checked: a regular file, one link if asked. Closes the
    descriptor when it refuses."""
    try:
        st = os.fstat(look_fd)
        if stat.S_ISLNK(st.st_mode):  # O_PATH | O_NOFOLLOW opens a symbolic link itself rather than failing
            raise _map_open_error(errno.ELOOP, what, shown, folder)
        _check_regular(st, what, shown, expected)
        if check_links:
            check_single_link(st, what=f"{what} ({shown!r})")
    except BaseException:
        os.close(look_fd)
        raise
    return st


def _map_open_error(err: int, what: str, shown: str, folder: str | None) -> Exception:
    """The typed error for a failed open of ``shown`` (``folder``: the held folder it was opened through)."""
    if err in (errno.ENOENT, errno.ENOTDIR):
        where = f" in the model's folder {folder!r} (looked for {shown!r})" if folder is not None else ""
        why = " (a component of its path is a file, not a folder)" if err == errno.ENOTDIR else ""
        return FileNotFoundError(errno.ENOENT, f"{what} does not exist{where}{why}", shown)
    if err in (errno.EMFILE, errno.ENFILE):
        return descriptor_limit_error(err, what)
    if err in (errno.ELOOP, errno.EMLINK) and folder is not None:
        return UnsafeLocationError(
            f"{what} ({shown!r}) is a symbolic link or goes through one; refused as onnx's loader refuses any "
            "symbolic link in a data path, inside or outside the model's folder. Pass allow_outside_folder=True "
            "(CLI: --allow-outside-folder) for a trusted layout such as the Hugging Face cache."
        )
    if err == errno.EXDEV and folder is not None:
        return UnsafeLocationError(
            f"{what} ({shown!r}) leads outside the model's folder {folder!r}; refused before reading anything."
        )
    return ExternalDataError(f"{what} ({shown!r}) cannot be accessed: {os.strerror(err)}.")


def _open_for_reading(look_fd: int, st: os.stat_result, what: str, shown: str, again: Callable[[], int]) -> int:
    """A read descriptor of the file ``look_fd`` (``O_PATH``) designates, checked to be that file.

    Through ``/proc/self/fd`` (the inode itself); without ``/proc``, ``again()`` opens the name anew, and the result
    must be the same device and inode (``look_fd`` keeps the inode from being freed and its number reused).
    """
    if _O_PATH is None:
        return os.dup(look_fd)  # already a read descriptor, checked by fstat
    fd = -1
    if not PROBE.no_proc:
        try:
            fd = os.open(f"{_PROC_FD}/{look_fd}", _FILE_FLAGS)
        except FileNotFoundError:
            fd = -1  # no /proc here
        except OSError as exc:
            raise _map_open_error(exc.errno or errno.EIO, what, shown, None) from exc
    if fd < 0:
        fd = again()
    try:
        now = os.fstat(fd)
        if FileIdentity.of(now) != FileIdentity.of(st):
            raise ExternalDataError(
                f"{what} ({shown!r}) was replaced while it was being opened (another device/inode than the file "
                "checked); nothing was read."
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


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
            OSError: ``EMFILE``/``ENFILE``, out of descriptors (:func:`descriptor_limit_error`).
            ExternalDataError: ``path`` is not a folder or cannot be opened.
        """
        shown = os.path.abspath(os.fspath(path))
        return cls._hold(shown, shown, bool(allow_outside_folder))

    @classmethod
    def current(cls) -> ModelFolder:
        """Hold the current directory: the directory the process is in (opened as ``"."``), whatever its name now.

        Its :attr:`identity` tells two directories apart even when one was renamed away and another created at the
        same path. Confined (``allow_outside_folder=False``).

        Raises:
            FileNotFoundError: the current directory was deleted.
            OSError: ``EMFILE``/``ENFILE``.
            ExternalDataError: it cannot be opened.
        """
        try:
            shown = os.getcwd()
        except FileNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, f"the current directory is not accessible ({exc})") from exc
        return cls._hold(".", shown, False)

    @classmethod
    def _hold(cls, name: str, shown: str, allow_outside_folder: bool) -> ModelFolder:
        try:
            fd = os.open(name, _DIR_FLAGS)
        except FileNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, f"model folder {shown!r} does not exist", shown) from exc
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise descriptor_limit_error(exc.errno, f"model folder {shown!r}") from exc
            raise ExternalDataError(f"model folder {shown!r} cannot be opened: {exc.strerror or exc}.") from exc
        return cls(shown, fd, FileIdentity.of(os.fstat(fd)), allow_outside_folder)

    def duplicate(self) -> ModelFolder:
        """A second hold on the same folder (its own descriptor, same path and mode), for another owner to close.

        Raises:
            OSError: ``EMFILE``/``ENFILE``.
        """
        try:
            fd = os.dup(self.fd)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise descriptor_limit_error(exc.errno, f"model folder {self.path!r}") from exc
            raise
        return ModelFolder(self.path, fd, self.identity, self.allow_outside_folder)

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
        """Open ``location`` read-only relative to the held folder, after looking at what it is.

        Confined (the default): no component may be a symbolic link (inside or outside the folder: onnx refuses
        both), no absolute name, no ``..``; the kernel guarantees it when it has ``openat2``, the walk otherwise.
        With ``allow_outside_folder``: symbolic links are followed, absolute names used as they are. Both modes:
        :func:`check_file_name` first, then the name is opened ``O_PATH`` and must be a regular file with exactly
        one hard link before it is opened for reading (a FIFO, a device, a socket, a folder never are).

        Args:
            location: the name as the model wrote it (already through
                :func:`~onnx_light_ref.io._read.locations.check_location_syntax` for external data).
            tensor_name: the tensor the file is for; messages start ``tensor '<name>': external data file ...``.
            subject: the start of every message instead (a kernel names its node), e.g. ``"node 'w': file 'x'"``.
            check_links: refuse several hard links here (False: the caller checks ``stat.st_nlink`` itself, after
                reporting a more useful error first, such as "the destination is this source").

        Returns:
            The open file; the caller closes it.

        Raises:
            FileNotFoundError: the file or a folder on the way does not exist (or a component is a file).
            UnsafeLocationError: a symbolic link on the way, an absolute or ``..`` name, a name ending with ``/``,
                several hard links.
            OSError: ``EMFILE``/``ENFILE``, out of descriptors.
            ExternalDataError: not a regular file, or not accessible (permissions, name too long...).
        """
        what = subject or f"tensor {tensor_name!r}: external data file {location!r}"
        look_fd, st = self._look(location, what, check_links)
        shown = self.display_path(location)
        try:
            fd = _open_for_reading(look_fd, st, what, shown, lambda: self._opener(location, what, False))
        finally:
            os.close(look_fd)
        return OpenedFile(fd, location, shown, st)

    def stat_file(
        self, location: str, *, tensor_name: str | None = None, subject: str | None = None, check_links: bool = True
    ) -> os.stat_result:
        """The checked ``stat`` of the file ``location`` names now, by the rules of :meth:`open_file`, without
        opening it for reading (``O_PATH`` and ``fstat`` only)."""
        what = subject or f"tensor {tensor_name!r}: external data file {location!r}"
        look_fd, st = self._look(location, what, check_links)
        os.close(look_fd)
        return st

    def _look(self, location: str, what: str, check_links: bool) -> tuple[int, os.stat_result]:
        """``location`` opened ``O_PATH`` and checked (regular, one link); the caller closes the descriptor."""
        check_file_name(location, what)
        look_fd = self._opener(location, what, True)
        return look_fd, _check_looked(look_fd, what, self.display_path(location), self.path, check_links)

    def _opener(self, location: str, what: str, look: bool) -> int:
        if self.allow_outside_folder:
            return self._open_following(location, what, look)
        return self._open_beneath(location, what, look)

    # ------------------------------------------------------------------------------------------------ confined

    def _open_beneath(self, location: str, what: str, look: bool) -> int:
        if location.startswith("/"):
            raise UnsafeLocationError(
                f"{what} is not a relative name inside the model's folder {self.path!r}; refused before opening."
            )
        if ".." in location.split("/"):
            raise UnsafeLocationError(f"{what} contains a '..' component; refused before opening.")
        if not location.strip("/."):
            raise UnsafeLocationError(f"{what} names the model's folder itself, not a file.")
        flags = _LOOK_FLAGS if look else _FILE_FLAGS
        if openat2_available():
            fd = self._openat2(location, what, flags)
            if fd is not None:
                return fd
        return self._walk(location, what, flags)

    def _openat2(self, location: str, what: str, flags: int) -> int | None:
        """The kernel's contained open; None when it cannot be used (the walk takes over)."""
        assert _syscall is not None
        how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
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
            raise _map_open_error(err, what, self.display_path(location), self.path)
        return None  # renames kept racing the lookup: the walk gives the same guarantee

    def _walk(self, location: str, what: str, flags: int) -> int:
        """Component by component from the held folder, each with ``O_NOFOLLOW``."""
        parts = [part for part in location.split("/") if part not in ("", ".")]
        current = self.fd
        try:
            for index, part in enumerate(parts):
                last = index == len(parts) - 1
                try:
                    opened = os.open(part, (flags if last else _DIR_FLAGS) | os.O_NOFOLLOW, dir_fd=current)
                except OSError as exc:
                    err = exc.errno or errno.EIO
                    if err in (errno.ENOTDIR, errno.ELOOP, errno.EMLINK) and _is_symlink(part, current):
                        err = errno.ELOOP
                    raise _map_open_error(err, what, self.display_path(location), self.path) from exc
                # O_PATH | O_NOFOLLOW opens a symbolic link itself rather than failing: refuse it here (the last
                # component is checked by the caller's fstat).
                if not last and stat.S_ISLNK(os.fstat(opened).st_mode):
                    os.close(opened)
                    raise _map_open_error(errno.ELOOP, what, self.display_path(location), self.path)
                if current != self._fd:
                    os.close(current)
                current = opened
        except BaseException:
            if current != self._fd:
                os.close(current)
            raise
        return current

    # ------------------------------------------------------------------------------------------------ trusted

    def _open_following(self, location: str, what: str, look: bool) -> int:
        try:
            return os.open(location, _LOOK_FLAGS if look else _FILE_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise _map_open_error(exc.errno or errno.EIO, what, self.display_path(location), self.path) from exc


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _look_unconfined(path: str, what: str, check_links: bool, expected: str) -> tuple[int, os.stat_result]:
    check_file_name(path, what)
    try:
        look_fd = os.open(path, _LOOK_FLAGS)
    except OSError as exc:
        raise _map_open_error(exc.errno or errno.EIO, what, path, None) from exc
    return look_fd, _check_looked(look_fd, what, path, None, check_links, expected)


def open_unconfined(
    path: str, *, subject: str, check_links: bool = False, expected: str = "a file of weights"
) -> OpenedFile:
    """Open a name the caller chose to trust as it is (an absolute ``filename`` of an unbound kernel, or of a bound
    one with ``allow_outside_folder``): symbolic links followed, the same look-before-opening and name rules as
    :meth:`ModelFolder.open_file` (``expected`` says, in the message for a FIFO or a device, what the file should
    have been).

    Raises:
        FileNotFoundError: missing (or a path through a file).
        UnsafeLocationError: an empty name, a name ending with ``/``, several hard links (``check_links``).
        OSError: ``EMFILE``/``ENFILE``.
        ExternalDataError: not a regular file, or not accessible.
    """

    def again() -> int:
        try:
            return os.open(path, _FILE_FLAGS)
        except OSError as exc:
            raise _map_open_error(exc.errno or errno.EIO, subject, path, None) from exc

    look_fd, st = _look_unconfined(path, subject, check_links, expected)
    try:
        fd = _open_for_reading(look_fd, st, subject, path, again)
    finally:
        os.close(look_fd)
    return OpenedFile(fd, path, path, st)


def stat_unconfined(path: str, *, subject: str, check_links: bool = False) -> os.stat_result:
    """:func:`open_unconfined`'s checks without opening for reading: the checked ``stat`` of ``path`` now."""
    look_fd, st = _look_unconfined(path, subject, check_links, "a file of weights")
    os.close(look_fd)
    return st


def relative_below(
    folder: str, absolute: str, *, what: str, outside: str = "", label: str = "the model's folder"
) -> str:
    """The name of ``absolute`` relative to ``folder``, compared by name, or the real reason it has none.

    For a confined reader given an absolute name (a ``DelayedInitializer`` filename): the name is then opened
    relative to the held folder like any other, so this only computes a name, it never decides what may be read.
    ``folder`` is compared as given and with its symbolic links resolved (the user may have bound it through an
    alias). Call :func:`check_file_name` on ``absolute`` first (a trailing ``/`` is refused there, not normalized
    away here).

    Args:
        folder: the held folder's path.
        absolute: the absolute name as the model wrote it.
        what: the start of every message (the node or tensor and the name).
        outside: appended to the message of a name outside the folder (what the caller can do about it).
        label: how messages name the folder.

    Returns:
        The relative name.

    Raises:
        UnsafeLocationError: a ``..`` component (refused as onnx refuses it, even when the name lands back inside);
            the folder itself (not a file); a name outside the folder.
    """
    if ".." in absolute.split("/"):
        raise UnsafeLocationError(
            f"{what} contains a '..' component; refused as onnx refuses '..' in a data path (even one that leads "
            "back inside the folder), before reading anything."
        )
    name = os.path.normpath(absolute)
    try:
        real_folder = os.path.realpath(folder)
    except OSError:  # a folder renamed during the lookup: compare by the name as given only
        real_folder = os.path.normpath(folder)
    bases = list(dict.fromkeys((os.path.normpath(folder), real_folder)))
    if name in bases:
        raise UnsafeLocationError(f"{what} names {label} {folder!r} itself, not a file in it.")
    for base in bases:
        prefix = os.path.join(base, "")
        if name.startswith(prefix):
            return name[len(prefix) :]
    raise UnsafeLocationError(
        f"{what} resolves to {name!r}, outside {label} {folder!r}; refused before reading anything.{outside}"
    )


def open_model_file(path: str, folder: ModelFolder | None) -> int:
    """Open the model file ``path`` read-only, relative to ``folder``'s descriptor when given (then by its base
    name: the file the held folder has under that name, a final symlink followed as for any path the user names).

    Looks before opening: the name is opened ``O_PATH`` first, and only a regular file is opened for reading. For
    anything else (a folder, a FIFO, a device, a socket) the ``O_PATH`` descriptor itself is returned: it can only
    be ``fstat``-ed, which every caller does before reading, to report what the path is (:func:`describe_file_type`);
    a FIFO's writer is not released and a device is not opened.

    Raises:
        OSError: what ``open`` raises (``FileNotFoundError``, ``PermissionError``, ``EMFILE``...).
    """
    name, dir_fd = (path, None) if folder is None else (os.path.basename(path), folder.fd)
    look_fd = os.open(name, _LOOK_FLAGS, dir_fd=dir_fd)
    if _O_PATH is None:
        return look_fd
    try:
        st = os.fstat(look_fd)
        if not stat.S_ISREG(st.st_mode):
            return look_fd
        fd = -1 if PROBE.no_proc else _reopen_through_proc(look_fd)
        if fd < 0:
            # No /proc: the name again. Replaced meanwhile by a regular file, that file is what the user's path
            # names now; by anything else, the O_PATH descriptor goes back for the caller to refuse.
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return look_fd
    except BaseException:
        os.close(look_fd)
        raise
    os.close(look_fd)
    return fd


def _reopen_through_proc(look_fd: int) -> int:
    """A read descriptor of the inode ``look_fd`` designates; -1 when there is no ``/proc``."""
    try:
        return os.open(f"{_PROC_FD}/{look_fd}", _FILE_FLAGS)
    except FileNotFoundError:
        return -1
