"""``ai.rt::DelayedInitializer`` as an ``onnx.reference`` kernel: a tensor read from a weights file.

Use it as ``ReferenceEvaluator(model, new_ops=[DelayedInitializer])``, or ``new_ops=[DelayedInitializer.bind(d)]``
for a model from folder ``d``. ``load_device="cpu"`` reads the bytes once when the evaluator is built and returns a
fresh copy at every run; ``load_device="file"`` reads the file at every run with positional reads straight into the
output array.

**What the kernel accepts.** Exactly the six attributes of the schema, each once, with its type
(:func:`~onnx_light_ref.ops.attributes.check_node_structure`, called before ``OpRun.__init__``): onnx's ``OpRun``
does ``setattr(self, name, value)`` for every node attribute, so any other name (``run``, ``onnx_node``,
``__class__``, a private name of the kernel...) is refused, naming the node, before it can reach the instance and
before any file is looked at.

**Where the kernel's state lives, out of any attribute's reach.** Nothing the kernel decides with is stored on the
instance. The policy (the bound folder, ``allow_outside_folder``) and the descriptors (the held folder, the held
weights files) are in a :class:`_Binding` made by :meth:`DelayedInitializer.bind` and kept by the class it returns,
read once, at construction, as ``type(self)._rt_binding`` (an instance attribute cannot change what the class
holds, and ``type(self)`` cannot be changed by ``setattr``: ``__class__`` only takes a class, and an attribute is
never one). Each node's own state (its validated parameters, the file it resolved to, its cache, the file it holds)
is a :class:`_NodeState` in :data:`_STATES`, a registry keyed by the instance (weakly): no name on the instance
leads to it. So even an attribute that got past the check could not redirect a read.

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
  current directory at evaluator construction, held (one hold per directory, found by the identity of the
  directory opened, never by its path), by the same rule as bound ones.

**What identifies the file (file mode).** At construction the file is opened (never read), validated and *held
open* for the evaluator's life: an inode that is held cannot be freed, so its number cannot be handed to another
file (ext4 reuses a freed number at once: ``(device, inode, size)`` alone could not tell a replaced file from the
original). Each run looks the name up again (``O_PATH`` and ``fstat`` through the held folder, no read) and
refuses, naming the file, a name that designates another file (replaced), or the same file at another size; the
bytes are read from the held descriptor, so they come from the validated file. The file changed *in place*, same
size, is read anew at every run (the spec's file mode). To switch to new weights written as a new file, build a new
evaluator. A file missing at construction is held from the first run that finds it.

**Who closes what.** A bound class owns its held folder and the weights files held through it: ``close()`` on the
class, a ``with`` block on it, or the class being collected releases them; the evaluator that
:func:`~onnx_light_ref.ops.reference_evaluator` returns does it on ``close()``, at the end of its ``with`` block, or
as soon as it is dropped. A held weights file is also released when the last node using it is dropped; an unbound
kernel's hold on the current directory when the last node using it is. ``load_device="cpu"`` holds no file after
construction.

This module must never seek a descriptor (positional reads only, so one held descriptor serves every thread),
never read more than ``offset + nbytes`` bytes of a file, never allocate the output before the file is known to hold
it, never hand out an array that aliases its cache, never read through a descriptor that was closed, never let a
raw ``OSError`` other than ``FileNotFoundError`` escape for a file problem (running out of descriptors is an
``OSError`` with ``errno`` ``EMFILE``/``ENFILE`` that says so), and never raise ``TypeError`` for one (onnx would
rewrap it). A tensor larger than the memory that can be allocated is
:class:`~onnx_light_ref.errors.TensorAllocationError` (a ``MemoryError``), never numpy's untyped one.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import weakref
from abc import ABCMeta
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from onnx_light_ref.errors import ExternalDataError, SafetensorsReferenceError, UnsafeLocationError
from onnx_light_ref.io.arguments import check_bool
from onnx_light_ref.io.posix import pread_exact
from onnx_light_ref.io.read.folder import (
    FileIdentity,
    ModelFolder,
    OpenedFile,
    check_file_name,
    open_unconfined,
    relative_below,
    stat_unconfined,
)
from onnx_light_ref.io.read.locations import check_location_syntax
from onnx_light_ref.io.read.safetensors_refs import HeaderCache, is_safetensors_location, refuse_disagreeing_reference
from onnx_light_ref.ops.attributes import (
    ATTRIBUTE_TYPES,
    DelayedInitializerParams,
    check_node_structure,
    describe_node,
    validate_attributes,
)
from onnx_light_ref.ops.evaluator_cycle import weaken_log_callback
from onnx_light_ref.ops.raw_arrays import read_array
from onnx_light_ref.ops.schema import DOMAIN, OP_TYPE

__all__ = ["DelayedInitializer"]

logger = logging.getLogger(__name__)

_OPT_IN = " Pass allow_outside_folder=True (CLI: --allow-outside-folder) if you trust this model."


# ----------------------------------------------------------------------------------------- descriptors and owners


class _HeldFile:
    """A weights file validated once and kept open: what a file-mode node reads (``pread`` only) and what identifies
    the file (its inode cannot be reused while it is held). Closed by its holder, or when no node uses it."""

    def __init__(self, opened: OpenedFile) -> None:
        self.identity = opened.identity
        self.fd = opened.detach()
        self._finalizer = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        self._finalizer()  # idempotent


class _Holder:
    """The descriptors kernels share: one held folder (``None`` for names opened as they are) and the weights files
    held through it, one descriptor per distinct file however many nodes read it.

    Every use (a construction, a run) happens inside :meth:`in_use`; :meth:`close` marks the holder closed at once
    (later uses are refused) and closes the descriptors when the last use in flight ends, so no read ever goes
    through a descriptor number the system may already have given to another file.
    """

    def __init__(self, folder: ModelFolder | None, *, path: str | None = None, allow_outside: bool = False) -> None:
        self._folder = folder
        self._path = path  # a bound folder that did not exist at bind(): opened at the first construction
        self._allow_outside = allow_outside
        self._files: weakref.WeakValueDictionary[FileIdentity, _HeldFile] = weakref.WeakValueDictionary()
        self.headers = HeaderCache()  # the safetensors headers of the files its nodes read, parsed once per file
        self._lock = threading.Lock()
        self._users = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def path(self) -> str:
        """The held folder's path, for messages."""
        if self._folder is not None:
            return self._folder.path
        return self._path or ""

    @contextmanager
    def in_use(self, where: str) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise ValueError(
                    f"{where}: this evaluator's DelayedInitializer descriptors were closed (close(), or the end of "
                    "its 'with' block); build a new evaluator to run the model again."
                )
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                last = self._closed and self._users == 0
            if last:
                self._release()

    def folder(self) -> ModelFolder:
        """The held folder (opened now if ``bind()`` found none; the caller is :meth:`in_use`)."""
        with self._lock:
            if self._folder is None:
                assert self._path is not None
                self._folder = ModelFolder.open(self._path, allow_outside_folder=self._allow_outside)
            return self._folder

    def hold(self, opened: OpenedFile) -> _HeldFile:
        """Keep ``opened`` open (its descriptor is taken over), or the file already held with its identity."""
        with self._lock:
            held = self._files.get(opened.identity)
            if held is not None:
                opened.close()
                return held
            held = self._files[opened.identity] = _HeldFile(opened)
            return held

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle = self._users == 0
        if idle:
            self._release()

    def _release(self) -> None:
        self.headers.clear()
        for held in list(self._files.values()):
            held.close()
        if self._folder is not None:
            self._folder.close()


