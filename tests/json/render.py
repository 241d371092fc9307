"""The text output of ``inspect`` and ``verify``, rebuilt from their JSON documents alone.

If the text rebuilt from a document equals what the command prints in text mode, the document carries every fact
the text shows. Only pure formatting helpers of the package are used (:func:`printable`, :func:`format_alignment`);
every value comes from the document.
"""

from __future__ import annotations

import os
from typing import Any

from onnx_light_ref._commands.inspect import format_alignment
from onnx_light_ref._commands.text import printable
from onnx_light_ref._commands.verify import _BY_NAME_HINT, _BY_POSITION_NAME_MISMATCH

__all__ = ["display", "inspect_text", "path_text", "verify_text"]

_WIDTH = 40


def display(value: str | dict[str, str]) -> str:
    """Model text as the text output shows it: the string, or the backslash-escaped form of its bytes."""
    return value if isinstance(value, str) else value["display"]


def path_text(value: str | dict[str, str]) -> str:
    """A file path as Python holds it: the string, or its bytes decoded as the filesystem encoding does."""
    return value if isinstance(value, str) else os.fsdecode(bytes.fromhex(value["hex"]))


def _shorten(text: str) -> str:
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


def _cell(value: int | None) -> str:
    return "?" if value is None else str(value)


def _place(label: str, location: str | dict[str, str], entry: dict[str, Any]) -> tuple[str, ...]:
    return (
        _shorten(printable(label)),
        _shorten(printable(display(location))),
        _cell(entry["offset"]),
        _cell(entry["length"]),
    )


def _tail(entry: dict[str, Any]) -> tuple[str, str]:
    shared = f"shared ({len(entry['shared_with']) + 1})"
    return format_alignment(entry["alignment"]), shared if entry["status"] == "shared" else entry["status"]


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]], right: tuple[int, ...]) -> list[str]:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in (header, *rows)
    ]


def inspect_text(document: dict[str, Any]) -> str:
    """What ``inspect`` prints for the model or folder ``document`` describes."""
    if document["kind"] == "folder":
        return _folder_text(document)
    return _report_text(document)


def _report_text(report: dict[str, Any]) -> str:
    lines = [f"model: {printable(path_text(report['model']))}"]
    lines += [f"note: {printable(path_text(note))}" for note in report["notes"]]
    tensors, delayed = report["tensors"], report["delayed"]
    if not tensors and not delayed:
        inline = report["inline_tensors"]
        return "\n".join([*lines, f"no external tensors and no DelayedInitializer node ({inline} inline)."]) + "\n"
    if tensors:
        header = ("name", "location", "offset", "length", "align", "status")
        lines += _columns(header, [(*_place(t["label"], t["location"], t), *_tail(t)) for t in tensors], (2, 3, 4))
    if delayed:
        lines += [""] if tensors else []
        lines.append(f"read by {len(delayed)} DelayedInitializer node(s):")
        header = ("name", "filename", "offset", "length", "dtype", "shape", "align", "status")
        rows = [
            (
                *_place(d["label"], d["filename"] or "", d),
                d["dtype"] or "?",
                "?" if d["shape"] is None else str(d["shape"]),
                *_tail(d),
            )
            for d in delayed
        ]
        lines += _columns(header, rows, (2, 3, 6))
    errors = [t for t in [*tensors, *delayed] if t["error"]]
    assert len(errors) == report["error_count"]
    if errors:
        lines += ["", f"{len(errors)} error(s):"]
        lines += [
            f"  {t['status']}: {printable(path_text(t['message']))}"
            + ("" if path_text(t["message"]).startswith(t["where"]) else f" (in {printable(t['where'])})")
            for t in errors
        ]
    refused = [t for t in tensors if t["refusals"] and t["status"] != "loader refuses"]
    if refused:
        lines += ["", "loaders:"]
        lines += [
            f"  tensor {printable(t['label'])!r}: {printable(path_text(r['text']))}"
            for t in refused
            for r in t["refusals"]
        ]
    lines += ["", "files:"]
    for file in report["files"]:
        location = printable(display(file["location"]))
        if file["missing"]:
            lines.append(f"  {location}: MISSING ({file['tensors']} tensors refer to it)")
            continue
        gaps = len(file["gaps"])
        lines.append(
            f"  {location}: {file['tensors']} tensors, {file['bytes_used']} bytes used of {file['size']}, "
            f"{file['gap_bytes']} gap bytes in {gaps} gap{'s' if gaps != 1 else ''}"
        )
        safetensors = file["safetensors"]
        if safetensors is not None:
            warning = "" if safetensors["ok"] else "REFUSED by the safetensors library: "
            lines.append(f"    {warning}{printable(path_text(safetensors['summary']))}")
    common = report["common_alignment"]
    shown = format_alignment(common) if common != 0 else "any power of two (all offsets are 0)"
    lines += [
        "",
        f"{report['external_tensors']} external tensors"
        + (f", {report['delayed_nodes']} read by DelayedInitializer nodes" if delayed else "")
        + f", {report['inline_tensors']} inline; every offset is aligned to {shown}"
        + (f" ({common} bytes)" if common and format_alignment(common) != str(common) else ""),
        "status: OK" if report["ok"] else f"status: {len(errors)} error(s)",
    ]
    return "\n".join(lines) + "\n"


