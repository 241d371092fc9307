"""Checks on what a run left behind, read with plain file reads and never through the code under test.

Import as ``from tests.checks import ...``. Model builders live in :mod:`tests.models`.

* :func:`sha256_of_tree` / :func:`snapshot_tree`: a folder's content, to prove nothing was created, removed or
  modified (``snapshot_tree`` also records directories and special files);
* :func:`assert_no_temp_files` / :func:`temp_files_under`: staged temp files a run must not leave behind;
* :func:`walk_tree`: every entry under a folder, symlinks not followed;
* :func:`external_payload`: a tensor's bytes as its entries say (plain ``open``/``seek``/``read``);
* :func:`run_onnxruntime`: a model's outputs computed by onnxruntime.

Nothing here writes a file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.external_data_helper
import pytest

__all__ = [
    "assert_no_temp_files",
    "dead_pid",
    "external_payload",
    "onnxruntime_session",
    "run_onnxruntime",
    "sha256_of_tree",
    "snapshot_tree",
    "temp_files_under",
    "walk_tree",
]


def dead_pid() -> int:
    """The pid of a process that has ended and been reaped (``true``: an exec, not a Python start-up per call)."""
    true = shutil.which("true")
    child = subprocess.Popen([true] if true else [sys.executable, "-c", ""])
    child.wait()
    return child.pid


def walk_tree(folder: str | os.PathLike[str]) -> Iterator[tuple[str, str]]:
    """``(relative path, absolute path)`` of every entry under ``folder``, symlinks not followed."""
    root = os.fspath(folder)
    for current, dirs, files in os.walk(root):
        for entry in dirs + files:
            path = os.path.join(current, entry)
            yield os.path.relpath(path, root), path


def sha256_of_tree(folder: str | os.PathLike[str], *, every_entry: bool = False) -> dict[str, str]:
    """``{relative path: sha256}`` of every regular file under ``folder`` (symlinks recorded by target, not followed).

    Comparing two snapshots proves that nothing was created, removed or modified. With ``every_entry``,
    directories (``"dir"``) and special files (``"special"``) are recorded too, so an empty folder left behind counts.
    """
    snapshot: dict[str, str] = {}
    for relative, path in sorted(walk_tree(folder)):
        if os.path.islink(path):
            snapshot[relative] = f"symlink -> {os.readlink(path)}"
        elif os.path.isfile(path):
            with open(path, "rb") as handle:
                snapshot[relative] = hashlib.sha256(handle.read()).hexdigest()
        elif every_entry:
            snapshot[relative] = "dir" if os.path.isdir(path) else "special"
    return snapshot


def snapshot_tree(folder: str | os.PathLike[str]) -> dict[str, str]:
    """:func:`sha256_of_tree` of ``folder`` with ``every_entry=True``."""
    return sha256_of_tree(folder, every_entry=True)


def temp_files_under(folder: str | os.PathLike[str]) -> list[str]:
    """Staged temp files (``.<name>.<pid>.<random>.tmp``) anywhere under ``folder``, as sorted absolute paths."""
    return sorted(
        path
        for _relative, path in walk_tree(folder)
        if os.path.basename(path).startswith(".") and path.endswith(".tmp") and not os.path.isdir(path)
    )


def assert_no_temp_files(folder: str | os.PathLike[str]) -> None:
    """Fail if a staged temp file, or any hidden file or folder, or any ``*.tmp`` is left under ``folder``."""
    leftovers = sorted(
        path for _relative, path in walk_tree(folder) if os.path.basename(path).startswith(".") or path.endswith(".tmp")
    )
    assert leftovers == [], f"temp files left behind: {leftovers}"


def external_payload(tensor: onnx.TensorProto, base_dir: str | os.PathLike[str]) -> bytes:
    """Bytes of an EXTERNAL tensor, read with a plain ``open``/``seek``/``read`` (independent of the package)."""
    entries = {e.key: e.value for e in tensor.external_data}
    with open(Path(base_dir) / entries["location"], "rb") as data_file:
        data_file.seek(int(entries.get("offset", 0)))
        return data_file.read(int(entries["length"]))


def run_onnxruntime(path: str | os.PathLike[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of an onnxruntime CPU session on the model at ``path``."""
    session = onnxruntime_session(path)
    return [np.asarray(output) for output in session.run(None, feeds)]


