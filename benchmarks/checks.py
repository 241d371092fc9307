"""What the comparison tests check once the children ran: expected output sizes, and contenders that are missing.

The suite never asserts on time or memory (``python -m benchmarks.report`` checks the targets); the tests only make
sure every contender did its job. A contender whose API has not landed yet reports itself unavailable (see
:mod:`benchmarks.child`); :func:`require` then skips the test with that reason instead of failing on a missing key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

__all__ = ["ALIGNMENT", "DEFAULT_CHUNK", "aligned_size", "require"]

ALIGNMENT = 4096
DEFAULT_CHUNK = 4 * 1024 * 1024  # the public default chunk_size of align_external_data_streaming and verify_models


def aligned_size(count: int, tensor_bytes: int, alignment: int = ALIGNMENT) -> int:
    """Bytes of one weights file holding ``count`` tensors of ``tensor_bytes``, each at an ``alignment`` multiple
    (no trailing padding after the last one)."""
    if count == 0:
        return 0
    step = -(-tensor_bytes // alignment) * alignment
    return step * (count - 1) + tensor_bytes


def require(summary: dict[str, dict[str, Any]], labels: Iterable[str], skipped: dict[str, str] | None = None) -> None:
    """Skip the calling test unless every method in ``labels`` produced a result (it was unavailable otherwise)."""
    missing = [label for label in labels if label not in summary]
    if missing:
        reasons = "; ".join(f"{label}: {(skipped or {}).get(label, 'no result')}" for label in missing)
        pytest.skip(f"contenders not available yet: {reasons}")