def _folder_text(document: dict[str, Any]) -> str:
    lines = [f"folder: {printable(path_text(document['folder']))}"]
    for model in document["models"]:
        name = printable(path_text(model["file"]))
        if model["report"] is None:
            lines.append(f"  {name}: not readable: {printable(path_text(model['error']['message']))}")
        else:
            count = model["report"]["error_count"]
            lines.append(f"  {name}: {'OK' if model['ok'] else f'{count} error(s)'}")
    lines += ["", "files:"]
    for file in document["files"]:
        users = ", ".join(
            printable(path_text(user["model"]))
            + (" (DelayedInitializer)" if user["via"] == "delayed_initializer" else "")
            for user in file["users"]
        )
        note = f" (shared by {len(file['users'])} models)" if file["shared"] else ""
        lines.append(f"  {printable(path_text(file['path']))}: used by {users}{note}")
    lines.append("status: OK" if document["ok"] else "status: error(s), see each model with 'inspect MODEL.onnx'")
    return "\n".join(lines) + "\n"


def verify_text(document: dict[str, Any]) -> str:
    """What ``verify`` prints on stdout for the comparison (or checkpoint) ``document`` describes."""
    if document["kind"] == "checkpoint":
        return _checkpoint_text(document)
    lines = [f"checksum mismatch: {printable(path_text(m['message']))}" for m in document["checksum_mismatches"]]
    if not document["equal"]:
        lines += [f"different: {printable(path_text(d['message']))}" for d in document["differences"]]
        first = path_text(document["differences"][0]["message"]) if document["differences"] else ""
        if document["pairing"] == "position" and _BY_POSITION_NAME_MISMATCH in first:
            lines.append(_BY_NAME_HINT)  # presentation only: the facts (pairing, the name difference) are in the JSON
    else:
        lines.append(f"equal: {document['tensors']} tensors, {document['bytes_compared']} bytes compared")
    return "\n".join(lines) + "\n"


def _checkpoint_text(document: dict[str, Any]) -> str:
    """What ``verify MODEL CHECKPOINT`` prints for ``document``."""
    lines = [
        f"different: model tensor {display(p['name'])!r} and checkpoint key {display(p['key'])!r} have the same name, "
        "data type and shape but other bytes"
        for p in document["differing"]
    ]
    lines += [
        f"missing: checkpoint key {display(k)!r}: no model tensor holds its values" for k in document["missing_keys"]
    ]
    lines += [f"extra: model weight {display(n)!r} is not in the checkpoint" for n in document["extra_weights"]]
    keys = document["checkpoint"]["keys"]
    if document["ok"]:
        words = {"name": "by name", "map": "through the map", "content": "by content", "transpose": "as transposes"}
        counts = {how: sum(p["how"] == how for p in document["pairings"]) for how in words}
        how = ", ".join(f"{count} {words[kind]}" for kind, count in counts.items() if count)
        lines.append(f"holds: the model holds all {keys} checkpoint tensors ({how})")
    else:
        lacking = len(document["missing_keys"]) + len(document["differing"])
        lines.append(f"incomplete: the model lacks {lacking} of the {keys} checkpoint tensors")
    return "\n".join(printable(line) for line in lines) + "\n"
