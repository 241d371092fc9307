"""``onnx-light-ref inspect MODEL.onnx``: print how the external tensors sit in their files, and what is wrong.

A thin presentation of :func:`onnx_light_ref.io._layout_report.build_layout_report`: one row per external tensor
(name, location, offset, length, alignment of the offset, status), the problems in words, totals per data file
(tensors, bytes used, file size, gaps) and the largest alignment every tensor satisfies. Exit status 1 when any
tensor is in error (partial overlap, out of bounds, missing file, unsafe location, hard-linked file, malformed
entry, a reference ``onnx.load``, ``check_model(full_check=True)`` or onnxruntime refuses: which loader refuses
what is printed per tensor; a ``*.safetensors`` data file the safetensors library refuses, a reference that overlaps
its header or is not exactly the bytes of its key), 0 otherwise: ``status: OK`` means the three loaders accept the
model's external data and every safetensors data file agrees with the references into it.
The table is printed either way. ``inspect FOLDER`` prints each model's status and which models use which data
files (a file used by several models is shared: see ``replace_shared``). Never reads external weights (data files
are ``stat``ed, safetensors headers read); a ``.onnx`` over 16 MiB is parsed without reading its inline payloads
(:func:`~onnx_light_ref.io._read.wire.load_model_lean`). ``--json`` prints the same report as one JSON document
(:mod:`~onnx_light_ref._commands.inspect_json`, ``docs/json.md``).

Names and locations come from the model, which may be hostile: every printed field goes through
:func:`~onnx_light_ref._commands.text.printable`, so a terminal escape sequence or a bidirectional override in a tensor
name is shown escaped, never executed.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnx_light_ref._commands.errors import describe_error, error_exit
from onnx_light_ref._commands.help_text import exit_statuses
from onnx_light_ref._commands.options import add_option
from onnx_light_ref._commands.text import printable

if TYPE_CHECKING:  # the library (and onnx) is imported when the command runs, not when the CLI starts
    from onnx_light_ref.io._layout_report import LayoutReport, TensorLayout
    from onnx_light_ref.io._read.sharing import SharedFile

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


def _range_cells(t: TensorLayout, *, typed: bool) -> tuple[str, ...]:
    """One row: name, file, offset, length, (``typed``: dtype, shape,) alignment, status. An external tensor's dtype
    and shape are the model's own (any viewer shows them); a DelayedInitializer node's say what its length is."""
    from onnx_light_ref.io._differences import dtype_name

    place = (_shorten(printable(t.name), _NAME_WIDTH_CAP), _shorten(printable(t.location), _NAME_WIDTH_CAP))
    known = t.data_type != 0
    kind = (dtype_name(t.data_type) if known else "?", str(list(t.dims)) if known else "?") if typed else ()
    return (*place, _cell(t.offset), _cell(t.length), *kind, format_alignment(t.alignment), _status(t))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Aligned columns, numbers (offset, length, alignment) to the right."""
    right = {header.index(name) for name in ("offset", "length", "align")}
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in (header, *rows)
    ]


def format_report(report: LayoutReport) -> str:
    """The text ``inspect`` prints: the table, the errors, the files and the totals; every field escaped.

    Args:
        report: what :func:`~onnx_light_ref.io._layout_report.build_layout_report` found.

    Returns:
        The whole text, newline-terminated.
    """
    lines = [f"model: {printable(report.model_path)}"]
    lines.extend(f"note: {printable(note)}" for note in report.notes)
    if not report.tensors and not report.delayed:
        lines.append(f"no external tensors and no DelayedInitializer node ({report.inline_tensors} inline).")
        return "\n".join(lines) + "\n"
    if report.tensors:
        header = ("name", "location", "offset", "length", "align", "status")
        lines += _table(header, [_range_cells(t, typed=False) for t in report.tensors])
    if report.delayed:
        lines += [""] if report.tensors else []
        lines.append(f"read by {len(report.delayed)} DelayedInitializer node(s):")
        lines += _table(("name", "filename", "offset", "length", "dtype", "shape", "align", "status"),
                        [_range_cells(t, typed=True) for t in report.delayed])  # fmt: skip
    errors = report.errors
    if errors:
        lines.append("")
        lines.append(f"{len(errors)} error(s):")
        # A DelayedInitializer node's message starts with where it is: not said twice.
        lines.extend(
            f"  {t.status}: {printable(t.message)}"
            + ("" if t.message.startswith(t.where) else f" (in {printable(t.where)})")
            for t in errors
        )
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
            verdict = "" if file.safetensors_ok else "REFUSED by the safetensors library: "
            lines.append(f"    {verdict}{printable(file.safetensors)}")
    lines.append("")
    common = report.common_alignment
    delayed = f", {len(report.delayed)} read by DelayedInitializer nodes" if report.delayed else ""
    lines.append(
        f"{len(report.tensors)} external tensors{delayed}, {report.inline_tensors} inline; every offset is aligned to "
        f"{format_alignment(common) if common != 0 else 'any power of two (all offsets are 0)'}"
        + (f" ({common} bytes)" if common and format_alignment(common) != str(common) else "")
    )
    lines.append("status: OK" if report.ok else f"status: {len(errors)} error(s)")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class FolderModel:
    """One ``.onnx`` of a folder: its layout report, or why it cannot be read (``error``)."""

    name: str
    report: LayoutReport | None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        """True when the model was read and no tensor is in error."""
        return self.report is not None and self.report.ok

    @property
    def status(self) -> str:
        """``"ok"``, ``"error"`` (a tensor in error) or ``"unreadable"``."""
        return "unreadable" if self.report is None else "ok" if self.report.ok else "error"


