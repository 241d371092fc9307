"""Where each blob of bytes goes in the destination weights files: alignment, align threshold and size-capped shards.

:class:`ShardedLayout` is pure arithmetic, fed one blob length at a time in destination order; it never touches a
file. Rules (``spec/002`` for the shard names):

* a blob of at least ``align_threshold`` bytes starts at a multiple of ``alignment``; a smaller one starts at the
  next free byte (``align_threshold=0`` aligns every blob, the historical behaviour);
* without ``max_shard_size``, one file holds every blob in the order given (the model's walk order);
* with ``max_shard_size``, the blobs are packed into as few files as first-fit decreasing finds
  (:func:`first_fit_decreasing`): the largest blob first (equal lengths in the order given), each appended to the
  first file it fits in, else to a new file. A blob is never split; one that cannot fit in a file by itself (larger
  than the cap) gets a file of its own and nothing joins it; so every file is at most ``max_shard_size`` bytes unless
  it holds a single blob larger than the cap, and at most one file is at most half full (first fit never leaves two:
  the later one's blobs would have fitted in the earlier one). Inside a file the blobs are in the order they were
  packed: largest first, equal lengths in the order given (large aligned blobs first, small ones packed at the end:
  the least padding, and the size the packer checked is the file's exact size). Files are numbered by the first blob
  of the order given they hold: the first file holds the model's first tensor. Filling the files in the model's order
  instead (the next file as soon as a blob does not fit) made files holding one 4 KiB tensor between two full ones;
* a file's size is the end of its last blob (no trailing padding);
* a zero-length blob sits at the END of its file: its offset is the file's final size, known once every blob is
  placed (:attr:`Placement.offset` reads it then); its file is the one of the blob before it (the first file when
  none is). onnx 1.17's loader reads a zero-length reference as "the rest of the file" (it treats length 0 as no
  length), so only the end of the file gives it zero bytes on every onnx; the offset is never past the end (onnx >=
  1.23's checks), and the blob neither pads nor extends its file nor opens a new one.

With a cap the files are decided once every blob is known: the :class:`Placement` objects :meth:`ShardedLayout.place`
returns and :attr:`ShardedLayout.sizes` are final when first read after the last :meth:`~ShardedLayout.place` (a
later :meth:`~ShardedLayout.place` is a bug, refused). The safetensors layout packs its files with the same
:func:`first_fit_decreasing`, its header counted in each file's size (``safetensors_layout.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from onnx_light_ref.io._read.alignment import align_up

_State = TypeVar("_State")


def first_fit_decreasing(
    lengths: Sequence[int], cap: int, empty: _State, grow: Callable[[_State, int], tuple[_State, int]]
) -> list[list[int]]:
    """Pack blobs into files of at most ``cap`` bytes: the indices of each file's blobs.

    Blobs are taken largest first (equal lengths in index order); each is appended to the first file it fits in,
    else to a new one. ``grow(state, index)`` returns a file's state and size once ``index`` is appended to it
    (``empty``: a new file); a size above ``cap`` does not fit, and a blob that does not fit in a new file gets a file
    of its own that nothing joins. Each file lists its blobs in the order they were appended; files are sorted by the
    smallest index they hold.

    Args:
        lengths: each blob's length in bytes (what the order is decided by).
        cap: the most bytes a file may hold, as ``grow`` counts them.
        empty: the state of a file holding nothing.
        grow: a file's state and size (an upper bound is enough) with one more blob.

    Returns:
        The files, each a list of indices in the order they were appended; every index is in exactly one.

    Example:
        >>> sizes = [3, 1, 4, 1, 4]
        >>> first_fit_decreasing(sizes, 5, 0, lambda used, i: (used + sizes[i], used + sizes[i]))
        [[0], [2, 1], [4, 3]]
    """
    smallest = min(lengths, default=0)
    members: list[list[int]] = []  # per file
    states: list[_State] = []
    room: list[int] = []  # files that may still take a blob, in opening order
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for position, file in enumerate(room):
            state, size = grow(states[file], index)
            if size <= cap:
                members[file].append(index)
                states[file] = state
                if cap - size < smallest:  # no blob is small enough to join it any more
                    del room[position]
                break
        else:
            state, size = grow(empty, index)
            members.append([index])
            states.append(state)
            if size <= cap and cap - size >= smallest:
                room.append(len(members) - 1)
    return sorted(members, key=min)


class Placement:
    """Where one blob lands: file index (0 = the main weights file) and offset in that file.

    A zero-length blob's offset is the final size of its file, and with a cap the file of every blob is decided once
    all are known: read :attr:`shard` and :attr:`offset` after every blob is placed.
    """

    __slots__ = ("_index", "_layout", "_offset", "_shard")

    def __init__(self, shard: int, offset: int, *, layout: ShardedLayout | None = None, index: int = -1) -> None:
        self._shard, self._offset = shard, offset
        self._layout, self._index = layout, index

    @property
    def shard(self) -> int:
        """The file's index (0: the main weights file)."""
        return self._shard if self._layout is None else self._layout.resolved(self._index)[0]

    @property
    def offset(self) -> int:
        """Offset in the file: for a zero-length blob, the end of its file."""
        return self._offset if self._layout is None else self._layout.resolved(self._index)[1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Placement):
            return NotImplemented
        return (self.shard, self.offset) == (other.shard, other.offset)

    # Unhashable: its file and offset are not known until every blob is placed.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Placement(shard={self.shard}, offset={self.offset})"


