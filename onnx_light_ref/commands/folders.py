"""Destination folders for the commands that write: create the missing ones, remove them again if the run fails.

Users expect a command line to create a missing output folder; the Python API keeps refusing one (a typo in a
library call should fail, not scatter folders). Every writing command calls :func:`make_folders` before the
library call and :func:`remove_created_folders` when that call fails or is interrupted (or wraps the call in
:func:`created_folders`, which does both), so a refused or interrupted run leaves the tree as it was.

An interrupt (SIGINT/SIGTERM, raised by the CLI as a ``KeyboardInterrupt``) can land between two bytecodes of the
library, e.g. right after a temp file was created and before the publish transaction recorded it; the transaction's
rollback cannot see such a file. :func:`remove_own_temp_files` removes, after an interrupt, the temp files of *this*
process (their names carry its pid) in the destination folders, and its bridge files no model references, so
nothing is left whatever the window but what a published model uses.

This module never removes a folder it did not create, nor a folder that is not empty (``rmdir`` only), nor a file
but a temp or bridge file named with this process's pid, and never creates anything but folders.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterable, Iterator, Sequence

__all__ = [
    "FolderError",
    "created_folders",
    "make_folders",
    "remove_created_folders",
    "remove_own_temp_files",
]


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
    except KeyboardInterrupt:
        remove_own_temp_files(folders)
        remove_created_folders(created)
        raise
    except BaseException:
        remove_created_folders(created)
        raise


def remove_own_temp_files(folders: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Delete the publish temp files of this process (``.olr~<tag>~<this pid>~<random>.tmp``) in ``folders``, and
    its bridge files (``.bridge``) that no model references.

    Called after an interrupt, once the library's own rollback has run: what is left with this pid is a file the
    interrupt caught between its creation and its registration (or a bridge file between its rename and its
    record). A bridge file a model references stays: the interrupt came after commit A, which could not be undone,
    and the destination model is published on it (``docs/durability.md``, "Interrupts"). Other processes' files
    are never touched.

    Args:
        folders: the command's destination folders (missing ones are skipped).

    Returns:
        The paths removed.
    """
    folders = [os.fspath(folder) for folder in folders]  # read twice: temp files, then bridge files

    from onnx_light_ref.io.write.publish import _TEMP_PREFIX, _TEMP_SUFFIX  # imports onnx: not at CLI start-up

    pattern = re.compile(
        re.escape(_TEMP_PREFIX) + r"[0-9a-f]{12}~" + str(os.getpid()) + r"~[0-9a-f]{16}" + re.escape(_TEMP_SUFFIX)
    )
    removed = []
    for folder in dict.fromkeys(os.path.abspath(os.fspath(folder)) for folder in folders):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if pattern.fullmatch(name):
                path = os.path.join(folder, name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(path)
    from onnx_light_ref.io.write.publish import remove_own_bridge_files

    return removed + remove_own_bridge_files([os.fspath(folder) for folder in folders])


def remove_created_folders(created: Sequence[str]) -> None:
    """Undo :func:`make_folders` after a failure: remove each listed folder that is still empty, deepest first."""
    for folder in created:
        with contextlib.suppress(OSError):  # not empty (something else wrote there) or already gone: leave it
            os.rmdir(folder)
