"""How the commands show paths: one rule for every line they print, and a warning for a destination misnamed.

Summaries used to print the destination as it was typed (``out/m.onnx``) next to files the library names by
absolute path (``/home/u/out/m.onnx.data``), and once named ``w.bin`` when the files written were
``w-00001-of-00008.bin``... Every path a command prints goes through :func:`shown_path`: absolute, as the library's
results and error messages name files (so a line means the same whichever folder it is read from, and can be pasted
into another command), and escaped (a file name can hold a terminal escape sequence). Commands name the files the
library reports it wrote, never the ones they asked for.

This module never touches the filesystem beyond ``os.path.abspath`` (which reads the current folder).
"""

from __future__ import annotations

import os
import sys

from onnx_light_ref.commands.text import printable

__all__ = ["shown_path", "warn_unless_onnx"]


def shown_path(path: str | os.PathLike[str]) -> str:
    """``path`` as every command prints it: absolute and escaped.

    Args:
        path: a path as typed or as the library returned it.

    Returns:
        The absolute path, safe to print on a terminal.
    """
    return printable(os.path.abspath(os.fspath(path)))


def warn_unless_onnx(dst_onnx: str | os.PathLike[str]) -> None:
    """Warn on stderr when a destination model's name does not end in ``.onnx`` (any case).

    ``align model.onnx x`` writes a model named ``x`` (and ``x.data``): legal, but almost always a folder was meant,
    and loaders, file pickers and ``inspect FOLDER`` look for ``*.onnx``. The run goes on: the name may be deliberate.

    Args:
        dst_onnx: the DST.onnx argument.
    """
    name = os.path.basename(os.fspath(dst_onnx))
    if not name.lower().endswith(".onnx"):
        folder = os.path.join(os.fspath(dst_onnx), "model.onnx")
        print(
            f"warning: the destination model {shown_path(dst_onnx)} does not end in .onnx: it is written under that "
            f"name (tools look for *.onnx files). For a folder, give a model path in it, e.g. {printable(folder)}",
            file=sys.stderr,
        )
