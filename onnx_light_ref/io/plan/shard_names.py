"""The names of weights files (shards) that consumers load: ours, Hugging Face's and transformers.js's.

Three schemes, for a base path ``W`` (the first weights file) and ``N`` files:

* ``None`` (ours, onnx-light's): ``W``, ``W.1``, ``W.2``, ... (the name of a shard never depends on ``N``);
* ``"hf"`` (onnx-ir's ``save_safetensors`` and transformers' form): ``W`` when ``N == 1``, else the marker
  ``-0000i-of-0000N`` inserted before the last extension: ``model.safetensors`` ->
  ``model-00001-of-00003.safetensors``, ``model.data`` -> ``model-00001-of-00003.data``;
* ``"transformers.js"``: ``W``, ``W_1``, ``W_2``, ... with ``W`` defaulting to ``model.onnx_data`` beside
  ``model.onnx`` (what transformers.js loads with ``use_external_data_format: N``); it loads at most 100 files, so
  more is refused before anything is written.

:func:`stale_candidates` finds, for each scheme, the files in the destination folder named like shards of ``W`` that
a run writing ``N`` files would not write (an earlier run's leftovers). Pure naming and one ``scandir``: this module
never opens, writes or deletes a file.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from onnx_light_ref.io.arguments import ArgumentTypeError

__all__ = [
    "SHARD_NAME_SCHEMES",
    "TRANSFORMERS_JS_MAX_CHUNKS",
    "ShardNames",
    "check_shard_count",
    "check_shard_names",
    "default_weights_path",
    "index_path",
    "shard_paths",
    "stale_candidates",
]

ShardNames = Literal["hf", "transformers.js"] | None
SHARD_NAME_SCHEMES: tuple[ShardNames, ...] = (None, "hf", "transformers.js")

# transformers.js (``use_external_data_format``) fetches model.onnx_data_1 ... _99 at most: a 101st file never loads.
TRANSFORMERS_JS_MAX_CHUNKS = 100

_HF_MARKER = re.compile(r"-(\d{5,})-of-(\d{5,})$")


def check_shard_names(value: object) -> ShardNames:
    """Validate ``shard_names``.

    Raises:
        ValueError: an unknown scheme (``ArgumentTypeError``, also a ``TypeError``, for a non-string).
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"shard_names must be None, 'hf' or 'transformers.js', got {type(value).__name__}.")
    if value not in ("hf", "transformers.js"):
        raise ValueError(f"shard_names must be None, 'hf' or 'transformers.js', got {value!r}.")
    return value  # type: ignore[return-value]


def default_weights_path(dst_onnx: str, weights_format: str, scheme: ShardNames) -> str:
    """The first weights file when the caller names none.

    ``<dst>.data`` (ours), ``<dst without .onnx>.data`` (hf: ``model.data``, then ``model-00001-of-0000N.data``),
    ``<dst>_data`` (transformers.js: ``model.onnx_data``), and
    ``<dst without .onnx>.safetensors`` for safetensors (``model.safetensors``, the name loaders look for).
    """
    stem = dst_onnx[: -len(".onnx")] if dst_onnx.endswith(".onnx") else dst_onnx
    if weights_format == "safetensors":
        return stem + ".safetensors"
    if scheme == "hf":
        return stem + ".data"
    if scheme == "transformers.js":
        return dst_onnx + "_data"
    return dst_onnx + ".data"


def _split_extension(path: str) -> tuple[str, str]:
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    if not ext or not stem:
        return path, ""
    return os.path.join(folder, stem), ext


def check_shard_count(scheme: ShardNames, count: int) -> None:
    """Raise when ``scheme`` cannot name ``count`` files for its consumer.

    Raises:
        ValueError: more than :data:`TRANSFORMERS_JS_MAX_CHUNKS` files with ``"transformers.js"``.
    """
    if scheme == "transformers.js" and count > TRANSFORMERS_JS_MAX_CHUNKS:
        raise ValueError(
            f"shard_names='transformers.js' names at most {TRANSFORMERS_JS_MAX_CHUNKS} weights files (transformers.js "
            f"loads no more), but this layout needs {count}; raise max_shard_size. Nothing written."
        )


def shard_paths(base: str, count: int, scheme: ShardNames) -> list[str]:
    """The ``count`` file paths of a layout, in shard order (``count`` checked with :func:`check_shard_count`)."""
    check_shard_count(scheme, count)
    if scheme is None:
        return [base if i == 0 else f"{base}.{i}" for i in range(count)]
    if scheme == "transformers.js":
        return [base if i == 0 else f"{base}_{i}" for i in range(count)]
    if count == 1:
        return [base]
    stem, ext = _split_extension(base)
    width = max(5, len(str(count)))
    return [f"{stem}-{i:0{width}d}-of-{count:0{width}d}{ext}" for i in range(1, count + 1)]


def index_path(base: str) -> str:
    """The index of a sharded safetensors set: ``model.safetensors.index.json`` for ``model.safetensors``."""
    return base + ".index.json"


def stale_candidates(base: str, written: list[str], scheme: ShardNames, *, safetensors: bool = False) -> list[str]:
    """Files of ``base``'s folder named like shards of ``base`` under ``scheme`` that this run does not write.

    ``written`` are the paths this run writes (``[]`` when nothing is external). With ``safetensors``, an index
    ``<base>.index.json`` left beside a run that writes a single file is listed too: loaders that find it would read
    the old shards. Sorted by path; sources are filtered out by the caller.
    """
    folder, name = os.path.split(base)
    keep = set(written)
    found: list[str] = []
    try:
        entries = os.scandir(folder)
    except OSError:  # the folder is missing or unreadable: publication reports it
        return []
    with entries:
        for entry in entries:
            if entry.path not in keep and _is_shard_name(entry.name, name, scheme):
                found.append(entry.path)
    index = index_path(base)
    if safetensors and len(written) <= 1 and os.path.lexists(index) and index not in found:
        found.append(index)
    return sorted(found)


def _is_shard_name(candidate: str, base_name: str, scheme: ShardNames) -> bool:
    if candidate == base_name:
        return True
    if scheme is None or scheme == "transformers.js":
        separator = "." if scheme is None else "_"
        suffix = candidate[len(base_name) + 1 :] if candidate.startswith(base_name + separator) else ""
        return suffix.isascii() and suffix.isdigit() and suffix == str(int(suffix)) and int(suffix) >= 1
    stem, ext = _split_extension(base_name)
    if ext and not candidate.endswith(ext):
        return False
    middle = candidate[: len(candidate) - len(ext)] if ext else candidate
    if not middle.startswith(stem):
        return False
    return _HF_MARKER.fullmatch(middle[len(stem) :]) is not None