@dataclass(frozen=True)
class _Binding:
    """What ``bind()`` decided, kept by the class it made (never by an instance): the folder filenames are confined
    to, whether they may point outside it, and the holder of its descriptors."""

    base_dir: str
    allow_outside: bool
    holder: _Holder


# Unbound kernels: one hold per current directory, found by the identity of the directory opened (two directories
# seen at the same path are two holds), shared by the live nodes that use it.
_CWD_HOLDERS: weakref.WeakValueDictionary[FileIdentity, _Holder] = weakref.WeakValueDictionary()
_CWD_LOCK = threading.Lock()
# Names opened as they are (unbound absolute names): the files are held per node, released with the nodes.
_UNCONFINED = _Holder(None)


def _hold_current_directory(where: str) -> _Holder:
    try:
        folder = ModelFolder.current()
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            errno.ENOENT, f"{where}: a relative filename needs the current directory, which is not accessible ({exc})"
        ) from exc
    with _CWD_LOCK:
        holder = _CWD_HOLDERS.get(folder.identity)
        if holder is not None and not holder.closed:
            folder.close()
            return holder
        holder = _CWD_HOLDERS[folder.identity] = _Holder(folder)
        return holder


# ----------------------------------------------------------------------------------------- per-node state


@dataclass(frozen=True)
class _Source:
    """Where a node's file is: ``name`` relative to ``holder``'s folder, or (``name`` None) ``shown`` opened as it
    is (an absolute name the caller trusts)."""

    shown: str  # the filename as the node wrote it, for messages
    holder: _Holder
    name: str | None
    check_links: bool

    def open(self, subject: str) -> OpenedFile:
        if self.name is None:
            return open_unconfined(self.shown, subject=subject, check_links=self.check_links)
        return self.holder.folder().open_file(self.name, subject=subject, check_links=self.check_links)

    def stat(self, subject: str) -> os.stat_result:
        if self.name is None:
            return stat_unconfined(self.shown, subject=subject, check_links=self.check_links)
        return self.holder.folder().stat_file(self.name, subject=subject, check_links=self.check_links)


