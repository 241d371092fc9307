"""``onnx-light-ref run MODEL.onnx --input name=file.npy ...``: evaluate a model lazily and save its outputs.

Builds the evaluator with :func:`onnx_light_ref.ops.reference_evaluator` (external weights become
``DelayedInitializer`` nodes bound to, and confined to, the model's folder unless ``--allow-outside-folder``),
checks the feeds against the model's declared inputs, runs it, and writes each output to
``<output-dir>/<name>.npy``, printing its shape and dtype. A missing ``--output-dir`` is created (with its parents)
before the model is evaluated, and removed again if the run fails.

Every ordinary mistake (a feed of the wrong shape or type, an output folder that is a file, a model the converter
or the kernel refuses, an output that is a sequence or a map) prints one ``error: ...`` line and exits 1. Outputs are
written only once all of them are known to be savable, and appear together (temp files renamed at the end), so a
failed run leaves no half-written ``.npy``. Never loads ``.npy`` files with pickle.

Never writes over a file the run reads: an output file that is (same device and inode: the same path, a hard link,
a symlink to it) an ``--input`` file, the model, or a weights file the model names (external data, a
``DelayedInitializer`` filename) is refused before the model runs. Every model-controlled string printed (output
names, error messages quoting the model) goes through :func:`~onnx_light_ref.commands.text.printable`, so an
escape sequence (OSC 52 clipboard writes, clear-screen) or a bidi override in a name is shown, never executed. A
tensor too large for this machine's memory is :class:`~onnx_light_ref.errors.TensorAllocationError`, one line.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import re
import stat
import time
from typing import Any, NamedTuple

import numpy as np
import onnx

from onnx_light_ref.commands.errors import error_exit
from onnx_light_ref.commands.folders import FolderError, make_folders, remove_created_folders, remove_own_temp_files
from onnx_light_ref.commands.npy_types import NpyForm, evaluator_array_dtype, feed_dtype, input_from_npy, output_for_npy
from onnx_light_ref.commands.text import printable
from onnx_light_ref.io.read.locations import FileIdentity, is_external
from onnx_light_ref.io.read.model_file import load_model_metadata
from onnx_light_ref.io.read.walker import iter_graphs, iter_tensors
from onnx_light_ref.io.write.publish import StagedFile, publish_all, staged_files
from onnx_light_ref.ops.schema import DOMAIN, OP_TYPE

__all__ = ["output_file_name", "parse_input_spec", "register", "run_command"]

# What evaluating an arbitrary model can raise for a user's mistake (bad feed, unsupported model, bad attribute,
# unreadable weights), as opposed to a bug: reported as one line rather than a traceback.
# MemoryError: a tensor larger than the machine (TensorAllocationError from the kernel, numpy's own from an op).
_USER_ERRORS = (OSError, ValueError, TypeError, KeyError, IndexError, RuntimeError, NotImplementedError, MemoryError)


class _RunError(Exception):
    """A problem to report as ``error: <message>`` with exit status 1."""


def parse_input_spec(spec: str) -> tuple[str, str]:
    """``"x=inputs/x.npy"`` -> ``("x", "inputs/x.npy")``; the first ``=`` separates name and file."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--input expects NAME=FILE.npy, got {spec!r}.")
    return name, path


