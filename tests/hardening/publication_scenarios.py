"""The writers, sources and oracles of the publication hardening tests (kill points, injected and real faults).

Each writer publishes a model of four tensors (1200..3600 bytes: three weights files with ``max_shard_size=4096``)
from a source folder written by :func:`write_source` (into weights named after the model, or into ``w.bin``), with
one alignment for the previous output and another for the new one, so that new bytes read through old offsets would
show. :func:`computed` is the oracle: onnx's loader, its
full checker, a link-count check and onnxruntime. Nothing here publishes anything by itself.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import safetensors.numpy as st_numpy
from onnx import numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    link_external_data,
    save_model_with_shared_external_data,
)
from onnx_light_ref.ops._convert import delay_initializers
from onnx_light_ref.ops._undelay import undelay_initializers
from tests.checks import external_locations, model_fingerprint
from tests.models import identity_model, write_external_model

__all__ = [
    "NEW_ALIGNMENT",
    "OLD_ALIGNMENT",
    "WRITERS",
    "Values",
    "Writer",
    "computed",
    "loaded",
    "prepare",
    "same",
    "values",
    "write_source",
]

# Four tensors of 1200..3600 bytes: with max_shard_size=4096 the aligners write three weights files.
SIZES = {"a": 300, "b": 500, "c": 700, "d": 900}
SHARD_SIZE = 4096
OLD_ALIGNMENT, NEW_ALIGNMENT = 64, 128  # different offsets in the previous and the new output

Values = dict[str, np.ndarray]
Writer = Callable[[Path, Path, int], object]  # (source folder, destination .onnx, alignment)


def values(seed: int) -> Values:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(count, dtype=np.float32) for name, count in SIZES.items()}


LINKED = ("a", "b")  # the tensors link_external_data finds in the checkpoint; c and d go to its own weights file


def write_source(folder: Path, arrays: Values) -> None:
    """``model.onnx`` (external data) for the aligners and link, ``inline.onnx`` for the saver, ``delayed.onnx`` for
    undelay, ``ckpt.safetensors`` (two of the tensors) for link."""
    folder.mkdir()
    source = write_external_model(folder, arrays)
    onnx.save(identity_model(arrays), folder / "inline.onnx")
    onnx.save(delay_initializers(source), folder / "delayed.onnx")
    st_numpy.save_file({name: arrays[name] for name in LINKED}, str(folder / "ckpt.safetensors"))


def _align(function: Callable[..., object], shards: bool) -> Writer:
    extra = {"max_shard_size": SHARD_SIZE} if shards else {}
    return lambda src, dst, alignment: function(src / "model.onnx", dst, alignment=alignment, **extra)


def _align_into(function: Callable[..., object], shards: bool) -> Writer:
    """The aligner writing weights not named after the model (``--weights w.bin``): only a journal tells a rerun that
    a ``w.bin`` a killed run moved in before its commit is the job's own."""
    extra = {"max_shard_size": SHARD_SIZE} if shards else {}
    return lambda src, dst, alignment: function(src / "model.onnx", dst, dst.parent / "w.bin", alignment, **extra)


def _shared(src: Path, dst: Path, alignment: int) -> object:
    return save_model_with_shared_external_data(onnx.load(src / "inline.onnx"), dst, alignment)


def _shared_into(src: Path, dst: Path, alignment: int) -> object:
    return save_model_with_shared_external_data(onnx.load(src / "inline.onnx"), dst, alignment, location="w.bin")


def _undelay(src: Path, dst: Path, alignment: int) -> object:
    return undelay_initializers(src / "delayed.onnx", dst, alignment=alignment)


def _link(src: Path, dst: Path, alignment: int) -> object:
    """The checkpoint must sit in the destination folder: ``<source folder name>.safetensors`` (see ``prepare``)."""
    return link_external_data(src / "model.onnx", dst.parent / f"{src.name}.safetensors", dst, alignment=alignment)


def prepare(name: str, template: Path, old_src: Path, new_src: Path) -> None:
    """Files a writer reads from the destination folder, there before anything is written (link's checkpoints)."""
    if name == "link":
        for src in (old_src, new_src):
            shutil.copyfile(src / "ckpt.safetensors", template / f"{src.name}.safetensors")


WRITERS: dict[str, tuple[Writer, int]] = {  # writer, number of files beside the .onnx it leaves here
    "align-streaming": (_align(align_external_data_streaming, False), 1),
    "align-streaming-3-shards": (_align(align_external_data_streaming, True), 3),
    "align-in-memory-3-shards": (_align(align_external_data_in_memory, True), 3),
    "align-streaming-into-w.bin": (_align_into(align_external_data_streaming, False), 1),
    "align-streaming-3-shards-into-w.bin": (_align_into(align_external_data_streaming, True), 3),
    "shared-save": (_shared, 1),
    "shared-save-into-w.bin": (_shared_into, 1),
    "undelay": (_undelay, 1),
    "link": (_link, 3),  # its weights file and the two checkpoints
}


# The oracles' verdicts by the bytes they judged (tests.checks.model_fingerprint): a fault leaves one of a few states
# (previous or new model, under final or bridge names), so the three loaders run once per distinct state.
_VERDICTS: dict[str, Values] = {}


def computed(model_path: Path) -> Values:
    """What the model at ``model_path`` computes, after onnx's loader, its full checker and onnxruntime (once per
    distinct state of the bytes) and a symlink and link-count check of its files (every time)."""
    locations = external_locations(model_path)
    for location in locations:
        assert not (model_path.parent / location).is_symlink(), f"{location} is a symbolic link"
        assert os.stat(model_path.parent / location).st_nlink == 1, f"{location} has several links"
    key = model_fingerprint(model_path, locations)
    if key not in _VERDICTS:
        onnx.load(str(model_path))  # loads the external data: refuses symlinks and hard-linked files
        onnx.checker.check_model(str(model_path), full_check=True)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        _VERDICTS[key] = {
            name.removeprefix("out_"): value for name, value in zip(names, session.run(None, {}), strict=True)
        }
    return _VERDICTS[key]


def loaded(model_path: Path) -> Values:
    """The initializers onnx's loader reads (a cheaper check than :func:`computed`, for the recovery runs)."""
    model = onnx.load(str(model_path))
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}


def same(first: Values, second: Values) -> bool:
    return first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)
