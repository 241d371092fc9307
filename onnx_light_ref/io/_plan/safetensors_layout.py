"""Lay tensors out as safetensors files: keys, dtypes, shards, the order inside each file and each file's header.

safetensors requires the tensors to cover the data section exactly (no hole, no overlap), so alignment cannot come
from padding between tensors. Instead the header is padded with spaces so the data section starts at a multiple of
the alignment, and each file's tensors are ordered so that as many as possible start aligned: first the tensors
whose byte size is a multiple of the alignment (largest first: each ends where the next aligned one starts), then
the other tensors of at least ``align_threshold`` bytes (largest first: the first of them is aligned too), then the
small ones in model order. The tensors of at least ``align_threshold`` bytes that still do not start aligned are
counted and named (:attr:`SafetensorsLayout.unaligned`).

With ``max_shard_size`` the tensors are packed into files by
:func:`~onnx_light_ref.io._plan.placement.first_fit_decreasing`, as raw shards are: largest first, each into the first
file it fits in; a file's size counts its header (for the decision, an upper bound: every entry's JSON with the
longest offsets a file under the cap can have, and the most padding the alignment can add), so every file is at most
``max_shard_size`` bytes, header included, unless it holds one tensor that cannot fit in a file with its own header;
files are numbered by their first tensor in model order, each ordered as below. (The transformers convention counts
data bytes only: a 4 MiB tensor under a 4 MiB cap made a 4,198,400-byte file.)

Each file's header must stay within the ``safetensors`` library's limit (``N`` <= 100,000,000 bytes, the JSON and the
padding that aligns the data section): a longer one, or an alignment no header padding can give (above 64 MiB), is
refused before anything is written (:func:`~onnx_light_ref.io._read.safetensors_header.encode_header`).

Keys are the tensors' names: every externalized tensor needs a non-empty name no other one has. Data types map to
safetensors codes (:func:`~onnx_light_ref.io._read.safetensors_header.safetensors_dtype`); sub-byte types (INT4,
UINT4, FLOAT4E2M1, INT2, UINT2, FLOAT6*) are stored as ``U8`` of their packed bytes with shape ``[nbytes]``, as
onnx-ir does, and STRING, COMPLEX128 and UNDEFINED are refused. Every refusal lists all the offending tensors at once.
Pure planning: this module never opens a file.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from onnx_light_ref.errors import SafetensorsError
from onnx_light_ref.io._plan.placement import first_fit_decreasing
from onnx_light_ref.io._read.alignment import align_up
from onnx_light_ref.io._read.proto import data_type_name
from onnx_light_ref.io._read.safetensors_header import (
    SIZE_PREFIX,
    SafetensorsEntry,
    check_data_alignment,
    encode_header,
    safetensors_dtype,
    storage_shape,
)


@dataclass(frozen=True, slots=True)
class SafetensorsTensor:
    """One externalized tensor as the layout sees it (model walk order)."""

    name: str
    label: str  # where it is in the model, for messages
    data_type: int
    dims: tuple[int, ...]
    length: int


@dataclass
class SafetensorsLayout:
    """Where each tensor lands (``shards[i]``, ``offsets[i]``: file offset, header included) and each file's header."""

    shards: list[int]
    offsets: list[int]
    sizes: list[int]  # file sizes
    headers: list[bytes]
    unaligned: list[str] = field(default_factory=list)  # names of tensors >= align_threshold not starting aligned


def plan_safetensors(
    tensors: Sequence[SafetensorsTensor], step: int, align_threshold: int, max_shard_size: int | None
) -> SafetensorsLayout:
    """Check keys and dtypes, split into files, order each file and build its header.

    Args:
        tensors: the externalized tensors, in model walk order.
        step: effective alignment (1 = packed).
        align_threshold: tensors of at least this many bytes are meant to start aligned.
        max_shard_size: at most this many bytes per file, its header included; a tensor is never split, one that
            cannot fit in a file with its header gets a file of its own. None: one file.

    Returns:
        The :class:`SafetensorsLayout`.

    Raises:
        SafetensorsError: empty or repeated names, or data types safetensors cannot store (all listed); an alignment
            above 64 MiB, or a file whose header would exceed the safetensors library's 100,000,000-byte limit.
    """
    try:
        check_data_alignment(step)
    except SafetensorsError as exc:
        raise SafetensorsError(f"{exc} Nothing written.") from None
    _check_keys(tensors)
    _check_dtypes(tensors)
    groups = [list(range(len(tensors)))] if max_shard_size is None else _split(tensors, max_shard_size, step)
    layout = SafetensorsLayout([0] * len(tensors), [0] * len(tensors), [], [])
    for shard, members in enumerate(groups):
        ordered = _order(tensors, members, step, align_threshold)
        entries: list[SafetensorsEntry] = []
        cursor = 0
        for index in ordered:
            tensor = tensors[index]
            entries.append(SafetensorsEntry(tensor.name, *_storage(tensor), cursor, cursor + tensor.length))
            cursor += tensor.length
        what = "safetensors file" if len(groups) == 1 else f"safetensors file {shard + 1} of {len(groups)}"
        try:
            header = encode_header(entries, step, what=what)
        except SafetensorsError as exc:
            raise SafetensorsError(f"{exc} Nothing written.") from None
        for index, entry in zip(ordered, entries, strict=True):
            layout.shards[index] = shard
            layout.offsets[index] = len(header) + entry.begin
            if tensors[index].length >= max(align_threshold, 1) and layout.offsets[index] % step:
                layout.unaligned.append(tensors[index].name)
        layout.headers.append(header)
        layout.sizes.append(len(header) + cursor)
    return layout