def output_file_name(name: str) -> str:
    """A file name for an output: characters other than letters, digits, ``._-`` become ``_``."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    return (safe or "output") + ".npy"


def _load_feeds(specs: list[tuple[str, str]], read: dict[FileIdentity, str]) -> dict[str, np.ndarray]:
    """Load every ``--input``; record the identity of each file in ``read``."""
    feeds: dict[str, np.ndarray] = {}
    for name, path in specs:
        if name in feeds:
            raise _RunError(f"input {name!r} given twice.")
        try:
            feeds[name] = _load_array(name, path, read)
        except (OSError, ValueError) as exc:
            raise _RunError(f"cannot load input {name!r} from {path!r}: {exc}") from exc
        if not isinstance(feeds[name], np.ndarray):  # an .npz archive
            raise _RunError(f"input {name!r} from {path!r} is not a single array (.npy); .npz is not supported.")
    return feeds


def _load_array(name: str, path: str, read: dict[FileIdentity, str]) -> Any:
    """``np.load`` without pickle, refusing first what it would choke on: a FIFO or device (it would block or read
    forever) and a ``.npy`` whose header announces more data than the file holds (numpy allocates the announced
    size before reading: a 40-byte file claiming 2**40 floats raised MemoryError)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _RunError(f"cannot load input {name!r} from {path!r}: not a regular file.")
        read[FileIdentity(st.st_dev, st.st_ino)] = f"the file of --input {name!r}"
        if f.read(6) == b"\x93NUMPY":
            f.seek(0)
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(f)
            needed = math.prod(shape) * dtype.itemsize
            if not dtype.hasobject and needed > st.st_size - f.tell():
                raise _RunError(
                    f"cannot load input {name!r} from {path!r}: its header announces shape {list(shape)} of {dtype} "
                    f"({needed} bytes), but the file holds {st.st_size - f.tell()} bytes of data."
                )
        f.seek(0)
        if f.read(1) == b"\x80":  # a raw pickle (protocol 2+): numpy < 2's refusal does not say what it is
            raise _RunError(
                f"cannot load input {name!r} from {path!r}: the file contains pickled (object) data; it is never "
                "unpickled."
            )
        f.seek(0)
        return np.load(f, allow_pickle=False)


def _check_output_dir(folder: str) -> None:
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise _RunError(f"--output-dir {folder!r} exists and is not a folder.")


def _check_feed(name: str, value: np.ndarray, declared: Any) -> None:
    """Compare a feed with the graph input's declared tensor type (element type, rank, fixed dimensions)."""
    if not isinstance(declared, onnx.TypeProto) or not declared.HasField("tensor_type"):
        return
    tensor_type = declared.tensor_type
    if tensor_type.elem_type:
        expected = evaluator_array_dtype(tensor_type.elem_type)
        if value.dtype != expected:
            raise _RunError(f"input {name!r} has dtype {value.dtype}, the model expects {expected}.")
    if tensor_type.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        shown = [d if d is not None else "?" for d in dims]
        mismatch = len(dims) != value.ndim or any(d not in (None, v) for d, v in zip(dims, value.shape, strict=False))
        if mismatch:
            raise _RunError(f"input {name!r} has shape {list(value.shape)}, the model expects {shown}.")


def _narrow_feeds(sess: Any, feeds: dict[str, np.ndarray], raw_bits: bool) -> None:
    """Inputs of a type ``.npy`` cannot carry (bfloat16, float8, int4...) arrive widened (or as bits): narrow them
    exactly to onnx's representation (:mod:`~onnx_light_ref.commands.npy_types`), refusing what does not fit."""
    for name, declared in zip(sess.input_names, sess.input_types, strict=False):
        if name not in feeds or not isinstance(declared, onnx.TypeProto) or not declared.HasField("tensor_type"):
            continue
        elem_type = declared.tensor_type.elem_type
        if feed_dtype(elem_type) is None:
            continue
        try:
            feeds[name] = input_from_npy(name, feeds[name], elem_type, raw_bits=raw_bits)
        except ValueError as exc:
            raise _RunError(f"{exc} Nothing was evaluated.") from exc


def _check_feeds(sess: Any, feeds: dict[str, np.ndarray]) -> None:
    unknown = [name for name in feeds if name not in sess.input_names]
    if unknown:
        raise _RunError(f"the model has no input(s) {unknown}; its inputs are {sess.input_names}.")
    missing = [name for name in sess.input_names if name not in feeds]
    if missing:
        raise _RunError(f"missing --input for {missing} (the model's inputs are {sess.input_names}).")
    for name, declared in zip(sess.input_names, sess.input_types, strict=False):
        _check_feed(name, feeds[name], declared)


class _Planned(NamedTuple):
    """One output to write: its name, its file, the array saved and how it was converted for ``.npy`` (or None)."""

    name: str
    path: str
    array: np.ndarray
    note: str | None


def _as_savable(name: str, value: object, raw_bits: bool = False) -> NpyForm:
    if isinstance(value, (list, tuple)):
        raise _RunError(
            f"output {name!r} is a sequence of {len(value)} values; only tensor outputs can be saved as .npy "
            "(nothing was written)."
        )
    if isinstance(value, dict):
        raise _RunError(f"output {name!r} is a map; only tensor outputs can be saved as .npy (nothing was written).")
    array = np.asarray(value)
    if array.dtype == object:
        try:
            array = array.astype(str)  # string tensors: save as fixed-width unicode, never pickled
        except (TypeError, ValueError) as exc:
            raise _RunError(f"output {name!r} holds Python objects that .npy cannot store: {exc}") from exc
    return output_for_npy(array, raw_bits=raw_bits)  # bfloat16, float8, int4...: widened exactly, or bits


