"""A family of models over one set of weights (issue 28): a decoder and a decoder-with-past exported separately.

The user's story: two exports (different folders, each with its own ``model.onnx_data``, the same weights under
different names plus a tensor each, an inline shape tensor, If and Loop subgraphs with their own initializers) go
into one folder where the shared weights are stored once. Every output loads in onnx, passes the full checker,
runs in onnxruntime with the source's outputs and is ``verify``-equal to its source; the weights file holds each
distinct payload once, aligned; the sources never change.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref import align_external_data_streaming, align_models, verify_models
from onnx_light_ref.errors import ExistingFileError, SharedWeightsError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read import reference_scan
from onnx_light_ref.io._results import FamilyResult
from onnx_light_ref.ops import reference_evaluator
from tests.checks import assert_no_temp_files, external_payload, sha256_of_tree
from tests.contract.sharers import TEST_FIELD_BUDGET, grown
from tests.family.family_models import Family, outputs_of, write_family
from tests.models import make_model, save_external, value_info

DECODER, WITH_PAST = "decoder_model.onnx", "decoder_with_past_model.onnx"


@pytest.fixture
def family(tmp_path: Path) -> Family:
    return write_family(tmp_path / "exports")


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "family"
    folder.mkdir()
    return folder


def tensors_of(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers of ``graph`` and of every subgraph (read with onnx, not with the code under test)."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:
                yield from tensors_of(subgraph)


def external_tensors(path: Path) -> list[onnx.TensorProto]:
    model = onnx.load(str(path), load_external_data=False)
    return [t for t in tensors_of(model.graph) if t.data_location == TensorProto.EXTERNAL]


def entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def assert_computes_as_its_source(source: Path, output: Path) -> None:
    """Loads in onnx (external data too), passes the full checker, runs as the source in onnxruntime, verify-equal."""
    onnx.load(str(output))
    onnx.checker.check_model(str(output), full_check=True)
    for cond in (True, False):
        for expected, got in zip(outputs_of(source, cond), outputs_of(output, cond), strict=True):
            np.testing.assert_array_equal(got, expected)
    assert verify_models(source, output).equal
    for tensor in external_tensors(output):
        assert os.stat(output.parent / entries(tensor)["location"]).st_nlink == 1


def test_a_decoder_family_is_written_over_one_weights_file_and_each_member_computes_as_its_source(
    family: Family, out: Path, tmp_path: Path
) -> None:
    sources_before = sha256_of_tree(tmp_path / "exports")

    result = align_models(family.sources, out)

    assert sorted(p.name for p in out.iterdir()) == [DECODER, WITH_PAST, "weights.data"]
    for source, member in zip(family.sources, result.members, strict=True):
        assert member.source == str(source) and member.path == str(out / source.name)
        assert_computes_as_its_source(source, out / source.name)
        assert {entries(t)["location"] for t in external_tensors(out / source.name)} == {"weights.data"}
    # The inline shape tensor (16 bytes) and the other small ones stayed inline.
    decoder = onnx.load(str(out / DECODER), load_external_data=False)
    shape = next(t for t in decoder.graph.initializer if t.name == "shape")
    assert shape.data_location != TensorProto.EXTERNAL and shape.raw_data
    assert sha256_of_tree(tmp_path / "exports") == sources_before
    assert_no_temp_files(out)


def test_each_distinct_payload_is_stored_once_at_an_aligned_offset(family: Family, out: Path) -> None:
    result = align_models(family.sources, out)

    by_offset: dict[int, bytes] = {}
    for member in (out / DECODER, out / WITH_PAST):
        for tensor in external_tensors(member):
            offset = int(entries(tensor)["offset"])
            payload = external_payload(tensor, out)
            assert offset % 4096 == 0
            assert by_offset.setdefault(offset, payload) == payload  # one offset, one content
    contents = list(by_offset.values())
    assert len(set(contents)) == len(contents)  # no content stored twice
    assert sum(map(len, contents)) == result.unique_bytes
    assert os.path.getsize(out / "weights.data") == int(result) == result.unique_bytes + result.padding


def test_the_family_writes_less_than_aligning_each_member_alone(family: Family, out: Path, tmp_path: Path) -> None:
    separate = []
    for source in family.sources:
        alone = tmp_path / f"alone_{source.stem}"
        alone.mkdir()
        separate.append(align_external_data_streaming(source, alone / source.name))

    result = align_models(family.sources, out)

    assert result.separate_bytes == sum(r.payload_bytes for r in separate)
    assert result.saved_bytes == result.separate_bytes - result.unique_bytes > 0
    assert int(result) < sum(int(r) for r in separate)
    # The five shared weights are saved: 4 + 2 + 4 + 2 + 4 KiB.
    assert result.saved_bytes == 16 * 1024


def test_the_result_names_each_member_the_weights_files_and_the_shared_tensors(family: Family, out: Path) -> None:
    result = align_models(family.sources, out)

    assert isinstance(result, int) and isinstance(result, FamilyResult)
    assert result.weights_files == (str(out / "weights.data"),)
    assert [m.tensors for m in result.members] == [6, 6] and result.tensors == 12
    assert [m.shared_tensors for m in result.members] == [5, 5]
    assert result.deduplicated_tensors == 5 and result.deduplicated_bytes == 16 * 1024
    pairs = {tuple(name for _, name in shared.users) for shared in result.shared_tensors}
    assert ("model.layers.0.weight", "onnx::MatMul_12") in pairs
    assert ("loop.weight", "onnx::MatMul_16") in pairs  # a Loop body's initializer
    assert ("then.bias", "onnx::Add_15") in pairs  # an If branch's initializer
    for shared in result.shared_tensors:
        assert [path for path, _ in shared.users] == [str(out / DECODER), str(out / WITH_PAST)]
        assert shared.weights_file == str(out / "weights.data") and shared.offset % 4096 == 0
    text = repr(result)
    assert "2 members" in text and f"unique_bytes={result.unique_bytes}" in text and "shared_tensors=5" in text
    assert str(result) == f"{result}" == str(int(result))
    copied = pickle.loads(pickle.dumps(result))
    assert copied == result and copied.members == result.members and copied.saved_bytes == result.saved_bytes
    assert sum(result.bytes_by_method.values()) == result.unique_bytes and result.copy_methods


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"max_shard_size": 8192}, ["weights.data", "weights.data.1", "weights.data.2", "weights.data.3"]),
        ({"max_shard_size": 8192, "shard_names": "hf"}, [f"weights-0000{i}-of-00004.data" for i in range(1, 5)]),
        (
            {"max_shard_size": 8192, "shard_names": "transformers.js"},
            ["weights.onnx_data", "weights.onnx_data_1", "weights.onnx_data_2", "weights.onnx_data_3"],
        ),
        ({"alignment": 64, "align_threshold": 4096, "weights_name": "shared/w.bin"}, ["shared/w.bin"]),
        ({"alignment": 0}, ["weights.data"]),
    ],
    ids=["shards", "hf-names", "transformers-js-names", "threshold-and-subfolder", "packed"],
)
def test_every_layout_of_the_aligner_applies_to_the_family(
    family: Family, out: Path, options: dict[str, object], names: list[str]
) -> None:
    if "weights_name" in options:
        (out / "shared").mkdir()
    result = align_models(family.sources, out, **options)  # type: ignore[arg-type]

    assert [os.path.relpath(path, out) for path in result.weights_files] == names
    for source in family.sources:
        assert_computes_as_its_source(source, out / source.name)
    cap = options.get("max_shard_size")
    assert all(os.path.getsize(path) <= (cap or 1 << 40) for path in result.weights_files)
    if options.get("alignment") == 0:
        assert int(result) == result.unique_bytes  # packed: no padding at all
    assert_no_temp_files(out)


def test_a_safetensors_family_stores_each_tensor_once_under_its_first_users_name(family: Family, out: Path) -> None:
    safetensors = pytest.importorskip("safetensors")

    result = align_models(family.sources, out, weights_format="safetensors")

    assert result.weights_files == (str(out / "model.safetensors"),) and result.index_file is None
    with safetensors.safe_open(str(out / "model.safetensors"), framework="numpy") as checkpoint:
        keys = set(checkpoint.keys())
        layer = checkpoint.get_tensor("model.layers.0.weight")
    assert keys == {
        "model.layers.0.weight",
        "model.layers.0.bias",
        "model.layers.1.weight",
        "then.bias",
        "loop.weight",
        "lm_head.weight",
        "past.proj",
    }
    source = onnx.load(str(family.decoder))
    expected = next(t for t in source.graph.initializer if t.name == "model.layers.0.weight")
    np.testing.assert_array_equal(layer, numpy_helper.to_array(expected))
    for source_path in family.sources:
        assert_computes_as_its_source(source_path, out / source_path.name)


def test_a_sharded_safetensors_family_has_one_index_naming_every_key(family: Family, out: Path) -> None:
    import json

    result = align_models(family.sources, out, weights_format="safetensors", max_shard_size=8192)

    assert result.index_file == str(out / "model.safetensors.index.json")
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(weight_map) == 7 and set(weight_map.values()) == {os.path.basename(p) for p in result.weights_files}
    for source in family.sources:
        assert_computes_as_its_source(source, out / source.name)


def test_safetensors_keys_that_two_members_give_to_different_bytes_stay_unique(tmp_path: Path, out: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    from tests.models import identity_model

    for folder, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / folder).mkdir()
        model = identity_model({"onnx::MatMul_1": np.full(512, value, np.float32)})
        save_external(model, tmp_path / folder / f"{folder}.onnx", "data.bin")

    align_models([tmp_path / "a" / "a.onnx", tmp_path / "b" / "b.onnx"], out, weights_format="safetensors")

    checkpoint = load_file(str(out / "model.safetensors"))
    # Neither member's bytes take the bare name: a key named like a tensor is that tensor's bytes in every member
    # (what every reader checks), so the name two members give to different bytes is qualified for both.
    assert set(checkpoint) == {"a.onnx/onnx::MatMul_1", "b.onnx/onnx::MatMul_1"}
    assert checkpoint["a.onnx/onnx::MatMul_1"][0] == 1.0
    assert checkpoint["b.onnx/onnx::MatMul_1"][0] == 2.0
    for name in ("a", "b"):
        assert verify_models(tmp_path / name / f"{name}.onnx", out / f"{name}.onnx").equal
        assert build_layout_report(out / f"{name}.onnx").ok


def test_safetensors_equal_bytes_of_another_dtype_or_shape_get_a_key_of_their_own(tmp_path: Path, out: Path) -> None:
    """A key has one dtype and shape: zeros as float32 [4], int32 [4] and float32 [2, 2] are three keys, each read
    back by every reader as its own tensor (bytes shared by the same dtype and shape are still stored once)."""
    from safetensors.numpy import load_file

    from tests.models import identity_model

    members = {
        "a": {"f": np.zeros(4, np.float32), "g": np.ones(4, np.float32)},
        "b": {"i": np.zeros(4, np.int32), "g2": np.ones(4, np.float32)},
        "c": {"m": np.zeros((2, 2), np.float32)},
    }
    for folder, tensors in members.items():
        (tmp_path / folder).mkdir()
        save_external(identity_model(tensors), tmp_path / folder / f"{folder}.onnx", "data.bin")

    result = align_models([tmp_path / f / f"{f}.onnx" for f in members], out, weights_format="safetensors")

    checkpoint = load_file(str(out / "model.safetensors"))
    assert set(checkpoint) == {"f", "g", "i", "m"}  # "g2" shares "g"'s bytes, dtype and shape
    assert result.deduplicated_tensors == 1
    for folder, tensors in members.items():
        assert build_layout_report(out / f"{folder}.onnx").ok
        assert verify_models(tmp_path / folder / f"{folder}.onnx", out / f"{folder}.onnx").equal
        with reference_evaluator(out / f"{folder}.onnx") as sess:
            for value, expected in zip(sess.run(None, {}), tensors.values(), strict=True):
                assert value.dtype == expected.dtype
                np.testing.assert_array_equal(value, expected)


def test_size_threshold_moves_the_inline_weights_of_every_member_into_the_shared_file(
    tmp_path: Path, out: Path
) -> None:
    exports = write_family(tmp_path / "exports", size_threshold=1 << 30)  # everything inline
    assert not any((tmp_path / "exports" / folder / "model.onnx_data").exists() for folder in ("export_a", "export_b"))

    result = align_models(exports.sources, out, size_threshold=1024)

    assert [m.externalized_tensors for m in result.members] == [6, 6] and result.externalized_tensors == 12
    assert result.saved_bytes == 16 * 1024
    for source in exports.sources:
        assert_computes_as_its_source(source, out / source.name)
        shapes = [
            t
            for t in tensors_of(onnx.load(str(out / source.name), load_external_data=False).graph)
            if t.name == "shape"
        ]
        assert shapes and shapes[0].data_location != TensorProto.EXTERNAL  # the shape tensor stays inline


def test_re_running_over_the_same_folder_replaces_the_family_as_a_whole(tmp_path: Path, out: Path) -> None:
    old = write_family(tmp_path / "old", seed=1)
    new = write_family(tmp_path / "new", seed=2)
    align_models(old.sources, out, alignment=64)
    names = sorted(p.name for p in out.iterdir())

    result = align_models(new.sources, out, alignment=128)

    assert sorted(p.name for p in out.iterdir()) == names  # same names, no bridge or temp file left
    assert result.stale_weights_files == ()
    for source in new.sources:
        assert_computes_as_its_source(source, out / source.name)
    assert_no_temp_files(out)


def test_re_running_with_another_weights_name_lists_the_old_weights_file_and_keeps_it(
    family: Family, out: Path, caplog: pytest.LogCaptureFixture
) -> None:
    align_models(family.sources, out)
    old = (out / "weights.data").read_bytes()

    with caplog.at_level(logging.WARNING, logger="onnx_light_ref"):
        result = align_models(family.sources, out, weights_name="renamed.data", alignment=256)

    assert result.stale_weights_files == (str(out / "weights.data"),)
    assert (out / "weights.data").read_bytes() == old  # named, never deleted
    assert "weights.data" in caplog.text and "not deleted" in caplog.text
    for source in family.sources:
        assert_computes_as_its_source(source, out / source.name)


@pytest.mark.parametrize("near", ["unreadable", "no-model"])
def test_an_old_weights_file_a_model_that_cannot_be_read_may_use_is_not_called_stale(
    family: Family, out: Path, near: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``.onnx`` beside it whose references cannot be read (too large for the reference scan) may be a model that
    loads it: "cannot read" never means "references nothing", so the file is not listed as one the user may delete.
    One protobuf refuses (a copy cut short) loads nothing: the file is stale, and a warning names that ``.onnx``."""
    align_models(family.sources, out)
    old = (out / "weights.data").read_bytes()
    whole = (out / DECODER).read_bytes()
    monkeypatch.setattr(reference_scan, "MAX_FIELDS", TEST_FIELD_BUDGET)
    near_bytes = (
        grown(onnx.load_from_string(whole)).SerializeToString() if near == "unreadable" else whole[: len(whole) // 2]
    )
    (out / "copy_in_progress.onnx").write_bytes(near_bytes)

    with caplog.at_level(logging.WARNING, logger="onnx_light_ref"):
        result = align_models(family.sources, out, weights_name="renamed.data", alignment=256)

    if near == "unreadable":
        assert result.stale_weights_files == ()
    else:
        assert result.stale_weights_files == (str(out / "weights.data"),)
        assert f"{str(out / 'copy_in_progress.onnx')!r} is not an ONNX model" in caplog.text
    assert (out / "weights.data").read_bytes() == old
    assert (out / "copy_in_progress.onnx").read_bytes() == near_bytes
    for source in family.sources:
        assert_computes_as_its_source(source, out / source.name)


def test_re_aligning_one_member_alone_over_the_shared_weights_is_refused_naming_the_other(
    family: Family, out: Path, tmp_path: Path
) -> None:
    align_models(family.sources, out)
    before = sha256_of_tree(tmp_path)

    with pytest.raises(SharedWeightsError, match=WITH_PAST) as refused:
        align_external_data_streaming(family.decoder, out / DECODER, out / "weights.data", alignment=64)
    assert "decoder_with_past_model.onnx" in str(refused.value) and "replace_shared" in str(refused.value)
    with pytest.raises(SharedWeightsError, match=WITH_PAST):
        align_models([family.decoder], out, alignment=64)  # a family without one of its members

    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(out)


def test_inspect_of_the_folder_shows_the_family_sharing_the_weights_file(
    family: Family, out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from onnx_light_ref._cli import main

    align_models(family.sources, out)

    assert main(["inspect", f"{out}/"]) == 0
    text = capsys.readouterr().out
    assert f"weights.data: used by {DECODER}, {WITH_PAST} (shared by 2 models)" in text
    assert f"{DECODER}: OK" in text and f"{WITH_PAST}: OK" in text


def test_sources_that_share_a_data_file_are_read_once_per_range(tmp_path: Path, out: Path) -> None:
    """Two members in one folder pointing at one data file: identical ranges merge without being compared."""
    from tests.models import identity_model

    folder = tmp_path / "one"
    folder.mkdir()
    tensors = {"w": np.arange(1024, dtype=np.float32), "v": np.ones(2048, np.float32)}
    save_external(identity_model(tensors), folder / "a.onnx", "shared.bin")
    model = onnx.load(str(folder / "a.onnx"), load_external_data=False)
    onnx.save(model, folder / "b.onnx")  # same references, same file

    result = align_models([folder / "a.onnx", folder / "b.onnx"], out)

    assert result.unique_bytes == 12 * 1024 and result.saved_bytes == 12 * 1024
    for name in ("a.onnx", "b.onnx"):
        assert verify_models(folder / name, out / name).equal


def test_a_family_of_one_is_aligned_like_the_aligner_aligns_it(family: Family, out: Path, tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    aligned = align_external_data_streaming(family.decoder, alone / DECODER, alone / "weights.data")

    result = align_models([family.decoder], out, durable=False)

    assert (out / "weights.data").read_bytes() == (alone / "weights.data").read_bytes()
    assert int(result) == int(aligned) and result.saved_bytes == 0 and result.shared_tensors == ()
    assert (out / DECODER).read_bytes() == (alone / DECODER).read_bytes()


def test_progress_reports_every_unique_byte_once(family: Family, out: Path) -> None:
    seen: list[tuple[int, int]] = []

    result = align_models(family.sources, out, progress=lambda done, total: seen.append((done, total)))

    assert seen and seen[-1] == (result.unique_bytes, result.unique_bytes)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_overwrite_replaces_a_file_no_member_uses(family: Family, out: Path) -> None:
    (out / "weights.data").write_bytes(b"a user's file")

    align_models(family.sources, out, overwrite=True)

    for source in family.sources:
        assert_computes_as_its_source(source, out / source.name)


def test_members_without_external_tensors_are_written_with_no_weights_file(tmp_path: Path, out: Path) -> None:
    from tests.models import identity_model

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        onnx.save(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / name / f"{name}.onnx")

    result = align_models([tmp_path / "a" / "a.onnx", tmp_path / "b" / "b.onnx"], out)

    assert (
        int(result) == 0
        and result.weights_files == ()
        and sorted(p.name for p in out.iterdir()) == ["a.onnx", "b.onnx"]
    )
    for name in ("a", "b"):
        assert verify_models(tmp_path / name / f"{name}.onnx", out / f"{name}.onnx").equal


def _sparse_source(folder: Path) -> Path:
    """A model with a 1200-byte inline sparse initializer: onnx's loader never reads sparse tensors back."""
    values = numpy_helper.from_array(np.arange(300, dtype=np.float32), "sp")
    indices = numpy_helper.from_array(np.arange(300, dtype=np.int64), "")
    sparse = helper.make_sparse_tensor(values, indices, [600])
    graph = helper.make_graph([], "g", [], [value_info("sp", TensorProto.FLOAT, [600])], sparse_initializer=[sparse])
    folder.mkdir()
    path = folder / "sparse.onnx"
    onnx.save(make_model(graph), path)
    return path


def test_the_writer_contract_refuses_a_plan_that_externalizes_what_onnx_would_not_load_back(
    tmp_path: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 2 is decided again by the contract, whatever the planner decided: a planner that got it wrong is caught
    before the first byte."""
    import onnx_light_ref.io._plan.checkpoint_policy as checkpoint_policy
    from onnx_light_ref.io._plan.sites import SiteDecision, SitePolicy

    class Careless(SitePolicy):  # a planner ignoring the loader rule, with an analysis the contract cannot reuse
        def __init__(self, model: onnx.ModelProto, size_threshold: int | None) -> None:
            super().__init__(onnx.ModelProto(), size_threshold)

        def decide(self, site: object, nbytes: int | None) -> SiteDecision:
            return SiteDecision(True)

    source = _sparse_source(tmp_path / "src")
    monkeypatch.setattr(checkpoint_policy, "SitePolicy", Careless)  # what the aligners' walk asks (site_policy)
    before = sha256_of_tree(tmp_path)

    with pytest.raises(AssertionError, match=r"was made external although rule 2 keeps it inline \(sparse tensor\)"):
        align_models([source], out, size_threshold=1024)

    assert sha256_of_tree(tmp_path) == before


def test_a_sparse_tensor_stays_inline_and_is_counted(tmp_path: Path, out: Path) -> None:
    source = _sparse_source(tmp_path / "src")

    result = align_models([source], out, size_threshold=1024)

    assert result.kept_inline_tensors == 2 and result.members[0].kept_inline_reasons == {"sparse tensor": 2}
    assert verify_models(source, out / "sparse.onnx").equal


def test_a_kill_free_failure_during_publication_leaves_the_previous_family(
    tmp_path: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error at the last move of a re-run (a bridged publication) undoes every move: the old family stays."""
    from onnx_light_ref.io._write import publish

    old = write_family(tmp_path / "old", seed=1)
    new = write_family(tmp_path / "new", seed=2)
    align_models(old.sources, out, alignment=64)
    before = sha256_of_tree(out)
    real_move = publish._move
    moves = []

    def failing_move(temp: str, final: str) -> object:
        moves.append(final)
        if final.endswith(WITH_PAST) and moves.count(final) == 2:  # commit B of the second member
            raise OSError(5, "injected I/O error")
        return real_move(temp, final)

    monkeypatch.setattr(publish, "_move", failing_move)
    with pytest.raises(OSError, match="injected"):
        align_models(new.sources, out, alignment=128)

    assert sha256_of_tree(out) == before
    assert_no_temp_files(out)
    for source in old.sources:
        assert_computes_as_its_source(source, out / source.name)


def test_a_copy_of_the_family_folder_elsewhere_loads_as_it_is(family: Family, out: Path, tmp_path: Path) -> None:
    """Every location is relative to the folder: the family moves as one folder."""
    align_models(family.sources, out)
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)

    for source in family.sources:
        assert_computes_as_its_source(source, moved / source.name)


def _journal(out: Path, pid: int, files: list[str]) -> Path:
    """A journal of the weights set ``weights.data`` as a writer of ``pid`` leaves it (the publisher's pattern):
    each name with the identity of the file there now (the file that writer moved in)."""
    import json

    from onnx_light_ref.io._write import publish

    ours = Path(publish._own_name(str(out / "weights.data"), publish._JOURNAL_SUFFIX))
    path = ours.with_name(ours.name.replace(f"~{os.getpid()}~", f"~{pid}~"))
    listed = []
    for name in files:
        st = os.stat(out / name) if (out / name).exists() else os.stat(out)
        listed.append(
            {"name": name, "device": st.st_dev, "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        )
    path.write_text(json.dumps({"files": listed}))
    return path


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_file_a_killed_run_left_at_the_weights_name_is_the_familys_without_overwrite(
    family: Family, out: Path
) -> None:
    (out / "weights.data").write_bytes(b"the killed run's half-published weights")
    journal = _journal(out, _dead_pid(), ["weights.data"])

    align_models(family.sources, out)

    assert not journal.exists()  # deleted by the next publication of the set, after its last commit
    assert_no_temp_files(out)
    for source in family.sources:
        assert_computes_as_its_source(source, out / source.name)


@pytest.mark.parametrize(
    "case",
    [
        "live-writer",
        "another-name",
        "a-path-outside",
        "a-name-with-a-newline",
        "a-pid-in-other-digits",
        "a-file-put-there-since",
        "the-file-rewritten-since",
    ],
)
def test_a_journal_grants_nothing_unless_a_dead_writer_named_the_file(family: Family, out: Path, case: str) -> None:
    """A journal is evidence of one file only: the one its dead writer moved in, still there with the device, inode
    and size it recorded. A file a user put at that name since (``rm out/*`` leaves the hidden journal) is theirs."""
    (out / "weights.data").write_bytes(b"the killed run's file")
    pid = os.getppid() if case == "live-writer" else _dead_pid()  # a running process that is not this one
    files = {"another-name": ["other.data"], "a-path-outside": ["../weights.data"]}
    journal = _journal(out, pid, files.get(case, ["weights.data"]))
    (out / "weights.data").unlink()
    (out / "weights.data").write_bytes(b"a file of the user's")  # a new file: another inode (or the same, reused)
    if case == "the-file-rewritten-since":  # the killed run's file itself, written over in place since
        (out / "weights.data").unlink()
        (out / "weights.data").write_bytes(b"the killed run's file")
        journal.write_text(journal.read_text())  # the journal names the file as it was before
        os.utime(out / "weights.data", ns=(0, 0))
    if case == "a-name-with-a-newline":  # a user's file, not the publisher's: the pattern must match it whole
        journal.rename(journal.with_name(journal.name + "\n"))
    elif case == "a-pid-in-other-digits":  # Arabic-Indic digits: ``\d`` takes them, and int() reads a dead pid
        digits = "".join(chr(0x0660 + int(d)) for d in str(pid))
        journal.rename(journal.with_name(journal.name.replace(f"~{pid}~", f"~{digits}~")))
    before = sha256_of_tree(out)

    with pytest.raises(ExistingFileError, match=r"weights\.data' exists and is not an output of"):
        align_models(family.sources, out)

    assert sha256_of_tree(out) == before


def test_the_documented_prints_of_a_family_result_are_what_it_prints(family: Family, tmp_path: Path) -> None:
    """``print(result)`` prints the number (a FamilyResult is an int): the README and docs/align_models.md showed it
    as ``FamilyResult(...)``, which ``print(repr(result))`` prints."""
    import re

    out = tmp_path / "family"
    out.mkdir()
    result = align_models(family.sources, out, durable=False)

    assert str(result) == str(int(result)) == "28672"
    assert re.fullmatch(
        r"FamilyResult\(28672 bytes in 1 weights file\(s\): 2 members, 12 tensors, unique_bytes=24576, "
        r"saved_bytes=16384, shared_tensors=5\)",
        repr(result),
    )
    root = Path(__file__).resolve().parents[2]
    for page in (root / "README.md", root / "docs" / "align_models.md"):
        shown = [line.strip() for line in page.read_text().splitlines() if "# FamilyResult(" in line]
        assert shown and all(line.startswith("print(repr(result))") for line in shown), (page.name, shown)
        assert "print(result)" in page.read_text()  # and the plain print is said to be the number
