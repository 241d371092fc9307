"""``ai.rt::DelayedInitializer`` as an ``onnx.reference`` kernel: a tensor read from a weights file.

Use it as ``ReferenceEvaluator(model, new_ops=[DelayedInitializer])``, or ``new_ops=[DelayedInitializer.bind(d)]``
to resolve relative ``filename`` values against the folder ``d``. ``load_device="cpu"`` reads the bytes once when
the evaluator is built and returns a fresh copy at every run; ``load_device="file"`` never touches the file at
construction and reads it at every run with a positional read straight into the output array.

Where a relative ``filename`` points: against the bound folder, or, when unbound, against the process's current
directory *at evaluator construction* (made absolute then, so a later ``os.chdir`` changes nothing). A relative
name must stay inside that folder: no ``..`` component, no NUL, no backslash, and (checked when the file is read)
no symbolic link resolving outside, no file with several hard links. Absolute names are used as they are.

This module must never seek a shared file descriptor (every read opens its own descriptor and uses ``preadv``, so
concurrent runs of one evaluator are safe), never read more than ``offset + nbytes`` bytes of a file, never hand out
an array that aliases its cache, and never raise ``TypeError`` for a file problem (onnx would rewrap it).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.io.locations import check_location_syntax, resolve_location
from onnx_light_ref.ops.attributes import (
    ATTRIBUTE_TYPES,
    DelayedInitializerParams,
    describe_node,
    validate_attributes,
)
from onnx_light_ref.ops.dtypes import little_endian_dtype

__all__ = ["DelayedInitializer", "read_exact_into"]

logger = logging.getLogger(__name__)

# O_NONBLOCK: opening a FIFO for reading would otherwise block until a writer appears; with it the open returns and
# fstat reports "not a regular file". It has no effect on regular files. Flags missing on a platform count as 0.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def _pread_into(fd: int, buffer: memoryview, position: int) -> int:
    """One positional read into ``buffer``; returns the byte count (0 at end of file)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buffer], position)
    # Platforms without preadv (Windows): the descriptor is private to this call, so seeking it is still safe.
    os.lseek(fd, position, os.SEEK_SET)
    data = os.read(fd, len(buffer))
    buffer[: len(data)] = data
    return len(data)


def read_exact_into(path: str, offset: int, out: np.ndarray, *, where: str, refuse_hard_links: bool = False) -> None:
    """Fill the C-contiguous array ``out`` with the ``out.nbytes`` bytes of ``path`` starting at ``offset``.

    Zero bytes: returns without opening anything. Otherwise opens its own read-only descriptor, checks with
    ``fstat`` that it is a regular file holding ``offset + out.nbytes`` bytes, and loops on ``preadv`` until the
    buffer is full. Raises ``FileNotFoundError`` (missing) or ``ValueError`` (not a regular file, too short, or
    shrinking while read), each naming ``where``, the file, the offset and the byte counts. With
    ``refuse_hard_links``, a file with several hard links raises :class:`UnsafeLocationError` (checked on the open
    descriptor, so the file cannot be swapped after the check).
    """
    nbytes = out.nbytes
    if nbytes == 0:
        return
    wanted = f"{nbytes} bytes at offset {offset}"
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, f"{where}: file {path!r} does not exist (needed {wanted})", path
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{where}: {path!r} is not a regular file (needed {wanted}).")
        if refuse_hard_links and st.st_nlink > 1:
            raise UnsafeLocationError(
                f"{where}: file {path!r} has {st.st_nlink} hard links; refused as onnx does (a hard link can expose "
                "a file from outside the model's folder). Copy the file instead of hard-linking it."
            )
        if offset + nbytes > st.st_size:
            raise ValueError(
                f"{where}: file {path!r} is too short: needed {wanted} (up to byte {offset + nbytes}) but the "
                f"file has {st.st_size} bytes."
            )
        buffer = memoryview(out).cast("B")
        done = 0
        while done < nbytes:
            got = _pread_into(fd, buffer[done:], offset + done)
            if got == 0:
                raise ValueError(
                    f"{where}: file {path!r} ended early: read {done} of {wanted} (the file changed while read)."
                )
            done += got
    finally:
        os.close(fd)


