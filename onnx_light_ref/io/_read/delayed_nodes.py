"""What an ``ai.rt::DelayedInitializer`` node reads: every such node of a model, and its file opened safely.

A writer treats each node as a reference of the model it writes, like an external tensor: it reads ``length`` bytes
(``dtype`` and ``shape``) of ``filename`` at ``offset``. :func:`iter_delayed` yields every node (main graph and its
subgraphs, then model functions, then ``training_info`` graphs, depth first, in node order), and
:class:`DelayedResolver` opens the file a node names through the model's held folder, as the kernel would.

``io`` never imports ``ops``: the node's spelling comes from :mod:`~onnx_light_ref.io._read.delayed_names`, and only
the attributes a reader needs are read here (the kernel validates the other ones: devices, function links).
This module never writes and never reads a byte of the data it locates.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._read.delayed_names import DELAYED_FILENAME, DELAYED_OP_TYPE
from onnx_light_ref.io._read.delayed_rules import is_delayed
from onnx_light_ref.io._read.dtype_sizes import packed_nbytes
from onnx_light_ref.io._read.folder import FileIdentity, ModelFolder, check_file_name, relative_below
from onnx_light_ref.io._read.locations import check_location_syntax
from onnx_light_ref.io._read.safetensors_refs import SafetensorsFile, is_safetensors_location, read_safetensors_fd

if TYPE_CHECKING:
    import onnx

_OFFSET = "offset"


@dataclass(frozen=True, slots=True)
class DelayedSite:
    """A ``DelayedInitializer`` node and what it reads.

    ``filename`` is None when the node has no literal ``filename`` (missing, empty or function-linked), ``nbytes``
    None when its ``dtype``/``shape`` give no byte size: such a node reads bytes no writer can locate.
    """

    node: onnx.NodeProto
    where: str
    filename: str | None
    offset: int
    dtype: int
    shape: tuple[int, ...]
    nbytes: int | None

    @property
    def label(self) -> str:
        """The node's output name (what it produces), else a description of where it is."""
        name = self.node.output[0] if self.node.output else ""
        return name or f"<{DELAYED_OP_TYPE} node in {self.where}>"

    def point_at(self, location: str, offset: int) -> None:
        """Make the node read ``location`` at ``offset`` (its length, ``dtype`` and ``shape`` unchanged)."""
        for attribute in self.node.attribute:
            if attribute.name == DELAYED_FILENAME:
                attribute.s = location.encode("utf-8")
            elif attribute.name == _OFFSET:
                attribute.i = offset


def iter_delayed(model: onnx.ModelProto) -> Iterator[DelayedSite]:
    """Every ``DelayedInitializer`` node of ``model``, in a fixed order (module docstring).

    Args:
        model: the model to walk; its nodes are yielded live, not copied.

    Returns:
        An iterator of :class:`DelayedSite`.
    """
    yield from _nodes(model.graph.node, f"graph {model.graph.name!r}")
    for function in model.functions:
        yield from _nodes(function.node, f"function {function.domain}::{function.name}")
    for index, training in enumerate(model.training_info):
        for name in ("initialization", "algorithm"):
            if training.HasField(name):
                yield from _nodes(getattr(training, name).node, f"training_info[{index}] {name}")


def _nodes(nodes: Iterable[onnx.NodeProto], where: str) -> Iterator[DelayedSite]:
    for node in nodes:
        if is_delayed(node):
            yield _site(node, where)
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.HasField("g") else []
            for subgraph in [*subgraphs, *attribute.graphs]:
                yield from _nodes(subgraph.node, f"{where} / node {node.name or node.op_type!r} / {attribute.name}")


def _site(node: onnx.NodeProto, where: str) -> DelayedSite:
    values: dict[str, onnx.AttributeProto] = {}
    for attribute in node.attribute:
        values.setdefault(attribute.name, attribute)
    filename = None
    found = values.get(DELAYED_FILENAME)
    if found is not None and not found.ref_attr_name and found.s:
        filename = os.fsdecode(found.s)
    offset = values[_OFFSET].i if _OFFSET in values and not values[_OFFSET].ref_attr_name else -1
    dtype = values["dtype"].i if "dtype" in values and not values["dtype"].ref_attr_name else 0
    shape = tuple(values["shape"].ints) if "shape" in values and not values["shape"].ref_attr_name else None
    nbytes = None
    if shape is not None and all(dim >= 0 for dim in shape) and offset >= 0:
        nbytes = packed_nbytes(dtype, math.prod(shape))
    return DelayedSite(node, where, filename, offset, dtype, shape or (), nbytes)


