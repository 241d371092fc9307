"""Builders and spies shared by the kernel-state tests (issue 26): nodes, models, and a record of every open.

* :func:`delayed_node` / :func:`delayed_model`: a real ``ai.rt::DelayedInitializer`` node and a model around it;
* :func:`recorded_opens`: every path this process opens while the block runs, seen by a Python audit hook (so an
  ``os.open`` anywhere, ``/proc/self/fd/N`` resolved to the file it designates), with the flags;
* :func:`open_descriptors`: how many descriptors this process has open (``/proc/self/fd``).

Nothing here calls the code under test.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import onnx
from onnx import AttributeProto, TensorProto
from onnx import helper as oh

__all__ = [
    "OPSETS",
    "Open",
    "delayed_model",
    "delayed_node",
    "no_garbage_collection",
    "open_descriptors",
    "opens_of",
    "recorded_opens",
]

OPSETS = [oh.make_opsetid("", 18), oh.make_opsetid("ai.rt", 1)]


def delayed_node(
    filename: str,
    load_device: str = "file",
    *,
    output: str = "y",
    name: str = "w",
    shape: tuple[int, ...] = (4,),
    dtype: int = TensorProto.FLOAT,
    offset: int = 0,
) -> onnx.NodeProto:
    """A DelayedInitializer node with its six attributes, in the reference order."""
    node = oh.make_node("DelayedInitializer", [], [output], domain="ai.rt", name=name)
    node.attribute.append(oh.make_attribute("shape", list(shape), attr_type=AttributeProto.INTS))
    node.attribute.extend(
        [
            oh.make_attribute("dtype", dtype),
            oh.make_attribute("load_device", load_device),
            oh.make_attribute("runtime_device", "cpu"),
            oh.make_attribute("filename", filename),
            oh.make_attribute("offset", offset),
        ]
    )
    return node


def delayed_model(*nodes: onnx.NodeProto, elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A model whose outputs are the nodes' outputs."""
    outputs = [oh.make_tensor_value_info(node.output[0], elem_type, None) for node in nodes]
    return oh.make_model(oh.make_graph(list(nodes), "g", [], outputs), opset_imports=OPSETS)


@dataclass(frozen=True)
class Open:
    """One ``open`` the audit hook saw: the path (a ``/proc/self/fd/N`` resolved) and the flags."""

    path: str
    flags: int

    @property
    def looks_only(self) -> bool:
        """Opened ``O_PATH``: designates the file, cannot read it (and a FIFO's writer is not released)."""
        return bool(self.flags & getattr(os, "O_PATH", 0))


_RECORDING: list[list[Open]] = []
_LOCK = threading.Lock()
_HOOKED: list[bool] = []  # the hook is installed once per process


def _hook(event: str, args: tuple[object, ...]) -> None:
    if event != "open" or not _RECORDING:
        return
    path, _mode, flags = args
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        return  # an open by descriptor
    if path.startswith("/proc/self/fd/"):
        with suppress(OSError):  # a descriptor closed meanwhile: its number is all there is
            path = os.readlink(path)
    flags = flags if isinstance(flags, int) else 0
    for record in _RECORDING:
        record.append(Open(path, flags))


@contextmanager
def recorded_opens() -> Iterator[list[Open]]:
    """Every path opened while the block runs (audit hooks cannot be removed: the hook stays, idle, afterwards)."""
    with _LOCK:
        if not _HOOKED:
            sys.addaudithook(_hook)
            _HOOKED.append(True)
    record: list[Open] = []
    _RECORDING.append(record)
    try:
        yield record
    finally:
        _RECORDING.remove(record)


def opens_of(record: list[Open], fragment: str) -> list[Open]:
    """The opens of ``record`` whose path contains ``fragment`` (give outside files a unique name: a relative open
    through a held folder's descriptor is recorded by the name it used)."""
    return [o for o in record if fragment in o.path]


@contextmanager
def no_garbage_collection() -> Iterator[None]:
    """Collect what is already garbage, then keep the cyclic collector off: descriptor counts taken inside change
    only by what the block does (and anything released in it was released by reference counting)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def open_descriptors() -> int:
    """Descriptors this process has open now."""
    return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
