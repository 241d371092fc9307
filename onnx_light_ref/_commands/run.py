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

The outputs are a plan of the writer contract (:mod:`onnx_light_ref.io._write.contract`), checked before the model
runs and again under the folder lock right before they are moved into place: an output file that is (same device
and inode: the same path, a hard link, a symlink to it) an ``--input`` file, the model, or a weights file the model
names (external data, a ``DelayedInitializer`` filename) is refused; so is a name longer than the folder allows, an
output that is a directory, an existing file at an output name that no previous ``run`` wrote (``--overwrite``
replaces it) and a file another model uses as weights (``--replace-shared``). A rerun replaces the outputs a previous
``run`` wrote in that folder without ``--overwrite``: ``.onnx-light-ref-run.json``, written with the outputs, lists
each one's name, size and SHA-256, and a file still matching its entry is ``run``'s own
(:mod:`~onnx_light_ref._commands.run_record`).

Every model-controlled string printed (output names, error messages quoting the model) goes through
:func:`~onnx_light_ref._commands.text.printable`, so an escape sequence (OSC 52 clipboard writes, clear-screen) or a
bidi override in a name is shown, never executed. A tensor too large for this machine's memory is
:class:`~onnx_light_ref.errors.TensorAllocationError`, one line.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import re
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from onnx_light_ref._commands.errors import describe_error, error_exit, published_exit
from onnx_light_ref._commands.folders import FolderError, make_folders, remove_created_folders
from onnx_light_ref._commands.help_text import REFUSED, exit_statuses
from onnx_light_ref._commands.options import add_option, add_options
from onnx_light_ref._commands.paths import shown_path
from onnx_light_ref._commands.text import printable
from onnx_light_ref.errors import PublishedWithErrorsError

if TYPE_CHECKING:  # numpy, onnx and the library are imported when the command runs, not when the CLI starts
    import numpy as np

    from onnx_light_ref._commands.npy_types import NpyForm
    from onnx_light_ref._commands.run_record import RunRecord
    from onnx_light_ref.io._read.locations import FileIdentity
    from onnx_light_ref.io._write.contract import WritePlan

# What building and running an arbitrary model raises for the model or its data, wherever it is raised: the
# package's typed errors and the ValueErrors its checks raise, an OSError (unreadable weights), a MemoryError (a
# tensor larger than the machine: TensorAllocationError from the kernel, numpy's own from an op).
_INPUT_ERRORS = (ValueError, OSError, MemoryError)
# What onnx's reference evaluator and numpy raise for a model they cannot run or values an op refuses, seen in
# tests/test_cli_run.py: NotImplementedError (an operator it does not know), RuntimeError (an input no node produces,
# a missing or inconsistent attribute), TypeError (shapes an elementwise op cannot broadcast), IndexError (Gather or
# TopK out of range), KeyError (Cast to an unknown type). The user's input only when raised by their code: raised by
# ours, the same types are a bug, reported as one (exit status 70).
_EVALUATOR_ERRORS = (RuntimeError, TypeError, IndexError, KeyError)
_EVALUATOR_PACKAGES = ("onnx", "numpy")


class _RunError(Exception):
    """A problem to report as ``error: <message>`` with exit status 1."""


def _is_input_error(exc: Exception) -> bool:
    """Whether ``exc``, raised while the model was built, read or run, is the model's or its data's problem (one
    ``error:`` line) rather than a bug: one of :data:`_INPUT_ERRORS`, or of :data:`_EVALUATOR_ERRORS` raised in
    onnx's or numpy's code after the last frame of this package (our kernel calling numpy counts as numpy's)."""
    if isinstance(exc, _INPUT_ERRORS):
        return True
    if not isinstance(exc, _EVALUATOR_ERRORS):
        return False
    packages = []
    frame = exc.__traceback__
    while frame is not None:
        packages.append(str(frame.tb_frame.f_globals.get("__name__", "")).partition(".")[0])
        frame = frame.tb_next
    ours = max((index for index, package in enumerate(packages) if package == "onnx_light_ref"), default=-1)
    return any(package in _EVALUATOR_PACKAGES for package in packages[ours + 1 :])


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
    import numpy as np

    feeds: dict[str, np.ndarray] = {}
    for name, path in specs:
        if name in feeds:
            raise _RunError(f"input {name!r} given twice.")
        try:
            feeds[name] = _load_array(name, path, read)
        except EOFError as exc:  # numpy's answer for a file that ends inside the .npy header
            raise _RunError(
                f"cannot load input {name!r} from {path!r}: the file ends before a whole .npy header ({exc})."
            ) from exc
        except (OSError, ValueError) as exc:
            raise _RunError(f"cannot load input {name!r} from {path!r}: {describe_error(exc)}") from exc
        if not isinstance(feeds[name], np.ndarray):  # an .npz archive
            raise _RunError(f"input {name!r} from {path!r} is not a single array (.npy); .npz is not supported.")
    return feeds


