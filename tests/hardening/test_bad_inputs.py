"""The bad-input matrix: every hostile or broken input gets a typed error, and nothing on disk changes.

One row per (function, case). Each row builds real files under ``tmp_path``, snapshots the whole tree (hashes of
every file, symlink targets, folders), calls the public function, and asserts:

* the exception type (the most specific documented one) and a fragment of its message;
* the tree is byte-for-byte what it was: no destination file, no temp file (``.*.tmp``), every source unchanged;
* an in-memory model handed to the function is unchanged (``save_model_with_shared_external_data`` and
  ``delay_initializers`` must not mutate it when they refuse).

Faults of the filesystem itself are tested for real in ``tests/fs/test_writers_on_real_filesystems.py`` (every
writer on a full tmpfs, a read-only mount, a tmpfs out of inodes at each file creation, and an ext3 filled by
another file during the copy). The rows here simulate:

* a disk that fills *during* the copy, after the space check and preallocation succeeded (NFS, ZFS and other
  filesystems without ``fallocate``, or another writer taking the space): ``os.write``/``os.pwrite``/
  ``os.pwritev``/``os.writev``/``os.copy_file_range``/``os.sendfile`` all raise ``OSError(ENOSPC)``, so every
  fallback of the copy engine fails too, not only the route the real ext3 test happens to take;
* ``fsync`` or ``rename`` reporting EIO, and a source swapped between validation and copy.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light_ref import (
    DelayedInitializer,
    align_external_data_in_memory,
    align_external_data_streaming,
    save_model_with_shared_external_data,
)
from onnx_light_ref.errors import (
    DanglingReferenceError,
    DestinationConflictError,
    ExternalDataError,
    InvalidModelError,
    UnsafeLocationError,
)
from onnx_light_ref.io._arguments import ArgumentTypeError
from onnx_light_ref.io._verify import MAX_CHUNK_SIZE, verify_models
from onnx_light_ref.ops._convert import delay_initializers
from onnx_light_ref.ops._undelay import undelay_initializers
from tests.checks import snapshot_tree, temp_files_under
from tests.models import OPSET, external_tensor, identity_model, write_model

GOOD = np.arange(16, dtype=np.float32).reshape(4, 4)  # 64 bytes at offset 0 of model.onnx.data
BAD = np.arange(16, dtype=np.float32).reshape(4, 4) * -1  # its 64 bytes are at offset 64; entries vary per row
SECRET = b"top secret, outside the model folder\n" * 64  # 2,368 bytes in outside/secret.bin
DATA = "model.onnx.data"


@dataclass
class Scene:
    """The folders of one row: ``model/`` (the source), ``outside/`` (must never leak), ``dst/`` (destinations)."""

    root: Path
    monkeypatch: pytest.MonkeyPatch
    protos: list[onnx.ModelProto] = field(default_factory=list)  # in-memory inputs that must stay unchanged
    destinations: list[Path] = field(default_factory=list)  # paths that must not appear
    after_call: list[Callable[[], None]] = field(default_factory=list)  # undo what the row did to the sources

    def __post_init__(self) -> None:
        self.model_dir = self.root / "model"
        self.outside = self.root / "outside"
        self.dst_dir = self.root / "dst"
        for folder in (self.model_dir, self.outside, self.dst_dir):
            folder.mkdir()
        (self.outside / "secret.bin").write_bytes(SECRET)
        (self.model_dir / DATA).write_bytes(GOOD.tobytes() + BAD.tobytes())

    @property
    def src(self) -> Path:
        return self.model_dir / "model.onnx"


@dataclass(frozen=True)
class Row:
    prepare: Callable[[Scene], Callable[[], object]]  # builds files, returns the call that must fail
    error: type[BaseException]
    fragment: str


ROWS: list = []


def row(case_id: str, prepare: Callable[[Scene], Callable[[], object]], error: type[BaseException], fragment: str):
    ROWS.append(pytest.param(Row(prepare, error, fragment), id=case_id))


@pytest.mark.parametrize("case", ROWS)
def test_bad_input_is_refused_and_changes_nothing(case: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    scene = Scene(tmp_path, monkeypatch)
    try:
        call = case.prepare(scene)
        before = snapshot_tree(tmp_path)
        protos_before = [proto.SerializeToString() for proto in scene.protos]
        with pytest.raises(case.error) as caught:
            call()
        monkeypatch.undo()  # read the tree back with the real os functions
        for undo in scene.after_call:
            undo()
        assert case.fragment in str(caught.value), f"{case.fragment!r} not in {caught.value!r}"
        assert temp_files_under(tmp_path) == []
        for destination in scene.destinations:
            assert os.path.relpath(destination, tmp_path) in before or not os.path.lexists(destination)
        assert snapshot_tree(tmp_path) == before
        assert [proto.SerializeToString() for proto in scene.protos] == protos_before
    finally:
        monkeypatch.undo()


# --------------------------------------------------------------------------------------------------- source models


def entries(location: str = DATA, offset: str | None = "64", length: str | None = "64", *extra: tuple[str, str]):
    pairs = [("location", location)]
    if offset is not None:
        pairs.append(("offset", offset))
    if length is not None:
        pairs.append(("length", length))
    return pairs + list(extra)


def good_tensor() -> onnx.TensorProto:
    return external_tensor("w_good", GOOD, entries(offset="0"))


def source_model(bad: onnx.TensorProto) -> onnx.ModelProto:
    """w_good (valid, external), the row's bad tensor, and an inline tensor that must never be dropped."""
    return identity_model([good_tensor(), bad, numpy_helper.from_array(np.ones(3, np.int32), "inline_b")])


def if_model(bad: onnx.TensorProto) -> onnx.ModelProto:
    """The bad tensor is an initializer of an If branch, two levels down (If inside If)."""

    def branch(name: str, inner: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, [4, 4])
        return helper.make_graph(inner, name, [], [out], initializer=initializers)

    deep_then = branch("deep_then", [helper.make_node("Identity", [bad.name], ["deep_then_out"])], [bad])
    deep_else = branch("deep_else", [helper.make_node("Identity", ["w_good"], ["deep_else_out"])], [])
    inner_if = helper.make_node("If", ["cond"], ["then_out"], then_branch=deep_then, else_branch=deep_else)
    then_graph = branch("then", [inner_if], [])
    else_graph = branch("else", [helper.make_node("Identity", ["w_good"], ["else_out"])], [])
    outer_if = helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)
    graph = helper.make_graph(
        [outer_if],
        "nested_if",
        [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 4])],
        initializer=[good_tensor()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)


def sparse_model(bad: onnx.TensorProto) -> onnx.ModelProto:
    """The bad tensor is the values of a sparse initializer."""
    indices = numpy_helper.from_array(np.arange(16, dtype=np.int64), "")
    sparse = helper.make_sparse_tensor(bad, indices, [16, 4])
    model = identity_model([good_tensor()])
    model.graph.sparse_initializer.append(sparse)
    return model


def constant_model(bad: onnx.TensorProto) -> onnx.ModelProto:
    """The bad tensor is the ``value`` attribute of a Constant node."""
    model = identity_model([good_tensor()])
    model.graph.node.append(helper.make_node("Constant", [], ["c"], value=bad, name="const"))
    return model


# How each function receives the (bad) source. Every row of REFERENCE_CASES runs through all four.


def call_streaming(scene: Scene) -> Callable[[], object]:
    out = scene.dst_dir / "out.onnx"
    scene.destinations += [out, scene.dst_dir / "out.onnx.data"]
    return lambda: align_external_data_streaming(scene.src, out, alignment=64, chunk_size=16)


