"""What would help, said once per run: the writers' summaries add these notes (issue 41).

* A model whose weights are all inline (optimum's exports: a 71 MB ``.onnx``) has nothing for ``--max-shard-size``,
  ``--format safetensors``, ``--dedup`` or ``--alignment`` to act on: :func:`inline_hint` says that
  ``--size-threshold`` moves inline tensors out, and how many bytes a few sizes would move.
* transformers.js loads ``model.onnx_data``, ``model.onnx_data_1``, ... by count: :func:`transformers_js_note` gives
  the exact ``use_external_data_format`` value for ``config.json`` (or says why none would load the model), and
  :func:`config_note` what ``--update-config`` wrote there.
* A tensor larger than ``--max-shard-size`` gets a file of its own: :func:`oversized_note` counts those files and
  names the largest few (never one warning per tensor).
* An earlier layout's files no model uses any more: :func:`stale_notes` names those ``--delete-stale`` removed, those
  it kept, or says that it would remove them.
* Tensors left in the ``.onnx`` by rule 2 (shape tensors, what onnx would not load back, with ``--format
  safetensors`` a tensor without a name): :func:`kept_inline_note` names them by reason (a checkpoint user must know
  which keys the file lacks).

Reads the source ``.onnx``'s metadata (never a weights file) and the sizes of the files a run wrote.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence

_SIZES = ((1024, "1K"), (64 * 1024, "64K"), (1024 * 1024, "1M"))
_SHOWN = 3


def inline_hint(src_onnx: str) -> str | None:
    """``note: ...`` saying what ``--size-threshold`` would move out of ``src_onnx``, or None (nothing inline)."""
    from onnx_light_ref.io._read.model_file import load_model_metadata
    from onnx_light_ref.io._read.walker import iter_tensors

    try:
        model = load_model_metadata(os.path.abspath(src_onnx))
    except (ValueError, OSError):
        return None
    sizes = [len(site.tensor.raw_data) for site in iter_tensors(model) if site.tensor.HasField("raw_data")]
    moves = [(text, [n for n in sizes if n >= size]) for size, text in _SIZES]
    said = [f"--size-threshold {text} would move {len(found)} tensor(s), {sum(found)} bytes" for text, found in moves]
    if not moves[0][1]:
        return None
    return (
        "note: every tensor of the source is inline in the .onnx, so the options that act on external weights "
        f"(--max-shard-size, --format, --dedup, --alignment) had nothing to act on: {'; '.join(said)}"
    )


def kept_inline_note(names: Mapping[str, Sequence[str]], model: str | None = None) -> str | None:
    """``note: ...`` naming the tensors left in the ``.onnx`` (``kept_inline_names``: labels by reason), or None.

    Args:
        names: the tensors' labels by reason, as the results carry them.
        model: the member they belong to (a family's summary), shown first.
    """
    from onnx_light_ref.io._results import summarize_names

    count = sum(len(labels) for labels in names.values())
    if not count:
        return None
    parts = "; ".join(f"{reason}: {summarize_names(list(labels))}" for reason, labels in sorted(names.items()))
    whose = f"{model}: " if model is not None else ""
    return f"note: {whose}{count} tensor(s) stay in the .onnx, not in the weights files: {parts}"


def config_note(config_file: str | None, models: Sequence[tuple[str, Sequence[str]]]) -> str | None:
    """``updated CONFIG: ...`` with the counts ``--update-config`` stored, or None when it was not given."""
    if config_file is None:
        return None
    from onnx_light_ref._commands.paths import shown_path

    counts = {os.path.basename(model): len(files) for model, files in models}
    return f'updated {shown_path(config_file)}: "transformers.js_config": "use_external_data_format" {_json(counts)}'


def _json(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def stale_notes(stale: Sequence[str], removed: Sequence[str], delete_stale: bool) -> list[str]:
    """The lines about an earlier layout's files: those ``--delete-stale`` removed, those still there (kept by it, or
    left because it was not given)."""
    lines = []
    if removed:
        lines.append(f"removed {len(removed)} earlier file(s) no model uses now: {_paths(removed)}")
    if stale and delete_stale:
        lines.append(
            f"note: kept {len(stale)} earlier file(s) no model written now uses, which --delete-stale may not remove "
            f"(another model uses them, or this destination does not own them; a warning says which): {_paths(stale)}"
        )
    elif stale:
        lines.append(
            f"note: {len(stale)} file(s) left by an earlier run here are not used by what was written and were not "
            f"deleted: {_paths(stale)} (--delete-stale removes those no other model uses)"
        )
    return lines


def _paths(paths: Sequence[str]) -> str:
    from onnx_light_ref._commands.paths import shown_path

    return ", ".join(shown_path(path) for path in paths)


def oversized_note(files: Sequence[str], cap: int | None) -> str | None:
    """``note: ...`` counting the written files whose data is larger than ``cap`` (one tensor each), or None."""
    if cap is None:
        return None
    over = []
    for path in files:
        size = _data_size(path)
        if size is not None and size > cap:
            over.append((size, path))
    if not over:
        return None
    over.sort(reverse=True)
    shown = ", ".join(f"{os.path.basename(path)} ({size} bytes)" for size, path in over[:_SHOWN])
    more = f" and {len(over) - _SHOWN} more" if len(over) > _SHOWN else ""
    return (
        f"note: {len(over)} file(s) hold a single tensor larger than --max-shard-size {cap} (a tensor is never "
        f"split): {shown}{more}"
    )


def _data_size(path: str) -> int | None:
    """The file's size, without its header for a safetensors file (the cap counts the data section only)."""
    try:
        size = os.path.getsize(path)
        if not path.endswith(".safetensors"):
            return size
        with open(path, "rb") as file:
            (header,) = struct.unpack("<Q", file.read(8))
        return size - 8 - header
    except (OSError, struct.error):
        return None


def transformers_js_note(shard_names: str | None, models: Sequence[tuple[str, Sequence[str]]]) -> str | None:
    """``note: ...`` with the ``use_external_data_format`` value transformers.js needs for ``models`` (each written
    ``.onnx`` and the weights files it references), or why no value loads one of them; None without
    ``--shard-names transformers.js`` or weights files."""
    from onnx_light_ref.io._transformers_js import chunk_count

    if shard_names != "transformers.js" or not any(files for _, files in models):
        return None
    counts = {}
    for model, files in models:
        count = chunk_count(model, files)
        name = os.path.basename(model)
        if count is None:
            return (
                f"note: transformers.js fetches the external data of {name} from files named after it ({name}_data, "
                f"{name}_data_1...), so it cannot load {name} by count from {os.path.basename(files[0])}*"
            )
        counts[name] = count
    return (
        f'note: transformers.js: set "use_external_data_format": {_json(counts)} in config.json\'s '
        '"transformers.js_config" (--update-config config.json writes it)'
    )
