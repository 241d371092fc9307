"""io/destinations: the location a writer stores, and outputs compared by real identity, before anything is written.

Every case builds real folders, files and symlinks in ``tmp_path`` and checks the exception type, the message and
that the tree did not change (these functions only ``stat``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onnx_light_ref.errors import DestinationConflictError, UnsafeLocationError
from onnx_light_ref.io._plan.destinations import check_outputs, destination_key, weights_location
from onnx_light_ref.io._read.locations import FileIdentity, file_identity
from tests.checks import sha256_of_tree


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """``out/`` with ``self -> .`` (an alias of itself), ``sub/`` (with ``sub/self -> .``) and
    ``escape -> ../elsewhere``."""
    folder = tmp_path / "out"
    (folder / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (folder / "self").symlink_to(".", target_is_directory=True)
    (folder / "escape").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (folder / "sub" / "self").symlink_to(".", target_is_directory=True)
    return folder


@pytest.mark.parametrize(
    ("weights", "location"),
    [("m.onnx.data", "m.onnx.data"), ("sub/w.bin", "sub/w.bin"), ("./w.bin", "w.bin"), ("sub//w.bin", "sub/w.bin")],
)
def test_weights_inside_the_folder_get_a_relative_location(out: Path, weights: str, location: str):
    assert weights_location(str(out / "m.onnx"), f"{out}/{weights}") == location


@pytest.mark.parametrize(
    ("weights", "fragment"),
    [
        ("../w.bin", "is outside the destination model's folder"),
        ("/etc/w.bin", "is outside the destination model's folder"),
        ("escape/w.bin", "outside the destination model's folder"),
        ("escape/sub/../w.bin", "through a symbolic link"),
        # A symlinked subfolder staying inside the folder: onnx refuses it all the same ("kernel rejected path").
        ("self/w.bin", "through the symbolic link 'self'"),
        ("sub/self/w.bin", "through the symbolic link 'sub/self'"),
        ("w..1.bin", "'..' inside a name"),
        ("sub/a..b", "'..' inside a name"),
        ("w.bin/", "names a folder"),
        ("w.bin/.", "names a folder"),
        ("sub/..", "names a folder"),
        ("w\\x.bin", "backslash"),
    ],
)
def test_unsafe_weights_paths_are_refused(out: Path, weights: str, fragment: str):
    before = sha256_of_tree(out.parent)
    path = weights if weights.startswith("/") else f"{out}/{weights}"
    with pytest.raises(UnsafeLocationError) as raised:
        weights_location(str(out / "m.onnx"), path)
    assert fragment in str(raised.value), raised.value
    assert sha256_of_tree(out.parent) == before


def test_a_weights_name_that_is_not_utf8_is_refused_by_the_aligners_before_writing(out: Path, tmp_path: Path):
    """``os.fsdecode(b"w\\xff.bin")`` (a surrogate escape): a protobuf string must be UTF-8, so it cannot be a
    location; refused with a typed error (was a raw UnicodeEncodeError after the plan), nothing written."""
    import numpy as np

    from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming
    from tests.models import external_tensor, identity_model, write_model

    src = tmp_path / "src"
    src.mkdir()
    (src / "w.data").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    entries = [("location", "w.data"), ("offset", "0"), ("length", "16")]
    write_model(src / "m.onnx", identity_model([external_tensor("w", np.arange(4, dtype=np.float32), entries)]))
    before = sha256_of_tree(tmp_path)
    bad = os.path.join(str(out), os.fsdecode(b"w\xff.bin"))
    for align in (align_external_data_streaming, align_external_data_in_memory):
        with pytest.raises(UnsafeLocationError, match="has a name that is not valid UTF-8") as raised:
            align(src / "m.onnx", out / "m.onnx", bad)
        assert "onnx cannot store it" in str(raised.value)
        assert sha256_of_tree(tmp_path) == before


def test_outputs_aliasing_through_a_symlinked_folder_are_one_file(out: Path):
    with pytest.raises(DestinationConflictError, match="are the same file"):
        check_outputs(str(out / "m.onnx"), [str(out / "self" / "m.onnx")], {})
    with pytest.raises(DestinationConflictError, match="are the same file"):
        check_outputs(str(out / "m.onnx"), [str(out / "w.bin"), str(out / "self" / "self" / "w.bin")], {})
    assert destination_key(str(out / "self" / "x")) == destination_key(str(out / "x"))
    assert destination_key(str(out / "missing" / "x")) is None


def test_an_output_that_is_a_source_is_refused_whatever_the_path(out: Path, tmp_path: Path):
    source = tmp_path / "elsewhere" / "src.data"
    source.write_bytes(b"source bytes")
    identity = file_identity(str(source))
    assert identity is not None
    os.link(source, out / "hard.bin")
    (out / "soft.bin").symlink_to(source)
    before = sha256_of_tree(tmp_path)
    for path in (out / "hard.bin", out / "soft.bin", out / "escape" / "src.data", out / "self" / "hard.bin"):
        with pytest.raises(DestinationConflictError, match="would destroy the source") as raised:
            check_outputs(str(out / "m.onnx"), [str(path)], {identity: str(source)})
        assert str(source) in str(raised.value)
    with pytest.raises(DestinationConflictError, match="would destroy the source"):
        check_outputs(str(out / "hard.bin"), [], {identity: str(source)})
    assert sha256_of_tree(tmp_path) == before


def test_two_existing_outputs_that_are_one_file_are_refused(out: Path):
    (out / "a.bin").write_bytes(b"a")
    os.link(out / "a.bin", out / "b.bin")
    with pytest.raises(DestinationConflictError, match="same existing file"):
        check_outputs(str(out / "m.onnx"), [str(out / "a.bin"), str(out / "b.bin")], {})


def test_an_output_that_is_a_directory_is_refused_before_anything_is_written(out: Path):
    with pytest.raises(DestinationConflictError, match=r"'.*sub' exists and is a directory"):
        check_outputs(str(out / "m.onnx"), [str(out / "sub")], {})
    with pytest.raises(DestinationConflictError, match="is a directory"):
        check_outputs(str(out / "self"), [], {})  # a symlink to a folder


def test_a_missing_folder_and_an_overlong_name_are_refused(out: Path):
    with pytest.raises(FileNotFoundError, match="destination folder does not exist"):
        check_outputs(str(out / "missing" / "m.onnx"), [], {})
    with pytest.raises(DestinationConflictError, match="256 bytes, longer than the 255"):
        check_outputs(str(out / "m.onnx"), [str(out / ("w" * 256))], {})
    check_outputs(str(out / ("m" * 255)), [str(out / ("w" * 255))], {})  # the longest legal names are fine


def test_unrelated_sources_and_fresh_outputs_pass(out: Path):
    check_outputs(str(out / "m.onnx"), [str(out / "m.onnx.data"), str(out / "sub" / "m.onnx.data")], {})
    check_outputs(str(out / "m.onnx"), [], {FileIdentity(0, 0): "/nowhere"})