def call_in_memory(scene: Scene) -> Callable[[], object]:
    out = scene.dst_dir / "out.onnx"
    scene.destinations += [out, scene.dst_dir / "out.onnx.data"]
    return lambda: align_external_data_in_memory(scene.src, out, alignment=64)


def call_shared(scene: Scene) -> Callable[[], object]:
    """A variant of the source saved next to it, with one new tensor; the source's tensors are reused."""
    model = onnx.load_model(scene.src, load_external_data=False)
    model.graph.initializer.append(numpy_helper.from_array(np.full(8, 7, np.float64), "w_new"))
    scene.protos.append(model)
    out = scene.model_dir / "variant.onnx"
    scene.destinations += [out, scene.model_dir / "variant.onnx.data"]
    return lambda: save_model_with_shared_external_data(model, out, alignment=64, size_threshold=0)


def call_delay(scene: Scene) -> Callable[[], object]:
    return lambda: delay_initializers(scene.src)


def call_undelay(scene: Scene) -> Callable[[], object]:
    """undelay moves the source's external tensors into its own weights file: they are validated like any source."""
    out = scene.dst_dir / "out.onnx"
    scene.destinations += [out, scene.dst_dir / "out.onnx.data"]
    return lambda: undelay_initializers(scene.src, out, alignment=64)


def call_verify(scene: Scene) -> Callable[[], object]:
    return lambda: verify_models(scene.src, scene.src)


CALLERS = {
    "streaming": call_streaming,
    "in_memory": call_in_memory,
    "shared": call_shared,
    "delay": call_delay,
    "undelay": call_undelay,
    "verify": call_verify,
}


@dataclass(frozen=True)
class ReferenceCase:
    """A bad external reference; ``build`` writes whatever files it needs and returns the source model."""

    case_id: str
    build: Callable[[Scene], onnx.ModelProto]
    error: type[BaseException]
    fragment: str
    shared_error: type[BaseException] = DanglingReferenceError  # the saver wraps reference errors of reused tensors
    skip: tuple[str, ...] = ()  # functions for which this input is not an error (with the reason next to the case)


def bad(*pairs: tuple[str, str], keep_raw: bool = False, array: np.ndarray = BAD) -> onnx.TensorProto:
    return external_tensor("w_bad", array, pairs, keep_raw=keep_raw)


def symlinked_file(scene: Scene) -> onnx.ModelProto:
    (scene.model_dir / "link.bin").symlink_to(scene.outside / "secret.bin")
    return source_model(bad(*entries("link.bin", "0")))


def symlinked_folder(scene: Scene) -> onnx.ModelProto:
    (scene.model_dir / "shared").symlink_to(scene.outside, target_is_directory=True)
    return source_model(bad(*entries("shared/secret.bin", "0")))


def hard_linked(scene: Scene) -> onnx.ModelProto:
    os.link(scene.outside / "secret.bin", scene.model_dir / "hl.bin")
    return source_model(bad(*entries("hl.bin", "0")))


def fifo(scene: Scene) -> onnx.ModelProto:
    os.mkfifo(scene.model_dir / "pipe")
    return source_model(bad(*entries("pipe", "0")))


def directory(scene: Scene) -> onnx.ModelProto:
    (scene.model_dir / "sub").mkdir()
    return source_model(bad(*entries("sub", "0")))


def symlink_loop(scene: Scene) -> onnx.ModelProto:
    (scene.model_dir / "loop").symlink_to("loop")
    return source_model(bad(*entries("loop", "0")))


def nested_dotdot(scene: Scene) -> onnx.ModelProto:
    (scene.model_dir / "sub").mkdir()
    return source_model(bad(*entries("sub/../../outside/secret.bin", "0")))


def not_utf8(model: onnx.ModelProto, placeholder: bytes) -> onnx.ModelProto:
    """``model`` with ``placeholder`` replaced by bytes that are not UTF-8 (protobuf then hands back ``bytes``)."""
    data = model.SerializeToString()
    assert placeholder in data
    parsed = onnx.ModelProto()
    parsed.ParseFromString(data.replace(placeholder, b"\xff\xfe" + placeholder[2:]))
    return parsed


def with_typed_values(field_name: str, array: np.ndarray) -> onnx.TensorProto:
    """An EXTERNAL tensor that also holds its values in a typed field (``float_data``...)."""
    tensor = external_tensor("w_bad", array, entries())
    getattr(tensor, field_name).extend(array.ravel().tolist())
    return tensor


def negative_dims(tensor: onnx.TensorProto) -> onnx.TensorProto:
    tensor.dims[0] = -4
    return tensor


def simple(tensor_or_model: Callable[[], onnx.ModelProto]) -> Callable[[Scene], onnx.ModelProto]:
    return lambda scene: tensor_or_model()


