"""Shared test helpers: real ONNX models with external data, and checks on what a run left (or did not leave) behind.

``tests/`` is not a package, so helpers reach test modules as fixtures that return plain functions:

* ``make_external_model(folder, tensors, ...)``: a model saved by onnx itself (``save_as_external_data=True``);
* ``externalize(tensors, folder, location_for, ...)``: move chosen tensors' raw bytes into data files by hand (several
  files, gaps, checksums, any tensor onnx's writer does not handle such as sparse ones);
* ``sha256_of_tree(folder)`` / ``assert_no_temp_files(folder)``: what a refused or finished run must leave behind;
* ``external_payload(tensor, base_dir)``: a tensor's external bytes read with plain file reads (no package code).

Every builder writes real files under the folder it is given (normally ``tmp_path``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.external_data_helper import set_external_data

# onnxruntime 1.32 reads IR 10 models; opset 18 has every op the tests use (If, Loop, Constant, Identity, Add).
IR_VERSION = 10
OPSET = 18


def build_identity_model(
    tensors: dict[str, np.ndarray], *, typed_inline: Iterable[str] = (), name: str = "identity"
) -> onnx.ModelProto:
    """A runnable model whose initializers are ``tensors``; each is returned by an Identity node as ``out_<name>``.

    Tensors named in ``typed_inline`` are stored in the typed ``*_data`` fields, which onnx never moves to external
    data; the others use ``raw_data``.
    """
    typed = set(typed_inline)
    initializers = []
    for tensor_name, array in tensors.items():
        if tensor_name in typed:
            data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            initializers.append(helper.make_tensor(tensor_name, data_type, array.shape, array.flatten().tolist()))
        else:
            initializers.append(numpy_helper.from_array(array, tensor_name))
    nodes = [helper.make_node("Identity", [n], [f"out_{n}"], name=f"id_{n}") for n in tensors]
    outputs = [
        helper.make_tensor_value_info(f"out_{n}", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in tensors.items()
    ]
    graph = helper.make_graph(nodes, name, [], outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def make_external_model(
    folder: str | os.PathLike[str],
    tensors: dict[str, np.ndarray],
    *,
    name: str = "model.onnx",
    location: str | None = None,
    size_threshold: int = 0,
    typed_inline: Iterable[str] = (),
) -> Path:
    """Save an Identity model (see :func:`build_identity_model`) with onnx's own external-data writer.

    Every raw tensor of at least ``size_threshold`` bytes goes to ``location`` (default ``<name>.data``), back to
    back as onnx writes them. Returns the ``.onnx`` path.
    """
    path = Path(folder) / name
    model = build_identity_model(tensors, typed_inline=typed_inline)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location or f"{name}.data",
        size_threshold=size_threshold,
    )
    return path


def externalize(
    tensors: Iterable[onnx.TensorProto],
    folder: str | os.PathLike[str],
    location_for: str | Callable[[onnx.TensorProto], str],
    *,
    gap: bytes = b"",
    checksum: bool = False,
) -> None:
    """Append each tensor's ``raw_data`` to its data file and turn it into an EXTERNAL reference (in place).

    ``location_for`` is one location or a function of the tensor (to spread tensors over several files). ``gap``
    bytes are written before each payload so that a copier that takes the wrong range is caught. With ``checksum``,
    a ``checksum`` entry (sha1 of the payload) is recorded as some writers do.
    """
    for tensor in tensors:
        location = location_for if isinstance(location_for, str) else location_for(tensor)
        payload = tensor.raw_data
        path = Path(folder) / location
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as data_file:
            data_file.write(gap)
            offset = data_file.tell()
            data_file.write(payload)
        set_external_data(
            tensor,
            location,
            offset=offset,
            length=len(payload),
            checksum=hashlib.sha1(payload).hexdigest() if checksum else None,
        )
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL


def external_payload(tensor: onnx.TensorProto, base_dir: str | os.PathLike[str]) -> bytes:
    """Bytes of an EXTERNAL tensor, read with a plain ``open``/``seek``/``read`` (independent of the package)."""
    entries = {e.key: e.value for e in tensor.external_data}
    with open(Path(base_dir) / entries["location"], "rb") as data_file:
        data_file.seek(int(entries.get("offset", 0)))
        return data_file.read(int(entries["length"]))


def sha256_of_tree(folder: str | os.PathLike[str]) -> dict[str, str]:
    """``{relative path: sha256}`` of every regular file under ``folder`` (symlinks recorded by target, not followed).

    Comparing two snapshots proves that nothing was created, removed or modified.
    """
    snapshot = {}
    root = Path(folder)
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_symlink():
            snapshot[relative] = f"symlink -> {os.readlink(path)}"
        elif path.is_file():
            snapshot[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return snapshot


def assert_no_temp_files(folder: str | os.PathLike[str]) -> None:
    """Fail if a staged temp file (``.<name>.<pid>.<random>.tmp``) or any hidden file is left under ``folder``."""
    leftovers = [p for p in Path(folder).rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert leftovers == [], f"temp files left behind: {leftovers}"


@pytest.fixture(name="make_external_model")
def _make_external_model_fixture() -> Callable[..., Path]:
    return make_external_model


@pytest.fixture(name="build_identity_model")
def _build_identity_model_fixture() -> Callable[..., onnx.ModelProto]:
    return build_identity_model


@pytest.fixture(name="externalize")
def _externalize_fixture() -> Callable[..., None]:
    return externalize


@pytest.fixture(name="external_payload")
def _external_payload_fixture() -> Callable[..., bytes]:
    return external_payload


@pytest.fixture(name="sha256_of_tree")
def _sha256_of_tree_fixture() -> Callable[..., dict[str, str]]:
    return sha256_of_tree


@pytest.fixture(name="assert_no_temp_files")
def _assert_no_temp_files_fixture() -> Callable[..., None]:
    return assert_no_temp_files
