"""Shared checks of the layout (issue 11) and inline (issue 12) acceptance tests: run both aligners, read the layout.

Import as ``from tests.io.acceptance_support import ...``; models are built with :mod:`tests.models`. Everything here
reads files through plain ``open``/``onnx.load_model(load_external_data=False)``, never through the code under test,
so the checks do not share the aligners' bugs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io._read.walker import TensorSite, iter_tensors
from onnx_light_ref.io._verify import verify_models
from tests.checks import external_payload, run_onnxruntime

__all__ = [
    "AlignedPair",
    "Range",
    "align_both",
    "assert_common",
    "assert_shards",
    "external_ranges",
    "files_of",
    "payload",
    "sites",
    "tensor_nbytes",
    "weights_files",
]


@dataclass(frozen=True)
class Range:
    """Where an external tensor's bytes are: ``location`` (relative to the model's folder), ``offset``, ``length``."""

    location: str
    offset: int
    length: int


@dataclass(frozen=True)
class AlignedPair:
    """The outputs of both aligners for one source and one set of options."""

    source: Path
    streaming: Path  # the destination .onnx written by align_external_data_streaming
    in_memory: Path  # the same by align_external_data_in_memory
    streaming_result: int
    in_memory_result: int


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, with its bytes."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()
    }


def align_both(source: Path, out: Path, dst_weights: str | None = None, **options: Any) -> AlignedPair:
    """Run both aligners from ``source`` into ``out/streaming`` and ``out/in_memory`` (same file names in each).

    ``dst_weights`` is a file name inside each destination folder (None: the default ``model.onnx.data``). A small
    ``chunk_size`` makes the streaming copy take several rounds per tensor.
    """
    results = {}
    for name, aligner, extra in (
        ("streaming", align_external_data_streaming, {"chunk_size": 4096}),
        ("in_memory", align_external_data_in_memory, {}),
    ):
        folder = out / name
        folder.mkdir(parents=True)
        weights = None if dst_weights is None else folder / dst_weights
        results[name] = aligner(source, folder / "model.onnx", weights, **options, **extra)
    return AlignedPair(
        source,
        out / "streaming" / "model.onnx",
        out / "in_memory" / "model.onnx",
        int(results["streaming"]),
        int(results["in_memory"]),
    )


def _entries(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def tensor_nbytes(tensor: TensorProto) -> int:
    """Bytes of data the tensor holds (its external length, its raw_data, or its typed values as raw bytes)."""
    if _is_external(tensor):
        return int(_entries(tensor)["length"])
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    return len(_typed_as_raw(tensor))


def _typed_as_raw(tensor: TensorProto) -> bytes:
    array = numpy_helper.to_array(tensor)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def payload(site: TensorSite, folder: Path) -> bytes:
    """The tensor's little-endian bytes, read from its file when external."""
    tensor = site.tensor
    if _is_external(tensor):
        return external_payload(tensor, folder)
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    return _typed_as_raw(tensor)


def sites(path: Path) -> Iterator[TensorSite]:
    """Every tensor of the model at ``path`` (metadata only)."""
    yield from iter_tensors(onnx.load_model(str(path), load_external_data=False))


def external_ranges(path: Path) -> dict[str, Range]:
    """External tensors of the model at ``path``, by label."""
    ranges = {}
    for site in sites(path):
        if _is_external(site.tensor):
            entries = _entries(site.tensor)
            ranges[site.label] = Range(entries["location"], int(entries.get("offset", "0")), int(entries["length"]))
    return ranges


def weights_files(path: Path) -> set[str]:
    """The data files of the model at ``path``: every file of its folder but the ``.onnx``."""
    return {name for name in os.listdir(path.parent) if name != path.name}


def assert_shards(path: Path, base: str, cap: int) -> None:
    """Files are ``base``, ``base.1``, ``base.2``... in sequence; each is <= ``cap`` unless it holds one tensor."""
    files = weights_files(path)
    expected = {base} | {f"{base}.{index}" for index in range(1, len(files))}
    assert files == expected, sorted(files)
    ranges = external_ranges(path)
    for name in files:
        held = {(r.offset, r.length) for r in ranges.values() if r.location == name}
        size = os.path.getsize(path.parent / name)
        assert held, f"{name} holds no tensor"
        if size > cap:
            # Only a tensor larger than the cap may overflow it, alone in its file (dedup may point several
            # names at that one copy).
            ((offset, length),) = held
            assert length > cap and offset == 0 and size == length, (name, size, held)
        for offset, length in held:
            assert offset + length <= size  # never split over two files


def assert_common(pair: AlignedPair, feeds_list: list[dict[str, np.ndarray]]) -> None:
    """What every aligned output must satisfy, whatever the options.

    Streaming and in-memory outputs are the same files byte for byte; the return value is the size of all the weights
    files written; ``verify_models`` proves the destination holds the source's tensors; onnxruntime computes exactly
    the source's outputs.
    """
    streaming, in_memory = files_of(pair.streaming.parent), files_of(pair.in_memory.parent)
    assert streaming.keys() == in_memory.keys()
    for name in streaming:
        assert streaming[name] == in_memory[name], f"{name} differs between streaming and in-memory outputs"
    written = sum(len(data) for name, data in streaming.items() if name != pair.streaming.name)
    assert pair.streaming_result == pair.in_memory_result == written
    verified = verify_models(pair.source, pair.streaming)
    assert verified.equal, verified.first_difference
    for feeds in feeds_list:
        for got, expected in zip(
            run_onnxruntime(pair.streaming, feeds), run_onnxruntime(pair.source, feeds), strict=True
        ):
            np.testing.assert_array_equal(got, expected)
