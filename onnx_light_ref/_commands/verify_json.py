"""``verify --json``: what :func:`~onnx_light_ref.io._verify.verify_models` found, as one JSON document.

Builds the document described by ``docs/json.md`` and the shipped schema ``onnx_light_ref/schemas/verify-1.json``:
the verdict, the counts, how tensors were paired, and every difference found as a record (its kind, the tensor of
each model with its readable and structural place, data type and dims, and the two values that differ), plus the
wrong ``checksum`` entries. :mod:`~onnx_light_ref._commands.json_output` writes it.

This module only converts records into plain values: it never reads a file and never prints.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from onnx_light_ref._commands.json_output import SCHEMA_VERSIONS

if TYPE_CHECKING:
    from onnx_light_ref.io._differences import ChecksumMismatch, Difference, TensorRef
    from onnx_light_ref.io._verify import VerifyResult


def verify_status(result: VerifyResult) -> str:
    """``"equal"``, ``"different"`` or ``"checksum_mismatch"`` (equal tensors, a wrong ``checksum`` entry)."""
    if not result.equal:
        return "different"
    return "checksum_mismatch" if result.checksum_mismatches else "equal"


def verify_document(
    result: VerifyResult,
    a_path: str,
    b_path: str,
    *,
    max_differences: int,
    check_checksums: bool,
    chunk_size: int,
) -> dict[str, Any]:
    """The whole ``verify --json`` document.

    Args:
        result: what ``verify_models`` returned.
        a_path: model A as given on the command line (written as an absolute path).
        b_path: model B.
        max_differences: the limit the search ran with (0: none).
        check_checksums: whether ``checksum`` entries were checked.
        chunk_size: bytes read per system call and model.

    Returns:
        The document.
    """
    status = verify_status(result)
    return {
        "schema_version": SCHEMA_VERSIONS["verify"],
        "command": "verify",
        "kind": "comparison",
        "ok": status == "equal",
        "status": status,
        "equal": result.equal,
        "a": {"path": os.path.abspath(a_path), "tensors": result.tensors_a},
        "b": {"path": os.path.abspath(b_path), "tensors": result.tensors_b},
        "pairing": "name" if result.by_name else "position",
        "tensors": result.tensors,
        "bytes_compared": result.bytes_compared,
        "max_differences": max_differences,
        "check_checksums": check_checksums,
        "chunk_size": chunk_size,
        "difference_count": len(result.differences),
        "differences": [_difference_value(difference) for difference in result.differences],
        "checksum_mismatches": [_checksum_value(mismatch) for mismatch in result.checksum_mismatch_details],
    }


def _tensor_value(ref: TensorRef | None) -> dict[str, Any] | None:
    if ref is None:
        return None
    from onnx_light_ref._commands.inspect_json import place_value
    from onnx_light_ref.io._differences import dtype_name
    from onnx_light_ref.io._read.walker import describe_place

    return {
        "model": ref.model,
        "index": ref.index,
        "name": ref.name,
        "label": ref.label,
        "kind": ref.kind,
        "where": ref.where,
        "place": place_value(ref.place),
        "place_text": describe_place(ref.place),
        "data_type": ref.data_type,
        "dtype": dtype_name(ref.data_type),
        "dims": list(ref.dims),
    }


def _difference_value(difference: Difference) -> dict[str, Any]:
    return {
        "kind": difference.kind,
        "message": difference.message,
        "a": _tensor_value(difference.a),
        "b": _tensor_value(difference.b),
        "value_a": difference.value_a,
        "value_b": difference.value_b,
        "offset": difference.offset,
        "length": difference.length,
        "elsewhere": _tensor_value(difference.elsewhere),
    }


def _checksum_value(mismatch: ChecksumMismatch) -> dict[str, Any]:
    return {
        "model": mismatch.tensor.model,
        "tensor": _tensor_value(mismatch.tensor),
        "checksum": mismatch.checksum,
        "location": mismatch.location,
        "length": mismatch.length,
        "message": mismatch.message,
    }