def _load_array(name: str, path: str, read: dict[FileIdentity, str]) -> Any:
    """``np.load`` without pickle, refusing first what it would choke on: a FIFO or device (it would block or read
    forever) and a ``.npy`` whose header announces more data than the file holds (numpy allocates the announced
    size before reading: a 40-byte file claiming 2**40 floats raised MemoryError)."""
    import numpy as np

    from onnx_light_ref.io._read.folder import open_unconfined
    from onnx_light_ref.io._read.locations import FileIdentity

    # Looked at before it is opened: a FIFO or a device is refused saying what it is, and never opened.
    opened = open_unconfined(os.path.abspath(path), subject="the file", expected="a .npy file")
    with os.fdopen(opened.detach(), "rb") as f:
        st = opened.stat
        read[FileIdentity(st.st_dev, st.st_ino)] = f"the file of --input {name!r}"
        if st.st_size == 0:
            raise _RunError(f"cannot load input {name!r} from {path!r}: the file is empty (0 bytes), not a .npy file.")
        if f.read(6) == b"\x93NUMPY":
            f.seek(0)
            shape, dtype = _read_npy_header(name, path, f, st.st_size)
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


def _read_npy_header(name: str, path: str, f: Any, size: int) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype the ``.npy`` header of ``f`` (``size`` bytes) announces, or one error line naming the file.

    numpy parses the header's dict with ``ast.literal_eval`` after a tokenizer pass: a malformed one raises
    ``tokenize.TokenError`` (a dict never closed, a stray ``)``), ``SyntaxError``, ``TypeError`` (an unhashable key)
    or ``ValueError`` (a header over numpy's 10,000-byte safety limit), none of which should reach the user as a
    traceback. A header length past the end of the file is refused before numpy asks for that many bytes (up to
    4 GiB in a version 2 header), and a negative dimension, which numpy 1.24 loads as another shape, after.
    """
    import struct
    import tokenize

    import numpy as np

    try:
        version = np.lib.format.read_magic(f)
        length_format = "<H" if version == (1, 0) else "<I"
        start = f.tell()
        length_field = f.read(struct.calcsize(length_format))
        if len(length_field) == struct.calcsize(length_format):
            (length,) = struct.unpack(length_format, length_field)
            if length > size - f.tell():
                raise _RunError(
                    f"cannot load input {name!r} from {path!r}: its .npy header length is {length} bytes, but the "
                    f"file holds {size - f.tell()} bytes after it."
                )
        f.seek(start)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
    except (ValueError, TypeError, SyntaxError, RecursionError, tokenize.TokenError) as exc:
        what = exc.args[0] if isinstance(exc, tokenize.TokenError) and exc.args else describe_error(exc)
        raise _RunError(
            f"cannot load input {name!r} from {path!r}: its .npy header is malformed ({type(exc).__name__}: "
            f"{str(what).splitlines()[0] if str(what) else 'no detail'})."
        ) from exc
    if any(dim < 0 for dim in shape):
        raise _RunError(
            f"cannot load input {name!r} from {path!r}: its .npy header announces the shape {list(shape)}, with a "
            "negative dimension."
        )
    return shape, dtype


def _check_output_dir(folder: str) -> None:
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise _RunError(f"--output-dir {folder!r} exists and is not a folder.")


def _check_feed(name: str, value: np.ndarray, declared: Any) -> None:
    """Compare a feed with the graph input's declared tensor type (element type, rank, fixed dimensions)."""
    import onnx

    if not isinstance(declared, onnx.TypeProto) or not declared.HasField("tensor_type"):
        return
    tensor_type = declared.tensor_type
    if tensor_type.elem_type:
        expected = _declared_dtype(name, tensor_type.elem_type)
        if value.dtype != expected:
            raise _RunError(f"input {name!r} has dtype {value.dtype}, the model expects {expected}.")
    if tensor_type.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        shown = [d if d is not None else "?" for d in dims]
        mismatch = len(dims) != value.ndim or any(d not in (None, v) for d, v in zip(dims, value.shape, strict=False))
        if mismatch:
            raise _RunError(f"input {name!r} has shape {list(value.shape)}, the model expects {shown}.")


def _declared_dtype(name: str, elem_type: int) -> np.dtype:
    """The dtype onnx's evaluator holds a graph input's declared element type in; one error line for a type onnx
    does not know."""
    from onnx_light_ref._commands.npy_types import evaluator_array_dtype

    try:
        return evaluator_array_dtype(elem_type)
    except (KeyError, ValueError, TypeError) as exc:
        raise _RunError(
            f"input {name!r} is declared with element type {elem_type}, which is not a TensorProto.DataType this "
            "onnx knows; the model cannot be fed (nothing was run)."
        ) from exc


def _defaults(sess: Any) -> set[str]:
    """Graph inputs that have an initializer: overridable defaults, which the evaluator uses when not fed."""
    graph = getattr(getattr(sess, "proto_", None), "graph", None)
    if graph is None:
        return set()
    return {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}


def _narrow_feeds(sess: Any, feeds: dict[str, np.ndarray], raw_bits: bool) -> None:
    """Inputs of a type ``.npy`` cannot carry (bfloat16, float8, int4...) arrive widened (or as bits): narrow them
    exactly to onnx's representation (:mod:`~onnx_light_ref._commands.npy_types`), refusing what does not fit."""
    import onnx

    from onnx_light_ref._commands.npy_types import feed_dtype, input_from_npy

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
    defaults = _defaults(sess)
    missing = [name for name in sess.input_names if name not in feeds and name not in defaults]
    if missing:
        raise _RunError(f"missing --input for {missing} (the model's inputs are {sess.input_names}).")
    for name, declared in zip(sess.input_names, sess.input_types, strict=False):
        if name in feeds:  # an input left out has its initializer as default value
            _check_feed(name, feeds[name], declared)


class _Planned(NamedTuple):
    """One output to write: its name, its file, the array saved and how it was converted for ``.npy`` (or None)."""

    name: str
    path: str
    array: np.ndarray
    note: str | None


def _as_savable(name: str, value: object, raw_bits: bool = False) -> NpyForm:
    import numpy as np

    from onnx_light_ref._commands.npy_types import output_for_npy

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


def _model_files(model_path: str) -> dict[FileIdentity, str]:
    """The model and every file it names (external data locations, DelayedInitializer filenames), by identity;
    names resolving to nothing are left out (the evaluator reports those)."""
    from onnx_light_ref.io._read.delayed_names import DELAYED_OP_TYPE
    from onnx_light_ref.io._read.locations import FileIdentity
    from onnx_light_ref.io._read.sharing import file_key, read_references

    files: dict[FileIdentity, str] = {}
    model_id = file_key(model_path)
    if isinstance(model_id, FileIdentity):
        files[model_id] = "the model"
    for key, reference in (read_references(model_path) or {}).items():
        if isinstance(key, FileIdentity):
            what = f"{DELAYED_OP_TYPE} output" if reference.via == "delayed_initializer" else "tensor"
            files.setdefault(key, f"the weights file of {what} {reference.tensor!r}")
    return files


def _output_plan(
    args: argparse.Namespace, names: list[str], read: dict[FileIdentity, str]
) -> tuple[WritePlan, RunRecord]:
    """Every output file and the folder's record of what ``run`` wrote there (:mod:`.run_record`: the evidence that
    a previous run's outputs are its own to replace) as the writer contract's plan, checked before the model runs
    (names, lengths, existing files and folders at those names, files the run reads)."""
    from onnx_light_ref._commands.run_record import RunRecord
    from onnx_light_ref.io._write.contract import WriteOptions, WritePlan, check_plan

    paths = [os.path.abspath(path) for path in _output_paths(args.output_dir, names)]
    record = RunRecord.read(args.output_dir, paths)
    plan = WritePlan(
        "run",
        [],
        [*(record.planned(path) for path in paths), record.planned_record()],
        WriteOptions(args.replace_shared, args.overwrite, args.allow_outside_folder),
        dict(read),
        rename_hint="another --output-dir",
        source_checks=[record.check_unchanged()],
    )
    try:
        check_plan(plan)  # the names: checked before the model runs, the contents once it has
    except (ValueError, OSError) as exc:
        raise _RunError(f"{exc}") from exc
    return plan, record


def _save_outputs(folder: str, planned: list[_Planned], plan: WritePlan, record: RunRecord) -> None:
    import numpy as np

    from onnx_light_ref.io._write.execute import execute

    outputs = []
    for _, target, array, _ in planned:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        outputs.append((target, buffer.getvalue()))
    plan.files = [*(record.planned(target, data) for target, data in outputs), record.planned_record(outputs)]
    try:
        execute(plan, lambda _stats: None)  # checked again, and under the folder lock: a file made while it ran
    except ValueError as exc:  # the writer contract, re-checked under the folder lock
        raise _RunError(f"{exc}") from exc
    except OSError as exc:
        raise _RunError(f"cannot write the outputs to {folder!r}: {describe_error(exc)}") from exc


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
    except BaseException:  # a refusal, or SIGINT/SIGTERM (the library removed its temp files)
        remove_created_folders(created)
        raise


def _run_and_save(args: argparse.Namespace, feeds: dict[str, np.ndarray], read: dict[FileIdentity, str]) -> int:
    from onnx_light_ref.ops import reference_evaluator

    start = time.perf_counter()
    try:
        sess = reference_evaluator(args.model, args.load_device, allow_outside_folder=args.allow_outside_folder)
    except Exception as exc:
        if not _is_input_error(exc):
            raise
        raise _RunError(f"cannot evaluate {args.model!r}: {describe_error(exc)}") from exc
    built = time.perf_counter()
    _narrow_feeds(sess, feeds, args.raw_bits)
    _check_feeds(sess, feeds)
    try:
        read.update(_model_files(args.model))
    except (ValueError, OSError) as exc:  # our reader's errors: anything else from it is a bug
        raise _RunError(f"cannot read {args.model!r}: {describe_error(exc)}") from exc
    names = list(sess.output_names)
    plan, record = _output_plan(args, names, read)
    try:
        outputs = sess.run(None, feeds)
    except Exception as exc:
        # A weight file that vanished or shrank since construction, an op failing on these values: the model's or
        # the data's problem, reported without a traceback.
        if not _is_input_error(exc):
            raise
        raise _RunError(f"evaluation failed: {type(exc).__name__}: {describe_error(exc)}") from exc
    done = time.perf_counter()
    planned = _plan_outputs(args.output_dir, names, list(outputs), args.raw_bits)
    _save_outputs(args.output_dir, planned, plan, record)
    for name, target, array, note in planned:
        converted = f" ({note})" if note else ""
        print(f"{printable(name)}: shape {list(array.shape)} dtype {array.dtype}{converted} -> {shown_path(target)}")
    print(f"built in {built - start:.3f} s (load_device={args.load_device}), ran in {done - built:.3f} s")
    return 0


def run_command(args: argparse.Namespace) -> int:
    """The ``run`` handler: 0 on success, 1 with one ``error:`` line on stderr otherwise."""
    try:
        return _evaluate(args)
    except _RunError as exc:
        # Messages quote the model's names with repr, but errors from onnx's evaluator may carry them raw.
        return error_exit(exc)  # escaped there
    except PublishedWithErrorsError as exc:  # every output is written; a step after the last move failed
        return published_exit(exc)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``run`` sub-command."""
    parser = subparsers.add_parser(
        "run",
        epilog=exit_statuses("the outputs are written", REFUSED, writes=True),
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
        help="a graph input and the .npy file holding it: required, once for each input of the model (a model "
        "without inputs takes none)",
    )
    add_options(parser, "--load-device")
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        default=".",
        help="folder for the output .npy files, created if missing (default: current)",
    )
    add_option(parser, "--allow-outside-folder", subject="MODEL.onnx")
    add_option(
        parser,
        "--overwrite",
        owner="onnx-light-ref run",
        owned="the outputs a previous run wrote there, listed in <output-dir>/.onnx-light-ref-run.json",
        example="a <output-dir>/<name>.npy that no run wrote",
    )
    add_option(parser, "--replace-shared", what="an output file")
    parser.add_argument(
        "--raw-bits",
        action="store_true",
        help="outputs (and inputs) of types .npy cannot carry (bfloat16, float8, float4, float6, int4, uint4, int2, "
        "uint2) as each element's bits: uint16 for bfloat16, uint8 for the others (a sub-byte code in the low bits); "
        "by default they are widened exactly (float32, int8, uint8)",
    )
    # argparse shows an optional flag in brackets; --input is required whenever the model has inputs (each one is
    # checked against the model when it runs), so the usage shows it as the synopsis does.
    usage = parser.format_usage().removeprefix("usage: ").rstrip("\n")
    parser.usage = usage.replace("[--input NAME=FILE.npy]", "--input NAME=FILE.npy ...", 1)
    parser.set_defaults(func=run_command)
