"""What tests compare of a :class:`~onnx_light_ref.io._verify.VerifyResult`: the facts a sentence-level test states.

A result also carries every difference as a record and the tensor counts of both models; tests that state the
verdict, the counts compared and the sentences compare :func:`summary` of the result with that of the expected one.
"""

from __future__ import annotations

from onnx_light_ref.io._verify import VerifyResult

__all__ = ["summary"]


def summary(result: VerifyResult) -> tuple[bool, int, int, str | None, tuple[str, ...]]:
    """``(equal, tensors, bytes_compared, first_difference, checksum_mismatches)`` of ``result``."""
    return result.equal, result.tensors, result.bytes_compared, result.first_difference, result.checksum_mismatches