@functools.cache
def _onnxruntime_reads_external_sparse() -> bool:
    """Probe: onnxruntime up to at least 1.23 refuses sparse initializers whose indices are external data."""
    import onnxruntime as ort

    from tests.zoo import ZOO

    with tempfile.TemporaryDirectory() as folder:
        try:
            ort.InferenceSession(str(ZOO["sparse"](Path(folder)).path), providers=["CPUExecutionProvider"])
        except ort.capi.onnxruntime_pybind11_state.Fail as exc:
            if "CopySparseData" not in str(exc):
                raise
            return False
    return True


def _external_sparse(graph: onnx.GraphProto) -> bool:
    """True when a sparse tensor (initializer or attribute, subgraphs included) has external values or indices."""
    sparse = list(graph.sparse_initializer)
    for node in graph.node:
        for attr in node.attribute:
            sparse.extend([attr.sparse_tensor, *attr.sparse_tensors])
            if any(_external_sparse(sub) for sub in [attr.g, *attr.graphs]):
                return True
    return any(onnx.external_data_helper.uses_external_data(t) for sp in sparse for t in (sp.values, sp.indices))


def onnxruntime_session(path: str | os.PathLike[str]) -> Any:
    """An onnxruntime CPU session on the model at ``path``.

    Skips the calling test (after what it checked before) when the model has external sparse tensors and the
    installed onnxruntime cannot read them (the floor pass of ``.ci/run``; newer onnxruntime reads them).
    """
    import onnxruntime as ort

    model = onnx.load(str(path), load_external_data=False)
    if _external_sparse(model.graph) and not _onnxruntime_reads_external_sparse():
        pytest.skip(f"onnxruntime {ort.__version__} cannot read external sparse indices (CopySparseData)")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@functools.cache
def onnx_loader_refuses_symlinks() -> bool:
    """Whether the installed onnx's loader refuses a data file that is a symbolic link inside the model's folder.

    onnx 1.23 does (``RESOLVE_NO_SYMLINKS``), onnx 1.17 follows it. Our rule is the stricter, newer one on every
    onnx; tests that check onnx itself agrees ask this first.
    """
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "real.bin").write_bytes(b"\0" * 4)
        os.symlink("real.bin", os.path.join(folder, "alias.bin"))
        probe = onnx.TensorProto(name="probe", data_type=onnx.TensorProto.UINT8, dims=[4], raw_data=b"")
        onnx.external_data_helper.set_external_data(probe, "alias.bin", length=4)
        try:
            onnx.external_data_helper.load_external_data_for_tensor(probe, folder)
        except (onnx.checker.ValidationError, OSError, ValueError):
            return True
        return False


needs_onnx_with_the_newer_loader_rule = pytest.mark.skipif(
    not onnx_loader_refuses_symlinks(),
    reason=f"onnx {onnx.__version__}'s loader follows symbolic links in data paths and opens non-UTF-8 names; this "
    "package's rule and inspect's per-loader claims are those of the newer onnx loader (1.23)",
)
"""For tests that compare inspect's per-loader claims, or our refusals, with what the installed onnx does."""


def external_locations(model_path: str | os.PathLike[str]) -> set[str]:
    """Every ``location`` the model's tensors reference, wherever the tensors are (read without the weights)."""
    from onnx_light_ref.io._read.walker import iter_tensors

    model = onnx.load(str(model_path), load_external_data=False)
    return {e.value for site in iter_tensors(model) for e in site.tensor.external_data if e.key == "location"}


def model_fingerprint(model_path: str | os.PathLike[str], locations: set[str]) -> str:
    """SHA-256 over the ``.onnx`` bytes and the name and bytes of each referenced file: equal fingerprints, equal
    loads. Lets a fault-injection test run the loaders once per distinct state instead of once per fault."""
    folder = Path(model_path).parent
    digest = hashlib.sha256(Path(model_path).read_bytes())
    for location in sorted(locations):
        digest.update(b"\0" + location.encode() + b"\0" + (folder / location).read_bytes())
    return digest.hexdigest()
