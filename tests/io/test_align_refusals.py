"""Every refusal of the aligners: the documented error, a message that names the problem, and nothing written.

The story of each test: a model folder ``model/`` (``model.onnx`` pointing at ``w.bin``) next to an ``outside/``
folder holding a secret file; one thing is wrong; both aligners must raise before touching the disk, so the hash
snapshot of the whole tree (sources, outside file, destination folder) is identical before and after.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.errors import DestinationConflictError, ExternalDataError, InvalidModelError, UnsafeLocationError
from onnx_light_ref.io._arguments import ArgumentTypeError
from onnx_light_ref.io._write import publish
from tests.checks import dead_pid

WEIGHTS = np.arange(16, dtype=np.float32)  # 64 bytes in model/w.bin


def write_model(folder: Path, entries: dict[str, str], *, dims: tuple[int, ...] = (16,), name: str = "model.onnx"):
    """``folder/name`` whose one initializer ``w`` (float32, ``dims``) has exactly these external_data ``entries``."""
    tensor = numpy_helper.from_array(np.zeros(dims, dtype=np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(dims))],
        initializer=[tensor],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=10)
    onnx.save_model(model, str(folder / name))
    return folder / name


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """``model/model.onnx`` + ``model/w.bin`` (valid), ``outside/secret.bin``; returns the model folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(WEIGHTS.tobytes())
    write_model(folder, {"location": "w.bin", "offset": "0", "length": "64"})
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(b"secret" * 20)
    return folder


def _bad_entries(entries: dict[str, str], dims: tuple[int, ...] = (16,)) -> Callable[[Path], dict]:
    def setup(folder: Path) -> dict:
        write_model(folder, entries, dims=dims)
        return {}

    return setup


def _args(**kwargs: object) -> Callable[[Path], dict]:
    return lambda folder: kwargs


def _symlinked_file(folder: Path) -> dict:
    os.symlink(folder.parent / "outside" / "secret.bin", folder / "link.bin")
    write_model(folder, {"location": "link.bin", "length": "64"})
    return {}


def _symlinked_folder(folder: Path) -> dict:
    os.symlink(folder.parent / "outside", folder / "linkdir")
    write_model(folder, {"location": "linkdir/secret.bin", "length": "64"})
    return {}


def _hard_linked_source(folder: Path) -> dict:
    os.link(folder / "w.bin", folder.parent / "outside" / "w-link.bin")
    return {}


def _dst_weights_is_source(folder: Path) -> dict:
    return {"dst_weights_path": folder / "w.bin"}


def _dst_weights_is_hard_link_of_source(folder: Path) -> dict:
    os.link(folder / "w.bin", folder / "w-link.bin")
    return {"dst_weights_path": folder / "w-link.bin"}


def _dst_weights_is_symlink_to_source(folder: Path) -> dict:
    os.symlink("w.bin", folder / "w-sym.bin")
    return {"dst_weights_path": folder / "w-sym.bin"}


def _default_weights_collide_with_source(folder: Path) -> dict:
    # onnx's own default name: model.onnx + model.onnx.data, re-aligned in place with the default dst weights.
    os.rename(folder / "w.bin", folder / "model.onnx.data")
    write_model(folder, {"location": "model.onnx.data", "length": "64"})
    return {"dst_onnx_path": folder / "model.onnx"}


def _dst_weights_outside(folder: Path) -> dict:
    return {"dst_weights_path": folder.parent / "outside" / "new.bin"}


def _dst_weights_is_source_model(folder: Path) -> dict:
    return {"dst_weights_path": folder / "model.onnx", "dst_onnx_path": folder / "out.onnx"}


def _missing_model(folder: Path) -> dict:
    return {"src_onnx_path": folder / "nope.onnx"}


def _not_a_model(folder: Path) -> dict:
    (folder / "garbage.onnx").write_bytes(b"\xff\x00 not a protobuf \xff" * 3)
    return {"src_onnx_path": folder / "garbage.onnx"}