@dataclass(eq=False)
class _NodeState:
    """Everything one kernel instance decides with; kept in :data:`_STATES`, never on the instance."""

    where: str
    binding: _Binding | None
    output: str = ""  # the tensor the node produces: its safetensors key when its file is one
    cwd: _Holder | None = None  # unbound: the current directory at construction (relative names)
    params: DelayedInitializerParams | None = None  # None: function-linked attributes, known per call
    source: _Source | None = None
    cache: np.ndarray | None = None
    held: _HeldFile | None = None  # file mode: the validated file, held open
    held_size: int = 0  # its size when this node validated it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def holder_for(self, source: _Source | None = None) -> _Holder:
        if source is not None:
            return source.holder
        return self.binding.holder if self.binding is not None else _UNCONFINED


_STATES: weakref.WeakKeyDictionary[OpRun, _NodeState] = weakref.WeakKeyDictionary()


def _state(kernel: OpRun) -> _NodeState:
    return _STATES[kernel]


# ----------------------------------------------------------------------------------------- the class


class _KernelClass(ABCMeta):
    """The kernel's metaclass: a class made by ``bind()`` releases its descriptors with ``close()`` or ``with``.

    These are methods of the class, not of its instances: no node attribute can name them.
    """

    _rt_binding: _Binding | None

    def close(cls) -> None:
        """Release the held folder and weights files of this bound class (idempotent). Its evaluators' runs then
        raise ``ValueError``; build new ones to run again.

        Raises:
            TypeError: ``cls`` is the unbound ``DelayedInitializer``: its nodes share the current directory's hold,
                released when they are dropped.
        """
        if cls._rt_binding is None:
            raise TypeError(
                "the unbound DelayedInitializer holds no descriptors of its own (each node's hold is released when "
                "the node is dropped); close() and 'with' are for classes made by DelayedInitializer.bind()."
            )
        cls._rt_binding.holder.close()

    @property
    def closed(cls) -> bool:
        """Whether a bound class was closed (always False for the unbound one)."""
        return cls._rt_binding is not None and cls._rt_binding.holder.closed

    def __enter__(cls) -> _KernelClass:
        if cls._rt_binding is None:
            cls.close()  # raises the TypeError that explains it
        return cls

    def __exit__(cls, *exc: object) -> None:
        cls.close()