@dataclass(frozen=True)
class FolderReport:
    """What ``inspect FOLDER`` shows: each model (sorted by name) and each data file with the models using it."""

    folder: str
    models: list[FolderModel]
    files: list[SharedFile]

    @property
    def ok(self) -> bool:
        """True when every model is OK."""
        return all(model.ok for model in self.models)


def build_folder_report(folder: str, *, allow_outside_folder: bool = False) -> FolderReport:
    """Read every ``.onnx`` directly in ``folder`` and which data files each uses (no weight byte is read).

    Args:
        folder: a folder holding ``.onnx`` files.
        allow_outside_folder: as for :func:`~onnx_light_ref.io._layout_report.build_layout_report`.

    Returns:
        The :class:`FolderReport` (its ``folder`` absolute, as every printed path is); a model that cannot be read is
        listed with its error.
    """
    from onnx_light_ref.io._layout_report import build_layout_report
    from onnx_light_ref.io._read.sharing import folder_sharing, is_model_name

    folder = os.path.abspath(folder)

    models = []
    for name in sorted(name for name in os.listdir(folder) if is_model_name(name)):
        try:
            report = build_layout_report(os.path.join(folder, name), allow_outside_folder=allow_outside_folder)
        except (ValueError, OSError) as exc:  # InvalidModelError, ExternalDataError (a folder that cannot be held)
            models.append(FolderModel(name, None, exc))
            continue
        models.append(FolderModel(name, report))
    return FolderReport(folder, models, folder_sharing(folder))


def format_folder_report(report: FolderReport) -> str:
    """The text of a :class:`FolderReport`, every model-controlled field escaped."""
    folder = report.folder
    lines = [f"folder: {printable(folder)}"]
    from onnx_light_ref.io._read.delayed_names import DELAYED_OP_TYPE

    for model in report.models:
        if model.report is None:
            lines.append(f"  {printable(model.name)}: not readable: {printable(describe_error(model.error))}")
        else:
            lines.append(f"  {printable(model.name)}: {'OK' if model.ok else f'{len(model.report.errors)} error(s)'}")
    lines.append("")
    lines.append("files:")
    for shared in report.files:
        users = ", ".join(
            printable(os.path.basename(user.model))
            + (f" ({DELAYED_OP_TYPE})" if user.via == "delayed_initializer" else "")
            for user in shared.users
        )
        relative = os.path.relpath(shared.path, folder)
        note = f" (shared by {len(shared.users)} models)" if len(shared.users) > 1 else ""
        lines.append(f"  {printable(relative)}: used by {users}{note}")
    lines.append("status: OK" if report.ok else "status: error(s), see each model with 'inspect MODEL.onnx'")
    return "\n".join(lines) + "\n"


def inspect_command(args: argparse.Namespace) -> int:
    """Print the layout report of ``args.model`` (or, for a folder, each model's status and which models share
    which files); exit status 1 when a tensor is in error or the model is unreadable.

    With ``args.json`` the report is one JSON document on stdout instead (``docs/json.md``); an error is then both
    a JSON document with an ``error`` member on stdout and the usual ``error:`` line on stderr, with the same status.

    Args:
        args: the parsed command line (``model``, ``json``, ``allow_outside_folder``).

    Returns:
        The process exit status.
    """
    as_json = getattr(args, "json", False)
    if os.path.isdir(args.model):
        from onnx_light_ref.io._read.sharing import is_model_name

        if not any(is_model_name(name) for name in os.listdir(args.model)):
            return _failed(
                FileNotFoundError(
                    f"{args.model!r} is a directory with no .onnx file; give a model, or a folder of models"
                ),
                as_json,
            )
        folder = build_folder_report(args.model, allow_outside_folder=args.allow_outside_folder)
        if as_json:
            from onnx_light_ref._commands.inspect_json import folder_document
            from onnx_light_ref._commands.json_output import write_document

            write_document(folder_document(folder))
        else:
            sys.stdout.write(format_folder_report(folder))
        return 0 if folder.ok else 1
    from onnx_light_ref.io._layout_report import build_layout_report

    try:
        report = build_layout_report(args.model, allow_outside_folder=args.allow_outside_folder)
    except (ValueError, OSError) as exc:  # InvalidModelError, ExternalDataError: e.g. MODEL.onnx's folder is a file
        return _failed(exc, as_json)
    if as_json:
        from onnx_light_ref._commands.inspect_json import model_document
        from onnx_light_ref._commands.json_output import write_document

        write_document(model_document(report))
    else:
        sys.stdout.write(format_report(report))
    return 0 if report.ok else 1


def _failed(error: Exception, as_json: bool) -> int:
    """The ``error:`` line (escaped there) and, with ``--json``, the error document on stdout."""
    if as_json:
        from onnx_light_ref._commands.json_output import error_document, write_document

        write_document(error_document("inspect", error))
    return error_exit(error)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``inspect`` sub-command to ``subparsers``."""
    parser = subparsers.add_parser(
        "inspect",
        epilog=exit_statuses(
            "every reference is fine ('status: OK')",
            "a reference is broken (the report says which), or the model cannot be read (one 'error: ...' line)",
            writes=False,
        ),
        help="show the layout of a model's external tensors (offsets, alignment, gaps, overlaps, errors)",
        description="Print one row per external tensor, the problems found, totals per data file and the largest "
        "alignment every tensor satisfies. Exit status 1 if any reference is broken. Reads no external weight, and no "
        "inline payload of a .onnx over 16 MiB.",
    )
    parser.add_argument(
        "model",
        metavar="MODEL.onnx",
        help="model whose external tensors are shown, or a folder: each model's status and which models share which "
        "files",
    )
    add_option(parser, "--allow-outside-folder", subject="MODEL.onnx")
    add_option(parser, "--json", command="inspect")
    parser.set_defaults(func=inspect_command)
