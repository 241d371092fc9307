"""The writer conformance suite: every rule of the writer contract (``docs/safety.md``) against every writer.

Parametrized over :data:`tests.contract.writers.WRITERS` (both aligners in every format and shard scheme,
``align_models``, the shared saver, ``undelay``, ``link``, ``run --output-dir``): a writer added to the package gets
every test here by adding one row there. Each refusal checks the exception type, the message (it names the file and
the opt-in), that nothing was written (the whole tree byte for byte, no temp file) and that the other model still
computes what it did (onnxruntime); each opt-in checks that the writer then succeeds and its output computes the
right values.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import reference_evaluator
from onnx_light_ref._cli import main
from onnx_light_ref.errors import DestinationConflictError, ExistingFileError, SharedWeightsError
from onnx_light_ref.io._write import publish
from tests.checks import run_onnxruntime, snapshot_tree, temp_files_under
from tests.contract.sharers import (
    NOT_MODELS,
    SHARERS,
    UNREADABLE,
    bridge_name,
    computes,
    external_model,
    make_not_a_model,
    make_sharer,
    make_unreadable,
    shared_bytes,
)
from tests.contract.writers import ARRAYS, WRITERS, Scene, Writer, dry_run_outputs, make_scene
from tests.models import write_model

CLI_WRITERS = [writer for writer in WRITERS if writer.argv is not None]
MODEL_WRITERS = [writer for writer in WRITERS if writer.has_model]
# The rules about a file at an output name need one besides the .onnx: delay writes none (its nodes read the source's
# files); its .onnx is checked by the rules on the destination model.
FILE_WRITERS = [writer for writer in WRITERS if writer.writes_files]
CLI_FILE_WRITERS = [writer for writer in CLI_WRITERS if writer.writes_files]


def _ids(writer: Writer) -> str:
    return writer.name


def foreign_name(writer: Writer) -> str:
    """A main output name that is not named after the destination model (rule 3.3 would own that one)."""
    if "run" in writer.tags:
        return "y"
    return "w.safetensors" if "safetensors" in writer.tags else "w.bin"


def main_output(tmp_path: Path, writer: Writer, weights_name: str | None) -> str:
    """The name of the writer's first weights file (``run``: its output file), found by a dry run (a multi-model
    writer's other ``.onnx`` files are not weights)."""
    created = dry_run_outputs(tmp_path / "dry", writer, weights_name)
    return next(name for name in created if not name.endswith((".json", ".onnx")))


def scene_with_file_at_output(tmp_path: Path, writer: Writer, content: bytes) -> tuple[Scene, Path]:
    """The writer's scene (main output not named after the destination) with ``content`` already at its main
    output's name."""
    name = foreign_name(writer)
    target_name = main_output(tmp_path, writer, name)
    scene = make_scene(tmp_path / "scene", writer, name)
    target = scene.out / target_name
    target.write_bytes(content)
    return scene, target


def assert_written(scene: Scene, writer: Writer) -> None:
    """The writer's output computes what its source holds (onnxruntime; ``run``: the saved array)."""
    if not writer.has_model:
        np.testing.assert_array_equal(np.load(scene.out / f"{scene.weights_name or 'y'}.npy"), ARRAYS["a"][:4])
        return
    onnx.checker.check_model(str(scene.dst), full_check=True)
    if writer.onnxruntime:
        outputs = run_onnxruntime(scene.dst, {})
    else:
        with reference_evaluator(str(scene.dst)) as evaluator:
            outputs = evaluator.run(None, {})
    for got, expected in zip(outputs, ARRAYS.values(), strict=True):
        np.testing.assert_array_equal(got, expected)


def assert_unchanged(root: Path, before: dict[str, str]) -> None:
    assert snapshot_tree(root) == before
    assert temp_files_under(root) == []


# ------------------------------------------------------------------------------ rule 3: replace only what it owns


@pytest.mark.parametrize("writer", FILE_WRITERS, ids=_ids)
def test_a_foreign_file_at_an_output_name_is_refused_until_overwrite(tmp_path: Path, writer: Writer) -> None:
    scene, target = scene_with_file_at_output(tmp_path, writer, b"a file this writer did not write")
    before = snapshot_tree(scene.root)
    with pytest.raises(ExistingFileError) as raised:
        writer.call(scene)
    message = str(raised.value)
    assert str(target) in message and "overwrite=True" in message and "nothing was written" in message
    assert_unchanged(scene.root, before)
    writer.call(scene, overwrite=True)
    assert target.read_bytes() != b"a file this writer did not write"
    assert_written(scene, writer)


