"""Destination folders for the commands that write: create the missing ones, remove them again if the run fails.

Users expect a command line to create a missing output folder; the Python API keeps refusing one (a typo in a
library call should fail, not scatter folders). Every writing command calls :func:`make_folders` before the
library call and :func:`remove_created_folders` when that call fails or is interrupted (or wraps the call in
:func:`created_folders`, which does both), so a refused run, or one interrupted before its publication's first
move, leaves the tree as it was.

An interrupt (SIGINT/SIGTERM, raised by the CLI as a ``KeyboardInterrupt``) never lands between a temp file's
creation and its record, nor inside a publication: the library defers both signals there
(:mod:`onnx_light_ref.io._write.interrupts`), so its own rollback removes every temp file it created.

This module never removes a folder it did not create, nor a folder that is not empty (``rmdir`` only), nor any
file, and never creates anything but folders.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator, Sequence


class FolderError(OSError):
    """A destination folder could not be created (a parent is a file, no permission...); ``str`` is the message."""

    def __str__(self) -> str:
        return str(self.strerror)


def make_folders(folders: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Create each missing folder of ``folders`` with its missing parents.

    Args:
        folders: the folders the command writes into (absolute or relative).

    Returns:
        The folders this call created, deepest first (the order :func:`remove_created_folders` needs). A folder
        created meanwhile by someone else is not listed.

    Raises:
        FolderError: a folder cannot be created or used (e.g. it, or a parent, is a file); the folders this call
            had already created are removed first.
    """
    created: list[str] = []
    for given in folders:
        folder = os.path.abspath(os.fspath(given))
        missing = []
        while not os.path.lexists(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        if not missing and not os.path.isdir(folder):  # a file where the folder must be: say so now, not as a raw
            remove_created_folders(created)  # ENOTDIR from the command later (under a file, mkdir says it below)
            raise FolderError(errno.ENOTDIR, f"{folder!r} exists and is not a folder", folder)
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:  # created meanwhile by someone else: not ours to remove
                continue
            except OSError as exc:
                remove_created_folders(created)
                raise FolderError(
                    exc.errno, f"cannot create the folder {folder!r}: {exc.strerror or exc}", folder
                ) from exc
            except BaseException:  # interrupted (SIGINT/SIGTERM) between two folders: undo the ones made so far
                remove_created_folders(created)
                raise
            created.insert(0, folder)
    return created


@contextlib.contextmanager
def created_folders(folders: Iterable[str | os.PathLike[str]]) -> Iterator[list[str]]:
    """Create the missing ``folders`` for the block; remove those it created if the block raises anything.

    Anything includes an interrupt (``KeyboardInterrupt``, which the CLI raises for SIGINT and SIGTERM) and the
    exceptions a handler turns into an ``error:`` line after the block: the folders are gone before it prints.

    Args:
        folders: the folders the command writes into.

    Yields:
        The folders created (deepest first), as :func:`make_folders` returns them.

    Raises:
        FolderError: a folder cannot be created (nothing is left created).
    """
    folders = [os.path.abspath(os.fspath(folder)) for folder in folders]
    created = make_folders(folders)
    try:
        yield created
    except BaseException:
        remove_created_folders(created)
        raise


def remove_created_folders(created: Sequence[str]) -> None:
    """Undo :func:`make_folders` after a failure: remove each listed folder that is still empty, deepest first."""
    for folder in created:
        with contextlib.suppress(OSError):  # not empty (something else wrote there) or already gone: leave it
            os.rmdir(folder)
