"""Pair a model's tensors with a checkpoint's keys by content: equal bytes, or the 2-D transpose of a key's tensor.

Exporters rename (``lm_head.weight`` for a tied ``model.embed_tokens.weight``, ``val_41``, ``onnx::MatMul_593``) and
pre-transpose Linear weights (torch's ``optimize=True``, the legacy exporter, optimum). Names cannot pair those; bytes
can. :func:`pair_by_content` takes the tensors not paired by name and, among those of one data type and shape (or
swapped dims, for a transpose), finds equal ones:

* **equal bytes**: a streaming BLAKE2b digest of each candidate, then a byte comparison of the pairs whose digests
  agree (a digest alone never pairs two tensors);
* **transposes**: a model tensor ``M`` of dims ``[a, b]`` and a key ``C`` of shape ``[b, a]`` with ``M == C.T``: a
  streaming fingerprint ``sum M[i, j] u**i v**j mod P`` that is transpose-symmetric (``C`` is hashed with ``u`` and
  ``v`` swapped), then an exact comparison in tiles of at most ``chunk_size / 2`` bytes per side.

Each key is paired straight with at most one model tensor (a map file ``link --map`` can read must not send two
tensors to one key); a transpose may read a key another tensor reads straight (the tied embedding and its
pre-transposed ``lm_head``). A model tensor whose own name is a key is never paired with another key: every reader
checks such a tensor against the key of its name. Memory: two ``chunk_size`` buffers and the fingerprint's power
tables (at most ``chunk_size`` bytes each); nothing is written.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._plan.ranges import CopyRange, open_source
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._results import TensorPairing

_PRIME = 2**31 - 1  # products of two residues fit an uint64, sums of a chunk's products too
_BASES = (1_000_003, 998_244_353 % _PRIME)  # the fingerprint's row and column bases (any two distinct residues)
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True, slots=True)
class TensorBytes:
    """Where one tensor's bytes are: a validated range of a file (``source``) or bytes in memory (``data``).

    ``dtype`` is the safetensors code of its data type (None: none, never paired), ``shape`` its dims (a packed
    sub-byte tensor: ``(nbytes,)``).
    """

    name: str
    dtype: str | None
    shape: tuple[int, ...]
    nbytes: int
    source: CopyRange | None = None
    data: bytes | None = None


class TensorFiles:
    """The files :class:`TensorBytes` ranges read, each opened once (through its held folder) until :meth:`close`."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self._fds: dict[object, int] = {}
        self._buffers = [bytearray(), bytearray()]

    def read(self, tensor: TensorBytes, offset: int, n: int, which: int = 0) -> memoryview:
        """``n`` bytes of ``tensor`` from ``offset`` (``n <= chunk_size``), in buffer ``which`` unless in memory."""
        if tensor.data is not None:
            return memoryview(tensor.data)[offset : offset + n]
        source = tensor.source
        assert source is not None
        key = source.src_identity or source.src_path
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = open_source(_whole_file(source))
        if len(self._buffers[which]) < n:
            self._buffers[which] = bytearray(max(n, min(self.chunk_size, 2 * len(self._buffers[which]))))
        view = memoryview(self._buffers[which])[:n]
        got = pread_exact(fd, view, source.src_offset + offset)
        if got != n:
            raise ExternalDataError(
                f"{source.src_path!r} ended at byte {source.src_offset + offset + got} while reading tensor "
                f"{tensor.name!r}; it was shortened after it was validated."
            )
        return view

    def chunks(self, tensor: TensorBytes, which: int = 0) -> Iterator[memoryview]:
        """The tensor's bytes in order, ``chunk_size`` at a time."""
        for offset in range(0, tensor.nbytes, self.chunk_size):
            yield self.read(tensor, offset, min(self.chunk_size, tensor.nbytes - offset), which)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> TensorFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _whole_file(source: CopyRange) -> CopyRange:
    """The same file, as :func:`open_source` opens it (the range itself does not matter to the open)."""
    return CopyRange(source.src_path, 0, 0, 0, source.src_identity, source.src_folder, source.src_location)


