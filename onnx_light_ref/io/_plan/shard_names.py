"""The names of weights files (shards) that consumers load: ours, Hugging Face's and transformers.js's.

Three schemes, for a base path ``W`` (the first weights file) and ``N`` files:

* ``None`` (ours, onnx-light's): ``W``, ``W.1``, ``W.2``, ... (the name of a shard never depends on ``N``);
* ``"hf"`` (onnx-ir's ``save_safetensors`` and transformers' form): ``W`` when ``N == 1``, else the marker
  ``-0000i-of-0000N`` inserted before the last extension: ``model.safetensors`` ->
  ``model-00001-of-00003.safetensors``, ``model.data`` -> ``model-00001-of-00003.data``;
* ``"transformers.js"``: ``W``, ``W_1``, ``W_2``, ... with ``W`` defaulting to ``model.onnx_data`` beside
  ``model.onnx`` (what transformers.js loads with ``use_external_data_format: N``); it loads at most 100 files, so
  more is refused before anything is written.

:func:`stale_candidates` finds the files in the destination folder named like weights files of this destination under
*any* scheme and format (an earlier run may have used another) that this run does not write: its leftovers. Only
files that are demonstrably the destination's: a ``*.safetensors`` set (``model.safetensors``, its
``model-0000k-of-0000N.safetensors`` shards, its ``.index.json``) is every PyTorch checkpoint's name, so its files are
listed only on evidence: the model now at the destination references a shard of that set (rule 3 of the writer
contract asks the same, :func:`checkpoint_file_used`). Naming, one ``scandir`` and, only when
such a set is there, a metadata read of the destination ``.onnx`` (the wire reader, payloads skipped); this module
never writes or deletes a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterator
from typing import Literal, get_args

from onnx_light_ref.io._arguments import ArgumentTypeError

ShardScheme = Literal["hf", "transformers.js"]
"""The consumers' names for weights files (``shard_names=``, ``--shard-names``)."""
ShardNames = ShardScheme | None
"""``shard_names``: a consumer's scheme, or None for ours (``W``, ``W.1``...)."""
SHARD_NAME_SCHEMES: tuple[ShardNames, ...] = (None, *get_args(ShardScheme))

# transformers.js (``use_external_data_format``) fetches model.onnx_data_1 ... _99 at most: a 101st file never loads.
TRANSFORMERS_JS_MAX_CHUNKS = 100

# fullmatch only, ASCII digits only: ``\d`` takes other digits (``model-٠٠٠٠١-of-٠٠٠٠٢.data`` is a user's file).
_HF_MARKER = re.compile(r"-([0-9]{5,})-of-([0-9]{5,})")


def is_named_after_model(path: str, model_path: str) -> bool:
    """Whether ``path`` is in the folder of ``model_path`` and named after it (``m.onnx.data``, ``m.onnx.data.3``,
    ``m.onnx_data_1``): rule 3 owns such a file whatever the previous model says, so a publication needs no journal
    for it. Both paths absolute and normalized."""
    folder, name = os.path.split(path)
    model_folder, model_name = os.path.split(model_path)
    return folder == model_folder and name.startswith((model_name + ".", model_name + "_"))


def check_shard_names(value: object) -> ShardNames:
    """Validate ``shard_names``.

    Raises:
        ValueError: an unknown scheme (``ArgumentTypeError``, also a ``TypeError``, for a non-string).
    """
    if value is None:
        return None
    expected = "shard_names must be None, " + " or ".join(repr(scheme) for scheme in get_args(ShardScheme))
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{expected}, got {type(value).__name__}.")
    if value not in get_args(ShardScheme):
        raise ValueError(f"{expected}, got {value!r}.")
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


# Formats and schemes whose default first weights file (``default_weights_path``) an earlier run may have used.
_DEFAULT_LAYOUTS: tuple[tuple[str, ShardNames], ...] = (
    ("onnx", None),
    ("onnx", "hf"),
    ("onnx", "transformers.js"),
    ("safetensors", "hf"),
)


def stale_candidates(dst_onnx: str, base: str, written: list[str]) -> list[str]:
    """Files of the destination folder named like a weights file of ``dst_onnx`` that this run does not write.

    An earlier run may have used another scheme or format than this one: the names of every scheme (ours ``W.1``,
    ``hf`` ``model-0000k-of-0000N.<ext>``, transformers.js ``W_1``) are looked for, for this run's first weights
    file ``base`` and for the default first weights file of every format and scheme (``<dst>.data``,
    ``<stem>.data``, ``<dst>_data``, ``<stem>.safetensors``), with each one's ``.index.json`` (a sharded
    safetensors set's index: loaders that find it read the old shards). The first files themselves are listed too,
    except ``<stem>.safetensors`` when it is not this run's ``base``. A set whose first file is named
    ``*.safetensors`` is every PyTorch checkpoint's name (``model.safetensors``, ``model-00001-of-00002.safetensors``,
    ``model.safetensors.index.json``): a file of it is listed only when the model now at ``dst_onnx`` references a
    file that makes it the destination's (:func:`checkpoint_file_used`: for an hf shard or the index, an hf shard of
    the set); a user's sharded checkpoint beside a new ``model.onnx``, or beside the single ``model.safetensors`` a
    run of ours wrote there, is never called a leftover.

    Args:
        dst_onnx: the ``.onnx`` being written (absolute).
        base: this run's first weights file (absolute).
        written: every path this run writes (shards and index; ``[]`` when nothing is external).

    Returns:
        Sorted paths; sources of the run are filtered out by the caller.
    """
    folder = os.path.dirname(base)
    bases = {os.path.basename(base): True}
    for weights_format, scheme in _DEFAULT_LAYOUTS:
        default = default_weights_path(dst_onnx, weights_format, scheme)
        if os.path.dirname(default) == folder:
            bases.setdefault(os.path.basename(default), weights_format == "onnx")
    found: list[str] = []
    checkpoints: dict[str, list[str]] = {}  # a *.safetensors set's first name -> its files found here
    for entry in _entries(folder, set(written) | {dst_onnx}):
        names = [name for name, with_first in bases.items() if _is_weights_name(entry.name, name, with_first)]
        if any(not is_checkpoint_set(name) for name in names):
            found.append(entry.path)
        for name in names:
            if is_checkpoint_set(name):
                checkpoints.setdefault(name, []).append(entry.path)
    if checkpoints:
        used = _names_referenced_by(dst_onnx, folder)
        for name, paths in checkpoints.items():
            found.extend(path for path in paths if path not in found and checkpoint_file_used(path, name, used))
    return sorted(found)


