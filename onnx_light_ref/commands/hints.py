"""What would help, said once per run: the writers' summaries add these notes (issue 41).

* A model whose weights are all inline (optimum's exports: a 71 MB ``.onnx``) has nothing for ``--max-shard-size``,
  ``--format safetensors``, ``--dedup`` or ``--alignment`` to act on: :func:`inline_hint` says that
  ``--size-threshold`` moves inline tensors out, and how many bytes a few sizes would move.
* transformers.js loads ``model.onnx_data``, ``model.onnx_data_1``, ... by count: :func:`transformers_js_note` gives
  the exact ``use_external_data_format`` value for ``config.json``.
* A tensor larger than ``--max-shard-size`` gets a file of its own: :func:`oversized_note` counts those files and
  names the largest few (never one warning per tensor).
* Tensors left in the ``.onnx`` by rule 2 (shape tensors, what onnx would not load back, with ``--format
  safetensors`` a tensor without a name): :func:`kept_inline_note` names them by reason (a checkpoint user must know
  which keys the file lacks).

Reads the source ``.onnx``'s metadata (never a weights file) and the sizes of the files a run wrote.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence

__all__ = ["inline_hint", "kept_inline_note", "oversized_note", "transformers_js_note"]

_SIZES = ((1024, "1K"), (64 * 1024, "64K"), (1024 * 1024, "1M"))
_SHOWN = 3


def inline_hint(src_onnx: str) -> str | None:
    """``note: ...`` saying what ``--size-threshold`` would move out of ``src_onnx``, or None (nothing inline)."""
    from onnx_light_ref.io.read.model_file import load_model_metadata
    from onnx_light_ref.io.read.walker import iter_tensors

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
    from onnx_light_ref.io.results import summarize_names

    count = sum(len(labels) for labels in names.values())
    if not count:
        return None
    parts = "; ".join(f"{reason}: {summarize_names(list(labels))}" for reason, labels in sorted(names.items()))
    whose = f"{model}: " if model is not None else ""
    return f"note: {whose}{count} tensor(s) stay in the .onnx, not in the weights files: {parts}"


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


def transformers_js_note(shard_names: str | None, files: Sequence[str]) -> str | None:
    """``note: ...`` with the ``use_external_data_format`` value transformers.js needs, or None."""
    if shard_names != "transformers.js" or not files:
        return None
    return (
        f'note: transformers.js: set "use_external_data_format": {len(files)} in config.json\'s '
        f'"transformers.js_config" (it loads that many {os.path.basename(files[0])}* files)'
    )
