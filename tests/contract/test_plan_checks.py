"""The pieces of the writer contract on their own: rule 1's scan, rule 3's ownership, and ``check_plan`` refusing a
plan that breaks rule 2 (a writer bug: the conformance suite shows no writer does)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from onnx_light_ref.errors import ExistingFileError, SharedWeightsError
from onnx_light_ref.io._plan.sites import SITE_EXTERNALIZED, SITE_MOVED, SiteColumns
from onnx_light_ref.io._read import reference_scan, sharing
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._read.sharing import (
    NotAModel,
    UnreadableModel,
    file_key,
    files_referenced_near,
    folders_reaching,
    is_model_name,
    model_references,
    models_in,
    read_model_references,
    read_references,
    scan_users,
)
from onnx_light_ref.io._write.contract import (
    PlannedFile,
    PlannedModel,
    WriteOptions,
    WritePlan,
    check_plan,
    recheck_plan,
)
from onnx_light_ref.io._write.ownership import Ownership, ShardSet
from tests.checks import sha256_of_tree
from tests.contract.recorded import recorded
from tests.contract.sharers import delayed_model, external_model, too_deep, too_large
from tests.models import identity_model, write_model
from tests.wire_writer import Hole, encode_varint, field_key, write_segments

# -------------------------------------------------------------------------------------------------- rule 1's scan


def test_the_folders_that_reach_a_file_are_its_own_and_every_ancestor_by_path_and_by_real_path(tmp_path: Path) -> None:
    (tmp_path / "elsewhere" / "real" / "sub").mkdir(parents=True)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "alias").symlink_to(tmp_path / "elsewhere" / "real")
    folders = folders_reaching([str(tmp_path / "here" / "alias" / "sub" / "w.bin")])
    assert folders[:3] == [
        str(tmp_path / "here" / "alias" / "sub"),
        str(tmp_path / "here" / "alias"),
        str(tmp_path / "here"),
    ]
    assert str(tmp_path / "elsewhere") in folders  # an ancestor of the real path only
    assert str(tmp_path / "elsewhere" / "real") not in folders  # the same folder as here/alias: listed once
    assert "/" in folders and folders.count(str(tmp_path)) == 1


def test_models_are_found_in_any_case_of_the_suffix_and_through_symlinks(tmp_path: Path) -> None:
    for name in ("a.onnx", "b.ONNX", "c.Onnx"):
        write_model(tmp_path / name, external_model("w.bin"))
    (tmp_path / "d.onnx").symlink_to("a.onnx")
    (tmp_path / "e.onnx").mkdir()  # a folder named like a model is no model
    (tmp_path / "f.onnx.data").write_bytes(b"")
    assert [Path(p).name for p in models_in([str(tmp_path)])] == ["a.onnx", "b.ONNX", "c.Onnx", "d.onnx"]
    assert is_model_name("x.ONNX") and not is_model_name(".onnx") and not is_model_name("x.onnx.data")


def test_a_models_references_include_delayed_initializer_filenames(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    light = write_model(tmp_path / "light.onnx", delayed_model("w.bin"))
    (references,) = [read_references(str(light))]
    assert references is not None
    reference = references[file_key(str(tmp_path / "w.bin"))]
    assert (reference.via, reference.tensor, reference.location, reference.tensors) == (
        "delayed_initializer",
        "s",
        "w.bin",
        1,
    )
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert read_references(str(tmp_path / "junk.onnx")) is None


def test_the_scan_skips_the_destination_models_and_reports_what_the_others_reference(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    (tmp_path / "v.bin").write_bytes(b"\0" * 16)
    write_model(tmp_path / "dst.onnx", external_model("w.bin"))
    other = write_model(tmp_path / "other.onnx", external_model("v.bin"))
    scan = scan_users([str(tmp_path / "w.bin"), str(tmp_path / "v.bin")], exclude=[str(tmp_path / "dst.onnx")])
    assert list(scan.users) == [str(tmp_path / "v.bin")] and scan.users[str(tmp_path / "v.bin")][0].model == str(other)
    st = os.stat(tmp_path / "v.bin")
    assert FileIdentity(st.st_dev, st.st_ino) in scan.referenced


def _cut(path: Path, location: str) -> Path:
    data = external_model(location).SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    return path


def _too_large(path: Path, location: str) -> Path:
    path.write_bytes(too_large(location).SerializeToString())
    return path


def test_a_model_nested_past_protobufs_limit_is_not_a_model(tmp_path: Path) -> None:
    """``onnx.load`` and onnxruntime refuse a model nested deeper than 100 messages: it loads no file, so it blocks
    no write (a 1 KB file of that kind in a shared /tmp used to block every write below it)."""
    path = tmp_path / "deep.onnx"
    path.write_bytes(external_model("w.bin").SerializeToString() + too_deep())
    found = read_model_references(str(path))
    assert isinstance(found, NotAModel) and "nested deeper than 100 levels (protobuf's limit)" in found.reason
    with pytest.raises(DecodeError):
        onnx.load(str(path))


def test_a_file_protobuf_refuses_is_not_a_model(tmp_path: Path) -> None:
    """Cut short, an unclosed group, empty: ``onnx.load`` refuses the first two and reads nothing from the last, so
    none loads a file (rule 1 warns and goes on)."""
    cut = _cut(tmp_path / "cut.onnx", "w.bin")
    found = read_model_references(str(cut))
    assert found == NotAModel(str(cut), "field 7 (length 116) runs past the end of its message at byte offset 2")
    assert found.describe() == f"{str(cut)!r}, which is not an ONNX model ({found.reason})"
    (tmp_path / "group.onnx").write_bytes(external_model("w.bin").SerializeToString() + field_key(999, 3))
    found = read_model_references(str(tmp_path / "group.onnx"))
    assert isinstance(found, NotAModel) and "group of field 999 not closed" in found.reason
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert read_model_references(str(tmp_path / "empty.onnx")) == NotAModel(
        str(tmp_path / "empty.onnx"), "it has no graph"
    )
    assert read_references(str(cut)) is None and model_references(str(cut)) == {}
    for path in (cut, tmp_path / "group.onnx"):
        with pytest.raises(DecodeError):
            onnx.load(str(path))


def test_a_model_whose_references_cannot_be_read_is_not_a_model_that_references_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = _too_large(tmp_path / "deep.onnx", "w.bin")
    found = read_model_references(str(deep))
    assert isinstance(found, UnreadableModel) and "more than 5,000 fields" in found.reason
    assert found.describe() == f"{str(deep)!r}, which cannot be read as a model ({found.reason})"
    # A file this process may not open (another user's model, mode 0600), one the disk fails to read (EIO).
    write_model(tmp_path / "private.onnx", external_model("w.bin"))
    write_model(tmp_path / "failing.onnx", external_model("w.bin"))
    real_open, real_read = sharing._open_model, reference_scan.pread_exact

    def refused(path: str) -> int:
        if path.endswith("private.onnx"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path)

    def failing(fd: int, buffer: memoryview, offset: int) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}").endswith("failing.onnx"):
            raise OSError(errno.EIO, "Input/output error")
        return real_read(fd, buffer, offset)

    monkeypatch.setattr(sharing, "_open_model", refused)
    monkeypatch.setattr(reference_scan, "pread_exact", failing)
    assert read_model_references(str(tmp_path / "private.onnx")) == UnreadableModel(
        str(tmp_path / "private.onnx"), "Permission denied"
    )
    assert read_model_references(str(tmp_path / "failing.onnx")) == UnreadableModel(
        str(tmp_path / "failing.onnx"), "Input/output error"
    )
    assert read_references(str(tmp_path / "private.onnx")) is None  # rule 3's answer: it owns nothing by reference
    assert read_model_references(str(tmp_path / "gone.onnx")) is None  # gone: no model at all


def test_a_model_over_2_gib_is_read_and_its_references_count(tmp_path: Path) -> None:
    """Over protobuf's 2 GiB (a doc string of 2 GiB, a hole of a sparse file) with a graph using ``w.bin``: read in
    a few reads, its reference found (it was "cannot be read as a model", which blocked every write below it)."""
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    data = external_model("w.bin").SerializeToString()
    write_segments(tmp_path / "huge.onnx", [data, field_key(6, 2) + encode_varint(2**31), Hole(2**31)])
    references = read_model_references(str(tmp_path / "huge.onnx"))
    assert isinstance(references, dict)
    assert [(r.tensor, r.location, r.tensors) for r in references.values()] == [("s", "w.bin", 1)]
    assert list(references) == [file_key(str(tmp_path / "w.bin"))]


def test_the_scan_takes_a_model_that_cannot_be_read_as_using_every_existing_file_it_can_reach(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("w.bin", "sub/v.bin", "sub/deeper/u.bin", "other/x.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\0" * 16)
    deep = _too_large(tmp_path / "sub" / "deep.ONNX", "v.bin")
    cut = _cut(tmp_path / "sub" / "cut.onnx", "v.bin")  # no model: it loads nothing, so it is taken as nothing
    targets = [str(tmp_path / name) for name in ("w.bin", "sub/v.bin", "sub/deeper/u.bin", "other/x.bin", "no.bin")]
    with caplog.at_level(logging.WARNING, logger="onnx_light_ref"):
        scan = scan_users(targets)
    reason = read_model_references(str(deep)).reason  # type: ignore[union-attr]
    assert scan.unreadable == {
        str(tmp_path / "sub" / "v.bin"): [UnreadableModel(str(deep), reason)],
        str(tmp_path / "sub" / "deeper" / "u.bin"): [UnreadableModel(str(deep), reason)],
    }  # its folder and below; not w.bin above it, nor other/, nor a file that does not exist
    assert scan.users == {} and str(deep) in scan.models and str(cut) in scan.models
    assert caplog.text.count(f"{str(cut)!r} is not an ONNX model") == 1
    assert scan_users(targets, exclude=[str(deep)]).unreadable == {}  # a destination model is rule 3's, not rule 1's
    near = files_referenced_near(str(tmp_path / "sub" / "deeper"))
    assert near.unreadable == (UnreadableModel(str(deep), reason),)
    assert files_referenced_near(str(tmp_path / "other")).unreadable == ()


def test_rule_1_names_the_model_that_cannot_be_read_and_how_to_proceed(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    deep = _too_large(tmp_path / "other.onnx", "w.bin")
    plan = WritePlan("align", [], [PlannedFile(str(tmp_path / "w.bin"), "weights", 0)], rename_hint="another name")
    before = (tmp_path / "w.bin").read_bytes(), deep.read_bytes()
    with pytest.raises(SharedWeightsError) as raised:
        check_plan(plan)
    reason = read_model_references(str(deep)).reason  # type: ignore[union-attr]
    assert reason.startswith("its references could not be read: more than 5,000 fields")
    assert str(raised.value) == (
        f"align: file {str(tmp_path / 'w.bin')!r} may be used by {str(deep)!r}, which cannot be read as a model "
        f"({reason}): replacing it would silently change what those models compute; a .onnx that cannot be read may "
        "still be a model someone loads (a copy still running, a file another tool reads), so it counts as using "
        "every file of its folder and below: move it away (or repair it) to let the writer check what it uses. "
        "Write under another name, or pass replace_shared=True (--replace-shared) to replace it anyway; nothing was "
        "written."
    )
    assert ((tmp_path / "w.bin").read_bytes(), deep.read_bytes()) == before
    check_plan(WritePlan("align", [], plan.files, WriteOptions(replace_shared=True, overwrite=True)))


# ------------------------------------------------------------------------------------------------ rule 3's owner


def test_a_destination_model_that_cannot_be_read_owns_nothing_by_reference_and_the_refusal_says_why(
    tmp_path: Path,
) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    dst = _cut(tmp_path / "model.onnx", "w.bin")  # its previous version, cut short: what it uses is unknown
    files = [PlannedFile(str(tmp_path / "w.bin"), "weights", 0)]
    before = sha256_of_tree(tmp_path)
    with pytest.raises(ExistingFileError) as raised:
        check_plan(WritePlan("align", [_empty_model(dst)], files, rename_hint="another name"))
    reason = read_model_references(str(dst)).reason  # type: ignore[union-attr]
    assert (
        f"weights file {str(tmp_path / 'w.bin')!r} exists and is not an output of {str(dst)!r} ({str(dst)!r}, which "
        f"is not an ONNX model ({reason}), so what it references is unknown (move it away, or repair it, to "
        "let the writer see what it owns), and it is not named after them)"
    ) in str(raised.value)
    assert sha256_of_tree(tmp_path) == before
    check_plan(WritePlan("align", [_empty_model(dst)], files, WriteOptions(overwrite=True)))


def test_the_destination_model_owns_itself_when_it_is_a_model_or_named_like_one(tmp_path: Path) -> None:
    (tmp_path / "notes.json").write_text("{}")
    write_model(tmp_path / "model.bin", external_model("w.bin"))
    (tmp_path / "broken.onnx").write_bytes(b"\xff" * 8)
    ownership = Ownership([str(tmp_path / name) for name in ("notes.json", "model.bin", "broken.onnx", "new.x")])
    assert not ownership.owns_model(str(tmp_path / "notes.json"))
    assert ownership.owns_model(str(tmp_path / "model.bin"))  # parses as a model
    assert ownership.owns_model(str(tmp_path / "broken.onnx"))  # named like one
    assert ownership.owns_model(str(tmp_path / "new.x"))  # absent


def test_a_destination_owns_what_its_previous_model_uses_and_what_is_named_after_it(tmp_path: Path) -> None:
    for name in ("w.bin", "w.bin.1", "w.bin.7", "model.onnx.data", "model.onnx_data_3", "model.data", "x.bin"):
        (tmp_path / name).write_bytes(b"\0" * 16)
    previous = identity_model([numpy_helper.from_array(np.zeros(4, np.float32), "s")])
    write_model(tmp_path / "model.onnx", external_model("w.bin"))
    del previous
    ownership = Ownership([str(tmp_path / "model.onnx")])
    owns = {
        name: ownership.owns(str(tmp_path / name), ShardSet(str(tmp_path / "w.bin"))) for name in os.listdir(tmp_path)
    }
    assert owns["w.bin"] and owns["w.bin.7"]  # referenced, and a leftover shard of the set the model uses
    assert owns["model.onnx.data"] and owns["model.onnx_data_3"]  # named after the destination
    assert not owns["model.data"] and not owns["x.bin"]  # someone else's
    assert ownership.owns(str(tmp_path / "absent.bin"))


def test_hugging_face_shard_names_of_another_count_and_the_index_are_the_sets_leftovers(tmp_path: Path) -> None:
    for name in ("m-00001-of-00002.safetensors", "m-00002-of-00002.safetensors", "m-00001-of-00003.safetensors"):
        (tmp_path / name).write_bytes(b"\0" * 16)
    (tmp_path / "m.safetensors.index.json").write_text("{}")
    write_model(tmp_path / "model.onnx", external_model("m-00001-of-00002.safetensors"))
    shard_set = ShardSet(str(tmp_path / "m.safetensors"), "hf", True)
    ownership = Ownership([str(tmp_path / "model.onnx")])
    assert ownership.owns(str(tmp_path / "m-00001-of-00003.safetensors"), shard_set)
    assert ownership.owns(str(tmp_path / "m.safetensors.index.json"), shard_set)
    fresh = Ownership([str(tmp_path / "fresh.onnx")])  # a PyTorch set nobody of ours uses
    assert not fresh.owns(str(tmp_path / "m-00001-of-00003.safetensors"), shard_set)
    assert not fresh.owns(str(tmp_path / "m.safetensors.index.json"), shard_set)


# ---------------------------------------------------------------------------------------------------- check_plan


def _empty_model(path: Path) -> PlannedModel:
    """A destination model without tensors (its plan has no site)."""
    return PlannedModel(str(path), onnx.ModelProto(), SiteColumns())


def _plan(tmp_path: Path, kind: int, offset: int, length: int, size: int, **options: bool) -> WritePlan:
    model = identity_model([numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")])
    sites = recorded(model, (kind, str(tmp_path / "w.bin"), offset, length))
    return WritePlan(
        "test",
        [PlannedModel(str(tmp_path / "m.onnx"), model, sites, 0)],
        [PlannedFile(str(tmp_path / "w.bin"), "weights", size)],
        WriteOptions(**options),
    )


def test_a_plan_placing_a_tensor_outside_its_file_is_a_writer_bug(tmp_path: Path) -> None:
    check_plan(_plan(tmp_path, SITE_EXTERNALIZED, 0, 16, 16))
    with pytest.raises(AssertionError, match="past the end"):
        check_plan(_plan(tmp_path, SITE_MOVED, 8, 16, 16))
    with pytest.raises(AssertionError, match="zero-length"):
        check_plan(_plan(tmp_path, SITE_MOVED, 0, 0, 16))


def test_a_plan_externalizing_what_rule_2_keeps_inline_is_a_writer_bug(tmp_path: Path) -> None:
    plan = _plan(tmp_path, SITE_EXTERNALIZED, 0, 16, 16)
    plan.models[0].size_threshold = 64  # the writer's threshold says this 16-byte tensor stays inline
    with pytest.raises(AssertionError, match="made external although rule 2 keeps it inline"):
        check_plan(plan)
    plan = _plan(tmp_path, SITE_EXTERNALIZED, 0, 16, 16)
    plan.models[0].proto = onnx.ModelProto()  # more sites than the model has references
    with pytest.raises(AssertionError, match=r"has 0 references .* its plan 1 sites: every reference must be a site"):
        check_plan(plan)


def test_recheck_sees_what_changed_since_the_plan_and_runs_the_source_checks(tmp_path: Path) -> None:
    plan = _plan(tmp_path, SITE_EXTERNALIZED, 0, 16, 16)
    check_plan(plan)
    (tmp_path / "w.bin").write_bytes(b"appeared meanwhile")
    with pytest.raises(ExistingFileError, match=r"w\.bin"):
        recheck_plan(plan)
    write_model(tmp_path / "other.onnx", external_model("w.bin"))
    with pytest.raises(SharedWeightsError, match=r"other\.onnx"):
        recheck_plan(plan)
    calls: list[str] = []
    plan.options = WriteOptions(replace_shared=True)
    plan.source_checks.append(lambda: calls.append("checked"))
    protected = recheck_plan(plan)
    st = os.stat(tmp_path / "w.bin")
    assert calls == ["checked"] and FileIdentity(st.st_dev, st.st_ino) in protected


def test_format_checks_run_with_the_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path, SITE_EXTERNALIZED, 0, 16, 16)

    def refuse(seen: WritePlan) -> None:
        raise ValueError(f"{seen.writer}: a format limit")

    plan.format_checks.append(refuse)
    with pytest.raises(ValueError, match="test: a format limit"):
        check_plan(plan)


# ------------------------------------------------------------------------------------------- rule 4: format limits


@pytest.mark.parametrize("header", [0, 100_000_001])
def test_a_safetensors_file_whose_header_the_library_would_refuse_is_refused_before_writing(
    tmp_path: Path, header: int
) -> None:
    """Every writer of safetensors passes its files through the contract: a header of 0 bytes or above the
    library's 100,000,000 is refused by ``check_plan`` whatever the writer's own layout code let through."""
    from onnx_light_ref.errors import SafetensorsError

    weights = tmp_path / "m.safetensors"
    plan = WritePlan(
        "align",
        [_empty_model(tmp_path / "m.onnx")],
        [PlannedFile(str(weights), "weights", 8 + header + 16, data_start=8 + header, format="safetensors")],
    )
    with pytest.raises(SafetensorsError, match=rf"would have a {header:,}-byte header; the safetensors library"):
        check_plan(plan)
    assert list(tmp_path.iterdir()) == []


def test_a_safetensors_header_within_the_limit_passes(tmp_path: Path) -> None:
    plan = WritePlan(
        "align",
        [_empty_model(tmp_path / "m.onnx")],
        [
            PlannedFile(
                str(tmp_path / "m.safetensors"),
                "weights",
                8 + 100_000_000,
                data_start=8 + 100_000_000,
                format="safetensors",
            )
        ],
    )
    check_plan(plan)