# case: (setup, error type, fragments the message must contain)
REFUSALS = {
    "alignment 3": (_args(alignment=3), ValueError, ["alignment", "power of two", "3"]),
    "alignment -1": (_args(alignment=-1), ValueError, ["alignment", "-1"]),
    "alignment '4096'": (_args(alignment="4096"), ValueError, ["alignment", "int", "str"]),
    "alignment 4096.0": (_args(alignment=4096.0), ValueError, ["alignment", "float"]),
    "chunk_size 0": (_args(chunk_size=0), ValueError, ["chunk_size", "0"]),
    "chunk_size -5": (_args(chunk_size=-5), ValueError, ["chunk_size", "-5"]),
    "align_threshold -1": (_args(align_threshold=-1), ValueError, ["align_threshold", ">= 0", "-1"]),
    "align_threshold '1M'": (_args(align_threshold="1M"), ArgumentTypeError, ["align_threshold", "int", "str"]),
    "align_threshold None": (_args(align_threshold=None), ArgumentTypeError, ["align_threshold", "int", "None"]),
    "max_shard_size 0": (_args(max_shard_size=0), ValueError, ["max_shard_size", ">= 1", "0"]),
    "max_shard_size -4096": (_args(max_shard_size=-4096), ValueError, ["max_shard_size", "-4096"]),
    "max_shard_size 1.5": (_args(max_shard_size=1.5), ArgumentTypeError, ["max_shard_size", "int", "float"]),
    "dedup 1": (_args(dedup=1), ArgumentTypeError, ["dedup", "bool", "int"]),
    "dedup 'yes'": (_args(dedup="yes"), ArgumentTypeError, ["dedup", "bool", "str"]),
    "size_threshold -1": (_args(size_threshold=-1), ValueError, ["size_threshold", ">= 0", "-1"]),
    "size_threshold '1K'": (_args(size_threshold="1K"), ArgumentTypeError, ["size_threshold", "int", "str"]),
    "size_threshold True": (_args(size_threshold=True), ArgumentTypeError, ["size_threshold", "int", "bool"]),
    "'..' location": (
        _bad_entries({"location": "../outside/secret.bin", "length": "64"}),
        UnsafeLocationError,
        ["'w'", "'..'"],
    ),
    "absolute location": (
        _bad_entries({"location": "/etc/hostname", "length": "64"}),
        UnsafeLocationError,
        ["'w'", "absolute"],
    ),
    "empty location": (_bad_entries({"location": "", "length": "64"}), UnsafeLocationError, ["'w'", "empty"]),
    "no location": (_bad_entries({"length": "64"}), ExternalDataError, ["'w'", "location"]),
    "symlink escaping": (_symlinked_file, UnsafeLocationError, ["'w'", "link.bin", "outside the model's folder"]),
    "symlinked folder escaping": (_symlinked_folder, UnsafeLocationError, ["'w'", "linkdir/secret.bin", "outside"]),
    "missing file": (_bad_entries({"location": "gone.bin", "length": "64"}), FileNotFoundError, ["'w'", "gone.bin"]),
    "folder as file": (
        _bad_entries({"location": ".", "length": "64"}),
        UnsafeLocationError,
        ["'w'", "names a folder"],
    ),
    "offset past the end": (
        _bad_entries({"location": "w.bin", "offset": "65", "length": "0"}, dims=(0,)),
        ExternalDataError,
        ["'w'", "w.bin", "offset 65", "64 bytes"],
    ),
    "range past the end": (
        _bad_entries({"location": "w.bin", "offset": "8", "length": "64"}),
        ExternalDataError,
        ["'w'", "w.bin", "offset 8", "+64", "64 bytes"],
    ),
    "length vs dims": (
        _bad_entries({"location": "w.bin", "length": "60"}),
        ExternalDataError,
        ["'w'", "w.bin", "length 60", "[16]", "64 bytes"],
    ),
    "negative offset": (
        _bad_entries({"location": "w.bin", "offset": "-1", "length": "64"}),
        ExternalDataError,
        ["'w'", "-1"],
    ),
    "offset not a number": (
        _bad_entries({"location": "w.bin", "offset": "0x10", "length": "64"}),
        ExternalDataError,
        ["'0x10'"],
    ),
    "unknown key": (_bad_entries({"location": "w.bin", "length": "64", "sha": "x"}), ExternalDataError, ["'w'", "sha"]),
    "hard-linked source": (_hard_linked_source, UnsafeLocationError, ["'w'", "w.bin", "hard links"]),
    "dst weights == source weights": (
        _dst_weights_is_source,
        DestinationConflictError,
        ["w.bin", "is the source file", "destroy"],
    ),
    "dst weights hard link of source": (
        _dst_weights_is_hard_link_of_source,
        DestinationConflictError,
        ["w-link.bin", "w.bin", "hard link", "is the source file"],
    ),
    "dst weights symlink to source": (
        _dst_weights_is_symlink_to_source,
        DestinationConflictError,
        ["w-sym.bin", "symlink", "is the source file"],
    ),
    "default <dst>.data is the source": (
        _default_weights_collide_with_source,
        DestinationConflictError,
        ["model.onnx.data", "is the source file"],
    ),
    "dst weights is the source model": (
        _dst_weights_is_source_model,
        DestinationConflictError,
        ["model.onnx", "is the source file"],
    ),
    "dst weights outside the folder": (
        _dst_weights_outside,
        UnsafeLocationError,
        ["new.bin", "outside the destination model's folder"],
    ),
    "dst weights name with '..'": (
        _args(dst_weights_path="WEIGHTS_WITH_DOTDOT"),
        UnsafeLocationError,
        ["'my..w.bin'", "onnx refuses"],
    ),
    "dst weights == dst model": (_args(dst_weights_path="SAME"), DestinationConflictError, ["same file"]),
    "missing model": (_missing_model, FileNotFoundError, ["nope.onnx"]),
    "not a model": (_not_a_model, ValueError, ["garbage.onnx", "not a valid ONNX model"]),
}


