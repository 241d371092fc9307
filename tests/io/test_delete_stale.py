"""``delete_stale`` / ``--delete-stale``: an earlier layout's files go once the new one is published, through the
writer contract's guard (``tests/contract/test_removals.py`` holds the guard itself).

Every writer that lists stale files (both aligners, ``align_models``, ``link``) hands them to the contract as
removals: a re-run with fewer shards removes the old shards; a stale shard another model references is kept and
named (result, warning, command line); a refused run removes nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as st_numpy

from onnx_light_ref import align_external_data_streaming, align_models, link_external_data
from onnx_light_ref.errors import ExistingFileError
from tests.checks import run_onnxruntime, snapshot_tree, temp_files_under
from tests.cli_runner import run_cli
from tests.contract.sharers import computes, external_model
from tests.models import write_external_model, write_model

RNG = np.random.default_rng(8)
ARRAYS = {name: RNG.standard_normal(1000).astype(np.float32) for name in ("a", "b", "c", "d")}  # 4000 bytes each


def _source(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return write_external_model(tmp_path / "src", ARRAYS)


def _align(source: Path, dst: Path, shard: int, **options: object) -> object:
    return align_external_data_streaming(source, dst, alignment=64, max_shard_size=shard, durable=False, **options)


def _outputs(dst: Path) -> list[np.ndarray]:
    return run_onnxruntime(dst, {})


def test_a_rerun_with_fewer_shards_removes_the_old_shards(tmp_path: Path) -> None:
    source = _source(tmp_path)
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    assert len(_align(source, dst, 4096).weights_files) == 4  # type: ignore[attr-defined]
    old = [dst.parent / f"model.onnx.data.{index}" for index in (2, 3)]

    result = _align(source, dst, 8192, delete_stale=True)

    assert result.removed_files == tuple(str(path) for path in old)  # type: ignore[attr-defined]
    assert result.stale_weights_files == ()  # type: ignore[attr-defined]
    assert sorted(p.name for p in dst.parent.iterdir()) == ["model.onnx", "model.onnx.data", "model.onnx.data.1"]
    for got, want in zip(_outputs(dst), ARRAYS.values(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_without_it_the_old_shards_stay_and_are_listed(tmp_path: Path) -> None:
    source = _source(tmp_path)
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    _align(source, dst, 4096)
    result = _align(source, dst, 8192)
    assert result.removed_files == ()  # type: ignore[attr-defined]
    assert [Path(p).name for p in result.stale_weights_files] == ["model.onnx.data.2", "model.onnx.data.3"]  # type: ignore[attr-defined]
    assert (dst.parent / "model.onnx.data.3").exists()


def test_a_stale_shard_another_model_references_is_kept_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _source(tmp_path)
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    _align(source, dst, 4096)
    variant = write_model(dst.parent / "variant.onnx", external_model("model.onnx.data.3"))  # reads that shard
    computed = computes(variant)

    with caplog.at_level(logging.WARNING):
        result = _align(source, dst, 8192, delete_stale=True)

    shard = str(dst.parent / "model.onnx.data.3")
    assert result.removed_files == (str(dst.parent / "model.onnx.data.2"),)  # type: ignore[attr-defined]
    assert result.stale_weights_files == (shard,)  # type: ignore[attr-defined]
    assert f"kept the earlier file {shard} (another model uses it" in caplog.text
    np.testing.assert_array_equal(computes(variant), computed)


def test_nothing_is_removed_when_the_run_is_refused(tmp_path: Path) -> None:
    source = _source(tmp_path)
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    _align(source, dst, 4096, dst_weights_path=None)
    (dst.parent / "w.bin").write_bytes(b"the user's file")  # the new run's weights name: not the destination's
    before = snapshot_tree(tmp_path)
    with pytest.raises(ExistingFileError, match=r"w\.bin' exists"):
        align_external_data_streaming(
            source, dst, dst.parent / "w.bin", 64, max_shard_size=8192, delete_stale=True, durable=False
        )
    assert snapshot_tree(tmp_path) == before and temp_files_under(tmp_path) == []
    result = align_external_data_streaming(
        source, dst, dst.parent / "w.bin", 64, max_shard_size=8192, delete_stale=True, durable=False, overwrite=True
    )
    assert len(result.removed_files) == 4  # what the refused run would have removed


def test_a_wrong_type_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="delete_stale"):
        align_external_data_streaming(tmp_path / "absent.onnx", tmp_path / "m.onnx", delete_stale="yes")  # type: ignore[arg-type]


def test_the_command_says_what_it_removed_and_what_it_kept(tmp_path: Path) -> None:
    source = _source(tmp_path)
    dst = tmp_path / "out" / "model.onnx"
    common = ["align", str(source), str(dst), "--alignment", "64", "--no-progress"]
    assert run_cli(*common, "--max-shard-size", "4096").returncode == 0
    write_model(dst.parent / "variant.onnx", external_model("model.onnx.data.3"))

    done = run_cli(*common, "--max-shard-size", "8192", "--delete-stale")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"removed 1 earlier file(s) no model uses now: {dst.parent / 'model.onnx.data.2'}" in lines
    kept = next(line for line in lines if line.startswith("note: kept 1 earlier file(s)"))
    assert str(dst.parent / "model.onnx.data.3") in kept
    assert f"kept the earlier file {dst.parent / 'model.onnx.data.3'} (another model uses it" in done.stderr


def test_the_command_without_it_says_it_would_remove_them(tmp_path: Path) -> None:
    source = _source(tmp_path)
    dst = tmp_path / "out" / "model.onnx"
    common = ["align", str(source), str(dst), "--alignment", "64", "--no-progress"]
    assert run_cli(*common, "--max-shard-size", "4096").returncode == 0
    done = run_cli(*common, "--max-shard-size", "8192")
    assert "(--delete-stale removes those no other model uses)" in done.stdout
    assert (dst.parent / "model.onnx.data.3").exists()


def test_a_family_rerun_with_fewer_shards_removes_the_old_shards(tmp_path: Path) -> None:
    source = _source(tmp_path)
    out = tmp_path / "family"
    out.mkdir()
    first = align_models([source], out, alignment=64, max_shard_size=4096, durable=False)
    assert len(first.weights_files) == 4

    result = align_models([source], out, alignment=64, max_shard_size=8192, durable=False, delete_stale=True)

    assert [Path(p).name for p in result.removed_files] == ["weights.data.2", "weights.data.3"]
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "weights.data", "weights.data.1"]
    for got, want in zip(_outputs(out / "model.onnx"), ARRAYS.values(), strict=True):
        np.testing.assert_array_equal(got, want)
    done = run_cli(
        "align-models", str(source), "--out", str(out), "--alignment", "64", "--max-shard-size", "4096",
        "--no-progress", "--delete-stale",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "removed" not in done.stdout  # more shards again: nothing stale
    assert len(list(out.glob("weights.data*"))) == 4


def test_a_link_that_needs_no_weights_file_any_more_removes_the_old_one(tmp_path: Path) -> None:
    source = _source(tmp_path)
    out = tmp_path / "linked"
    out.mkdir()
    st_numpy.save_file({"a": ARRAYS["a"]}, str(out / "ck.safetensors"))
    first = link_external_data(source, out / "ck.safetensors", out / "model.onnx", alignment=64, durable=False)
    assert first.weights_files == (str(out / "model.onnx.data"),)
    st_numpy.save_file(dict(ARRAYS), str(out / "all.safetensors"))  # now every tensor is a key

    result = link_external_data(
        source, out / "all.safetensors", out / "model.onnx", alignment=64, durable=False, delete_stale=True
    )

    assert result.weights_files == () and result.removed_files == (str(out / "model.onnx.data"),)
    assert not (out / "model.onnx.data").exists()
    for got, want in zip(_outputs(out / "model.onnx"), ARRAYS.values(), strict=True):
        np.testing.assert_array_equal(got, want)