class DelayedInitializer(OpRun):
    """Kernel of ``ai.rt::DelayedInitializer`` v1 for ``onnx.reference.ReferenceEvaluator``.

    Construction validates the six attributes (``ValueError`` naming the node) and, for ``load_device="cpu"``,
    reads the bytes (``FileNotFoundError`` / ``ValueError`` naming the file). With function-linked attributes the
    values are only known per call, so validation and reading happen in ``_run`` instead.
    """

    op_domain = "ai.rt"
    # No name-based schema lookup: this kernel validates itself, whether or not register_schemas() ran, and
    # whether it ran before or after onnx.reference was imported.
    op_schema = None

    # Folder relative filenames resolve against; None means the current directory at construction. Set by bind().
    _rt_bound_dir: ClassVar[str | None] = None

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict[str, Any], schema: Any = None) -> None:
        super().__init__(onnx_node, run_params, schema=schema)
        self._rt_where = describe_node(onnx_node)
        self._rt_base_dir = self._rt_bound_dir if self._rt_bound_dir is not None else os.getcwd()
        self._rt_params: DelayedInitializerParams | None = None
        self._rt_cache: np.ndarray | None = None
        if self.has_linked_attribute:
            return  # one instance serves every call site of the function: nothing is known yet
        values = {name: getattr(self, name) for name in ATTRIBUTE_TYPES if hasattr(self, name)}
        self._rt_params = self._rt_validate(values)
        if self._rt_params.load_device == "cpu":
            cache = self._rt_load(self._rt_params)
            cache.setflags(write=False)
            self._rt_cache = cache

    @classmethod
    def bind(cls, base_dir: str | os.PathLike[str]) -> type[DelayedInitializer]:
        """A subclass, still named ``DelayedInitializer``, resolving relative filenames against ``base_dir``.

        ``base_dir`` is made absolute now. Use it as ``new_ops=[DelayedInitializer.bind(model_folder)]``.
        """
        bound_dir = os.path.abspath(os.fspath(base_dir))
        namespace = {
            "_rt_bound_dir": bound_dir,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": f"{cls.__doc__}\n\nBound to base directory {bound_dir!r}.",
        }
        return type("DelayedInitializer", (cls,), namespace)

    def _rt_validate(self, values: dict[str, Any]) -> DelayedInitializerParams:
        params = validate_attributes(values, where=self._rt_where)
        if not os.path.isabs(params.filename):
            try:
                check_location_syntax(params.filename, tensor_name=self._rt_output_name())
            except UnsafeLocationError as exc:
                raise UnsafeLocationError(
                    f"{self._rt_where}: relative filename {params.filename!r} must stay inside the base directory "
                    f"{self._rt_base_dir!r}: {exc}"
                ) from exc
        return params

    def _rt_output_name(self) -> str:
        return self.onnx_node.output[0] if len(self.onnx_node.output) > 0 else self.onnx_node.name

    def _rt_path(self, params: DelayedInitializerParams) -> str:
        """Absolute path to read; relative names are resolved (and contained) now, when the file is needed."""
        if os.path.isabs(params.filename):
            return params.filename
        wanted = f"{params.nbytes} bytes at offset {params.offset}"
        try:
            return resolve_location(self._rt_base_dir, params.filename, tensor_name=self._rt_output_name())
        except FileNotFoundError as exc:
            path = os.path.join(self._rt_base_dir, params.filename)
            raise FileNotFoundError(
                errno.ENOENT,
                f"{self._rt_where}: file {params.filename!r} does not exist in {self._rt_base_dir!r} (needed {wanted})",
                path,
            ) from exc
        except ValueError as exc:  # UnsafeLocationError (symlink escape) or not a regular file
            raise type(exc)(f"{self._rt_where}: cannot read {wanted}: {exc}") from exc

    def _rt_load(self, params: DelayedInitializerParams) -> np.ndarray:
        """A new native-endian array of the node's shape and dtype filled from the file."""
        out = np.empty(params.shape, dtype=little_endian_dtype(params.dtype))
        if params.nbytes > 0:
            # A relative name promises a file inside the base folder; a hard link there can be any file
            # (CVE-2026-34446), which delay_initializers already refuses: the kernel must not be the way around it.
            read_exact_into(
                self._rt_path(params),
                params.offset,
                out,
                where=self._rt_where,
                refuse_hard_links=not os.path.isabs(params.filename),
            )
        # A no-op on little-endian hosts; a converting copy on big-endian ones.
        return out.astype(params.np_dtype, copy=False)

    def _run(self, **kwargs: Any) -> tuple[np.ndarray]:
        if self._rt_cache is not None:
            return (self._rt_cache.copy(),)
        params = self._rt_params if self._rt_params is not None else self._rt_validate(kwargs)
        return (self._rt_load(params),)