def transposable(model: TensorBytes, key: TensorBytes) -> bool:
    """Whether ``model`` may be ``key``'s 2-D transpose: same dtype, dims swapped, whole bytes per element."""
    if model.dtype is None or model.dtype != key.dtype or len(model.shape) != 2 or len(key.shape) != 2:
        return False
    rows, cols = model.shape
    if (cols, rows) != key.shape or rows * cols == 0 or model.nbytes != key.nbytes:
        return False
    return model.nbytes % (rows * cols) == 0 and model.nbytes // (rows * cols) in _UNSIGNED


def pair_by_content(
    model: Sequence[TensorBytes],
    checkpoint: Mapping[str, TensorBytes],
    files: TensorFiles,
    *,
    taken: set[str],
    transposes: bool = True,
    reuse: bool = False,
) -> list[TensorPairing]:
    """Pair each model tensor with a key of equal bytes, or (``transposes``) of which it is the 2-D transpose.

    Args:
        model: the model tensors still unpaired (none of them named like a key).
        checkpoint: every key of the checkpoint.
        files: where the bytes are read (two buffers of at most ``files.chunk_size``).
        taken: keys already read straight by a model tensor (by name or map); updated with the keys paired here.
        transposes: also look for transposes.
        reuse: a key may be paired with several model tensors (``verify``: equal weights stored once).

    Returns:
        The pairings found, in model order (``how`` is ``"content"`` or ``"transpose"``).
    """
    straight = _pair_equal(model, checkpoint, files, taken, reuse)
    found = {pairing.name for pairing in straight}
    crossed: list[TensorPairing] = []
    if transposes:
        crossed = _pair_transposed([t for t in model if t.name not in found], checkpoint, files)
    order = {t.name: i for i, t in enumerate(model)}
    return sorted(straight + crossed, key=lambda pairing: order[pairing.name])


def _pair_equal(
    model: Sequence[TensorBytes],
    checkpoint: Mapping[str, TensorBytes],
    files: TensorFiles,
    taken: set[str],
    reuse: bool,
) -> list[TensorPairing]:
    groups: dict[tuple[str | None, tuple[int, ...]], list[str]] = {}
    for key in sorted(checkpoint):
        if key not in taken:
            entry = checkpoint[key]
            groups.setdefault((entry.dtype, entry.shape), []).append(key)
    digests: dict[str, bytes] = {}
    pairings: list[TensorPairing] = []
    for tensor in model:
        keys = [key for key in groups.get((tensor.dtype, tensor.shape), ()) if key not in taken]
        if tensor.dtype is None or not keys:
            continue
        digest = _digest(tensor, files)
        for key in keys:
            entry = checkpoint[key]
            if key not in digests:
                digests[key] = _digest(entry, files)
            if digests[key] == digest and equal_bytes(tensor, entry, files):
                pairings.append(TensorPairing(tensor.name, key, "content"))
                if not reuse:
                    taken.add(key)
                break
    return pairings


def _pair_transposed(
    model: Sequence[TensorBytes], checkpoint: Mapping[str, TensorBytes], files: TensorFiles
) -> list[TensorPairing]:
    prints: dict[str, int] = {}
    pairings: list[TensorPairing] = []
    for tensor in model:
        keys = [key for key in sorted(checkpoint) if transposable(tensor, checkpoint[key])]
        if not keys:
            continue
        mine = _fingerprint(tensor, files, swapped=False)
        for key in keys:
            entry = checkpoint[key]
            if key not in prints:
                prints[key] = _fingerprint(entry, files, swapped=True)
            if prints[key] == mine and _equal_transposed(tensor, entry, files):
                pairings.append(TensorPairing(tensor.name, key, "transpose"))
                break
    return pairings


def _digest(tensor: TensorBytes, files: TensorFiles) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for chunk in files.chunks(tensor):
        digest.update(chunk)
    return digest.digest()


def equal_bytes(a: TensorBytes, b: TensorBytes, files: TensorFiles) -> bool:
    """Byte comparison, ``chunk_size`` at a time (a digest alone never pairs two tensors); the same range of the
    same file (a linked tensor and its key) is equal without being read."""
    if a.nbytes != b.nbytes:
        return False
    if a.source is not None and b.source is not None and a.source.src_identity is not None:
        same_file = a.source.src_identity == b.source.src_identity
        if same_file and a.source.src_offset == b.source.src_offset:
            return True
    step = files.chunk_size
    for offset in range(0, a.nbytes, step):
        n = min(step, a.nbytes - offset)
        if files.read(a, offset, n, 0) != files.read(b, offset, n, 1):
            return False
    return True


