"""Alignment arithmetic shared by every writer: validate a requested alignment and round offsets up to it.

Pure integer arithmetic: this module never touches a file.
"""

from __future__ import annotations

from onnx_light_ref.io._arguments import ArgumentTypeError

MAX_ALIGNMENT = 1 << 30
"""Largest alignment accepted (1 GiB).

Why 1 GiB: it is the largest page size of the platforms we run on (x86-64 and arm64 1 GiB huge pages), so no mmap
or direct-I/O reader can ask for more; it is far above what loaders actually use (4 KiB pages, 64 KiB Windows
allocation granularity, 2 MiB huge pages; onnx caps padding at 64 KiB when it re-saves). Each tensor can cost up to
``alignment - 1`` bytes of padding, so an unbounded value turned three tiny tensors into a 1 TiB sparse file (2**40),
and offsets past int64 (2**62 and up) overflowed. Every offset this cap allows stays far inside int64."""


def validate_alignment(alignment: int, name: str = "alignment") -> int:
    """Return the effective alignment (1 for packed), or raise.

    0 and 1 both mean "packed" (no padding), as in onnx-light's ``SerializeOptions``; any other value must be a
    power of two (so that aligned offsets stay aligned for every smaller power of two a loader may want) and at most
    :data:`MAX_ALIGNMENT`.

    Args:
        alignment: the requested alignment in bytes.
        name: the parameter's name, for messages.

    Returns:
        The alignment to round offsets up to: 1 for 0 or 1, else ``alignment``.

    Raises:
        ArgumentTypeError: ``alignment`` is not an int (or is a bool); also a ``ValueError``.
        ValueError: negative, not a power of two, or above :data:`MAX_ALIGNMENT`.
    """
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(alignment).__name__}.")
    if alignment < 0:
        raise ValueError(f"{name} must be >= 0 (0 or 1 = packed, else a power of two), got {alignment}.")
    if alignment in (0, 1):
        return 1
    if alignment & (alignment - 1):
        raise ValueError(f"{name} must be a power of two (or 0/1 for packed), got {alignment}.")
    if alignment > MAX_ALIGNMENT:
        raise ValueError(
            f"{name} must be at most {MAX_ALIGNMENT} (1 GiB, the largest page size a loader can map), got {alignment}."
        )
    return alignment


def align_up(offset: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` (a power of two, or 1) that is >= ``offset``."""
    return (offset + alignment - 1) & ~(alignment - 1)


def offset_alignment(offset: int) -> int:
    """Largest power of two that divides ``offset``; 0 for offset 0 (which satisfies every alignment)."""
    return offset & -offset
