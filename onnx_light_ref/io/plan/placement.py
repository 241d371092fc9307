"""Where each blob of bytes goes in the destination weights files: alignment, align threshold and size-capped shards.

:class:`ShardedLayout` is pure arithmetic, fed one blob length at a time in destination order; it never touches a
file. Rules (issue 11, and ``spec/002`` for the shard names):

* a blob of at least ``align_threshold`` bytes starts at a multiple of ``alignment``; a smaller one starts at the
  next free byte (``align_threshold=0`` aligns every blob, the historical behaviour);
* with ``max_shard_size``, a blob is never split: when it does not fit in the current file it starts the next file
  at offset 0; a blob larger than the cap gets a file of its own; so every file is at most ``max_shard_size`` bytes
  unless it holds a single blob larger than the cap;
* a file's size is the end of its last blob (no trailing padding);
* a zero-length blob sits at the END of its file: its offset is the file's final size, known once every blob is
  placed (:attr:`Placement.offset` reads it then). onnx 1.17's loader reads a zero-length reference as "the rest of
  the file" (it treats length 0 as no length), so only the end of the file gives it zero bytes on every onnx; the
  offset is never past the end (onnx >= 1.23's checks), and the blob neither pads nor extends its file nor opens a
  new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnx_light_ref.io.plan.alignment import align_up

__all__ = ["Placement", "ShardedLayout", "shard_path"]


def shard_path(base_path: str, index: int) -> str:
    """Path of shard ``index``: the base path for 0, then ``<base>.1``, ``<base>.2``, ... (onnx-light's naming)."""
    return base_path if index == 0 else f"{base_path}.{index}"


class Placement:
    """Where one blob lands: file index (0 = the main weights file) and offset in that file.

    A zero-length blob's offset is the final size of its file (``at_end_of`` is the layout's live list of file
    sizes): read :attr:`offset` after every blob is placed.
    """

    __slots__ = ("_offset", "_sizes", "shard")

    def __init__(self, shard: int, offset: int, *, at_end_of: list[int] | None = None) -> None:
        self.shard = shard
        self._offset = offset
        self._sizes = at_end_of

    @property
    def offset(self) -> int:
        """Offset in the file: for a zero-length blob, the end of its file as placed so far (final once done)."""
        return self._offset if self._sizes is None else self._sizes[self.shard]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Placement):
            return NotImplemented
        return (self.shard, self.offset) == (other.shard, other.offset)

    # Unhashable: a zero-length blob's offset moves with its file's end until every blob is placed.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Placement(shard={self.shard}, offset={self.offset}{', at end' if self._sizes is not None else ''})"


@dataclass
class ShardedLayout:
    """Places blobs one after the other; ``step`` is an effective alignment (1 = packed), see ``validate_alignment``."""

    step: int
    align_threshold: int = 0
    max_shard_size: int | None = None
    sizes: list[int] = field(default_factory=list)  # size of every file opened so far
    _cursor: int = 0  # next free byte of the current file
    _blobs: int = 0  # blobs in the current file
    _full: bool = False  # the current file holds one oversized blob: nothing else goes there

    def place(self, length: int) -> Placement:
        """Choose the file and offset of the next blob of ``length`` bytes (a zero-length one: its file's end)."""
        if not self.sizes:
            self.sizes.append(0)
        if length == 0:
            return Placement(len(self.sizes) - 1, 0, at_end_of=self.sizes)
        offset = self._offset_in_current(length)
        cap = self.max_shard_size
        if cap is not None and self._blobs > 0 and (self._full or length > cap or offset + length > cap):
            self.sizes.append(0)
            self._cursor = self._blobs = 0
            offset = 0
        self._full = cap is not None and length > cap
        self._cursor = offset + length
        self._blobs += 1
        shard = len(self.sizes) - 1
        self.sizes[shard] = max(self.sizes[shard], self._cursor)
        return Placement(shard, offset)

    def _offset_in_current(self, length: int) -> int:
        if length >= self.align_threshold:
            return align_up(self._cursor, self.step)
        return self._cursor

    @property
    def total_size(self) -> int:
        """Bytes of all files together, padding included."""
        return sum(self.sizes)
