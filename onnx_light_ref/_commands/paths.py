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

from onnx_light_ref._commands.text import printable


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


def weights_argument(value: str) -> str:
    """The argparse type of ``--weights``: a file name, never a folder's (``sub/``, ``sub/.``, ``.``, ``..``).

    Raises:
        argparse.ArgumentTypeError: ``value`` names a folder (exit status 2, the usage printed).
    """
    import argparse

    if value.endswith(("/", "/.")) or os.path.basename(value) in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{value!r} names a folder, not a file: give the weights file's name")
    return value


def weights_path(folder: str, weights: str | None) -> str | None:
    """``--weights`` as the library wants it: a relative path is taken relative to ``folder`` (DST.onnx's, or
    ``align-models``' DIR), since that is what the model records; an absolute one is kept.

    ``--weights w.bin`` means ``<folder>/w.bin`` whatever the current folder is (and ``--weights ../w.bin`` is
    refused by the library as outside it).

    Args:
        folder: the folder the weights are relative to.
        weights: the ``--weights`` argument, or None for the writer's default.

    Returns:
        The path to hand to the library, or None.

    Raises:
        UsageError: ``weights`` names an existing folder (a trailing ``/`` is refused by argparse already).
    """
    from onnx_light_ref._commands.errors import UsageError

    if weights is None:
        return None
    path = os.path.join(folder, weights)
    if os.path.isdir(path):
        raise UsageError(f"--weights {weights!r} names a folder ({path!r}), not a file: give the weights file's name")
    return path