REFERENCE_CASES = [
    ReferenceCase(
        "location-absolute",
        lambda s: source_model(bad(*entries(str(s.outside / "secret.bin"), "0"))),
        UnsafeLocationError,
        "is absolute",
    ),
    ReferenceCase(
        "location-dotdot",
        simple(lambda: source_model(bad(*entries("../outside/secret.bin", "0")))),
        UnsafeLocationError,
        "'..' component",
    ),
    ReferenceCase("location-nested-dotdot", nested_dotdot, UnsafeLocationError, "'..' component"),
    ReferenceCase(
        "location-dotdot-staying-inside",
        simple(lambda: source_model(bad(*entries("./x/../model.onnx.data")))),
        UnsafeLocationError,
        "'..' component",
    ),
    ReferenceCase("location-empty", simple(lambda: source_model(bad(*entries("")))), UnsafeLocationError, "is empty"),
    ReferenceCase(
        "location-nul", simple(lambda: source_model(bad(*entries(DATA + "\x00.txt")))), UnsafeLocationError, "NUL"
    ),
    ReferenceCase(
        "location-backslash",
        simple(lambda: source_model(bad(*entries("..\\outside\\secret.bin", "0")))),
        UnsafeLocationError,
        "backslash",
    ),
    ReferenceCase(
        "location-dot", simple(lambda: source_model(bad(*entries("./")))), UnsafeLocationError, "does not name a file"
    ),
    ReferenceCase("location-symlinked-file", symlinked_file, UnsafeLocationError, "outside the model's folder"),
    ReferenceCase("location-symlinked-folder", symlinked_folder, UnsafeLocationError, "outside the model's folder"),
    # The saver never reads a reused file, so a hard link there leaks nothing and is written as it is.
    ReferenceCase("location-hard-linked", hard_linked, UnsafeLocationError, "hard links", skip=("shared",)),
    ReferenceCase(
        "location-missing",
        simple(lambda: source_model(bad(*entries("missing.bin")))),
        FileNotFoundError,
        "does not exist",
    ),
    ReferenceCase(
        "location-through-a-file",
        simple(lambda: source_model(bad(*entries(DATA + "/x.bin")))),
        FileNotFoundError,
        "does not exist",
    ),
    ReferenceCase("location-directory", directory, ExternalDataError, "not a regular file"),
    ReferenceCase("location-fifo", fifo, ExternalDataError, "not a regular file"),
    # A loop is a symbolic link on the way: refused as any other, without following it.
    ReferenceCase("location-symlink-loop", symlink_loop, UnsafeLocationError, "symbolic link"),
    ReferenceCase(
        "location-too-long",
        simple(lambda: source_model(bad(*entries("a" * 5000)))),
        ExternalDataError,
        "cannot be accessed",
    ),
    ReferenceCase(
        "offset-negative",
        simple(lambda: source_model(bad(*entries(offset="-1")))),
        ExternalDataError,
        "must be a non-negative integer written with ASCII digits only, got '-1'",
    ),
    ReferenceCase(
        "offset-non-numeric",
        simple(lambda: source_model(bad(*entries(offset="0x40")))),
        ExternalDataError,
        "must be a non-negative integer",
    ),
    ReferenceCase(
        "offset-float",
        simple(lambda: source_model(bad(*entries(offset="64.0")))),
        ExternalDataError,
        "must be a non-negative integer",
    ),
    ReferenceCase(
        "offset-past-eof",
        simple(lambda: source_model(bad(*entries(offset="4096")))),
        ExternalDataError,
        "exceeds the size",
    ),
    ReferenceCase(
        "range-past-eof",
        simple(lambda: source_model(bad(*entries(offset="100")))),
        ExternalDataError,
        "exceeds the size",
    ),
    ReferenceCase(
        "offset-overflows-int64",
        simple(lambda: source_model(bad(*entries(offset=str(2**63))))),
        ExternalDataError,
        "does not fit in int64",
    ),
    ReferenceCase(
        "length-negative",
        simple(lambda: source_model(bad(*entries(length="-64")))),
        ExternalDataError,
        "must be a non-negative integer written with ASCII digits only, got '-64'",
    ),
    *(
        ReferenceCase(
            f"{key}-spelled-{spelling_id}",
            simple(lambda key=key, spelling=spelling: source_model(bad(*entries(**{key: spelling})))),
            ExternalDataError,
            f"external data {key!r} must be a non-negative integer written with ASCII digits only, got {spelling!r}",
        )
        # int() accepts every one of these; onnxruntime refuses them, so a model we accept must not contain them.
        for key in ("offset", "length")
        for spelling_id, spelling in (
            ("plus-sign", "+64"),
            ("plus-zero", "+0"),
            ("leading-space", " 64"),
            ("trailing-newline", "64\n"),
            ("underscore", "6_4"),
            ("arabic-indic-digits", "\u0666\u0664"),
            ("fullwidth-digits", "\uff16\uff14"),
            ("empty", ""),
        )
    ),
    ReferenceCase(
        "length-non-numeric",
        simple(lambda: source_model(bad(*entries(length="64 bytes")))),
        ExternalDataError,
        "must be a non-negative integer",
    ),
    ReferenceCase(
        "length-overflows-int64",
        simple(lambda: source_model(bad(*entries(length=str(2**64))))),
        ExternalDataError,
        "does not fit in int64",
    ),
    ReferenceCase(
        "length-shorter-than-dims-x-dtype",
        simple(lambda: source_model(bad(*entries(length="32")))),
        ExternalDataError,
        "does not match dims",
    ),
    ReferenceCase(
        "length-longer-than-dims-x-dtype",
        simple(lambda: source_model(bad(*entries(offset="0", length="128")))),
        ExternalDataError,
        "does not match dims",
    ),
    ReferenceCase(
        "unknown-key",
        simple(lambda: source_model(bad(*entries(DATA, "64", "64", ("sha256", "00"))))),
        ExternalDataError,
        "unknown external_data keys ['sha256']",
    ),
    ReferenceCase(
        "duplicated-key",
        simple(lambda: source_model(bad(*entries(DATA, "64", "64", ("location", "../outside/secret.bin"))))),
        ExternalDataError,
        "duplicated keys ['location']",
    ),
    ReferenceCase(
        "no-location-key",
        simple(lambda: source_model(bad(("offset", "64"), ("length", "64")))),
        ExternalDataError,
        "no external_data 'location'",
    ),
    ReferenceCase(
        "inline-and-external",
        simple(lambda: source_model(bad(*entries(), keep_raw=True))),
        ExternalDataError,
        "both inline raw_data",
        shared_error=ExternalDataError,
    ),
    ReferenceCase(
        "external-without-entries",
        simple(lambda: source_model(bad())),
        ExternalDataError,
        "no external_data entries",
        shared_error=ExternalDataError,
    ),
    ReferenceCase(
        "bad-tensor-in-nested-if",
        simple(lambda: if_model(bad(*entries("../outside/secret.bin", "0")))),
        UnsafeLocationError,
        "'..' component",
    ),
    # delay_initializers converts dense initializers only; sparse and attribute tensors are left to onnx's loader.
    ReferenceCase(
        "bad-sparse-initializer-values",
        simple(lambda: sparse_model(bad(*entries("../outside/secret.bin", "0")))),
        UnsafeLocationError,
        "'..' component",
        skip=("delay",),
    ),
    ReferenceCase(
        "location-dotdot-inside-a-name",  # onnx refuses any '..' substring, so such a model could never be loaded
        lambda s: (
            (s.model_dir / "w..1.bin").write_bytes((s.model_dir / DATA).read_bytes()),
            source_model(bad(*entries("w..1.bin"))),
        )[1],
        UnsafeLocationError,
        "'..' inside a name",
    ),
    ReferenceCase(
        "location-trailing-slash",
        simple(lambda: source_model(bad(*entries(DATA + "/")))),
        UnsafeLocationError,
        "does not name a file",
    ),
    ReferenceCase(
        "location-trailing-slash-dot",
        simple(lambda: source_model(bad(*entries(DATA + "/.")))),
        UnsafeLocationError,
        "does not name a file",
    ),
    ReferenceCase(
        "location-not-utf8",
        simple(lambda: not_utf8(source_model(bad(*entries("LOC~~~~.bin"))), b"LOC~~~~")),
        InvalidModelError,
        "is not valid UTF-8",
        shared_error=InvalidModelError,
    ),
    ReferenceCase(
        "tensor-name-not-utf8",
        simple(lambda: not_utf8(source_model(external_tensor("NAM~~~~", BAD, entries())), b"NAM~~~~")),
        InvalidModelError,
        "is not valid UTF-8",
        shared_error=InvalidModelError,
    ),
    *(
        ReferenceCase(
            f"external-and-{field_name}",
            simple(lambda field_name=field_name, array=array: source_model(with_typed_values(field_name, array))),
            ExternalDataError,
            f"also holds inline values in {field_name}",
            shared_error=ExternalDataError,
        )
        for field_name, array in (
            ("float_data", BAD),
            ("int32_data", BAD.astype(np.int32)),
            ("int64_data", BAD.astype(np.int64)),
            ("double_data", BAD.astype(np.float64)),
        )
    ),
    ReferenceCase(
        "negative-dims-without-length",
        simple(lambda: source_model(negative_dims(bad(*entries(length=None))))),
        ExternalDataError,
        "negative dims",
    ),
    ReferenceCase(
        "negative-dims-with-length",
        simple(lambda: source_model(negative_dims(bad(*entries())))),
        ExternalDataError,
        "negative dims",
    ),
    ReferenceCase(
        "bad-constant-attribute",
        simple(lambda: constant_model(bad(*entries(offset="4096")))),
        ExternalDataError,
        "exceeds the size",
        skip=("delay",),
    ),
]


def reference_prepare(case: ReferenceCase, function: str) -> Callable[[Scene], Callable[[], object]]:
    def prepare(scene: Scene) -> Callable[[], object]:
        write_model(scene.src, case.build(scene))
        return CALLERS[function](scene)

    return prepare