def _storage(tensor: SafetensorsTensor) -> tuple[str, tuple[int, ...]]:
    code = safetensors_dtype(tensor.data_type)
    assert code is not None
    return code, storage_shape(tensor.data_type, tensor.dims, tensor.length)


def _check_keys(tensors: Sequence[SafetensorsTensor]) -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for tensor in tensors:
        by_name[tensor.name].append(tensor.label)
    problems = [
        f"{name!r} used by {len(labels)} tensors ({', '.join(labels[:4])})"
        for name, labels in by_name.items()
        if name and len(labels) > 1
    ]
    if "" in by_name:
        problems.insert(0, f"{len(by_name[''])} tensor(s) without a name ({', '.join(by_name[''][:4])})")
    if "__metadata__" in by_name:
        problems.append("'__metadata__' is reserved by safetensors")
    if problems:
        raise SafetensorsError(
            "safetensors keys are tensor names, which must be unique and non-empty across every externalized tensor: "
            + "; ".join(problems[:20])
            + (f"; and {len(problems) - 20} more" if len(problems) > 20 else "")
            + ". Nothing written."
        )


def _check_dtypes(tensors: Sequence[SafetensorsTensor]) -> None:
    bad = [t for t in tensors if safetensors_dtype(t.data_type) is None]
    if bad:
        listed = ", ".join(f"{t.label} ({_type_name(t.data_type)})" for t in bad[:20])
        raise SafetensorsError(
            f"{len(bad)} tensor(s) have a data type safetensors cannot store: {listed}"
            + (f" and {len(bad) - 20} more" if len(bad) > 20 else "")
            + ". Use weights_format='onnx' for them. Nothing written."
        )


def _type_name(data_type: int) -> str:
    name = data_type_name(data_type)
    return f"data type {data_type}" if name is None else name


def _split(tensors: Sequence[SafetensorsTensor], cap: int, step: int) -> list[list[int]]:
    """Tensor indices of each file, each in walk order: first fit decreasing, a file's size bounded by its data, its
    header's JSON (each entry with offsets of as many digits as the cap) and the alignment padding (module
    docstring)."""
    widest = 10 ** len(str(cap)) - 1
    entry_bytes = [len(_entry_json(tensor, widest)) + 1 for tensor in tensors]  # + the comma after it
    padding_step = max(step, _MIN_HEADER_STEP)

    def grow(state: tuple[int, int], index: int) -> tuple[tuple[int, int], int]:
        data, text = state[0] + tensors[index].length, state[1] + entry_bytes[index]
        return (data, text), data + align_up(SIZE_PREFIX + 2 + text, padding_step)  # 2: the braces

    files = first_fit_decreasing([tensor.length for tensor in tensors], cap, (0, 0), grow)
    return [sorted(members) for members in files]  # walk order: _order arranges each file


_MIN_HEADER_STEP = 8  # the safetensors library wants the data section at a multiple of 8


def _entry_json(tensor: SafetensorsTensor, offset: int) -> bytes:
    """The header entry of ``tensor`` as ``encode_header`` writes it, both data offsets ``offset``."""
    code, shape = _storage(tensor)
    entry = {tensor.name: {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset]}}
    text = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))[1:-1]
    return text.encode("utf-8", errors="surrogatepass")  # a name that is not Unicode is refused by encode_header


def _order(tensors: Sequence[SafetensorsTensor], members: list[int], step: int, threshold: int) -> list[int]:
    """Order of a file's tensors so that as many large ones as possible start at a multiple of ``step``.

    Zero-byte tensors always come last (``data_offsets`` ``[n, n]`` at the end of the data section, still covering
    it exactly): their ONNX offset is then the file's size, the one place onnx 1.17's loader, which reads a
    zero-length reference as the rest of the file, finds zero bytes.
    """
    empty = [i for i in members if tensors[i].length == 0]
    if empty:
        empty_set = set(empty)
        return _order(tensors, [i for i in members if i not in empty_set], step, threshold) + empty
    if step <= 1:
        return members
    large = [i for i in members if tensors[i].length >= max(threshold, 1)]
    whole = [i for i in large if tensors[i].length % step == 0]
    whole_set = set(whole)
    rest = [i for i in large if i not in whole_set]
    large_set = set(large)
    small = [i for i in members if i not in large_set]
    by_size = lambda i: -tensors[i].length  # noqa: E731 - stable: equal sizes keep walk order
    return sorted(whole, key=by_size) + sorted(rest, key=by_size) + small
