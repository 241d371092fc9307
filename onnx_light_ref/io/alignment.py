"""Alignment arithmetic shared by every writer: validate a requested alignment and round offsets up to it."""

from __future__ import annotations

__all__ = ["align_up", "offset_alignment", "validate_alignment"]


class _AlignmentTypeError(TypeError, ValueError):
    """A non-int alignment: a ``TypeError`` by Python convention, and the ``ValueError`` the public API documents
    for every invalid alignment (so ``except ValueError`` and the CLI's error handling catch it too)."""


def validate_alignment(alignment: int, name: str = "alignment") -> int:
    """Return the effective alignment (1 for packed), or raise ``ValueError``.

    0 and 1 both mean "packed" (no padding), as in onnx-light's ``SerializeOptions``; any other value must be a
    positive power of two so that aligned offsets stay aligned for every smaller power of two a loader may want.
    """
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise _AlignmentTypeError(f"{name} must be an int, got {type(alignment).__name__}.")
    if alignment < 0:
        raise ValueError(f"{name} must be >= 0 (0 or 1 = packed, else a power of two), got {alignment}.")
    if alignment in (0, 1):
        return 1
    if alignment & (alignment - 1):
        raise ValueError(f"{name} must be a power of two (or 0/1 for packed), got {alignment}.")
    return alignment


def align_up(offset: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` (a power of two, or 1) that is >= ``offset``."""
    return (offset + alignment - 1) & ~(alignment - 1)


def offset_alignment(offset: int) -> int:
    """Largest power of two that divides ``offset``; 0 for offset 0 (which satisfies every alignment)."""
    return offset & -offset