for _case in REFERENCE_CASES:
    for _function in CALLERS:
        if _function in _case.skip:
            continue
        _error = _case.shared_error if _function == "shared" else _case.error
        row(f"{_function}-{_case.case_id}", reference_prepare(_case, _function), _error, _case.fragment)


# ------------------------------------------------------------------------------------------- broken .onnx files


def model_bytes() -> bytes:
    return source_model(external_tensor("w_bad", BAD, entries())).SerializeToString()


MODEL_FILE_CASES = [
    ("onnx-truncated", lambda: model_bytes()[: len(model_bytes()) // 2], InvalidModelError, "not a valid ONNX model"),
    ("onnx-garbage", lambda: bytes(range(256)) * 4, InvalidModelError, "not a valid ONNX model"),
    ("onnx-empty", lambda: b"", InvalidModelError, "no graph"),
    ("onnx-text", lambda: b'{"graph": "not protobuf"}\n', InvalidModelError, "not a valid ONNX model"),
    ("onnx-missing", None, FileNotFoundError, "not found"),
]


def model_file_prepare(content: Callable[[], bytes] | None, function: str) -> Callable[[Scene], Callable[[], object]]:
    def prepare(scene: Scene) -> Callable[[], object]:
        if content is not None:
            scene.src.write_bytes(content())
        return CALLERS[function](scene)

    return prepare


for _case_id, _content, _error, _fragment in MODEL_FILE_CASES:
    for _function in ("streaming", "in_memory", "delay"):
        row(f"{_function}-{_case_id}", model_file_prepare(_content, _function), _error, _fragment)


# ------------------------------------------------------------------------------ aligner destinations and arguments


def valid_source(scene: Scene) -> None:
    write_model(scene.src, source_model(external_tensor("w_bad", BAD, entries())))


ALIGNERS = {
    "streaming": lambda src, onnx_path, weights=None, **kw: align_external_data_streaming(
        src, onnx_path, weights, **{"chunk_size": 16, **kw}
    ),
    "in_memory": align_external_data_in_memory,
}


def align_prepare(
    function: str,
    paths: Callable[[Scene], tuple[Path, Path | None]],
    setup: Callable[[Scene], None] | None = None,
    **kwargs: object,
) -> Callable[[Scene], Callable[[], object]]:
    def prepare(scene: Scene) -> Callable[[], object]:
        valid_source(scene)
        dst_onnx, dst_weights = paths(scene)
        scene.destinations += [dst_onnx, dst_weights or Path(f"{dst_onnx}.data")]
        if setup is not None:
            setup(scene)
        return lambda: ALIGNERS[function](scene.src, dst_onnx, dst_weights, **kwargs)

    return prepare


def default_dst(scene: Scene) -> tuple[Path, Path | None]:
    return scene.dst_dir / "out.onnx", None


def disk_full_after_reservation(scene: Scene) -> None:
    """The disk fills during the copy: the space check and preallocation pass, then every write fails with ENOSPC.

    What a filesystem without ``fallocate`` (NFS, ZFS) does when the space goes while the copy runs: no local
    filesystem does it on demand, so every way of writing bytes is made to fail and no fallback can route around it.
    """

    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for name in ("write", "pwrite", "pwritev", "writev", "copy_file_range", "sendfile"):
        if hasattr(os, name):
            scene.monkeypatch.setattr(os, name, enospc)


def failing(name: str, code: int, *, after: int = 0, times: int | None = None) -> Callable[[Scene], None]:
    """``os.<name>`` fails with ``code`` after ``after`` successful calls, ``times`` times (None: from then on).

    E.g. fsync reporting EIO for good, or one rename failing (the cleanup's own renames then work again).
    """

    def setup(scene: Scene) -> None:
        real = getattr(os, name)
        calls = []

        def flaky(*args, **kwargs):
            calls.append(args)
            if len(calls) > after and (times is None or len(calls) <= after + times):
                raise OSError(code, os.strerror(code))
            return real(*args, **kwargs)

        scene.monkeypatch.setattr(os, name, flaky)

    return setup


def failing_move(*, after: int) -> Callable[[Scene], None]:
    """The publication's move (an exchange of names, or a rename) number ``after + 1`` fails once with EIO.

    Over a previous output the moves are exchanges (``renameat2``), not ``os.replace``: over a previous output that
    references the same weights name they are the bridge ``.onnx`` (commit A), the weights copy, the final ``.onnx``.
    """

    def setup(scene: Scene) -> None:
        import onnx_light_ref.io._write.publish as publish

        real = publish._move
        calls = []

        def flaky(temp: str, final: str) -> object:
            calls.append(final)
            if len(calls) == after + 1:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(temp, final)

        scene.monkeypatch.setattr(publish, "_move", flaky)

    return setup


def swap_source_after_validation(replacement: str) -> Callable[[Scene], None]:
    """Between validation and copy, replace model.onnx.data (an attacker with write access to the model folder).

    ``replacement``: ``"symlink"`` (a symlink to outside/secret.bin) or ``"copy"`` (a new file, same bytes). The
    original is put back after the call, so the tree snapshot still proves nothing else changed.
    """

    def setup(scene: Scene) -> None:
        import onnx_light_ref.io._align as align_module

        data = scene.model_dir / DATA
        original = scene.root / "original.data.keep"
        real_plan = align_module.plan_alignment

        def plan_then_swap(*args, **kwargs):
            plan = real_plan(*args, **kwargs)
            os.link(data, original)
            if replacement == "symlink":
                data.unlink()
                data.symlink_to(scene.outside / "secret.bin")
            else:
                data.unlink()
                data.write_bytes(original.read_bytes())
            return plan

        def put_back() -> None:
            os.replace(original, data)

        scene.monkeypatch.setattr(align_module, "plan_alignment", plan_then_swap)
        scene.after_call.append(put_back)

    return setup


def previous_destination(scene: Scene) -> None:
    """A complete previous output (packed) sits at the destination: a failed run must leave it exactly as it was."""
    align_external_data_in_memory(scene.src, scene.dst_dir / "out.onnx", alignment=0)


def hard_link_source_data(scene: Scene) -> None:
    os.link(scene.model_dir / DATA, scene.dst_dir / "link.data")


def symlink_source_data(scene: Scene) -> None:
    (scene.dst_dir / "out.onnx.data").symlink_to(scene.model_dir / DATA)


ALIGN_CASES = [
    (
        "dst-weights-is-source-data",
        lambda s: (s.model_dir / "out.onnx", s.model_dir / DATA),
        None,
        {},
        DestinationConflictError,
        "would destroy the source",
    ),
    (
        "dst-weights-hard-link-of-source-data",
        lambda s: (s.dst_dir / "out.onnx", s.dst_dir / "link.data"),
        hard_link_source_data,
        {},
        DestinationConflictError,
        "hard link of it",
    ),
    (
        "dst-weights-symlink-to-source-data",
        default_dst,
        symlink_source_data,
        {},
        DestinationConflictError,
        "would destroy the source",
    ),
    (
        "dst-weights-is-source-onnx",
        lambda s: (s.model_dir / "out.onnx", s.src),
        None,
        {},
        DestinationConflictError,
        "is the source file",
    ),
    (
        "dst-onnx-is-source-data",
        lambda s: (s.model_dir / DATA, s.model_dir / "new.data"),
        None,
        {},
        DestinationConflictError,
        "is the source file",
    ),
    (
        "dst-onnx-equals-dst-weights",
        lambda s: (s.dst_dir / "out.onnx", s.dst_dir / "out.onnx"),
        None,
        {},
        DestinationConflictError,
        "are the same file",
    ),
    (
        "dst-weights-outside-dst-folder",
        lambda s: (s.dst_dir / "out.onnx", s.root / "elsewhere.data"),
        None,
        {},
        UnsafeLocationError,
        "must be inside the folder",
    ),
    (
        "dst-folder-missing",
        lambda s: (s.root / "nope" / "out.onnx", None),
        None,
        {},
        FileNotFoundError,
        "destination folder does not exist",
    ),
    # Read-only folders, full disks caught by the space check and file creations failing one after the other are
    # real in tests/fs (read-only mount, full tmpfs, tmpfs out of inodes); these rows are the write failing later.
    ("disk-full-after-reservation", default_dst, disk_full_after_reservation, {}, OSError, "No space left"),
    (
        "disk-full-after-reservation-over-previous-output",
        default_dst,
        lambda s: (previous_destination(s), disk_full_after_reservation(s)),
        {},
        OSError,
        "No space left",
    ),
    ("fsync-fails", default_dst, failing("fsync", errno.EIO), {}, OSError, "Input/output error"),
    ("rename-of-weights-fails", default_dst, failing("replace", errno.EIO), {}, OSError, "Input/output error"),
    (
        "rename-of-onnx-fails-after-weights-published",
        default_dst,
        failing("replace", errno.EIO, after=1, times=1),
        {},
        OSError,
        "Input/output error",
    ),
    *[
        (
            f"move-{index + 1}-fails-over-previous-output",  # bridge .onnx, weights copy, final .onnx
            default_dst,
            lambda s, index=index: (previous_destination(s), failing_move(after=index)(s)),
            {},
            OSError,
            "Input/output error",
        )
        for index in range(3)
    ],
    (
        "source-swapped-for-symlink-after-validation",
        default_dst,
        swap_source_after_validation("symlink"),
        {},
        ExternalDataError,
        "was replaced after it was validated",
    ),
    (
        "source-swapped-for-new-file-after-validation",
        default_dst,
        swap_source_after_validation("copy"),
        {},
        ExternalDataError,
        "was replaced after it was validated",
    ),
    ("alignment-not-power-of-two", default_dst, None, {"alignment": 3}, ValueError, "power of two"),
    ("alignment-negative", default_dst, None, {"alignment": -4096}, ValueError, "must be >= 0"),
    ("alignment-not-int", default_dst, None, {"alignment": "4096"}, ValueError, "alignment must be an int"),
    ("alignment-bool", default_dst, None, {"alignment": True}, ValueError, "alignment must be an int"),
]

for _case_id, _paths, _setup, _kwargs, _error, _fragment in ALIGN_CASES:
    for _function in ALIGNERS:
        row(f"{_function}-{_case_id}", align_prepare(_function, _paths, _setup, **_kwargs), _error, _fragment)

for _case_id, _chunk, _fragment in (
    ("zero", 0, "chunk_size must be >= 1, got 0"),
    ("negative", -1, "chunk_size must be >= 1, got -1"),
    ("float", 1.5, "chunk_size must be an int, got float 1.5"),
    ("bool", True, "chunk_size must be an int, got bool True"),
    ("none", None, "chunk_size must be an int, got NoneType None"),
):
    row(
        f"streaming-chunk-size-{_case_id}",
        align_prepare("streaming", default_dst, chunk_size=_chunk),
        ValueError,
        _fragment,
    )

for _function in ALIGNERS:
    for _case_id, _durable in (("int", 1), ("none", None), ("str", "no")):
        row(
            f"{_function}-durable-{_case_id}",
            align_prepare(_function, default_dst, durable=_durable),
            ValueError,
            f"durable must be a bool, got {type(_durable).__name__} {_durable!r}",
        )


# ------------------------------------------------------------------ shared saver: destinations and arguments


def shared_prepare(
    dst: Callable[[Scene], Path],
    setup: Callable[[Scene], None] | None = None,
    *,
    reused: bool = True,
    **kwargs: object,
) -> Callable[[Scene], Callable[[], object]]:
    """A model with one reused tensor (in model/model.onnx.data, unless ``reused=False``) and one new tensor."""

    def prepare(scene: Scene) -> Callable[[], object]:
        tensors = [good_tensor()] if reused else []
        tensors.append(numpy_helper.from_array(np.full(8, 7, np.float64), "w_new"))
        model = identity_model(tensors)
        scene.protos.append(model)
        out = dst(scene)
        scene.destinations += [out, Path(f"{out}.data")]
        if setup is not None:
            setup(scene)
        return lambda: save_model_with_shared_external_data(model, out, **{"size_threshold": 0, **kwargs})

    return prepare


def variant(scene: Scene) -> Path:
    return scene.model_dir / "variant.onnx"


def previous_variant(scene: Scene) -> None:
    """A complete previous variant (other new weights) sits at the destination; a failed save must keep it."""
    model = identity_model([good_tensor(), numpy_helper.from_array(np.arange(5, dtype=np.int16), "w_old")])
    save_model_with_shared_external_data(model, variant(scene), alignment=0, size_threshold=0)


def hard_link_in_model_dir(scene: Scene) -> None:
    os.link(scene.model_dir / DATA, scene.model_dir / "hl.data")


SHARED_CASES = [
    ("secondary-is-reused-file", variant, None, {"location": DATA}, DestinationConflictError, "would destroy"),
    (
        "secondary-hard-link-of-reused-file",
        variant,
        hard_link_in_model_dir,
        {"location": "hl.data"},
        DestinationConflictError,
        "would destroy",
    ),
    ("dst-onnx-is-reused-file", lambda s: s.model_dir / DATA, None, {}, DestinationConflictError, "reused tensor"),
    ("secondary-equals-dst-onnx", variant, None, {"location": "variant.onnx"}, DestinationConflictError, "same"),
    ("location-dotdot", variant, None, {"location": "../outside/x.data"}, UnsafeLocationError, "'..' component"),
    ("location-absolute", variant, None, {"location": "/tmp/x.data"}, UnsafeLocationError, "is absolute"),
    ("location-empty", variant, None, {"location": ""}, UnsafeLocationError, "is empty"),
    ("location-nul", variant, None, {"location": "x\x00.data"}, UnsafeLocationError, "NUL"),
    ("references-dangle-from-other-folder", lambda s: s.dst_dir / "v.onnx", None, {}, DanglingReferenceError, "dangle"),
    ("alignment-not-power-of-two", variant, None, {"alignment": 48}, ValueError, "power of two"),
    ("alignment-not-int", variant, None, {"alignment": 4096.0}, ValueError, "alignment must be an int"),
    ("size-threshold-negative", variant, None, {"size_threshold": -1}, ValueError, "size_threshold must be >= 0"),
    ("size-threshold-float", variant, None, {"size_threshold": 1.0}, ValueError, "size_threshold must be an int"),
    ("durable-int", variant, None, {"durable": 0}, ValueError, "durable must be a bool, got int 0"),
    ("durable-none", variant, None, {"durable": None}, ValueError, "durable must be a bool, got NoneType None"),
    ("check-references-int", variant, None, {"check_references": 1}, ValueError, "check_references must be a bool"),
    ("check-references-str", variant, None, {"check_references": "no"}, ValueError, "check_references must be a bool"),
    # Read-only folders and file creations failing are real in tests/fs; this row is a write failing after the check.
    ("disk-full-after-reservation", variant, disk_full_after_reservation, {}, OSError, "No space left"),
    ("fsync-fails", variant, failing("fsync", errno.EIO), {}, OSError, "Input/output error"),
    (
        "rename-of-onnx-fails-after-weights-published",
        variant,
        failing("replace", errno.EIO, after=1, times=1),
        {},
        OSError,
        "Input/output error",
    ),
    *[
        (
            f"move-{index + 1}-fails-over-previous-variant",  # bridge .onnx, weights copy, final .onnx
            variant,
            lambda s, index=index: (previous_variant(s), failing_move(after=index)(s)),
            {},
            OSError,
            "Input/output error",
        )
        for index in range(3)
    ],
]

for _case_id, _dst, _setup, _kwargs, _error, _fragment in SHARED_CASES:
    row(f"shared-{_case_id}", shared_prepare(_dst, _setup, **_kwargs), _error, _fragment)

row(
    "shared-dst-folder-missing",
    shared_prepare(lambda s: s.root / "nope" / "v.onnx", reused=False),
    FileNotFoundError,
    "destination folder does not exist",
)
row(
    "shared-model-not-a-proto",
    lambda s: lambda: save_model_with_shared_external_data(b"", s.dst_dir / "v.onnx"),
    TypeError,
    "must be an onnx.ModelProto",
)


# ------------------------------------------- shared saver: locations and reused references checked by one rule


def symlink_in_model_dir(name: str, target: str) -> Callable[[Scene], None]:
    """``model/<name>`` -> ``target`` (relative to model/, or ``outside`` for the folder that must never be written)."""

    def setup(scene: Scene) -> None:
        destination = scene.outside if target == "outside" else Path(target)
        (scene.model_dir / name).symlink_to(destination, target_is_directory=True)

    return setup


SHARED_LOCATION_CASES = [
    ("location-dotdot-inside-a-name", {"location": "w..1.bin"}, None, UnsafeLocationError, "'..' inside a name"),
    ("location-trailing-slash", {"location": "x.data/"}, None, UnsafeLocationError, "does not name a file"),
    ("location-trailing-slash-dot", {"location": "x.data/."}, None, UnsafeLocationError, "does not name a file"),
    ("location-dot", {"location": "."}, None, UnsafeLocationError, "does not name a file"),
    ("location-not-a-str", {"location": b"x.data"}, None, ArgumentTypeError, "location must be a str"),
    ("location-too-long", {"location": "x" * 256}, None, DestinationConflictError, "longer than the 255"),
    # A symlinked subfolder on the weights path is refused first (onnx would not load it: issue 18), before
    # the identity comparison that also catches it.
    (
        "location-through-self-link-to-dst-onnx",
        {"location": "self/variant.onnx"},
        symlink_in_model_dir("self", "."),
        UnsafeLocationError,
        "through the symbolic link 'self'",
    ),
    # A symlinked subfolder on the weights path is refused first (onnx would not load it: issue 18), before
    # the identity comparison that also catches it.
    (
        "location-through-self-link-to-reused-file",
        {"location": f"self/{DATA}"},
        symlink_in_model_dir("self", "."),
        UnsafeLocationError,
        "through the symbolic link 'self'",
    ),
    # A symlinked subfolder on the weights path is refused first (onnx would not load it: issue 18), before
    # the identity comparison that also catches it.
    (
        "location-through-self-link-to-reused-file-unchecked",
        {"location": f"self/{DATA}", "check_references": False},
        symlink_in_model_dir("self", "."),
        UnsafeLocationError,
        "through the symbolic link 'self'",
    ),
    (
        "location-escaping-through-symlinked-folder",
        {"location": "esc/x.data"},
        symlink_in_model_dir("esc", "outside"),
        UnsafeLocationError,
        "through a symbolic link",
    ),
    (
        "location-is-a-directory",
        {"location": "subdir"},
        lambda s: (s.model_dir / "subdir").mkdir(),
        DestinationConflictError,
        "is a directory",
    ),
]

for _case_id, _kwargs, _setup, _error, _fragment in SHARED_LOCATION_CASES:
    row(f"shared-{_case_id}", shared_prepare(variant, _setup, **_kwargs), _error, _fragment)

row(
    "shared-dst-onnx-is-a-directory",
    shared_prepare(lambda s: s.model_dir / "dir.onnx", lambda s: (s.model_dir / "dir.onnx").mkdir()),
    DestinationConflictError,
    "is a directory",
)


def unchecked_reuse(*pairs: tuple[str, str]) -> Callable[[Scene], Callable[[], object]]:
    """A variant whose reused tensor has ``pairs`` as entries, saved with check_references=False."""

    def prepare(scene: Scene) -> Callable[[], object]:
        model = identity_model(
            [external_tensor("w_reused", GOOD, pairs), numpy_helper.from_array(np.full(8, 7, np.float64), "w_new")]
        )
        scene.protos.append(model)
        out = variant(scene)
        scene.destinations += [out, Path(f"{out}.data")]
        return lambda: save_model_with_shared_external_data(model, out, check_references=False, size_threshold=0)

    return prepare


UNCHECKED_REUSE_CASES = [
    ("folder-dot", entries(f"{DATA}/.", "0"), UnsafeLocationError, "does not name a file"),
    ("trailing-slash", entries(f"{DATA}/", "0"), UnsafeLocationError, "does not name a file"),
    ("dotdot-inside-a-name", entries("w..1.bin", "0"), UnsafeLocationError, "'..' inside a name"),
    ("dotdot-component", entries("../outside/secret.bin", "0"), UnsafeLocationError, "'..' component"),
    ("absolute", entries("/etc/passwd", "0"), UnsafeLocationError, "is absolute"),
    ("unknown-key", entries(DATA, "0", "64", ("sha256", "00")), ExternalDataError, "unknown external_data keys"),
    ("no-location", [("offset", "0")], ExternalDataError, "no external_data 'location'"),
    *(
        (f"{key}-spelled-{spelling_id}", entries(**{key: spelling}), ExternalDataError, "ASCII digits only")
        for key in ("offset", "length")
        for spelling_id, spelling in (
            ("plus-zero", "+0"),
            ("leading-space", " 64"),
            ("underscore", "6_4"),
            ("arabic-indic-digits", "\u0666\u0664"),
        )
    ),
]

for _case_id, _pairs, _error, _fragment in UNCHECKED_REUSE_CASES:
    row(f"shared-unchecked-reuse-{_case_id}", unchecked_reuse(*_pairs), _error, _fragment)


# ---------------------------------------------------------------------------------------- undelay destinations


def undelay_prepare(
    dst: Callable[[Scene], tuple[Path, Path | None]], setup: Callable[[Scene], None] | None = None
) -> Callable[[Scene], Callable[[], object]]:
    def prepare(scene: Scene) -> Callable[[], object]:
        valid_source(scene)
        dst_onnx, dst_weights = dst(scene)
        if setup is not None:
            setup(scene)
        # Outputs absent now must stay absent; one that exists (a source reached through a link) is in the snapshot.
        outputs = [dst_onnx, dst_weights or Path(f"{dst_onnx}.data")]
        scene.destinations += [path for path in outputs if not os.path.lexists(path)]
        return lambda: undelay_initializers(scene.src, dst_onnx, dst_weights)

    return prepare


def self_link_in_dst(scene: Scene) -> None:
    (scene.dst_dir / "self").symlink_to(".", target_is_directory=True)


UNDELAY_CASES = [
    # A symlinked subfolder on the weights path is refused first (onnx would not load it: issue 18), before
    # the identity comparison that also catches it.
    (
        "weights-reach-dst-onnx-through-self-link",
        lambda s: (s.dst_dir / "out.onnx", s.dst_dir / "self" / "out.onnx"),
        self_link_in_dst,
        UnsafeLocationError,
        "through the symbolic link 'self'",
    ),
    (
        "weights-escape-through-symlinked-folder",
        lambda s: (s.dst_dir / "out.onnx", s.dst_dir / "esc" / "w.bin"),
        lambda s: (s.dst_dir / "esc").symlink_to(s.outside, target_is_directory=True),
        UnsafeLocationError,
        "through a symbolic link",
    ),
    (
        "weights-dotdot-inside-a-name",
        lambda s: (s.dst_dir / "out.onnx", s.dst_dir / "w..1.bin"),
        None,
        UnsafeLocationError,
        "'..' inside a name",
    ),
    (
        "dst-onnx-is-a-directory",
        lambda s: (s.dst_dir / "out.onnx", None),
        lambda s: (s.dst_dir / "out.onnx").mkdir(),
        DestinationConflictError,
        "is a directory",
    ),
    # A symlinked subfolder on the weights path is refused first (onnx would not load it: issue 18), before
    # the identity comparison that also catches it.
    (
        "dst-weights-is-source-data-through-self-link",
        lambda s: (s.model_dir / "out.onnx", s.model_dir / "self" / DATA),
        lambda s: (s.model_dir / "self").symlink_to(".", target_is_directory=True),
        UnsafeLocationError,
        "through the symbolic link 'self'",
    ),
    (
        "dst-onnx-name-too-long",
        lambda s: (s.dst_dir / ("o" * 256), s.dst_dir / "w.bin"),
        None,
        DestinationConflictError,
        "longer than the 255",
    ),
]

for _case_id, _dst, _setup, _error, _fragment in UNDELAY_CASES:
    row(f"undelay-{_case_id}", undelay_prepare(_dst, _setup), _error, _fragment)


# ------------------------------------------- model files whose names make onnx pick a text parser: always binary


def text_named_source(suffix: str, function: str) -> Callable[[Scene], Callable[[], object]]:
    def prepare(scene: Scene) -> Callable[[], object]:
        src = scene.model_dir / f"model{suffix}"
        src.write_bytes(b'ir_version: 10\ngraph { name: "text" }\n')
        out = scene.dst_dir / "out.onnx"
        scene.destinations += [out, scene.dst_dir / "out.onnx.data"]
        calls: dict[str, Callable[[], object]] = {
            "streaming": lambda: align_external_data_streaming(src, out),
            "in_memory": lambda: align_external_data_in_memory(src, out),
            "delay": lambda: delay_initializers(src),
            "undelay": lambda: undelay_initializers(src, out),
            "verify": lambda: verify_models(src, src),
        }
        return calls[function]

    return prepare


for _suffix in (".json", ".textproto", ".onnxtxt", ".txt"):
    for _function in ("streaming", "in_memory", "delay", "undelay", "verify"):
        row(
            f"{_function}-text-file-named{_suffix.replace('.', '-')}",
            text_named_source(_suffix, _function),
            InvalidModelError,
            "not a valid ONNX model",
        )


# --------------------------------------------------------------------------------------- verify_models arguments


def verify_prepare(**kwargs: object) -> Callable[[Scene], Callable[[], object]]:
    def prepare(scene: Scene) -> Callable[[], object]:
        return lambda: verify_models(scene.src, scene.src, **kwargs)  # type: ignore[arg-type]

    return prepare


for _case_id, _chunk, _fragment in (
    # Two 64 GiB buffers used to be allocated up front: a MemoryError traceback instead of a typed refusal.
    ("huge", 64 * 2**30, f"chunk_size must be <= {MAX_CHUNK_SIZE}, got {64 * 2**30}."),
    ("over-max-by-one", MAX_CHUNK_SIZE + 1, f"chunk_size must be <= {MAX_CHUNK_SIZE}, got {MAX_CHUNK_SIZE + 1}."),
    ("zero", 0, "chunk_size must be >= 1, got 0"),
    ("float", 1.5, "chunk_size must be an int, got float 1.5"),
    ("bool", True, "chunk_size must be an int, got bool True"),
):
    row(f"verify-chunk-size-{_case_id}", verify_prepare(chunk_size=_chunk), ValueError, _fragment)


# ------------------------------------------------------------------------------- delay_initializers arguments


def delay_prepare(
    model: Callable[[Scene], onnx.ModelProto], as_proto: bool = False, **kwargs: object
) -> Callable[[Scene], Callable[[], object]]:
    def prepare(scene: Scene) -> Callable[[], object]:
        proto = model(scene)
        if as_proto:
            scene.protos.append(proto)
            return lambda: delay_initializers(proto, **kwargs)
        write_model(scene.src, proto)
        return lambda: delay_initializers(scene.src, **kwargs)

    return prepare


def valid_model(scene: Scene) -> onnx.ModelProto:
    return source_model(external_tensor("w_bad", BAD, entries()))


def wrong_ai_rt_version(scene: Scene) -> onnx.ModelProto:
    model = valid_model(scene)
    model.opset_import.append(helper.make_opsetid("ai.rt", 2))
    return model


DELAY_CASES = [
    ("load-device-unknown", delay_prepare(valid_model, load_device="gpu"), ValueError, "load_device must be one of"),
    ("min-size-negative", delay_prepare(valid_model, min_size=-1), ValueError, "min_size must be"),
    ("min-size-not-int", delay_prepare(valid_model, min_size="64"), ValueError, "min_size must be"),
    ("proto-without-base-dir", delay_prepare(valid_model, as_proto=True), ValueError, "base_dir is required"),
    (
        "proto-with-wrong-base-dir",
        delay_prepare(valid_model, as_proto=True, base_dir="/nonexistent-dir"),
        FileNotFoundError,
        "does not exist",
    ),
    # bfloat16/float8/int4 initializers are no longer refused: delay_initializers keeps them (issue 15).
    ("ai-rt-opset-version-2", delay_prepare(wrong_ai_rt_version), ValueError, "only version 1"),
    ("not-a-model", lambda s: lambda: delay_initializers(42), TypeError, "must be an onnx.ModelProto or a path"),
]

for _case_id, _prepare, _error, _fragment in DELAY_CASES:
    row(f"delay-{_case_id}", _prepare, _error, _fragment)


# --------------------------------------------------------------------------------------- the DelayedInitializer op

OP_DEFAULTS: dict[str, object] = {
    "shape": [4, 4],
    "dtype": onnx.TensorProto.FLOAT,
    "load_device": "file",
    "runtime_device": "cpu",
    "filename": DATA,
    "offset": 64,
}
_MISSING = object()


def op_model(**overrides: object) -> onnx.ModelProto:
    attributes = {**OP_DEFAULTS, **overrides}
    node = helper.make_node("DelayedInitializer", [], ["y"], domain="ai.rt", name="delayed")
    for name, value in attributes.items():
        if value is _MISSING:
            continue
        if isinstance(value, onnx.AttributeProto):  # built by hand: what make_attribute cannot make
            node.attribute.append(value)
        elif name == "shape" and value == []:
            node.attribute.append(helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS))
        else:
            node.attribute.append(helper.make_attribute(name, value))
    graph = helper.make_graph([node], "op", [], [helper.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.rt", 1)], ir_version=10
    )


def op_prepare(setup: Callable[[Scene], None] | None = None, **overrides: object):
    """Build the evaluator and run it (either may raise: ``cpu`` reads at construction, ``file`` at every run)."""

    def prepare(scene: Scene) -> Callable[[], object]:
        if setup is not None:
            setup(scene)
        model = op_model(**overrides)
        kernel = DelayedInitializer.bind(scene.model_dir)
        return lambda: ReferenceEvaluator(model, new_ops=[kernel]).run(None, {})

    return prepare


def shrinks_between_runs(scene: Scene) -> Callable[[], object]:
    """``file`` mode: the first run reads the tensor, then the file is truncated under the live evaluator."""
    evaluator = ReferenceEvaluator(op_model(), new_ops=[DelayedInitializer.bind(scene.model_dir)])
    (first,) = evaluator.run(None, {})
    np.testing.assert_array_equal(first, BAD)
    with open(scene.model_dir / DATA, "r+b") as data_file:
        data_file.truncate(100)
    return lambda: evaluator.run(None, {})


def grows_then_points_past_end_cpu(scene: Scene) -> Callable[[], object]:
    """``cpu`` mode reads once; a second evaluator built after the file shrank must refuse, naming the size."""
    ReferenceEvaluator(op_model(load_device="cpu"), new_ops=[DelayedInitializer.bind(scene.model_dir)])
    with open(scene.model_dir / DATA, "r+b") as data_file:
        data_file.truncate(64)
    return lambda: ReferenceEvaluator(op_model(load_device="cpu"), new_ops=[DelayedInitializer.bind(scene.model_dir)])


OP_CASES = [
    ("missing-shape", op_prepare(shape=_MISSING), ValueError, "missing required attribute(s) 'shape'"),
    ("missing-filename", op_prepare(filename=_MISSING), ValueError, "missing required attribute(s) 'filename'"),
    ("missing-offset", op_prepare(offset=_MISSING), ValueError, "missing required attribute(s) 'offset'"),
    ("shape-not-ints", op_prepare(shape=4), ValueError, "'shape' must be INTS"),
    ("dtype-not-int", op_prepare(dtype=1.0), ValueError, "'dtype' must be INT"),
    ("load-device-not-string", op_prepare(load_device=1), ValueError, "'load_device' must be STRING"),
    ("runtime-device-not-string", op_prepare(runtime_device=[1]), ValueError, "'runtime_device' must be STRING"),
    ("filename-not-string", op_prepare(filename=7), ValueError, "'filename' must be STRING"),
    ("offset-not-int", op_prepare(offset="64"), ValueError, "'offset' must be INT"),
    (
        "offset-type-undefined",  # onnx's OpRun raised KeyError: 0
        op_prepare(offset=onnx.AttributeProto(name="offset", type=onnx.AttributeProto.UNDEFINED, i=64)),
        ValueError,
        "DelayedInitializer node 'delayed': attribute 'offset' has type UNDEFINED",
    ),
    (
        "filename-not-utf8",  # onnx's OpRun raised a bare UnicodeDecodeError
        op_prepare(filename=onnx.AttributeProto(name="filename", type=onnx.AttributeProto.STRING, s=b"w\xff.bin")),
        ValueError,
        "DelayedInitializer node 'delayed': attribute 'filename' is not valid UTF-8",
    ),
    ("load-device-unknown", op_prepare(load_device="gpu"), ValueError, "load_device must be 'cpu' or 'file'"),
    ("runtime-device-unknown", op_prepare(runtime_device="cuda"), ValueError, "runtime_device must be 'cpu'"),
    ("filename-empty", op_prepare(filename=""), ValueError, "filename must not be empty"),
    ("filename-nul", op_prepare(filename=DATA + "\x00x"), ValueError, "NUL byte"),
    ("offset-negative", op_prepare(offset=-1), ValueError, "offset must be non-negative"),
    ("shape-negative-dim", op_prepare(shape=[4, -4]), ValueError, "negative dimensions"),
    ("dtype-string", op_prepare(dtype=onnx.TensorProto.STRING), ValueError, "is not supported"),
    ("dtype-undefined", op_prepare(dtype=onnx.TensorProto.UNDEFINED), ValueError, "is not supported"),
    ("dtype-unknown", op_prepare(dtype=999), ValueError, "is not supported"),
    ("size-overflows-int64", op_prepare(shape=[2**40, 2**30]), ValueError, "must fit in int64"),
    ("offset-plus-size-overflows-int64", op_prepare(offset=2**63 - 8), ValueError, "must fit in int64"),
    ("filename-dotdot", op_prepare(filename="../outside/secret.bin"), UnsafeLocationError, "'..' component"),
    ("filename-nested-dotdot", op_prepare(filename="a/../../outside/secret.bin"), UnsafeLocationError, "'..'"),
    ("filename-backslash", op_prepare(filename="..\\outside\\secret.bin"), UnsafeLocationError, "backslash"),
    (
        "filename-symlinked-file",
        op_prepare(lambda s: (s.model_dir / "link.bin").symlink_to(s.outside / "secret.bin"), filename="link.bin"),
        UnsafeLocationError,
        "outside the model's folder",
    ),
    (
        "filename-symlinked-folder-cpu",
        op_prepare(lambda s: (s.model_dir / "sh").symlink_to(s.outside), filename="sh/secret.bin", load_device="cpu"),
        UnsafeLocationError,
        "outside the model's folder",
    ),
    (
        "filename-hard-linked",
        op_prepare(lambda s: os.link(s.outside / "secret.bin", s.model_dir / "hl.bin"), filename="hl.bin", offset=0),
        UnsafeLocationError,
        "hard links",
    ),
    (
        "filename-hard-linked-cpu",
        op_prepare(
            lambda s: os.link(s.outside / "secret.bin", s.model_dir / "hl.bin"),
            filename="hl.bin",
            offset=0,
            load_device="cpu",
        ),
        UnsafeLocationError,
        "hard links",
    ),
    ("file-missing-file-mode", op_prepare(filename="missing.bin"), FileNotFoundError, "does not exist"),
    ("file-missing-cpu-mode", op_prepare(filename="missing.bin", load_device="cpu"), FileNotFoundError, "not exist"),
    ("offset-past-eof", op_prepare(offset=4096), ValueError, "too short"),
    ("range-past-eof-cpu", op_prepare(offset=100, load_device="cpu"), ValueError, "too short"),
    ("file-is-a-directory", op_prepare(lambda s: (s.model_dir / "d").mkdir(), filename="d"), ValueError, "regular"),
    (
        "file-is-a-fifo",
        op_prepare(lambda s: os.mkfifo(s.model_dir / "p"), filename="p", load_device="cpu"),
        ValueError,
        "not a regular file",
    ),
    ("file-shrinks-between-runs", shrinks_between_runs, ValueError, "too short"),
    ("file-shrank-before-cpu-load", grows_then_points_past_end_cpu, ValueError, "too short"),
]

for _case_id, _prepare, _error, _fragment in OP_CASES:
    row(f"op-{_case_id}", _prepare, _error, _fragment)


def test_matrix_covers_every_function_with_enough_rows():
    """The issue asks for at least 40 rows across the five entry points; count them per function."""
    counts: dict[str, int] = {}
    for param in ROWS:
        function = param.id.split("-")[0]
        counts[function] = counts.get(function, 0) + 1
    assert set(counts) == {"streaming", "in_memory", "shared", "delay", "undelay", "verify", "op"}
    assert sum(counts.values()) >= 40
    assert all(count >= 8 for count in counts.values()), counts
