"""What tests compare of a :class:`~onnx_light_ref.io._verify.VerifyResult`: the facts a sentence-level test states.

A result also carries every difference as a record and the tensor counts of both models; tests that state the
verdict, the counts compared and the sentences compare :func:`summary` of the result with that of the expected one.
"""

from __future__ import annotations

from pathlib import Path

from onnx_light_ref.io._verify import VerifyResult

__all__ = ["summary"]


def summary(result: VerifyResult) -> tuple[bool, int, int, str | None, tuple[str, ...]]:
    """``(equal, tensors, bytes_compared, first_difference, checksum_mismatches)`` of ``result``."""
    return result.equal, result.tensors, result.bytes_compared, result.first_difference, result.checksum_mismatches


def flip_byte(path: Path, offset: int) -> None:
    """Flip the lowest bit of the byte at ``offset`` of ``path``, in place."""
    with open(path, "r+b") as data_file:
        data_file.seek(offset)
        byte = data_file.read(1)
        data_file.seek(offset)
        data_file.write(bytes([byte[0] ^ 0x01]))