def _output_paths(folder: str, names: list[str]) -> list[str]:
    """Where each output goes: ``<folder>/<sanitized name>.npy``, a suffix for names sanitized alike."""
    used: set[str] = set()
    paths = []
    for name in names:
        file_name = output_file_name(name)
        stem, suffix = file_name[: -len(".npy")], 1
        while file_name in used:  # two names sanitized alike
            suffix += 1
            file_name = f"{stem}_{suffix}.npy"
        used.add(file_name)
        paths.append(os.path.join(folder, file_name))
    return paths


def _plan_outputs(folder: str, names: list[str], values: list[object], raw_bits: bool = False) -> list[_Planned]:
    paths = _output_paths(folder, names)
    planned = []
    for name, path, value in zip(names, paths, values, strict=True):
        form = _as_savable(name, value, raw_bits)
        planned.append(_Planned(name, path, form.array, form.note))
    return planned


def _identity(path: str) -> FileIdentity | None:
    try:
        st = os.stat(path)  # follows symlinks: a link to a file the run reads is that file
    except (OSError, ValueError):
        return None
    return FileIdentity(st.st_dev, st.st_ino)


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes of the main graph, of model functions, and of all their subgraphs."""
    nodes = [node for graph in iter_graphs(model.graph) for node in graph.node]
    for function in model.functions:
        nodes.extend(function.node)
        for node in function.node:
            for attribute in node.attribute:
                subgraphs = [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
                nodes.extend(inner for subgraph in subgraphs for graph in iter_graphs(subgraph) for inner in graph.node)
    return nodes


def _named_files(model: onnx.ModelProto) -> dict[str, str]:
    """Every file name the model uses (external data locations, DelayedInitializer filenames) -> how to name it."""
    named: dict[str, str] = {}
    for site in iter_tensors(model):
        if is_external(site.tensor):
            for entry in site.tensor.external_data:
                if entry.key == "location" and entry.value:
                    named.setdefault(entry.value, f"the weights file of tensor {site.tensor.name!r}")
    for node in _all_nodes(model):
        if node.domain == DOMAIN and node.op_type == OP_TYPE:
            for attribute in node.attribute:
                if attribute.name == "filename" and attribute.s:
                    filename = attribute.s.decode("utf-8", errors="surrogateescape")
                    named.setdefault(filename, f"the weights file of DelayedInitializer output {list(node.output)}")
    return named


def _model_files(model_path: str) -> dict[FileIdentity, str]:
    """The model and every weights file it names, by identity; names resolving to nothing are left out (the
    evaluator reports those)."""
    folder = os.path.dirname(os.path.abspath(model_path))
    files: dict[FileIdentity, str] = {}
    model_id = _identity(model_path)
    if model_id is not None:
        files[model_id] = "the model"
    for location, what in _named_files(load_model_metadata(model_path)).items():
        identity = _identity(os.path.join(folder, location))  # an absolute location stays as it is
        if identity is not None:
            files.setdefault(identity, what)
    return files


def _check_not_read(names: list[str], paths: list[str], read: dict[FileIdentity, str]) -> None:
    """Refuse an output file that is a file the run reads (same device and inode, through any link)."""
    for name, path in zip(names, paths, strict=True):
        identity = _identity(path)
        if identity is not None and identity in read:
            raise _RunError(
                f"output {name!r} would be written to {path!r}, which is {read[identity]} (the same file, or a link "
                "to it): the run reads it, so it is never overwritten. Choose another --output-dir; nothing was "
                "written."
            )


def _save_outputs(folder: str, planned: list[_Planned]) -> None:
    try:
        with staged_files() as files:
            for _, target, array, _ in planned:
                buffer = io.BytesIO()
                np.save(buffer, array, allow_pickle=False)
                staged = StagedFile(target)
                files.append(staged)
                staged.write_all(buffer.getbuffer(), 0)
            publish_all(files)
    except OSError as exc:
        raise _RunError(f"cannot write the outputs to {folder!r}: {exc}") from exc


def _evaluate(args: argparse.Namespace) -> int:
    read: dict[FileIdentity, str] = {}
    feeds = _load_feeds(args.input, read)
    _check_output_dir(args.output_dir)
    try:
        created = make_folders([args.output_dir])
    except FolderError as exc:
        raise _RunError(f"--output-dir: {exc}") from exc
    try:
        return _run_and_save(args, feeds, read)
    except KeyboardInterrupt:  # SIGINT/SIGTERM: also a temp file the interrupt caught before it was recorded
        remove_own_temp_files([args.output_dir])
        remove_created_folders(created)
        raise
    except BaseException:
        remove_created_folders(created)
        raise


def _run_and_save(args: argparse.Namespace, feeds: dict[str, np.ndarray], read: dict[FileIdentity, str]) -> int:
    from onnx_light_ref.ops import reference_evaluator

    start = time.perf_counter()
    try:
        sess = reference_evaluator(args.model, args.load_device, allow_outside_folder=args.allow_outside_folder)
    except _USER_ERRORS as exc:
        raise _RunError(f"cannot evaluate {args.model!r}: {exc}") from exc
    built = time.perf_counter()
    _narrow_feeds(sess, feeds, args.raw_bits)
    _check_feeds(sess, feeds)
    try:
        read.update(_model_files(args.model))
    except _USER_ERRORS as exc:
        raise _RunError(f"cannot read {args.model!r}: {exc}") from exc
    names = list(sess.output_names)
    _check_not_read(names, _output_paths(args.output_dir, names), read)
    try:
        outputs = sess.run(None, feeds)
    except _USER_ERRORS as exc:
        # A weight file that vanished or shrank since construction, an op failing on these values: the model's or
        # the data's problem, reported without a traceback.
        raise _RunError(f"evaluation failed: {type(exc).__name__}: {exc}") from exc
    done = time.perf_counter()
    planned = _plan_outputs(args.output_dir, names, list(outputs), args.raw_bits)
    _check_not_read(names, [item.path for item in planned], read)  # a link made while the model ran
    _save_outputs(args.output_dir, planned)
    for name, target, array, note in planned:
        shown = f" ({note})" if note else ""
        print(printable(f"{name}: shape {list(array.shape)} dtype {array.dtype}{shown} -> {target}"))
    print(f"built in {built - start:.3f} s (load_device={args.load_device}), ran in {done - built:.3f} s")
    return 0


def run_command(args: argparse.Namespace) -> int:
    """The ``run`` handler: 0 on success, 1 with one ``error:`` line on stderr otherwise."""
    try:
        return _evaluate(args)
    except _RunError as exc:
        # Messages quote the model's names with repr, but errors from onnx's evaluator may carry them raw.
        return error_exit(exc)  # escaped there


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``run`` sub-command."""
    parser = subparsers.add_parser(
        "run",
        help="evaluate a model lazily with the reference evaluator and save its outputs as .npy",
        description="Evaluate MODEL.onnx with onnx's reference evaluator, its external weights turned into "
        "ai.rt::DelayedInitializer nodes (read from the files when needed), and save each output as "
        "<output-dir>/<name>.npy. Every file the model names must be inside its folder unless "
        "--allow-outside-folder.",
    )
    parser.add_argument("model", metavar="MODEL.onnx", help="model to evaluate")
    parser.add_argument(
        "--input",
        action="append",
        type=parse_input_spec,
        default=[],
        metavar="NAME=FILE.npy",
        help="a graph input and the .npy file holding it (repeat for each input)",
    )
    parser.add_argument(
        "--load-device",
        choices=("file", "cpu"),
        default="file",
        help="file: read each weight at every run, nothing at construction (default); cpu: read each weight once "
        "when the evaluator is built",
    )
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        default=".",
        help="folder for the output .npy files, created if missing (default: current)",
    )
    parser.add_argument(
        "--allow-outside-folder",
        action="store_true",
        help="trust the model: let DelayedInitializer nodes read absolute filenames outside the model's folder "
        "(the spec's examples use /tmp paths); refused by default",
    )
    parser.add_argument(
        "--raw-bits",
        action="store_true",
        help="outputs (and inputs) of types .npy cannot carry (bfloat16, float8, float4, float6, int4, uint4, int2, "
        "uint2) as each element's bits: uint16 for bfloat16, uint8 for the others (a sub-byte code in the low bits); "
        "by default they are widened exactly (float32, int8, uint8)",
    )
    parser.set_defaults(func=run_command)