def _call(aligner: str, folder: Path, overrides: dict) -> int:
    arguments = {"src_onnx_path": folder / "model.onnx", "dst_onnx_path": folder / "out.onnx", **overrides}
    if arguments.get("dst_weights_path") == "SAME":
        arguments["dst_weights_path"] = arguments["dst_onnx_path"]
    if arguments.get("dst_weights_path") == "WEIGHTS_WITH_DOTDOT":
        arguments["dst_weights_path"] = folder / "my..w.bin"
    if aligner == "streaming":
        return align_external_data_streaming(**arguments)
    return align_external_data_in_memory(**arguments)


# Only the streaming aligner has a chunk size.
CASES = [
    (case, aligner)
    for case in REFUSALS
    for aligner in ("streaming", "in_memory")
    if not (aligner == "in_memory" and case.startswith("chunk_size"))
]


@pytest.mark.parametrize(("case", "aligner"), CASES)
def test_refusal_raises_and_writes_nothing(tmp_path, layout, sha256_of_tree, assert_no_temp_files, case, aligner):
    setup, error, fragments = REFUSALS[case]
    overrides = setup(layout)
    before = sha256_of_tree(tmp_path)

    with pytest.raises(error) as raised:
        _call(aligner, layout, overrides)

    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_every_refusal_is_a_value_error_or_a_missing_file():
    """Callers can catch ValueError (bad input) and FileNotFoundError (missing input) and nothing else."""
    for setup, error, _ in REFUSALS.values():
        assert issubclass(error, (ValueError, FileNotFoundError)), setup


def test_a_refused_run_keeps_a_previous_destination_intact(tmp_path, layout, sha256_of_tree):
    """A destination that already exists from an earlier run is neither truncated nor replaced by a failed run."""
    align_external_data_streaming(layout / "model.onnx", layout / "out.onnx", alignment=64)
    write_model(layout, {"location": "w.bin", "length": "60"})  # now inconsistent
    before = sha256_of_tree(tmp_path)

    with pytest.raises(ExternalDataError):
        align_external_data_streaming(layout / "model.onnx", layout / "out.onnx", alignment=64)

    assert sha256_of_tree(tmp_path) == before
    reloaded = onnx.load_model(str(layout / "out.onnx"))
    np.testing.assert_array_equal(numpy_helper.to_array(reloaded.graph.initializer[0]), WEIGHTS)