@dataclass(frozen=True)
class DelayedFile:
    """A file a node reads, validated: its path, identity and size, and how to reopen it (through the held
    folder, as ``location``); the header of a ``*.safetensors`` file."""

    path: str
    identity: FileIdentity
    size: int
    folder: ModelFolder | None = None
    location: str | None = None
    safetensors: SafetensorsFile | None = field(default=None, compare=False, repr=False)


class DelayedResolver:
    """Opens the files ``DelayedInitializer`` filenames name through a model's held folder, each name once.

    The kernel's rule: a relative name stays in the folder (no ``..``, no symlink unless the folder allows links);
    an absolute one is read as a name below the folder, or as it is with ``allow_outside_folder`` (the spec's own
    examples name files in ``/tmp``).
    """

    def __init__(self, folder: ModelFolder) -> None:
        self.folder = folder
        self._cache: dict[str, DelayedFile] = {}

    def resolve(self, filename: str, where: str) -> DelayedFile:
        """The validated file ``filename`` names, for the node described by ``where``.

        Raises:
            UnsafeLocationError: a name outside the folder (without the opt-in), with ``..``, through a symlink.
            ExternalDataError: a file that is missing, not regular, hard-linked, or a malformed safetensors file.
        """
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._cache[filename] = self._resolve(filename, where)
        return hit

    def _resolve(self, filename: str, where: str) -> DelayedFile:
        name = filename
        what = f"{where}: filename {filename!r}"
        check_file_name(filename, what)  # the kernel's rule on the name as written: one answer for both
        if os.path.isabs(filename) and not self.folder.allow_outside_folder:
            name = relative_below(
                self.folder.path,
                filename,
                what=what,
                outside=" Nothing was written. Pass allow_outside_folder=True (CLI: --allow-outside-folder) to trust "
                "it.",
                label="the source model's folder",
            )
        if not os.path.isabs(name):
            try:
                check_location_syntax(name, tensor_name=where)
            except UnsafeLocationError as exc:
                raise UnsafeLocationError(f"{where}: filename {filename!r} is not allowed: {exc}") from exc
        # Absolute names outside the folder (opted in) are the spec's files in /tmp: hard links are not refused.
        trusted_absolute = os.path.isabs(name)
        with self.folder.open_file(
            name, subject=f"{where}: file {filename!r}", check_links=not trusted_absolute
        ) as opened:
            header = None
            if is_safetensors_location(filename):
                header = read_safetensors_fd(opened.fd, opened.path, opened.size, filename)
            return DelayedFile(opened.path, opened.identity, opened.size, self.folder, name, header)

    def read_range(self, site: DelayedSite) -> tuple[DelayedFile, int, int]:
        """The validated file, offset and length ``site`` reads; refuses a node whose range cannot be located.

        Raises:
            ExternalDataError: the node has no literal filename, no byte size, or reads past the end of its file.
            UnsafeLocationError: as :meth:`resolve`.
        """
        if site.filename is None or site.nbytes is None:
            raise ExternalDataError(
                f"{DELAYED_OP_TYPE} node {site.label!r} in {site.where}: its filename, offset, dtype or shape is "
                "missing, invalid or function-linked, so the bytes it reads cannot be located; nothing was written."
            )
        file = self.resolve(site.filename, f"{DELAYED_OP_TYPE} node {site.label!r} in {site.where}")
        if site.offset + site.nbytes > file.size:
            raise ExternalDataError(
                f"{DELAYED_OP_TYPE} node {site.label!r}: file {site.filename!r} too short: needs "
                f"{site.offset + site.nbytes} bytes ({site.nbytes} bytes at offset {site.offset}), has {file.size}; "
                "nothing was written."
            )
        return file, site.offset, site.nbytes