# The format of PyTorch checkpoints: a set named like one is not a leftover of ours unless the destination used it.
_CHECKPOINT_SUFFIX = ".safetensors"


def _names_referenced_by(dst_onnx: str, folder: str) -> set[str]:
    """Names of the files of ``folder`` the model now at ``dst_onnx`` references (none when there is no model there
    or it cannot be read: then nothing of a checkpoint set is demonstrably the destination's)."""
    from onnx_light_ref.io._read.sharing import read_references  # the wire reader: only when a checkpoint set is here

    if not os.path.lexists(dst_onnx):
        return set()
    model_folder = os.path.dirname(dst_onnx)
    names = set()
    for reference in (read_references(dst_onnx) or {}).values():
        path = os.path.normpath(os.path.join(model_folder, reference.location))
        if os.path.dirname(path) == os.path.normpath(folder):
            names.add(os.path.basename(path))
    return names


def is_checkpoint_set(base: str) -> bool:
    """Whether the weights set of first file ``base`` is named like a PyTorch checkpoint (``*.safetensors``): its
    files are the destination's only on evidence (:func:`checkpoint_file_used`), never by their names alone."""
    return base.endswith(_CHECKPOINT_SUFFIX)


def checkpoint_file_used(candidate: str, base_name: str, referenced: Collection[str]) -> bool:
    """Whether ``referenced`` (names of the files of the set's folder that the destination's model references)
    makes ``candidate`` (a file of the checkpoint-named set ``base_name``) the destination's.

    An hf shard or the index: only a referenced hf shard of the set is evidence (of any count: a run of ours that
    wrote ``-of-00003`` owns the ``-of-00002`` it wrote before); the first file alone is not, since
    ``model.safetensors`` written by a run of ours beside a user's ``model-00001-of-00002.safetensors`` and
    ``model.safetensors.index.json`` does not make that checkpoint ours. A ``W.k`` / ``W_k`` shard: the first file
    or a shard of the same scheme.
    """
    name = os.path.basename(candidate)
    hf_used = any(_is_shard_name(used, base_name, "hf") for used in referenced)
    if name == os.path.basename(index_path(base_name)) or _is_shard_name(name, base_name, "hf"):
        return hf_used
    for scheme in (None, "transformers.js"):
        if _is_shard_name(name, base_name, scheme):
            return any(used == base_name or _is_shard_name(used, base_name, scheme) for used in referenced)
    return name in referenced


def existing_shards(base: str, written: list[str], scheme: ShardNames, *, safetensors: bool = False) -> list[str]:
    """Files of ``base``'s folder named like ``base`` or a shard of it under ``scheme``, except those in ``written``.

    One scheme, one set (what a set of shards owns: :mod:`~onnx_light_ref.io._write.ownership`); leftovers of every
    scheme are :func:`stale_candidates`. With ``safetensors``, an index ``<base>.index.json`` left beside a run that
    writes a single file is listed too. Sorted by path.
    """
    folder, name = os.path.split(base)
    found = [
        entry.path
        for entry in _entries(folder, set(written))
        if entry.name == name or _is_shard_name(entry.name, name, scheme)
    ]
    index = index_path(base)
    if safetensors and len(written) <= 1 and os.path.lexists(index) and index not in found:
        found.append(index)
    return sorted(found)


def _entries(folder: str, skip: Collection[str]) -> Iterator[os.DirEntry[str]]:
    """The entries of ``folder`` whose path is not in ``skip``; none when the folder is missing or unreadable (the
    publication reports it)."""
    try:
        entries = os.scandir(folder)
    except OSError:
        return
    with entries:
        yield from (entry for entry in entries if entry.path not in skip)


def _is_weights_name(candidate: str, base_name: str, with_first: bool) -> bool:
    """``candidate`` is a shard of ``base_name`` under some scheme, its index, or (``with_first``) it itself."""
    if candidate == base_name:
        return with_first
    if candidate == os.path.basename(index_path(base_name)):
        return True
    return any(_is_shard_name(candidate, base_name, scheme) for scheme in SHARD_NAME_SCHEMES)


def _is_shard_name(candidate: str, base_name: str, scheme: ShardNames) -> bool:
    """A further shard of ``base_name`` under ``scheme`` (``base_name`` itself is not)."""
    if candidate == base_name:
        return False
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