def test_an_io_error_during_the_copy_leaves_no_output_and_no_temp_file(
    tmp_path, layout, sha256_of_tree, assert_no_temp_files, monkeypatch
):
    import errno

    def failing_copy(*args):
        raise OSError(errno.EIO, "simulated disk error")

    monkeypatch.setattr(os, "copy_file_range", failing_copy)
    before = sha256_of_tree(tmp_path)

    with pytest.raises(OSError, match="simulated disk error"):
        align_external_data_streaming(layout / "model.onnx", layout / "out.onnx", alignment=64)

    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_a_missing_destination_folder_is_refused_before_copying(tmp_path, layout, sha256_of_tree):
    before = sha256_of_tree(tmp_path)

    with pytest.raises(FileNotFoundError, match=r"folder of destination .* does not exist"):
        align_external_data_streaming(layout / "model.onnx", layout / "out.onnx", layout / "missing" / "w.bin")

    assert sha256_of_tree(tmp_path) == before


@pytest.mark.parametrize("aligner", ["streaming", "in_memory"])
@pytest.mark.parametrize("missing", ["model folder", "weights folder"])
def test_the_python_api_never_creates_a_destination_folder(
    tmp_path, layout, sha256_of_tree, assert_no_temp_files, aligner, missing
):
    """Only the command line creates folders; a library call with a missing folder raises and writes nothing."""
    overrides = {"dst_onnx_path": layout / "missing" / "out.onnx"}
    if missing == "weights folder":
        overrides = {"dst_weights_path": layout / "missing" / "w.bin"}
    before = sha256_of_tree(tmp_path)

    with pytest.raises(FileNotFoundError, match=r"folder of destination .* does not exist") as raised:
        _call(aligner, layout, overrides)

    assert str(layout / "missing") in str(raised.value)
    assert not (layout / "missing").exists()
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


@pytest.mark.parametrize("aligner", ["streaming", "in_memory"])
@pytest.mark.parametrize(
    "option", [{"align_threshold": -1}, {"max_shard_size": 0}, {"dedup": None}, {"size_threshold": -2}]
)
def test_layout_options_are_checked_before_the_source_is_read(tmp_path, aligner, option):
    """A bad option is reported even when the source does not exist: nothing was opened."""
    function = align_external_data_streaming if aligner == "streaming" else align_external_data_in_memory
    with pytest.raises(ValueError, match=next(iter(option))):
        function(tmp_path / "missing.onnx", tmp_path / "out.onnx", **option)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("aligner", ["streaming", "in_memory"])
@pytest.mark.parametrize("destination", ["out.onnx.data", "out.onnx"])
def test_a_source_named_like_a_dead_writers_temp_file_is_never_swept(
    tmp_path, layout, sha256_of_tree, aligner, destination
):
    """The stale-temp sweep of each output keeps the job's sources, whatever their names (publish's ``keep``)."""
    lookalike = f".olr~{publish._name_tag(destination)}~{dead_pid()}~{'ab' * 8}.tmp"
    os.rename(layout / "w.bin", layout / lookalike)
    write_model(layout, {"location": lookalike, "offset": "0", "length": "64"})
    sources = sha256_of_tree(layout)

    _call(aligner, layout, {"dst_onnx_path": layout / "out.onnx"})

    assert (layout / lookalike).read_bytes() == WEIGHTS.tobytes()
    assert {name: digest for name, digest in sha256_of_tree(layout).items() if name in sources} == sources
    assert (layout / "out.onnx.data").read_bytes()[:64] == WEIGHTS.tobytes()


@pytest.mark.parametrize("aligner", ["streaming", "in_memory"])
def test_a_non_utf8_tensor_name_is_refused_when_inline_tensors_move_out(
    tmp_path, sha256_of_tree, assert_no_temp_files, aligner
):
    """The stripped parse (streaming with ``size_threshold``) refuses a non-UTF-8 name like the whole parse does."""
    folder = tmp_path / "model"
    folder.mkdir()
    tensor = numpy_helper.from_array(np.arange(256, dtype=np.float32), "NAME_A")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["NAME_A"], ["y"])],
        "g",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [256])],
        initializer=[tensor],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=10)
    (folder / "model.onnx").write_bytes(model.SerializeToString().replace(b"NAME_A", b"N\xffME_A"))
    before = sha256_of_tree(tmp_path)

    with pytest.raises(InvalidModelError, match=re.escape("is not valid UTF-8 (b'N\\xffME_A')")):
        _call(aligner, folder, {"dst_onnx_path": folder / "out.onnx", "size_threshold": 0})

    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)