@pytest.mark.parametrize("writer", CLI_FILE_WRITERS, ids=_ids)
def test_a_foreign_file_at_an_output_name_is_refused_by_the_command_until_overwrite(
    tmp_path: Path, writer: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    scene, target = scene_with_file_at_output(tmp_path, writer, b"a file this writer did not write")
    before = snapshot_tree(scene.root)
    assert writer.argv is not None
    capsys.readouterr()
    assert main(writer.argv(scene)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--overwrite" in err and target.name in err
    assert_unchanged(scene.root, before)
    assert main([*writer.argv(scene), "--overwrite"]) == 0
    assert_written(scene, writer)


@pytest.mark.parametrize("writer", WRITERS, ids=_ids)
def test_its_own_previous_outputs_are_replaced_without_overwrite(tmp_path: Path, writer: Writer) -> None:
    """A destination owns what its previous ``.onnx`` references (``run``: the outputs its record lists)."""
    scene = make_scene(tmp_path / "scene", writer, foreign_name(writer))
    writer.call(scene)
    if writer.owns_previous:
        writer.call(scene)
    else:
        before = snapshot_tree(scene.root)
        with pytest.raises(ExistingFileError):
            writer.call(scene)
        assert_unchanged(scene.root, before)
        writer.call(scene, overwrite=True)
    assert_written(scene, writer)
    assert temp_files_under(scene.root) == []


@pytest.mark.parametrize("writer", MODEL_WRITERS, ids=_ids)
def test_a_destination_that_is_not_a_model_is_refused_until_overwrite(tmp_path: Path, writer: Writer) -> None:
    """The destination ``.onnx`` is replaced when it is a model or named like one; a JSON file named as DST is not."""
    scene = make_scene(tmp_path / "scene", writer)
    scene.dst = scene.out / "notes.json"
    scene.dst.write_text('{"a user\'s": "file"}')
    before = snapshot_tree(scene.root)
    with pytest.raises(ExistingFileError, match=r"notes\.json' exists and is not an ONNX model"):
        writer.call(scene)
    assert_unchanged(scene.root, before)
    writer.call(scene, overwrite=True)
    onnx.checker.check_model(str(scene.dst), full_check=True)


@pytest.mark.parametrize("writer", FILE_WRITERS, ids=_ids)
def test_an_output_that_is_a_directory_is_refused_even_with_overwrite(tmp_path: Path, writer: Writer) -> None:
    target_name = main_output(tmp_path, writer, None)
    scene = make_scene(tmp_path / "scene", writer)
    (scene.out / target_name).mkdir()
    (scene.out / target_name / "inside").write_bytes(b"kept")
    before = snapshot_tree(scene.root)
    for overwrite in (False, True):
        with pytest.raises(DestinationConflictError, match="exists and is a directory"):
            writer.call(scene, overwrite=overwrite)
        assert_unchanged(scene.root, before)


@pytest.mark.parametrize("writer", FILE_WRITERS, ids=_ids)
def test_an_output_name_longer_than_its_folder_allows_is_refused_before_writing(tmp_path: Path, writer: Writer) -> None:
    scene = make_scene(tmp_path / "scene", writer, "w" * 300)
    before = snapshot_tree(scene.root)
    with pytest.raises(DestinationConflictError, match="longer than the 255 bytes its folder allows"):
        writer.call(scene)
    assert_unchanged(scene.root, before)


@pytest.mark.parametrize("writer", [w for w in FILE_WRITERS if "shared-save" not in w.tags], ids=_ids)
def test_an_output_that_is_a_source_is_refused_even_with_overwrite(tmp_path: Path, writer: Writer) -> None:
    """A symlink at the output name to a file the writer reads (the shared saver reads no file of its own)."""
    target_name = main_output(tmp_path, writer, None)
    scene = make_scene(tmp_path / "scene", writer)
    source = scene.src / ("model.onnx" if "run" in writer.tags else "model.onnx.data")
    (scene.out / target_name).symlink_to(source)
    before = snapshot_tree(scene.root)
    for overwrite in (False, True):
        with pytest.raises(DestinationConflictError, match="writing it would destroy the source"):
            writer.call(scene, overwrite=overwrite)
        assert_unchanged(scene.root, before)


# ------------------------------------------------------------ rule 1: never silently change what another computes


@pytest.mark.parametrize("sharer", SHARERS)
@pytest.mark.parametrize("writer", FILE_WRITERS, ids=_ids)
def test_a_file_another_model_uses_is_refused_until_replace_shared(tmp_path: Path, writer: Writer, sharer: str) -> None:
    scene, target = scene_with_file_at_output(tmp_path, writer, shared_bytes())
    other = make_sharer(sharer, target)
    computed = computes(other)
    before = snapshot_tree(scene.root)
    with pytest.raises(SharedWeightsError) as raised:
        writer.call(scene)
    message = str(raised.value)
    assert str(target) in message and str(other) in message and "replace_shared=True" in message
    assert "nothing was written" in message
    assert_unchanged(scene.root, before)
    np.testing.assert_array_equal(computes(other), computed)
    writer.call(scene, replace_shared=True)  # the caller's word on that file: rule 3 does not ask again
    assert_written(scene, writer)


@pytest.mark.parametrize("kind", UNREADABLE)
@pytest.mark.parametrize("writer", FILE_WRITERS, ids=_ids)
def test_a_model_that_cannot_be_read_near_a_file_is_taken_as_using_it(
    tmp_path: Path, writer: Writer, kind: str
) -> None:
    """A "cannot read" never means "references nothing": a ``.onnx`` whose references cannot be read (here nested
    past the reference scan's budget) may be a model someone loads. Beside (or above) the writer's own
    previous output, which it would replace, it blocks the replacement until the caller says ``replace_shared``."""
    name = foreign_name(writer)
    target_name = main_output(tmp_path, writer, name)
    scene = make_scene(tmp_path / "scene", writer, name)
    writer.call(scene)  # its own previous outputs: replaced without a word, as long as nothing may use them
    target = scene.out / target_name
    other = make_unreadable(kind, target)
    unreadable = other.read_bytes()
    before = snapshot_tree(scene.root)
    with pytest.raises(SharedWeightsError) as raised:
        writer.call(scene, overwrite=not writer.owns_previous)
    message = str(raised.value)
    assert f"file {str(target)!r} may be used by {str(other)!r}, which cannot be read as a model" in message
    assert "move it away" in message and "replace_shared=True" in message and "nothing was written" in message
    assert_unchanged(scene.root, before)
    writer.call(scene, overwrite=not writer.owns_previous, replace_shared=True)
    assert_written(scene, writer)
    assert other.read_bytes() == unreadable


@pytest.mark.parametrize("kind", NOT_MODELS)
@pytest.mark.parametrize("writer", FILE_WRITERS, ids=_ids)
def test_a_file_protobuf_refuses_near_a_file_is_no_model_and_blocks_nothing(
    tmp_path: Path, writer: Writer, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``.onnx`` protobuf refuses (cut in half, an unclosed group) is one ``onnx.load`` refuses too: it loads no
    file, so it does not block the replacement of the writer's previous output; a warning names it."""
    name = foreign_name(writer)
    target_name = main_output(tmp_path, writer, name)
    scene = make_scene(tmp_path / "scene", writer, name)
    writer.call(scene)
    other = make_not_a_model(kind, scene.out / target_name)
    junk = other.read_bytes()
    with caplog.at_level(logging.WARNING, logger="onnx_light_ref"):
        writer.call(scene, overwrite=not writer.owns_previous)
    assert_written(scene, writer)
    assert f"{str(other)!r} is not an ONNX model: " in caplog.text and "onnx.load refuses it too" in caplog.text
    assert other.read_bytes() == junk


@pytest.mark.parametrize("writer", CLI_FILE_WRITERS, ids=_ids)
def test_a_file_another_model_uses_is_refused_by_the_command_until_replace_shared(
    tmp_path: Path, writer: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    scene, target = scene_with_file_at_output(tmp_path, writer, shared_bytes())
    other = make_sharer("parent-folder", target)
    before = snapshot_tree(scene.root)
    assert writer.argv is not None
    capsys.readouterr()
    assert main(writer.argv(scene)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--replace-shared" in err and "top.onnx" in err
    assert_unchanged(scene.root, before)
    np.testing.assert_array_equal(computes(other), np.arange(4, dtype=np.float32))
    assert main([*writer.argv(scene), "--replace-shared"]) == 0
    assert_written(scene, writer)


@pytest.mark.parametrize("writer", FILE_WRITERS, ids=_ids)
def test_a_sharer_saved_while_the_writer_works_is_refused_under_the_folder_lock(
    tmp_path: Path, writer: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant saved by another process between the plan and the publication (re-check under the lock)."""
    name = foreign_name(writer)
    target_name = main_output(tmp_path, writer, name)
    scene = make_scene(tmp_path / "scene", writer, name)
    writer.call(scene)  # its own previous output: replaced without a word, unless someone uses it meanwhile
    target = scene.out / target_name
    kept = {path.name: path.read_bytes() for path in scene.out.iterdir() if path.is_file()}
    sharers: list[Path] = []

    def save_a_variant() -> None:
        if not sharers:
            sharers.append(make_sharer("sibling", target))

    # Every publication (models, a family's members, run's outputs) goes through OutputTransaction.publish.
    real_publish = publish.OutputTransaction.publish

    def publish_outputs(self: publish.OutputTransaction, *args: object, **kwargs: object) -> object:
        save_a_variant()
        return real_publish(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(publish.OutputTransaction, "publish", publish_outputs)
    with pytest.raises(SharedWeightsError, match=r"other\.onnx"):
        writer.call(scene, overwrite=not writer.owns_previous)
    assert {path.name: path.read_bytes() for path in scene.out.iterdir() if path.is_file() and path != sharers[0]} == (
        kept
    )
    assert temp_files_under(scene.root) == []
    np.testing.assert_array_equal(computes(sharers[0]), np.frombuffer(kept[target_name][:16], dtype=np.float32))


@pytest.mark.parametrize(
    "near", ["a-variant-uses-it", "nothing-uses-it", "a-model-near-cannot-be-read", "a-file-near-is-no-model"]
)
@pytest.mark.parametrize("writer", MODEL_WRITERS, ids=_ids)
def test_a_bridge_file_a_visible_model_references_is_never_deleted(tmp_path: Path, writer: Writer, near: str) -> None:
    """A run killed between its two commits leaves the destination on a bridge file; a variant saved from it uses
    that file; the next publication to the destination sweeps the bridge only when no model it can see uses it, or
    may use it (a ``.onnx`` there whose references cannot be read). A file protobuf refuses loads nothing: it keeps
    nothing."""
    scene = make_scene(tmp_path / "scene", writer)
    bridge = scene.out / bridge_name("model.onnx.data")
    bridge.write_bytes(shared_bytes())
    write_model(scene.dst, external_model(bridge.name))  # the killed run's model, complete, on its bridge file
    variant = None
    if near == "a-variant-uses-it":
        variant = write_model(scene.out / "variant.onnx", external_model(bridge.name))
    elif near == "a-model-near-cannot-be-read":
        cut = make_unreadable("too-large", bridge)
    elif near == "a-file-near-is-no-model":
        make_not_a_model("truncated", bridge)
    writer.call(scene)
    assert_written(scene, writer)
    if variant is not None:
        assert bridge.read_bytes() == shared_bytes()
        np.testing.assert_array_equal(computes(variant), np.arange(4, dtype=np.float32))
    elif near == "a-model-near-cannot-be-read":
        assert bridge.read_bytes() == shared_bytes()
        # Once readable (repaired), it loads its weights from the bridge file that was kept.
        write_model(cut, external_model(bridge.name))
        np.testing.assert_array_equal(computes(cut), np.arange(4, dtype=np.float32))
    else:
        assert not bridge.exists()


# -------------------------------------------------------- rule 2: external only where onnx loads it, placed right


@pytest.mark.parametrize("writer", [w for w in FILE_WRITERS if "run" not in w.tags], ids=_ids)
def test_every_tensor_it_makes_external_loads_back_everywhere(tmp_path: Path, writer: Writer) -> None:
    from tests.contract.rule2 import check_output, expected_outputs, prepare

    scene = make_scene(tmp_path / "scene", writer)
    options = prepare(scene, writer)
    writer.call(scene, **options)
    check_output(scene.dst)
    outputs = run_onnxruntime(scene.dst, {"x": np.ones((2, 8), np.float32)})
    for got, expected in zip(outputs, expected_outputs(with_function="undelay" not in writer.tags), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert os.listdir(scene.out)  # the writer wrote its files there
