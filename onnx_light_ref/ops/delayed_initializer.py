"""``ai.rt::DelayedInitializer`` as an ``onnx.reference`` kernel: a tensor read from a weights file.

Use it as ``ReferenceEvaluator(model, new_ops=[DelayedInitializer])``, or ``new_ops=[DelayedInitializer.bind(d)]``
for a model from folder ``d``. ``load_device="cpu"`` reads the bytes once when the evaluator is built and returns a
fresh copy at every run; ``load_device="file"`` reads the file at every run with positional reads straight into the
output array (construction only checks where the file is, never opens it).

Where a ``filename`` may point depends on how the class is made:

* **bound** (``DelayedInitializer.bind(folder)``, what :func:`~onnx_light_ref.ops.reference_evaluator` and the
  ``run`` command use): every filename, absolute or relative, must resolve (symlinks followed) inside ``folder``,
  and a file with several hard links is refused. A model downloaded from anywhere cannot read ``/etc/passwd`` or
  ``~/.ssh/id_rsa`` through the op (the same concern as onnx's CVE-2022-25882 and CVE-2024-27318 for external
  data). :class:`~onnx_light_ref.errors.UnsafeLocationError` names the node and the file, before any byte is read.
* **bound with** ``allow_outside_folder=True``, and **unbound**: the spec's behaviour. Absolute names are used as
  they are; relative names resolve against the bound folder, or (unbound) against the current directory at
  evaluator construction, and must stay inside it (no ``..``, no symlink escape, no hard link).

This module must never seek a shared file descriptor (every read opens its own descriptor), never read more than
``offset + nbytes`` bytes of a file, never allocate the output before the file is known to hold it, never hand out an
array that aliases its cache, never let a raw ``OSError`` other than ``FileNotFoundError`` escape for a file
problem, and never raise ``TypeError`` for one (onnx would rewrap it). A tensor larger than the memory that can be
allocated is :class:`~onnx_light_ref.errors.TensorAllocationError` (a ``MemoryError``), never numpy's untyped one.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io.arguments import check_bool
from onnx_light_ref.io.locations import FileIdentity, check_location_syntax, is_inside, stat_regular_file
from onnx_light_ref.io.posix import check_single_link, pread_exact
from onnx_light_ref.ops.allocation import allocate_tensor
from onnx_light_ref.ops.attributes import (
    ATTRIBUTE_TYPES,
    DelayedInitializerParams,
    check_node_structure,
    describe_node,
    validate_attributes,
)
from onnx_light_ref.ops.dtypes import little_endian_dtype
from onnx_light_ref.ops.schema import DOMAIN, OP_TYPE

__all__ = ["DelayedInitializer"]

logger = logging.getLogger(__name__)

# O_NONBLOCK: opening a FIFO for reading would otherwise block until a writer appears (it is also refused by the
# stat made before opening). It has no effect on regular files.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK

# Where Linux shows the path an open descriptor really refers to: lets a confined read check the file it opened,
# whatever happened to the parent folders between validation and open.
_PROC_FD = "/proc/self/fd"


@dataclass(frozen=True)
class _Source:
    """A validated file to read: where it is, what it is, and the folder it must stay in (None: not confined)."""

    path: str  # what is opened: the real path when resolved, else the absolute filename as written
    shown: str  # the filename as the node wrote it, for messages
    resolved: bool  # path is symlink-free: open it with O_NOFOLLOW
    confined_to: str | None
    refuse_hard_links: bool
    identity: FileIdentity
    size: int


def _checked_getcwd(where: str) -> str:
    try:
        return os.getcwd()
    except OSError as exc:  # the current directory was deleted
        raise FileNotFoundError(
            errno.ENOENT, f"{where}: a relative filename needs the current directory, which is not accessible ({exc})"
        ) from exc


class DelayedInitializer(OpRun):
    """Kernel of ``ai.rt::DelayedInitializer`` v1 for ``onnx.reference.ReferenceEvaluator``.

    Construction checks the node's structure (no input, one output, each attribute once) and validates the six
    attributes (``ValueError`` naming the node), then checks where the file is (see the module docstring) and, for
    ``load_device="cpu"``, reads the bytes. File problems raise ``FileNotFoundError`` (missing),
    :class:`~onnx_light_ref.errors.UnsafeLocationError` (outside the folder, hard-linked, swapped) or ``ValueError``
    (not a regular file, too short, not accessible), each naming the node and the file. With function-linked
    attributes the values are only known per call, so attribute and file checks happen in ``_run`` instead.
    """

    op_domain = DOMAIN
    # No name-based schema lookup: this kernel validates itself, whether or not register_schemas() ran, and
    # whether it ran before or after onnx.reference was imported.
    op_schema = None

    # Set by bind(): the folder filenames resolve against (None: the current directory at construction), and
    # whether filenames may point outside it.
    _rt_bound_dir: ClassVar[str | None] = None
    _rt_allow_outside: ClassVar[bool] = False

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict[str, Any], schema: Any = None) -> None:
        self._rt_where = describe_node(onnx_node)
        # Before OpRun stores the attributes: it keeps the last of duplicated ones without a word.
        check_node_structure(onnx_node, where=self._rt_where)
        super().__init__(onnx_node, run_params, schema=schema)
        self._rt_base_dir: str | None = self._rt_bound_dir
        self._rt_params: DelayedInitializerParams | None = None
        self._rt_cache: np.ndarray | None = None
        if self.has_linked_attribute:
            # One instance serves every call site; the filename is only known per call. Capture the directory a
            # relative name would use now, as the spec says, but do not fail if there is none (absolute names).
            if self._rt_base_dir is None:
                try:
                    self._rt_base_dir = os.getcwd()
                except OSError:
                    self._rt_base_dir = None
            return
        values = {name: getattr(self, name) for name in ATTRIBUTE_TYPES if hasattr(self, name)}
        params = validate_attributes(values, where=self._rt_where)
        if self._rt_base_dir is None and not os.path.isabs(params.filename):
            self._rt_base_dir = _checked_getcwd(self._rt_where)
        self._rt_params = params
        if params.load_device == "cpu":
            cache = self._rt_load(params)
            cache.setflags(write=False)
            self._rt_cache = cache
        else:
            # Refuse a file outside the folder now, not at the first run; the file itself may appear later.
            self._rt_check_path(params)

    @classmethod
    def bind(cls, base_dir: str | os.PathLike[str], *, allow_outside_folder: bool = False) -> type[DelayedInitializer]:
        """A subclass, still named ``DelayedInitializer``, whose filenames are confined to ``base_dir``.

        Every ``filename``, absolute or relative, must resolve (symlinks followed) inside ``base_dir``; relative
        ones resolve against it; files with several hard links are refused. Use it as
        ``new_ops=[DelayedInitializer.bind(model_folder)]``.

        Args:
            base_dir: the model's folder, made absolute now (a later ``os.chdir`` changes nothing).
            allow_outside_folder: trust the model: absolute filenames are used as they are (the spec's behaviour,
                needed for models like the spec's examples, whose files are in ``/tmp``). Relative names still
                resolve against ``base_dir`` and must stay inside it.

        Returns:
            The bound kernel class.

        Raises:
            TypeError: ``allow_outside_folder`` is not a bool.
        """
        check_bool("allow_outside_folder", allow_outside_folder)
        bound_dir = os.path.abspath(os.fspath(base_dir))
        policy = "absolute filenames allowed anywhere" if allow_outside_folder else "every filename confined to it"
        namespace = {
            "_rt_bound_dir": bound_dir,
            "_rt_allow_outside": allow_outside_folder,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": f"{cls.__doc__}\n\nBound to base directory {bound_dir!r} ({policy}).",
        }
        return type(OP_TYPE, (cls,), namespace)

    # ------------------------------------------------------------------------------------------- where the file is

    def _rt_output_name(self) -> str:
        return self.onnx_node.output[0]

    def _rt_wanted(self, params: DelayedInitializerParams) -> str:
        return f"{params.nbytes} bytes at offset {params.offset}"

    def _rt_check_path(self, params: DelayedInitializerParams) -> tuple[str, bool, str | None, bool]:
        """Where to open ``params.filename``, without touching the file (only ``realpath``).

        Returns ``(path, resolved, confined_to, refuse_hard_links)``; raises :class:`UnsafeLocationError` for a
        name outside the folder it must stay in.
        """
        filename = params.filename
        confined = self._rt_bound_dir is not None and not self._rt_allow_outside
        if os.path.isabs(filename) and not confined:
            return filename, False, None, False
        base = self._rt_base_dir if self._rt_base_dir is not None else _checked_getcwd(self._rt_where)
        real_base = os.path.realpath(base)
        if not os.path.isabs(filename):
            try:
                check_location_syntax(filename, tensor_name=self._rt_output_name())
            except UnsafeLocationError as exc:
                raise UnsafeLocationError(
                    f"{self._rt_where}: relative filename {filename!r} must stay inside the folder {base!r}: {exc}"
                ) from exc
        real = os.path.realpath(os.path.join(real_base, filename))
        if not is_inside(real_base, real):
            hint = (
                " Pass allow_outside_folder=True (CLI: --allow-outside-folder) if you trust this model."
                if confined
                else ""
            )
            raise UnsafeLocationError(
                f"{self._rt_where}: filename {filename!r} resolves to {real!r}, outside the model's folder "
                f"{real_base!r}; refused before reading anything.{hint}"
            )
        return real, True, real_base, True

    def _rt_locate(self, params: DelayedInitializerParams) -> _Source:
        """Check the path and ``stat`` the file it names (not opened yet)."""
        path, resolved, confined_to, refuse_hard_links = self._rt_check_path(params)
        shown = params.filename

        def missing() -> FileNotFoundError:
            folder = "" if os.path.isabs(shown) else f" in {os.path.dirname(path) or path!r}"
            if not os.path.isabs(shown) and self._rt_base_dir is not None:
                folder = f" in {self._rt_base_dir!r}"
            return FileNotFoundError(
                errno.ENOENT,
                f"{self._rt_where}: file {shown!r} does not exist{folder} (needed {self._rt_wanted(params)})",
                path,
            )

        st = stat_regular_file(
            path,
            missing=missing,
            inaccessible=lambda reason: ExternalDataError(
                f"{self._rt_where}: file {shown!r} ({path!r}) cannot be accessed: {reason} "
                f"(needed {self._rt_wanted(params)})."
            ),
            not_regular=lambda: ExternalDataError(
                f"{self._rt_where}: {shown!r} ({path!r}) is not a regular file (needed {self._rt_wanted(params)})."
            ),
        )
        source = _Source(
            path, shown, resolved, confined_to, refuse_hard_links, FileIdentity(st.st_dev, st.st_ino), st.st_size
        )
        self._rt_check_file(source, st, params)
        return source

    def _rt_check_file(self, source: _Source, st: os.stat_result, params: DelayedInitializerParams) -> None:
        if source.refuse_hard_links:
            check_single_link(st, what=f"{self._rt_where}: file {source.shown!r} ({source.path!r})")
        needed = params.offset + params.nbytes
        if needed > st.st_size:
            raise ValueError(
                f"{self._rt_where}: file {source.shown!r} too short: needs {needed} bytes "
                f"({self._rt_wanted(params)}), has {st.st_size} bytes."
            )

    # ------------------------------------------------------------------------------------------------ reading

    def _rt_open(self, source: _Source, params: DelayedInitializerParams) -> int:
        """Open ``source`` and prove the descriptor is the validated file; checks size before any allocation."""
        flags = _OPEN_FLAGS | (os.O_NOFOLLOW if source.resolved else 0)
        try:
            fd = os.open(source.path, flags)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise FileNotFoundError(
                errno.ENOENT,
                f"{self._rt_where}: file {source.shown!r} disappeared before it was read "
                f"(needed {self._rt_wanted(params)})",
                source.path,
            ) from exc
        except OSError as exc:
            if source.resolved and exc.errno in (errno.ELOOP, errno.EMLINK):
                raise UnsafeLocationError(
                    f"{self._rt_where}: file {source.shown!r} was replaced by a symbolic link after it was "
                    "validated; nothing was read."
                ) from exc
            raise ExternalDataError(
                f"{self._rt_where}: file {source.shown!r} ({source.path!r}) cannot be opened: {exc.strerror or exc}."
            ) from exc
        try:
            st = os.fstat(fd)
            if FileIdentity(st.st_dev, st.st_ino) != source.identity:
                # A parent folder swapped for a symlink between validation and open: O_NOFOLLOW only guards the
                # last component, the identity guards them all.
                raise UnsafeLocationError(
                    f"{self._rt_where}: file {source.shown!r} was replaced after it was validated (the file opened is "
                    "not the one checked inside the folder); nothing was read."
                )
            self._rt_check_opened_path(fd, source)
            self._rt_check_file(source, st, params)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _rt_check_opened_path(self, fd: int, source: _Source) -> None:
        """Where Linux tells which path a descriptor refers to, check it is still inside the folder."""
        if source.confined_to is None or not os.path.isdir(_PROC_FD):
            return
        try:
            opened = os.readlink(os.path.join(_PROC_FD, str(fd)))
        except OSError:
            return
        if not is_inside(source.confined_to, opened):
            raise UnsafeLocationError(
                f"{self._rt_where}: file {source.shown!r} opened as {opened!r}, outside the model's folder "
                f"{source.confined_to!r} (a folder was swapped during the open); nothing was read."
            )

    def _rt_load(self, params: DelayedInitializerParams) -> np.ndarray:
        """A new native-endian array of the node's shape and dtype filled from the file."""
        if params.nbytes == 0:
            self._rt_check_path(params)  # a zero-byte tensor opens nothing, but its name must still be allowed
            return np.empty(params.shape, dtype=params.np_dtype)
        source = self._rt_locate(params)
        fd = self._rt_open(source, params)
        try:
            out = allocate_tensor(params.shape, little_endian_dtype(params.dtype), where=self._rt_where)
            done = pread_exact(fd, out.data.cast("B"), params.offset)
        finally:
            os.close(fd)
        if done < params.nbytes:
            raise ValueError(
                f"{self._rt_where}: file {source.shown!r} ended early: read {done} of {self._rt_wanted(params)} "
                "(the file changed while read)."
            )
        # A no-op on little-endian hosts; a converting copy on big-endian ones.
        return out.astype(params.np_dtype, copy=False)

    def _run(self, **kwargs: Any) -> tuple[np.ndarray]:
        if self._rt_cache is not None:
            return (self._rt_cache.copy(),)
        params = self._rt_params if self._rt_params is not None else validate_attributes(kwargs, where=self._rt_where)
        return (self._rt_load(params),)