class ShardedLayout:
    """Places blobs in the order given; ``step`` is an effective alignment (1 = packed), see ``validate_alignment``.

    Args:
        step: the alignment of blobs of at least ``align_threshold`` bytes.
        align_threshold: smaller blobs start at the next free byte.
        max_shard_size: the most bytes a file may hold (None: one file); see the module docstring.
    """

    def __init__(self, step: int, align_threshold: int = 0, max_shard_size: int | None = None) -> None:
        self.step, self.align_threshold, self.max_shard_size = step, align_threshold, max_shard_size
        self._lengths: list[int] = []
        self._where: list[tuple[int, int]] = []  # (file, offset) of each blob laid out; offset -1: at its file's end
        self._sizes: list[int] = []
        self._decided = False  # with a cap: the files were decided (read), no blob may come any more

    def place(self, length: int) -> Placement:
        """The file and offset of the next blob of ``length`` bytes (a zero-length one: its file's end).

        Raises:
            RuntimeError: with a cap, the files were already decided (read) before this blob came.
        """
        return Placement(0, 0, layout=self, index=self.add(length))

    def add(self, length: int) -> int:
        """Lay out the next blob of ``length`` bytes, as :meth:`place` does; return its index for :meth:`columns`
        (no object per blob: 100,000 blobs are placed at once).

        Raises:
            RuntimeError: with a cap, the files were already decided (read) before this blob came.
        """
        index = len(self._lengths)
        self._lengths.append(length)
        if self.max_shard_size is not None:
            if self._decided:
                raise RuntimeError("ShardedLayout.place() after the shards were read: every blob must come first.")
            return index
        sizes = self._sizes
        if not sizes:  # one file, in the order given: known at once
            sizes.append(0)
        if not length:
            self._where.append((0, -1))
            return index
        offset = self._offset(sizes[0], length)
        self._where.append((0, offset))
        sizes[0] = offset + length
        return index

    def columns(self) -> tuple[list[int], list[int]]:
        """The file and the offset of every blob laid out, by index: read once every blob is placed (a zero-length
        blob's offset is the final end of its file)."""
        if self.max_shard_size is not None and not self._decided:
            self._decide()
        sizes = self._sizes
        shards = [shard for shard, _ in self._where]
        offsets = [sizes[shard] if offset < 0 else offset for shard, offset in self._where]
        return shards, offsets

    def resolved(self, index: int) -> tuple[int, int]:
        """The file and offset of blob ``index`` (with a cap: once every blob is known, see the module docstring)."""
        if self.max_shard_size is not None and not self._decided:
            self._decide()
        shard, offset = self._where[index]
        return (shard, self._sizes[shard]) if offset < 0 else (shard, offset)

    @property
    def sizes(self) -> list[int]:
        """The size of every file (``[0]``: one empty file when no blob has bytes; ``[]`` when none was placed)."""
        if self.max_shard_size is not None and not self._decided:
            self._decide()
        return self._sizes

    @property
    def total_size(self) -> int:
        """Bytes of all files together, padding included."""
        return sum(self.sizes)

    def _decide(self) -> None:
        """Pack the blobs placed into files (first fit decreasing) and lay each file out in the order given."""
        assert self.max_shard_size is not None
        self._decided = True
        lengths = self._lengths
        if not lengths:
            return
        nonempty = [i for i, length in enumerate(lengths) if length]
        files = self._pack(nonempty, self.max_shard_size)
        where: list[tuple[int, int]] = [(0, -1)] * len(lengths)
        sizes = [0] * max(len(files), 1)
        for shard, members in enumerate(files):
            cursor = 0
            for index in members:
                offset = self._offset(cursor, lengths[index])
                where[index], cursor = (shard, offset), offset + lengths[index]
            sizes[shard] = cursor
        shard = 0
        for index, length in enumerate(lengths):  # a zero-length blob: the file of the blob before it
            if length:
                shard = where[index][0]
            else:
                where[index] = (shard, -1)
        self._where, self._sizes = where, sizes

    def _offset(self, cursor: int, length: int) -> int:
        return align_up(cursor, self.step) if length >= self.align_threshold else cursor

    def _pack(self, indices: list[int], cap: int) -> list[list[int]]:
        """:func:`first_fit_decreasing` over ``indices``; a file's state is its end, the exact size."""
        lengths = [self._lengths[i] for i in indices]

        def grow(end: int, position: int) -> tuple[int, int]:
            end = self._offset(end, lengths[position]) + lengths[position]
            return end, end

        files = first_fit_decreasing(lengths, cap, 0, grow)
        return [[indices[position] for position in members] for members in files]