def _elements(tensor: TensorBytes) -> tuple[type[np.unsignedinteger], int, int, int]:
    """The unsigned type of one element, its size, and the 2-D shape."""
    rows, cols = tensor.shape
    size = tensor.nbytes // (rows * cols)
    return _UNSIGNED[size], size, rows, cols


def _powers(base: int, n: int) -> np.ndarray:
    """``base**k mod P`` for ``k < n`` (doubling: log2(n) vector steps)."""
    out = np.ones(max(n, 1), dtype=np.uint64)
    filled = 1
    while filled < n:
        step = min(filled, n - filled)
        out[filled : filled + step] = out[:step] * np.uint64(pow(base, filled, _PRIME)) % np.uint64(_PRIME)
        filled += step
    return out[:n]


def _fingerprint(tensor: TensorBytes, files: TensorFiles, *, swapped: bool) -> int:
    """``sum X[i, j] u**i v**j mod P`` over the 2-D tensor ``X`` read row-major (``swapped``: ``u`` and ``v``
    exchanged, so that a tensor and its transpose get the same value), in blocks of at most ``chunk_size`` bytes."""
    kind, size, rows, cols = _elements(tensor)
    row_base, col_base = _BASES[::-1] if swapped else _BASES
    per_block = max(1, files.chunk_size // 8)  # elements per block: the power tables stay within chunk_size
    prime = np.uint64(_PRIME)
    total = 0
    if cols <= per_block:
        col_powers = _powers(col_base, cols)
        block_rows = max(1, per_block // cols)
        row_powers = _powers(row_base, min(rows, block_rows))
        for first in range(0, rows, block_rows):
            count = min(block_rows, rows - first)
            view = files.read(tensor, first * cols * size, count * cols * size)
            values = np.frombuffer(view, dtype=kind).astype(np.uint64).reshape(count, cols) % prime
            row_sums = (values * col_powers % prime).sum(axis=1, dtype=np.uint64) % prime
            weights = row_powers[:count] * np.uint64(pow(row_base, first, _PRIME)) % prime
            total = (total + int((row_sums * weights % prime).sum(dtype=np.uint64))) % _PRIME
        return total
    col_powers = _powers(col_base, per_block)
    for row in range(rows):
        row_sum = 0
        for first in range(0, cols, per_block):
            count = min(per_block, cols - first)
            view = files.read(tensor, (row * cols + first) * size, count * size)
            values = np.frombuffer(view, dtype=kind).astype(np.uint64) % prime
            weights = col_powers[:count] * np.uint64(pow(col_base, first, _PRIME)) % prime
            row_sum = (row_sum + int((values * weights % prime).sum(dtype=np.uint64))) % _PRIME
        total = (total + row_sum * pow(row_base, row, _PRIME)) % _PRIME
    return total


def _equal_transposed(model: TensorBytes, key: TensorBytes, files: TensorFiles) -> bool:
    """``model == key.T`` exactly, compared tile by tile (each tile at most ``chunk_size / 2`` bytes per side)."""
    kind, size, rows, cols = _elements(model)
    half = max(size, files.chunk_size // 2)
    tile_cols = min(cols, max(1, half // size))
    tile_rows = min(rows, max(1, half // (tile_cols * size)))
    for first_row in range(0, rows, tile_rows):
        n_rows = min(tile_rows, rows - first_row)
        for first_col in range(0, cols, tile_cols):
            n_cols = min(tile_cols, cols - first_col)
            if n_cols == cols:  # whole rows: one read
                view = files.read(model, first_row * cols * size, n_rows * cols * size, 0)
                mine = np.frombuffer(view, dtype=kind).reshape(n_rows, n_cols).copy()
            else:
                mine = np.empty((n_rows, n_cols), dtype=kind)
                for r in range(n_rows):
                    offset = ((first_row + r) * cols + first_col) * size
                    mine[r] = np.frombuffer(files.read(model, offset, n_cols * size, 0), dtype=kind)
            theirs = np.empty((n_cols, n_rows), dtype=kind)
            for c in range(n_cols):  # row first_col + c of the key, its columns first_row...
                offset = ((first_col + c) * rows + first_row) * size
                theirs[c] = np.frombuffer(files.read(key, offset, n_rows * size, 1), dtype=kind)
            if not np.array_equal(mine, theirs.T):
                return False
    return True
