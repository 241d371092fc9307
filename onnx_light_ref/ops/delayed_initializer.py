"""``ai.rt::DelayedInitializer`` as an ``onnx.reference`` kernel: a tensor read from a weights file.

Use it as ``ReferenceEvaluator(model, new_ops=[DelayedInitializer])``, or ``new_ops=[DelayedInitializer.bind(d)]``
for a model from folder ``d``. ``load_device="cpu"`` reads the bytes once when the evaluator is built and returns a
fresh copy at every run; ``load_device="file"`` reads the file at every run with positional reads straight into the
output array (construction only checks where the file is, never opens it).

Where a ``filename`` may point depends on how the class is made:

* **bound** (``DelayedInitializer.bind(folder)``, what :func:`~onnx_light_ref.ops.reference_evaluator` and the
  ``run`` command use): the folder is opened once, at ``bind()``, and held
  (:class:`~onnx_light_ref.io.read.folder.ModelFolder`); every filename is opened relative to that descriptor with no
  symbolic link on the way and must have one hard link (onnx's loader rule, ``docs/safety.md``); an absolute
  filename must name a file below the folder. A model downloaded from anywhere cannot read ``/etc/passwd`` or
  ``~/.ssh/id_rsa`` through the op (the same concern as onnx's CVE-2022-25882 and CVE-2024-27318 for external
  data), and renaming the folder away or swapping it (or a subfolder) for a symbolic link after construction cannot
  redirect a read. :class:`~onnx_light_ref.errors.UnsafeLocationError` names the node and the file.
* **bound with** ``allow_outside_folder=True``: absolute names are used as they are (the spec's behaviour) and
  symbolic links are followed (trusted layouts such as the Hugging Face cache).
* **unbound**: the spec's behaviour. Absolute names are used as they are; relative names are opened through the
  current directory at evaluator construction (held), by the same rule as bound ones.

``load_device="file"`` records, at construction, which file a name designates (device, inode, size) when it exists;
a run that finds another file there (replaced, as every writer replaces files) or another size raises a typed
error naming the file instead of reading other bytes through the planned offsets.

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
import stat
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io.arguments import check_bool
from onnx_light_ref.io.posix import pread_exact
from onnx_light_ref.io.read.folder import FileIdentity, ModelFolder, relative_below
from onnx_light_ref.io.read.locations import check_location_syntax
from onnx_light_ref.ops.attributes import (
    ATTRIBUTE_TYPES,
    DelayedInitializerParams,
    check_node_structure,
    describe_node,
    validate_attributes,
)
from onnx_light_ref.ops.raw_arrays import read_array
from onnx_light_ref.ops.schema import DOMAIN, OP_TYPE

__all__ = ["DelayedInitializer"]

logger = logging.getLogger(__name__)

# O_NONBLOCK: opening a FIFO for reading would otherwise block until a writer appears (it is also refused by the
# stat made before opening). It has no effect on regular files.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


# Unbound kernels: the folder of each current directory seen, held while an instance uses it.
_UNBOUND_FOLDERS: weakref.WeakValueDictionary[str, ModelFolder] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class _Source:
    """Where a file is: a name relative to a held folder, or (unconfined) an absolute name opened as it is."""

    shown: str  # the filename as the node wrote it, for messages
    folder: ModelFolder | None  # open `name` through it; None: `name` is an absolute path, opened as it is
    name: str
    refuse_hard_links: bool


@dataclass(frozen=True)
class _Stamp:
    """What the file was when it was validated: a later run refuses another file, or one of another size.

    Same inode and size: the same file with the same layout, rewritten in place, which the spec's file mode reads
    anew at every run. Another inode (every writer replaces files atomically) or another size: offsets planned for
    the validated file would read other bytes.
    """

    identity: FileIdentity
    size: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Stamp:
        return cls(FileIdentity(st.st_dev, st.st_ino), st.st_size)


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
    _rt_bound_folder: ClassVar[ModelFolder | None] = None  # held from bind() (or the first construction) on

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict[str, Any], schema: Any = None) -> None:
        self._rt_where = describe_node(onnx_node)
        # Before OpRun stores the attributes: it keeps the last of duplicated ones without a word.
        check_node_structure(onnx_node, where=self._rt_where)
        super().__init__(onnx_node, run_params, schema=schema)
        self._rt_base_dir: str | None = self._rt_bound_dir
        self._rt_params: DelayedInitializerParams | None = None
        self._rt_cache: np.ndarray | None = None
        self._rt_folder: ModelFolder | None = None  # the folder relative names open through, held from now on
        self._rt_stamp: _Stamp | None = None  # file mode: the file validated at construction (None: absent then)
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
            # Refuse a file outside the folder now, not at the first run; the file itself may appear later. When it
            # exists, remember which file it is: a run must never read another file through offsets planned now.
            source = self._rt_check_path(params)
            if params.nbytes:
                try:
                    fd, st = self._rt_open(source, params)
                except UnsafeLocationError:
                    raise  # a symlink or a hard link now: refused before any run
                except (FileNotFoundError, ValueError):
                    pass  # missing, too short, not a regular file: each run reports it (the spec's file mode)
                else:
                    os.close(fd)
                    self._rt_stamp = _Stamp.of(st)

    @classmethod
    def bind(
        cls, base_dir: str | os.PathLike[str] | ModelFolder, *, allow_outside_folder: bool = False
    ) -> type[DelayedInitializer]:
        """A subclass, still named ``DelayedInitializer``, whose filenames are confined to ``base_dir``.

        The folder is opened now and held: every ``filename`` is opened relative to that descriptor, with no
        symbolic link on the way (onnx's loader rule); an absolute filename must name a file below ``base_dir``
        (compared by name); files with several hard links are refused. Renaming the folder away or swapping it for a
        symbolic link afterwards changes nothing: the held folder is read. Use it as
        ``new_ops=[DelayedInitializer.bind(model_folder)]``.

        Args:
            base_dir: the model's folder, made absolute now (a later ``os.chdir`` changes nothing), or a held
                :class:`~onnx_light_ref.io.read.folder.ModelFolder`. A folder that does not exist yet is opened at the
                first construction.
            allow_outside_folder: trust the model: absolute filenames are used as they are (the spec's behaviour,
                needed for models like the spec's examples, whose files are in ``/tmp``), and symbolic links are
                followed (a trusted layout such as the Hugging Face cache). Relative names still resolve against
                ``base_dir`` and may not contain ``..``.

        Returns:
            The bound kernel class.

        Raises:
            TypeError: ``allow_outside_folder`` is not a bool.
        """
        check_bool("allow_outside_folder", allow_outside_folder)
        held: ModelFolder | None = None
        if isinstance(base_dir, ModelFolder):
            held, bound_dir = base_dir, base_dir.path
            allow_outside_folder = allow_outside_folder or base_dir.allow_outside_folder
        else:
            bound_dir = os.path.abspath(os.fspath(base_dir))
            try:
                held = ModelFolder.open(bound_dir, allow_outside_folder=allow_outside_folder)
            except FileNotFoundError:
                held = None  # opened at the first construction, which reports it if it is still missing
        policy = "absolute filenames allowed anywhere" if allow_outside_folder else "every filename confined to it"
        namespace = {
            "_rt_bound_dir": bound_dir,
            "_rt_allow_outside": allow_outside_folder,
            "_rt_bound_folder": held,
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

    def _rt_held_folder(self, base: str) -> ModelFolder:
        """The folder relative names open through: the bound one (held since bind), else ``base``, opened now."""
        if self._rt_folder is not None:
            return self._rt_folder
        cls = type(self)
        if self._rt_bound_dir is not None:
            if cls._rt_bound_folder is None:
                cls._rt_bound_folder = ModelFolder.open(base, allow_outside_folder=self._rt_allow_outside)
            self._rt_folder = cls._rt_bound_folder
        else:
            # Unbound: one held folder per directory shared by the live instances (a model has thousands of nodes).
            held = _UNBOUND_FOLDERS.get(base)
            if held is None or held.closed:
                held = _UNBOUND_FOLDERS[base] = ModelFolder.open(base)
            self._rt_folder = held
        return self._rt_folder

    def _rt_check_path(self, params: DelayedInitializerParams) -> _Source:
        """Where to open ``params.filename``, by name only (the file is not opened).

        Raises :class:`UnsafeLocationError` for a name outside the folder it must stay in.
        """
        filename = params.filename
        confined = self._rt_bound_dir is not None and not self._rt_allow_outside
        if os.path.isabs(filename) and not confined:
            return _Source(filename, None, filename, False)
        base = self._rt_base_dir if self._rt_base_dir is not None else _checked_getcwd(self._rt_where)
        name = filename
        if os.path.isabs(filename):
            relative = relative_below(base, filename)
            if relative is None:
                raise UnsafeLocationError(
                    f"{self._rt_where}: filename {filename!r} resolves to {os.path.normpath(filename)!r}, outside the "
                    f"model's folder {base!r}; refused before reading anything. Pass allow_outside_folder=True "
                    "(CLI: --allow-outside-folder) if you trust this model."
                )
            name = relative
        try:
            check_location_syntax(name, tensor_name=self._rt_output_name())
        except UnsafeLocationError as exc:
            raise UnsafeLocationError(
                f"{self._rt_where}: relative filename {filename!r} must stay inside the folder {base!r}: {exc}"
            ) from exc
        return _Source(filename, self._rt_held_folder(base), name, True)

    def _rt_open(self, source: _Source, params: DelayedInitializerParams) -> tuple[int, os.stat_result]:
        """Open ``source`` (through the held folder when it has one) and check it before any allocation."""
        subject = f"{self._rt_where}: file {source.shown!r}"
        wanted = self._rt_wanted(params)
        if source.folder is not None:
            try:
                opened = source.folder.open_file(source.name, subject=subject, check_links=source.refuse_hard_links)
            except FileNotFoundError as exc:
                raise FileNotFoundError(errno.ENOENT, f"{exc.strerror} (needed {wanted})", exc.filename) from exc
            fd, st = opened.fd, opened.stat
        else:
            fd, st = self._rt_open_absolute(source, subject, wanted)
        try:
            self._rt_check_file(source, st, params)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _rt_open_absolute(self, source: _Source, subject: str, wanted: str) -> tuple[int, os.stat_result]:
        """An absolute name outside any folder (unbound, or ``allow_outside_folder``): the spec's behaviour."""
        try:
            fd = os.open(source.name, _OPEN_FLAGS)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise FileNotFoundError(errno.ENOENT, f"{subject} does not exist (needed {wanted})", source.name) from exc
        except OSError as exc:
            raise ExternalDataError(f"{subject} ({source.name!r}) cannot be accessed: {exc.strerror or exc}.") from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ExternalDataError(f"{source.shown!r} ({source.name!r}) is not a regular file (needed {wanted}).")
        return fd, st

    def _rt_check_file(self, source: _Source, st: os.stat_result, params: DelayedInitializerParams) -> None:
        needed = params.offset + params.nbytes
        if needed > st.st_size:
            raise ValueError(
                f"{self._rt_where}: file {source.shown!r} too short: needs {needed} bytes "
                f"({self._rt_wanted(params)}), has {st.st_size} bytes."
            )

    def _rt_check_stamp(self, source: _Source, st: os.stat_result) -> None:
        """File mode: the file read now must be the file validated when the evaluator was built."""
        stamp = self._rt_stamp
        if stamp is None:
            return
        now = _Stamp.of(st)
        if now.identity != stamp.identity:
            raise UnsafeLocationError(
                f"{self._rt_where}: file {source.shown!r} was replaced after it was validated (the file opened is not "
                "the one checked when the evaluator was built: another device/inode); nothing was read. Build the "
                "evaluator again to read the new file."
            )
        if now != stamp:
            raise ExternalDataError(
                f"{self._rt_where}: file {source.shown!r} was modified after it was validated (size {stamp.size} -> "
                f"{now.size} bytes); nothing was read. Build the evaluator again to read it."
            )

    # ------------------------------------------------------------------------------------------------ reading

    def _rt_load(self, params: DelayedInitializerParams) -> np.ndarray:
        """A new native-endian array of the node's shape and dtype filled from the file."""
        source = self._rt_check_path(params)  # a zero-byte tensor opens nothing, but its name must still be allowed
        if params.nbytes == 0:
            return np.empty(params.shape, dtype=params.np_dtype)
        fd, st = self._rt_open(source, params)
        try:
            self._rt_check_stamp(source, st)
            return self._rt_read_array(fd, source, params)
        finally:
            os.close(fd)

    def _rt_read_array(self, fd: int, source: _Source, params: DelayedInitializerParams) -> np.ndarray:
        """Bytes -> array: the raw bytes at ``offset``, as onnx's own evaluator would hold them for ``dtype``.

        Byte-sized types are read straight into the output; packed ones (int4, float4...) are read in chunks that
        onnx unpacks (:mod:`onnx_light_ref.ops.raw_arrays`).
        """

        def read(view: memoryview, position: int) -> int:
            return pread_exact(fd, view, params.offset + position)

        try:
            array, done = read_array(params.dtype, params.shape, read, where=self._rt_where)
        except OSError as exc:
            raise ExternalDataError(
                f"{self._rt_where}: file {source.shown!r} cannot be read: {exc.strerror or exc} "
                f"(needed {self._rt_wanted(params)})."
            ) from exc
        if done < params.nbytes:
            raise ValueError(
                f"{self._rt_where}: file {source.shown!r} ended early: read {done} of {self._rt_wanted(params)} "
                "(the file changed while read)."
            )
        return array

    def _run(self, **kwargs: Any) -> tuple[np.ndarray]:
        if self._rt_cache is not None:
            return (self._rt_cache.copy(),)
        params = self._rt_params if self._rt_params is not None else validate_attributes(kwargs, where=self._rt_where)
        return (self._rt_load(params),)
