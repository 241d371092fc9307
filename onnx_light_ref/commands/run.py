"""``onnx-light-ref run MODEL.onnx --input name=file.npy ...``: evaluate a model lazily and save its outputs.

Builds the evaluator with :func:`onnx_light_ref.ops.reference_evaluator` (external weights become
``DelayedInitializer`` nodes bound to the model's folder), feeds the ``.npy`` inputs, and writes each output to
``<output-dir>/<name>.npy``, printing its shape and dtype. Never loads ``.npy`` files with pickle.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import numpy as np

from onnx_light_ref.errors import ExternalDataError, InvalidModelError

__all__ = ["output_file_name", "parse_input_spec", "register", "run_model"]


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


def run_model(args: argparse.Namespace) -> int:
    from onnx_light_ref.ops import reference_evaluator

    feeds: dict[str, np.ndarray] = {}
    for name, path in args.input:
        if name in feeds:
            print(f"error: input {name!r} given twice.", file=sys.stderr)
            return 1
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            print(f"error: cannot load input {name!r} from {path!r}: {exc}", file=sys.stderr)
            return 1
    start = time.perf_counter()
    try:
        sess = reference_evaluator(args.model, args.load_device)
    except (FileNotFoundError, InvalidModelError, ExternalDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    built = time.perf_counter()
    unknown = [name for name in feeds if name not in sess.input_names]
    if unknown:
        print(f"error: the model has no input(s) {unknown}; its inputs are {sess.input_names}.", file=sys.stderr)
        return 1
    try:
        outputs = sess.run(None, feeds)
    except (KeyError, RuntimeError, ValueError, FileNotFoundError) as exc:
        # A missing feed (KeyError/RuntimeError from onnx), a weight file that vanished or shrank since
        # construction, or feeds of the wrong shape: report it as the user's problem, not a crash.
        print(f"error: evaluation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    done = time.perf_counter()
    os.makedirs(args.output_dir, exist_ok=True)
    used: set[str] = set()
    for name, value in zip(sess.output_names, outputs, strict=True):
        file_name = output_file_name(name)
        stem, suffix = file_name[: -len(".npy")], 1
        while file_name in used:  # two names sanitized alike
            suffix += 1
            file_name = f"{stem}_{suffix}.npy"
        used.add(file_name)
        target = os.path.join(args.output_dir, file_name)
        array = np.asarray(value)
        np.save(target, array, allow_pickle=False)
        print(f"{name}: shape {list(array.shape)} dtype {array.dtype} -> {target}")
    print(f"built in {built - start:.3f} s (load_device={args.load_device}), ran in {done - built:.3f} s")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="evaluate a model lazily with the reference evaluator and save its outputs as .npy",
        description="Evaluate MODEL with onnx's reference evaluator, its external weights turned into "
        "ai.rt::DelayedInitializer nodes (read from the files when needed), and save each output as "
        "<output-dir>/<name>.npy.",
    )
    parser.add_argument("model", help="path to the .onnx file")
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
    parser.add_argument("--output-dir", default=".", help="folder for the output .npy files (default: current)")
    parser.set_defaults(func=run_model)
