"""Where each blob of bytes goes in the destination weights files: alignment, align threshold and size-capped shards.

:class:`ShardedLayout` is pure arithmetic, fed one blob length at a time in destination order; it never touches a
file. Rules (issue 11, and ``spec/002`` for the shard names):

* a blob of at least ``align_threshold`` bytes starts at a multiple of ``alignment``; a smaller one starts at the
  next free byte (``align_threshold=0`` aligns every blob, the historical behaviour);
* with ``max_shard_size``, a blob is never split: when it does not fit in the current file it starts the next file
  at offset 0; a blob larger than the cap gets a file of its own; so every file is at most ``max_shard_size`` bytes
  unless it holds a single blob larger than the cap;
* a file's size is the end of its last blob (no trailing padding). A zero-length blob still gets an offset inside
  its file (the file is extended to it if needed) so no entry ever points past the end of a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnx_light_ref.io.alignment import align_up

__all__ = ["Placement", "ShardedLayout", "shard_path"]


def shard_path(base_path: str, index: int) -> str:
    """Path of shard ``index``: the base path for 0, then ``<base>.1``, ``<base>.2``, ... (onnx-light's naming)."""
    return base_path if index == 0 else f"{base_path}.{index}"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one blob lands: file index (0 = the main weights file) and offset in that file."""

    shard: int
    offset: int


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
        """Choose the file and offset of the next blob of ``length`` bytes."""
        if not self.sizes:
            self.sizes.append(0)
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
