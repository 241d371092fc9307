"""``onnx-light-ref inspect MODEL.onnx``: print how the external tensors sit in their files, and what is wrong.

A thin presentation of :func:`onnx_light_ref.io.layout_report.build_layout_report`: one row per external tensor
(name, location, offset, length, alignment of the offset, status), the problems in words, totals per data file
(tensors, bytes used, file size, gaps) and the largest alignment every tensor satisfies. Exit status 1 when any
tensor is in error (partial overlap, out of bounds, missing file, unsafe location, hard-linked file, malformed
entry, a reference ``onnx.load``, ``check_model(full_check=True)`` or onnxruntime refuses: which loader refuses
what is printed per tensor), 0 otherwise: ``status: OK`` means the three loaders accept the model's external data.
The table is printed either way. ``inspect FOLDER`` prints each model's status and which models use which data
files (a file used by several models is shared: see ``replace_shared``). Never reads weight bytes.

Names and locations come from the model, which may be hostile: every printed field goes through
:func:`~onnx_light_ref.commands.text.printable`, so a terminal escape sequence or a bidirectional override in a tensor
name is shown escaped, never executed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from onnx_light_ref.commands.errors import describe_error, error_exit
from onnx_light_ref.commands.text import printable

if TYPE_CHECKING:  # the library (and onnx) is imported when the command runs, not when the CLI starts
    from onnx_light_ref.io.layout_report import LayoutReport, TensorLayout

__all__ = ["format_alignment", "format_folder", "format_report", "inspect_command", "register"]

# Alignments above this are shown as ">=1M": no loader asks for more, and a huge power of two (an offset of 2 GiB
# is 2 GiB-aligned) says nothing useful.
_ALIGNMENT_DISPLAY_CAP = 1024 * 1024

_NAME_WIDTH_CAP = 40


def format_alignment(alignment: int | None) -> str:
    """``4096`` -> ``"4K"``; 0 (offset 0) -> ``"any"``; above 1 MiB -> ``">=1M"``; unknown -> ``"?"``."""
    if alignment is None:
        return "?"
    if alignment == 0:
        return "any"
    if alignment > _ALIGNMENT_DISPLAY_CAP:
        return ">=1M"
    for unit, size in (("M", 1024 * 1024), ("K", 1024)):
        if alignment >= size:
            return f"{alignment // size}{unit}"
    return str(alignment)


def _cell(value: object) -> str:
    return "?" if value is None else printable(str(value))


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _status(tensor: TensorLayout) -> str:
    if tensor.status == "shared":
        return f"shared ({len(tensor.shared_range)})"
    return tensor.status


def format_report(report: LayoutReport) -> str:
    """The text ``inspect`` prints: the table, the errors, the files and the totals; every field escaped.

    Args:
        report: what :func:`~onnx_light_ref.io.layout_report.build_layout_report` found.

    Returns:
        The whole text, newline-terminated.
    """
    lines = [f"model: {printable(report.model_path)}"]
    lines.extend(f"note: {printable(note)}" for note in report.notes)
    if not report.tensors:
        lines.append(f"no external tensors ({report.inline_tensors} inline).")
        return "\n".join(lines) + "\n"
    header = ("name", "location", "offset", "length", "align", "status")
    rows = [
        (
            _shorten(printable(t.name), _NAME_WIDTH_CAP),
            _shorten(printable(t.location), _NAME_WIDTH_CAP),
            _cell(t.offset),
            _cell(t.length),
            format_alignment(t.alignment),
            _status(t),
        )
        for t in report.tensors
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    right = {2, 3, 4}
    for row in (header, *rows):
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    errors = report.errors
    if errors:
        lines.append("")
        lines.append(f"{len(errors)} error(s):")
        lines.extend(f"  {t.status}: {printable(t.message)} (in {printable(t.where)})" for t in errors)
    refused = [t for t in report.tensors if t.refusals and t.status != "loader refuses"]
    if refused:  # tensors in error for another reason may be refused by some loaders only: say which
        lines.append("")
        lines.append("loaders:")
        for tensor in refused:
            lines.extend(f"  tensor {printable(tensor.name)!r}: {printable(r.describe())}" for r in tensor.refusals)
    lines.append("")
    lines.append("files:")
    for file in report.files:
        if file.size is None:
            lines.append(f"  {printable(file.location)}: MISSING ({file.tensors} tensors refer to it)")
            continue
        gap_count = len(file.gaps)
        lines.append(
            f"  {printable(file.location)}: {file.tensors} tensors, {file.bytes_used} bytes used of {file.size}, "
            f"{file.gap_bytes} gap bytes in {gap_count} gap{'s' if gap_count != 1 else ''}"
        )
        if file.safetensors is not None:
            lines.append(f"    {'' if file.safetensors_ok else 'WARNING: '}{printable(file.safetensors)}")
    lines.append("")
    common = report.common_alignment
    lines.append(
        f"{len(report.tensors)} external tensors, {report.inline_tensors} inline; every offset is aligned to "
        f"{format_alignment(common) if common != 0 else 'any power of two (all offsets are 0)'}"
        + (f" ({common} bytes)" if common and format_alignment(common) != str(common) else "")
    )
    lines.append("status: OK" if report.ok else f"status: {len(errors)} error(s)")
    return "\n".join(lines) + "\n"


def format_folder(folder: str, *, allow_outside_folder: bool = False) -> tuple[str, bool]:
    """What ``inspect FOLDER`` prints: each model's status, then which models use which data files.

    Args:
        folder: a folder holding ``.onnx`` files.
        allow_outside_folder: as for :func:`~onnx_light_ref.io.layout_report.build_layout_report`.

    Returns:
        The text (newline-terminated) and whether every model is OK.
    """
    from onnx_light_ref.io.layout_report import build_layout_report
    from onnx_light_ref.io.read.sharing import folder_sharing

    lines = [f"folder: {printable(folder)}"]
    names = sorted(name for name in os.listdir(folder) if name.endswith(".onnx"))
    ok = True
    for name in names:
        try:
            report = build_layout_report(os.path.join(folder, name), allow_outside_folder=allow_outside_folder)
        except (ValueError, OSError) as exc:  # InvalidModelError, ExternalDataError (a folder that cannot be held)
            lines.append(f"  {printable(name)}: not readable: {printable(describe_error(exc))}")
            ok = False
            continue
        ok = ok and report.ok
        lines.append(f"  {printable(name)}: {'OK' if report.ok else f'{len(report.errors)} error(s)'}")
    lines.append("")
    lines.append("files:")
    for shared in folder_sharing(folder):
        users = ", ".join(printable(os.path.basename(user.model)) for user in shared.users)
        relative = os.path.relpath(shared.path, folder)
        note = f" (shared by {len(shared.users)} models)" if len(shared.users) > 1 else ""
        lines.append(f"  {printable(relative)}: used by {users}{note}")
    lines.append("status: OK" if ok else "status: error(s), see each model with 'inspect MODEL.onnx'")
    return "\n".join(lines) + "\n", ok


def inspect_command(args: argparse.Namespace) -> int:
    """Print the layout report of ``args.model`` (or, for a folder, each model's status and which models share
    which files); exit status 1 when a tensor is in error or the model is unreadable.

    Args:
        args: the parsed command line (``model``).

    Returns:
        The process exit status.
    """
    from onnx_light_ref.io.layout_report import build_layout_report

    if os.path.isdir(args.model):
        if not any(name.endswith(".onnx") for name in os.listdir(args.model)):
            return error_exit(
                f"{printable(args.model)!r} is a directory with no .onnx file; give a model, or a folder of models"
            )
        text, ok = format_folder(args.model, allow_outside_folder=args.allow_outside_folder)
        sys.stdout.write(text)
        return 0 if ok else 1
    try:
        report = build_layout_report(args.model, allow_outside_folder=args.allow_outside_folder)
    except (ValueError, OSError) as exc:  # InvalidModelError, ExternalDataError: e.g. MODEL.onnx's folder is a file
        return error_exit(exc)  # escaped there
    sys.stdout.write(format_report(report))
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``inspect`` sub-command to ``subparsers``."""
    parser = subparsers.add_parser(
        "inspect",
        help="show the layout of a model's external tensors (offsets, alignment, gaps, overlaps, errors)",
        description="Print one row per external tensor, the problems found, totals per data file and the largest "
        "alignment every tensor satisfies. Exit status 1 if any reference is broken. Reads no weight bytes.",
    )
    parser.add_argument(
        "model",
        metavar="MODEL.onnx",
        help="model whose external tensors are shown, or a folder: each model's status and which models share which "
        "files",
    )
    parser.add_argument(
        "--allow-outside-folder",
        action="store_true",
        help="trust the model's data layout: follow symbolic links in data paths, e.g. the Hugging Face cache "
        "(snapshots/<rev>/model.onnx.data -> ../../blobs/<sha>); refused by default, as onnx's loader refuses them",
    )
    parser.set_defaults(func=inspect_command)