class DelayedInitializer(OpRun, metaclass=_KernelClass):
    """Kernel of ``ai.rt::DelayedInitializer`` v1 for ``onnx.reference.ReferenceEvaluator``.

    Construction checks the node's structure (no input, one output, exactly the six attributes, each once, with its
    type) before onnx's ``OpRun`` stores any attribute, validates the six values (``ValueError`` naming the node),
    then checks where the file is (see the module docstring) and, for ``load_device="cpu"``, reads the bytes; for
    ``"file"``, opens and holds the file when it exists. File problems raise ``FileNotFoundError`` (missing),
    :class:`~onnx_light_ref.errors.UnsafeLocationError` (outside the folder, hard-linked, replaced),
    :class:`~onnx_light_ref.errors.SafetensorsReferenceError` (a ``*.safetensors`` file whose header says the range
    overlaps the header or is not the tensor's key: the message every reader gives, naming the output and the file)
    or ``ValueError`` (not a regular file, too short, not accessible), each naming the node and the file. With
    function-linked attributes the values are only known per call, so attribute and file checks happen in ``_run``
    instead.
    """

    op_domain = DOMAIN
    # No name-based schema lookup: this kernel validates itself, whether or not register_schemas() ran, and
    # whether it ran before or after onnx.reference was imported.
    op_schema = None

    # Set by bind() on the class it makes; read as type(self)._rt_binding, never through the instance.
    _rt_binding: ClassVar[_Binding | None] = None

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict[str, Any], schema: Any = None) -> None:
        binding = type(self)._rt_binding
        where = describe_node(onnx_node)
        # Before OpRun stores the attributes (setattr for each): only the six names, each once, get that far.
        check_node_structure(onnx_node, where=where)
        state = _NodeState(where, binding, output=onnx_node.output[0])
        with state.holder_for().in_use(where):  # a closed class builds nothing
            super().__init__(onnx_node, run_params, schema=schema)
            _STATES[self] = state
            weaken_log_callback(run_params)  # so the evaluator, and the files held for it, go when it is dropped
            if self.has_linked_attribute:
                # One instance serves every call site; the filename is only known per call. Hold the directory a
                # relative name would use now, as the spec says, but do not fail if there is none (absolute names).
                if binding is None:
                    try:
                        state.cwd = _hold_current_directory(where)
                    except (OSError, ValueError):
                        state.cwd = None
                return
            values = {name: getattr(self, name) for name in ATTRIBUTE_TYPES if hasattr(self, name)}
            params = validate_attributes(values, where=where)
            source = self._rt_locate(state, params)
            state.params, state.source = params, source
            with source.holder.in_use(where):
                if params.load_device == "cpu":
                    cache = self._rt_load(params)
                    cache.setflags(write=False)
                    state.cache = cache
                elif params.nbytes:
                    self._rt_hold_if_present(state, source, params)

    @classmethod
    def bind(
        cls, base_dir: str | os.PathLike[str] | ModelFolder, *, allow_outside_folder: bool = False
    ) -> type[DelayedInitializer]:
        """A subclass, still named ``DelayedInitializer``, whose filenames are confined to ``base_dir``.

        The folder is opened now and held: every ``filename`` is opened relative to that descriptor, with no
        symbolic link on the way (onnx's loader rule); an absolute filename must name a file below ``base_dir``
        (compared by name); files with several hard links are refused. Renaming the folder away or swapping it for a
        symbolic link afterwards changes nothing: the held folder is read. Use it as
        ``new_ops=[DelayedInitializer.bind(model_folder)]``; the class owns its descriptors: ``close()`` it (or use
        it as ``with DelayedInitializer.bind(d) as op:``) when its evaluators are done, or let it be collected.

        Args:
            base_dir: the model's folder, made absolute now (a later ``os.chdir`` changes nothing), or a held
                :class:`~onnx_light_ref.io.read.folder.ModelFolder` (the class holds a duplicate of its
                descriptor: the caller still closes its own). A folder that does not exist yet is opened at the
                first construction.
            allow_outside_folder: trust the model: absolute filenames are used as they are (the spec's behaviour,
                needed for models like the spec's examples, whose files are in ``/tmp``), and symbolic links are
                followed (a trusted layout such as the Hugging Face cache). Relative names still resolve against
                ``base_dir`` and may not contain ``..``.

        Returns:
            The bound kernel class.

        Raises:
            TypeError: ``allow_outside_folder`` is not a bool.
            OSError: ``EMFILE``/``ENFILE``: no descriptor left to hold the folder.
            ExternalDataError: ``base_dir`` is not a folder or cannot be opened.
        """
        check_bool("allow_outside_folder", allow_outside_folder)
        folder: ModelFolder | None
        if isinstance(base_dir, ModelFolder):
            bound_dir = base_dir.path
            allow_outside_folder = allow_outside_folder or base_dir.allow_outside_folder
            folder = base_dir.duplicate()
            folder.allow_outside_folder = allow_outside_folder
        else:
            bound_dir = os.path.abspath(os.fspath(base_dir))
            try:
                folder = ModelFolder.open(bound_dir, allow_outside_folder=allow_outside_folder)
            except FileNotFoundError:
                folder = None  # opened at the first construction, which reports it if it is still missing
        holder = _Holder(folder, path=bound_dir, allow_outside=allow_outside_folder)
        policy = "absolute filenames allowed anywhere" if allow_outside_folder else "every filename confined to it"
        namespace = {
            "_rt_binding": _Binding(bound_dir, allow_outside_folder, holder),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": f"{cls.__doc__}\n\nBound to base directory {bound_dir!r} ({policy}).",
        }
        metaclass: Any = type(cls)
        return cast("type[DelayedInitializer]", metaclass(OP_TYPE, (cls,), namespace))

    # ------------------------------------------------------------------------------------------- where the file is

    def _rt_locate(self, state: _NodeState, params: DelayedInitializerParams) -> _Source:
        """Where to open ``params.filename``, by name only (nothing is opened but, unbound, the current directory).

        Raises :class:`UnsafeLocationError` for a name outside the folder it must stay in, naming the real reason.
        """
        filename, binding, where = params.filename, state.binding, state.where
        what = f"{where}: filename {filename!r}"
        if os.path.isabs(filename):
            check_file_name(filename, what)  # the name as written: one answer whichever opener and mode follow
            if binding is None:
                return _Source(filename, _UNCONFINED, None, False)  # the spec: used as it is
            if binding.allow_outside:
                return _Source(filename, binding.holder, None, False)
            name = relative_below(binding.base_dir, filename, what=what, outside=_OPT_IN)
            return _Source(filename, binding.holder, name, True)
        holder = binding.holder if binding is not None else (state.cwd or _hold_current_directory(where))
        if binding is None:
            state.cwd = holder
        try:
            check_location_syntax(filename, tensor_name=self.onnx_node.output[0])
        except UnsafeLocationError as exc:
            base = binding.base_dir if binding is not None else holder.path
            raise UnsafeLocationError(
                f"{where}: relative filename {filename!r} must stay inside the folder {base!r}: {exc}"
            ) from exc
        check_file_name(filename, what)
        return _Source(filename, holder, filename, True)

    def _rt_open(self, state: _NodeState, source: _Source, params: DelayedInitializerParams) -> OpenedFile:
        """Open ``source`` (looked at before it is opened) and check it holds the tensor, before any allocation."""
        subject = f"{state.where}: file {source.shown!r}"
        try:
            opened = source.open(subject)
        except FileNotFoundError as exc:
            raise FileNotFoundError(exc.errno, f"{exc.strerror} (needed {_wanted(params)})", exc.filename) from exc
        try:
            _check_size(state.where, source, opened.size, params)
            _check_safetensors_header(state, source, params, opened.fd, opened.stat)
        except BaseException:
            opened.close()
            raise
        return opened

    def _rt_hold_if_present(self, state: _NodeState, source: _Source, params: DelayedInitializerParams) -> None:
        """File mode at construction: hold the file now when it is there and holds the tensor.

        A symbolic link, a hard link or a reference that disagrees with its safetensors header is refused now, before
        any run; a missing, short or non-regular file is left for each run to report (the spec's file mode: the file
        may appear later).
        """
        try:
            opened = self._rt_open(state, source, params)
        except (UnsafeLocationError, SafetensorsReferenceError):
            raise
        except (FileNotFoundError, ValueError):
            return
        state.held_size = opened.size
        state.held = source.holder.hold(opened)

    def _rt_held_file(self, state: _NodeState, source: _Source, params: DelayedInitializerParams) -> _HeldFile:
        """File mode at a run: the held file, after checking that the name still designates it, at the same size."""
        subject = f"{state.where}: file {source.shown!r}"
        with state.lock:
            if state.held is None:  # missing (or short) at construction: held from the first run that finds it
                opened = self._rt_open(state, source, params)
                state.held_size = opened.size
                state.held = source.holder.hold(opened)
                return state.held
            held = state.held
        try:
            now = source.stat(subject)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                errno.ENOENT,
                f"{exc.strerror}: it was removed after it was validated; nothing was read (this evaluator reads only "
                "the file it validated; build a new evaluator to read a new one).",
                exc.filename,
            ) from exc
        if FileIdentity.of(now) != held.identity:
            raise UnsafeLocationError(
                f"{subject} was replaced after it was validated (the name now designates another file than the one "
                "this evaluator checked and holds open); nothing was read. Build a new evaluator to read the new "
                "file (or rewrite the bytes in place, in the same file)."
            )
        _check_size(state.where, source, now.st_size, params)  # first: the more precise message
        if now.st_size != state.held_size:
            raise ExternalDataError(
                f"{subject} was modified after it was validated (size {state.held_size} -> {now.st_size} bytes); "
                "nothing was read. Build a new evaluator to read it."
            )
        _check_safetensors_header(state, source, params, held.fd, now)  # a header rewritten in place: read again
        return held

    # ------------------------------------------------------------------------------------------------ reading

    def _rt_load(self, params: DelayedInitializerParams) -> np.ndarray:
        """A new native-endian array of the node's shape and dtype filled from the file.

        File mode reads the held file; ``cpu`` mode (at construction) and function-linked calls open the file,
        read it and close it.
        """
        state = _state(self)
        source = state.source if state.params is not None else self._rt_locate(state, params)
        assert source is not None
        if params.nbytes == 0:  # opens nothing, but the name was still checked
            return np.empty(params.shape, dtype=params.np_dtype)
        if state.params is not None and state.params.load_device == "file":
            held = self._rt_held_file(state, source, params)
            return _read_tensor(held.fd, params, state.where, source.shown)
        with self._rt_open(state, source, params) as opened:
            return _read_tensor(opened.fd, params, state.where, source.shown)

    def _run(self, **kwargs: Any) -> tuple[np.ndarray]:
        state = _state(self)
        holder = state.holder_for(state.source) if state.params is not None else state.holder_for()
        with holder.in_use(state.where):
            if state.cache is not None:
                return (state.cache.copy(),)
            params = state.params if state.params is not None else validate_attributes(kwargs, where=state.where)
            return (self._rt_load(params),)


