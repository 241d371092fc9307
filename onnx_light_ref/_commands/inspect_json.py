"""``inspect --json``: the layout report of a model, or the report of a folder, as one JSON document.

Builds the document described by ``docs/json.md`` and the shipped schema ``onnx_light_ref/schemas/inspect-2.json``
from what :func:`~onnx_light_ref.io._layout_report.build_layout_report` found: every fact the text output shows (per
tensor, per file, the verdict) and the ones the text leaves out for width (data type, dims, structural place, every
gap, every overlap, the safetensors header's numbers). :mod:`~onnx_light_ref._commands.json_output` writes it.

This module only converts records into plain values: it never reads a file and never prints.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from onnx_light_ref._commands.json_output import SCHEMA_VERSIONS
from onnx_light_ref.io._read.loader_rule import LOADERS, Refusal

if TYPE_CHECKING:
    from onnx_light_ref._commands.inspect import FolderReport
    from onnx_light_ref.io._layout_report import DelayedLayout, FileLayout, LayoutReport, TensorLayout
    from onnx_light_ref.io._read.safetensors_header import SafetensorsHeader
    from onnx_light_ref.io._read.walker import SitePlace


def model_document(report: LayoutReport) -> dict[str, Any]:
    """The whole ``inspect --json MODEL.onnx`` document."""
    return {"schema_version": SCHEMA_VERSIONS["inspect"], "command": "inspect", "kind": "model", **report_value(report)}


def report_value(report: LayoutReport) -> dict[str, Any]:
    """One model's report: the verdict, every external tensor, every data file, the totals."""
    errors = report.errors
    return {
        "model": report.model_path,
        "ok": report.ok,
        "status": "ok" if report.ok else "error",
        "error_count": len(errors),
        "external_tensors": len(report.tensors),
        "delayed_nodes": len(report.delayed),
        "inline_tensors": report.inline_tensors,
        "common_alignment": report.common_alignment,
        "tensors": [_tensor_value(tensor) for tensor in report.tensors],
        "delayed": [_delayed_value(read) for read in report.delayed],
        "files": [_file_value(file) for file in report.files],
        "notes": list(report.notes),
    }


def place_value(place: SitePlace) -> list[list[Any]]:
    """A structural place (:data:`~onnx_light_ref.io._read.walker.SitePlace`) as a list of steps, each a list."""
    return [list(step) if isinstance(step, tuple) else [step] for step in place]


def _tensor_value(tensor: TensorLayout) -> dict[str, Any]:
    from onnx_light_ref.io._differences import dtype_name
    from onnx_light_ref.io._read.walker import describe_place

    return {
        "index": tensor.index,
        "name": tensor.raw_name,
        "label": tensor.name,
        "kind": tensor.kind,
        "where": tensor.where,
        "place": place_value(tensor.place),
        "place_text": describe_place(tensor.place),
        "data_type": tensor.data_type,
        "dtype": dtype_name(tensor.data_type),
        "dims": list(tensor.dims),
        "location": tensor.raw_location,
        "offset": tensor.offset,
        "length": tensor.length,
        "alignment": tensor.alignment,
        "status": tensor.status,
        "error": tensor.is_error,
        "message": tensor.message,
        "shared_with": tensor.shared_with,
        "refusals": [_refusal_value(refusal) for refusal in tensor.refusals],
    }


def _delayed_value(read: DelayedLayout) -> dict[str, Any]:
    from onnx_light_ref.io._differences import dtype_name

    known = read.data_type != 0  # 0 (UNDEFINED): the node's attributes could not be read
    return {
        "index": read.index,
        "node": read.node,
        "output": read.raw_name,
        "label": read.name,
        "where": read.where,
        "filename": read.raw_location if read.offset is not None else None,
        "path": read.path,
        "offset": read.offset,
        "length": read.length,
        "alignment": read.alignment,
        "data_type": read.data_type if known else None,
        "dtype": dtype_name(read.data_type) if known else None,
        "shape": list(read.dims) if known else None,
        "load_device": read.load_device,
        "status": read.status,
        "error": read.is_error,
        "message": read.message,
        "shared_with": read.shared_with,
    }


def _refusal_value(refusal: Refusal) -> dict[str, Any]:
    return {
        "loaders": list(refusal.loaders),
        "accepting": [loader for loader in LOADERS if loader not in refusal.loaders],
        "reason": refusal.reason,
        "symlink": refusal.symlink,
        "text": refusal.describe(),
    }


def _file_value(file: FileLayout) -> dict[str, Any]:
    missing = file.size is None
    return {
        "location": file.location,
        "path": file.path,
        "missing": missing,
        "size": file.size,
        "tensors": file.tensors,
        "bytes_used": None if missing else file.bytes_used,
        "coverage": None if missing or not file.size else round(file.bytes_used / file.size, 6),
        "gap_bytes": None if missing else file.gap_bytes,
        "gaps": [{"offset": gap.offset, "length": gap.length} for gap in file.gaps],
        "overlaps": [
            {
                "tensor": overlap.tensor,
                "offset": overlap.offset,
                "length": overlap.length,
                "partner": {"offset": overlap.partner.offset, "length": overlap.partner.length},
                "ranges": overlap.ranges,
            }
            for overlap in file.overlaps
        ],
        "safetensors": None if file.safetensors is None else _safetensors_value(file),
    }


def _safetensors_value(file: FileLayout) -> dict[str, Any]:
    header: SafetensorsHeader | None = file.safetensors_header
    value: dict[str, Any] = {"ok": file.safetensors_ok, "valid": header is not None, "summary": file.safetensors}
    if header is None:
        return {**value, "data_start": None, "data_size": None, "tensors": None, "metadata": None, "holes": []}
    return {
        **value,
        "data_start": header.data_start,
        "data_size": header.data_size,
        "tensors": len(header.entries),
        "metadata": dict(header.metadata),
        "holes": [{"offset": header.data_start + begin, "length": end - begin} for begin, end in header.holes],
    }


def _error_value(error: BaseException) -> dict[str, str]:
    return {"type": type(error).__name__, "message": str(error)}


def folder_document(folder: FolderReport) -> dict[str, Any]:
    """The whole ``inspect --json FOLDER`` document: each model's report (or why it is unreadable) and who uses
    which data file."""
    return {
        "schema_version": SCHEMA_VERSIONS["inspect"],
        "command": "inspect",
        "kind": "folder",
        "folder": folder.folder,
        "ok": folder.ok,
        "status": "ok" if folder.ok else "error",
        "models": [
            {
                "file": model.name,
                "ok": model.ok,
                "status": model.status,
                "error": None if model.error is None else _error_value(model.error),
                "report": None if model.report is None else report_value(model.report),
            }
            for model in folder.models
        ],
        "files": [
            {
                "path": os.path.relpath(shared.path, folder.folder),
                "shared": len(shared.users) > 1,
                "users": [
                    {
                        "model": os.path.basename(user.model),
                        "tensor": user.tensor,
                        "location": user.location,
                        "tensors": user.tensors,
                        "via": user.via,
                    }
                    for user in shared.users
                ],
            }
            for shared in folder.files
        ],
    }
