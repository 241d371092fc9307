"""What a SIGKILL at a system call leaves in a destination folder, as one comparable value.

A process killed with SIGKILL runs no code on its way out: what it leaves is exactly what the file system holds at
that instant (its locks and descriptors go with it). So the state a kill at the k-th system call of a publication
leaves can be read, without killing anything, by a run that looks at the folder from inside its ``before_syscall``
hook at that call. Two kill points whose states are equal leave the same files, so the same oracles' verdicts and
the same recovery run follow; the kill-point tests kill once per distinct state (and check that the killed run left
the state the looking run saw).

Equal means equal up to the parts of the publisher's hidden names that differ from run to run by construction: the
pid and the random part of ``.olr~<tag>~<pid>~<random>.<suffix>`` (every killed child has its own pid, every run
draws new random parts). They are renamed consistently, in names and in file contents alike (a bridge ``.onnx``
names its bridge files), by order of first appearance in a canonical walk, so two states are equal only when one
is the other with its pids and random parts renamed one to one. Everything else counts: each entry's path, kind,
permission bits, link count and bytes (a file's content, a symbolic link's target).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError, Message

from tests.checks import walk_tree

__all__ = ["folder_state"]

_RUN_TOKENS = re.compile(rb"~([0-9]{1,10})~([0-9a-f]{16})(?=\.)")
"""The ``~<pid>~<random>`` of a publisher's hidden name, ``io/_write/publish.py``'s format (the names a real
``StagedFile`` takes are checked to match: tests/hardening/test_kill_states.py)."""


_IDENTITIES = re.compile(rb'"(device|inode|mtime_ns)": [0-9]+')
"""The identity a publication's journal records of each file it moves in: another inode and time every run."""


def _erased(data: bytes) -> bytes:
    return _IDENTITIES.sub(rb'"\1": ?', _RUN_TOKENS.sub(b"~pid~random", data))


def _content(data: bytes, rename: Callable[[bytes], bytes]) -> bytes:
    """A file's bytes with ``rename`` applied to its hidden names. In a model (a bridge ``.onnx`` names its bridge
    files) they are renamed inside its strings and the model serialized again: a pid of another length (9919, then
    11823 once the pids pass 10000) changes the strings' length prefixes, which renaming the raw bytes leaves as they
    were, so two equal states compared unequal (seen in full runs, whose children get 5-digit pids)."""
    if _RUN_TOKENS.search(data) is None:
        return rename(data)  # no hidden name; a journal's identities are still erased
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        return rename(data)
    if model.SerializeToString() != data:  # not a model as protobuf writes one: its bytes as they are
        return rename(data)
    _rename_strings(model, rename)
    return model.SerializeToString()


def _rename_strings(message: Message, rename: Callable[[bytes], bytes]) -> None:
    """Apply ``rename`` to every string of ``message``, in field order (the order of their bytes in the file)."""
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _rename_strings(item, rename)
        elif field.type in (field.TYPE_STRING, field.TYPE_BYTES):  # a node's filename attribute is bytes
            text = field.type == field.TYPE_STRING
            one = (lambda item: rename(item.encode()).decode()) if text else rename
            if field.is_repeated:
                renamed = [one(item) for item in value]
                del value[:]
                value.extend(renamed)
            else:
                setattr(message, field.name, one(value))


def _entries(folder: Path) -> list[tuple[bytes, str, int, int, bytes]]:
    """``(relative path, kind, permission bits, link count, bytes)`` of every entry under ``folder``."""
    found = []
    for relative, path in walk_tree(folder):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            kind, data = "symlink", os.fsencode(os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as handle:
                kind, data = "file", handle.read()
        else:
            kind, data = ("dir" if stat.S_ISDIR(st.st_mode) else "special"), b""
        found.append((os.fsencode(relative), kind, stat.S_IMODE(st.st_mode), st.st_nlink, data))
    return found


def folder_state(folder: Path) -> str:
    """A digest of everything under ``folder`` that a kill leaves, pids and random parts of hidden names renamed.

    Entries are walked in the order of their path and bytes with those parts erased (the same for two states that
    differ only by them); each new pid and each new random part gets the next number as it first appears.
    """
    entries = sorted(
        _entries(folder),
        key=lambda e: (_erased(e[0]), e[1], hashlib.sha256(_content(e[4], _erased)).digest(), e[2], e[3]),
    )
    pids: dict[bytes, bytes] = {}
    randoms: dict[bytes, bytes] = {}

    def renamed(data: bytes) -> bytes:
        def one(match: re.Match[bytes]) -> bytes:
            pid = pids.setdefault(match.group(1), b"%d" % len(pids))
            random = randoms.setdefault(match.group(2), b"%d" % len(randoms))
            return b"~pid" + pid + b"~random" + random

        return _IDENTITIES.sub(rb'"\1": ?', _RUN_TOKENS.sub(one, data))

    digest = hashlib.sha256()
    for path, kind, mode, links, data in entries:
        path_renamed = renamed(path)  # the path first: the numbering follows the walk
        content = hashlib.sha256(_content(data, renamed)).hexdigest()
        digest.update(repr((path_renamed, kind, mode, links, content)).encode())
    return digest.hexdigest()
