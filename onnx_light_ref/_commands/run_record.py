"""What ``run`` wrote in a folder: the evidence that lets a rerun replace its own outputs, and only those.

``run MODEL.onnx --input x=x.npy`` twice in one folder must not need ``--overwrite`` for the second run's ``y.npy``;
a ``y.npy`` of the user's (expected outputs saved to compare with, say) must still be refused. Neither the name nor
the content of a ``.npy`` tells them apart: a user's reference output has the planned name, a valid header, the
model output's dtype and shape; and a ``.npy`` header holds exactly three keys (numpy refuses others, and readers
in other languages parse it with their own grammars), so it cannot carry a mark. The evidence is therefore a record
beside the outputs, written in the same transaction as they are: ``.onnx-light-ref-run.json`` lists each file
``run`` wrote in that folder by name, with its size and SHA-256. An existing output file is ``run``'s own to replace
when the record lists its name with its exact size and digest (a file changed since, or put there by anyone else,
is not); the writer contract then replaces that very file (:attr:`PlannedFile.replaces
<onnx_light_ref.io._write.contract.PlannedFile.replaces>`), checked again under the folder lock (same file, same size
and modification time as when it was hashed). A file with the same bytes as one ``run`` wrote is the only false
positive: replacing it destroys nothing that ``run`` did not write.

The record keeps the entries of earlier runs whose files are still there (another model's outputs in the same
folder), so each model's rerun is recognised. A record that is not one of ours (another tool's file of that name)
vouches for nothing and is itself refused by rule 3. This module reads and hashes files; it never writes (the
executor does).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from onnx_light_ref.errors import ExistingFileError
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._write.contract import PlannedFile

RECORD_NAME = ".onnx-light-ref-run.json"
_FORMAT = "onnx-light-ref run outputs"  # the record's "format" member: a file without it is not ours
_VERSION = 1
_MAX_RECORD = 16 * 1024 * 1024  # names, sizes and digests of a folder's outputs: a larger file is not a record
_HASH_CHUNK = 1024 * 1024


@dataclass
class RunRecord:
    """The record of ``folder`` as read when ``run`` planned its outputs, and the outputs it recognised.

    ``entries``: name -> ``{"size": ..., "sha256": ...}`` (empty when there is no record of ours); ``identity``: the
    record file's, when it is ours (rule 3 lets ``run`` replace it); ``owned``: each existing output found to be
    ``run``'s own, by path, with what it was when hashed (identity, size, modification time).
    """

    folder: str
    entries: dict[str, dict[str, object]] = field(default_factory=dict)
    identity: FileIdentity | None = None
    owned: dict[str, tuple[FileIdentity, int, int]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return os.path.join(self.folder, RECORD_NAME)

    @classmethod
    def read(cls, folder: str, outputs: Sequence[str]) -> RunRecord:
        """Read ``folder``'s record and recognise which of ``outputs`` (paths in it) ``run`` wrote."""
        record = cls(os.path.abspath(folder))
        found = _read_json(record.path)
        if found is not None:
            record.entries, record.identity = found
        for path in outputs:
            entry = record.entries.get(os.path.basename(path))
            seen = _regular(path)
            if (
                entry is not None
                and seen is not None
                and seen[1] == entry.get("size")
                and _sha256(path) == entry.get("sha256")
            ):
                record.owned[os.path.abspath(path)] = seen
        return record

    def planned(self, path: str, data: bytes | None = None) -> PlannedFile:
        """The output ``path`` as a planned file (``data``: its content, None while only its name is checked)."""
        owned = self.owned.get(os.path.abspath(path))
        content = data if data is not None else b""
        return PlannedFile(
            path,
            "array",
            len(content),
            writes=[(0, content)] if content else (),
            format="npy",
            replaces=owned[0] if owned is not None else None,
        )

    def planned_record(self, outputs: Sequence[tuple[str, bytes]] = ()) -> PlannedFile:
        """The record after this run: earlier entries whose files are still there, then each output written."""
        written = {os.path.basename(path): data for path, data in outputs}
        files = {
            name: entry
            for name, entry in self.entries.items()
            if name not in written and os.path.lexists(os.path.join(self.folder, name))
        }
        files.update(
            {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in written.items()}
        )
        document = {"format": _FORMAT, "version": _VERSION, "files": files}
        content = (json.dumps(document, indent=1, sort_keys=True) + "\n").encode() if outputs else b""
        writes = [(0, content)] if content else ()
        return PlannedFile(self.path, "data", len(content), writes=writes, format="json", replaces=self.identity)

    def check_unchanged(self) -> Callable[[], None]:
        """A source check for the folder lock: each output recognised as ``run``'s is still the file hashed."""

        def check() -> None:
            for path, seen in self.owned.items():
                if _regular(path) != seen:
                    raise ExistingFileError(
                        f"run: output file {path!r} changed since this run recognised it as one a previous run wrote; "
                        "replacing it would destroy a file run did not write. Write under another --output-dir, or "
                        "pass --overwrite to replace it; nothing was written."
                    )

        return check


def _regular(path: str) -> tuple[FileIdentity, int, int] | None:
    """A regular file's identity, size and modification time (None for anything else, or nothing)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return FileIdentity(st.st_dev, st.st_ino), st.st_size, st.st_mtime_ns


def _sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            while chunk := file.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _read_json(path: str) -> tuple[dict[str, dict[str, object]], FileIdentity] | None:
    """The record's entries and identity, or None when there is none or it is not one of ours."""
    seen = _regular(path)
    if seen is None or seen[1] > _MAX_RECORD:
        return None
    try:
        with open(path, "rb") as file:
            document = json.loads(file.read(_MAX_RECORD + 1).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("format") != _FORMAT or document.get("version") != _VERSION:
        return None
    files = document.get("files")
    if not isinstance(files, dict) or not all(isinstance(entry, dict) for entry in files.values()):
        return None
    return files, seen[0]