def _wanted(params: DelayedInitializerParams) -> str:
    return f"{params.nbytes} bytes at offset {params.offset}"


def _check_size(where: str, source: _Source, size: int, params: DelayedInitializerParams) -> None:
    needed = params.offset + params.nbytes
    if needed > size:
        raise ValueError(
            f"{where}: file {source.shown!r} too short: needs {needed} bytes ({_wanted(params)}), has {size} bytes."
        )


def _check_safetensors_header(
    state: _NodeState, source: _Source, params: DelayedInitializerParams, fd: int, st: os.stat_result
) -> None:
    """Refuse a node whose ``*.safetensors`` file's header says its bytes are not its tensor (the readers' one check:
    :func:`~onnx_light_ref.io.read.safetensors_refs.refuse_disagreeing_reference`, by the output's name)."""
    if not is_safetensors_location(source.shown):
        return
    file = source.holder.headers.read(fd, source.shown, st, source.shown)
    refuse_disagreeing_reference(file, state.output, params.dtype, params.shape, params.offset, params.nbytes)


def _read_tensor(fd: int, params: DelayedInitializerParams, where: str, shown: str) -> np.ndarray:
    """The one step from file bytes to the output array: ``params.nbytes`` raw bytes at ``params.offset`` of ``fd``,
    as onnx's own evaluator would hold them for ``dtype`` (:func:`~onnx_light_ref.ops.raw_arrays.read_array`:
    byte-sized types read straight into the output, packed ones such as int4 unpacked by onnx in chunks)."""

    def read(view: memoryview, position: int) -> int:
        return pread_exact(fd, view, params.offset + position)

    try:
        array, done = read_array(params.dtype, params.shape, read, where=where)
    except OSError as exc:
        raise ExternalDataError(
            f"{where}: file {shown!r} cannot be read: {exc.strerror or exc} (needed {_wanted(params)})."
        ) from exc
    if done < params.nbytes:
        raise ValueError(
            f"{where}: file {shown!r} ended early: read {done} of {_wanted(params)} (the file changed while read)."
        )
    return array
