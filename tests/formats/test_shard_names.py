"""Shard names consumers load (ours, hf, transformers.js): the files written, onnxruntime loading them, stale files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming, verify_models
from onnx_light_ref.io._plan.shard_names import shard_paths, stale_candidates
from tests.checks import run_onnxruntime, sha256_of_tree
from tests.cli_runner import run_cli
from tests.models import make_external_model

ARRAYS = {f"w{i}": np.full((256,), i, dtype=np.float32) for i in range(3)}  # 1024 bytes each


def test_shard_paths_of_each_scheme() -> None:
    assert shard_paths("/d/m.onnx.data", 3, None) == ["/d/m.onnx.data", "/d/m.onnx.data.1", "/d/m.onnx.data.2"]
    assert shard_paths("/d/model.data", 2, "hf") == ["/d/model-00001-of-00002.data", "/d/model-00002-of-00002.data"]
    assert shard_paths("/d/model.data", 1, "hf") == ["/d/model.data"]
    assert shard_paths("/d/model.onnx_data", 3, "transformers.js") == [
        "/d/model.onnx_data",
        "/d/model.onnx_data_1",
        "/d/model.onnx_data_2",
    ]
    assert len(shard_paths("/d/m.onnx_data", 100, "transformers.js")) == 100
    with pytest.raises(ValueError, match="at most 100"):
        shard_paths("/d/m.onnx_data", 101, "transformers.js")


@pytest.mark.parametrize(
    ("scheme", "names"),
    [
        (None, ["model.onnx.data", "model.onnx.data.1", "model.onnx.data.2"]),
        ("hf", ["model-00001-of-00003.data", "model-00002-of-00003.data", "model-00003-of-00003.data"]),
        ("transformers.js", ["model.onnx_data", "model.onnx_data_1", "model.onnx_data_2"]),
    ],
)
@pytest.mark.parametrize("aligner", [align_external_data_streaming, align_external_data_in_memory])
def test_each_scheme_writes_its_names_and_loads_in_onnxruntime(
    tmp_path: Path, scheme: str | None, names: list[str], aligner: object
) -> None:
    src = make_external_model(tmp_path, ARRAYS, name="src.onnx")
    dst = tmp_path / "model.onnx"
    result = aligner(src, dst, max_shard_size=1024, shard_names=scheme)  # type: ignore[operator]
    assert [Path(p).name for p in result.weights_files] == names
    for array, output in zip(ARRAYS.values(), run_onnxruntime(dst, {}), strict=True):
        assert np.array_equal(array, output)
    assert verify_models(src, dst).equal


@pytest.mark.parametrize(
    ("scheme", "leftover"),
    [
        (None, ["model.onnx.data.2"]),
        ("hf", ["model-00001-of-00003.data", "model-00002-of-00003.data", "model-00003-of-00003.data"]),
        ("transformers.js", ["model.onnx_data_2"]),
    ],
)
def test_stale_shards_are_reported_for_each_scheme_and_never_deleted(
    tmp_path: Path, scheme: str | None, leftover: list[str]
) -> None:
    src = make_external_model(tmp_path, ARRAYS, name="src.onnx")
    dst = tmp_path / "model.onnx"
    align_external_data_streaming(src, dst, None, 0, max_shard_size=1024, shard_names=scheme)  # type: ignore[arg-type]
    result = align_external_data_streaming(src, dst, None, 0, max_shard_size=2048, shard_names=scheme)  # type: ignore[arg-type]
    assert [Path(p).name for p in result.stale_weights_files] == leftover
    assert all(Path(p).exists() for p in result.stale_weights_files)
    for array, output in zip(ARRAYS.values(), run_onnxruntime(dst, {}), strict=True):
        assert np.array_equal(array, output)


EARLIER_RUNS = {  # an earlier run's options -> the files it leaves that a default run (model.onnx.data) does not write
    "hf": (
        {"shard_names": "hf"},
        ["model-00001-of-00003.data", "model-00002-of-00003.data", "model-00003-of-00003.data"],
    ),
    "transformers.js": (
        {"shard_names": "transformers.js"},
        ["model.onnx_data", "model.onnx_data_1", "model.onnx_data_2"],
    ),
    "safetensors": (
        {"weights_format": "safetensors"},
        ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
         "model.safetensors.index.json"],
    ),
    "ours": ({}, ["model.onnx.data.1", "model.onnx.data.2"]),
}  # fmt: skip


@pytest.mark.parametrize("earlier", list(EARLIER_RUNS))
def test_every_schemes_leftovers_are_listed_whatever_the_scheme_of_this_run(tmp_path: Path, earlier: str) -> None:
    """An earlier run with another scheme or format left its shards: the current (default, one file) run names
    them in ``stale_weights_files`` and deletes none; the CLI prints them in its note."""
    options, leftovers = EARLIER_RUNS[earlier]
    src = make_external_model(tmp_path, ARRAYS, name="src.onnx")
    dst = tmp_path / "model.onnx"
    align_external_data_streaming(src, dst, None, 0, max_shard_size=1024, **options)  # type: ignore[arg-type]
    before = {name: (tmp_path / name).read_bytes() for name in leftovers}

    result = align_external_data_streaming(src, dst, None, 0)

    assert [Path(p).name for p in result.stale_weights_files] == sorted(leftovers)
    assert {name: (tmp_path / name).read_bytes() for name in leftovers} == before
    assert verify_models(src, dst).equal
    # The same through the command, after the same earlier run again (for a safetensors set, what makes its shards
    # the destination's is that the model then at the destination used them; once it does not, rule 3 no longer
    # calls them its own either: overwrite).
    align_external_data_streaming(src, dst, None, 0, max_shard_size=1024, overwrite=True, **options)  # type: ignore[arg-type]
    out = run_cli("align", str(src), str(dst), "--alignment", "0", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert f"note: {len(leftovers)} file(s) left by an earlier run" in out.stdout
    assert all(str(tmp_path / name) in out.stdout for name in leftovers)


def test_a_pytorch_checkpoint_named_model_safetensors_is_not_called_a_leftover(tmp_path: Path) -> None:
    """``model.safetensors`` is every PyTorch checkpoint's name: listed only when it is the current run's own name."""
    src = make_external_model(tmp_path, ARRAYS, name="src.onnx")
    (tmp_path / "model.safetensors").write_bytes(b"a user's checkpoint")
    (tmp_path / "model.data").write_bytes(b"an hf-named single weights file of an earlier run")
    result = align_external_data_streaming(src, tmp_path / "model.onnx", None, 0)
    assert [Path(p).name for p in result.stale_weights_files] == ["model.data"]


def test_stale_candidates_ignore_unrelated_names(tmp_path: Path) -> None:
    hostile = [  # a user's files named almost like shards: other digits, a trailing newline
        "model-\u0660\u0660\u0660\u0660\u0661-of-\u0660\u0660\u0660\u0660\u0662.data",
        "model-00001-of-00002.data\n",
        "model-00001-of-00002\n.data",
        "model.onnx.data.\u0661",
        "model.onnx_data_\u0661",
        "model.onnx.data.1\n",
        "model.onnx_data_1\n",
        "model.data.index.json\n",
    ]
    unrelated = ["model-x-of-00002.data", "model.data.bak", "model.onnx_data_01", *hostile]
    for name in ["model-00001-of-00002.data", *unrelated]:
        (tmp_path / name).write_bytes(b"")
    dst = str(tmp_path / "model.onnx")
    assert stale_candidates(dst, str(tmp_path / "model.data"), []) == [str(tmp_path / "model-00001-of-00002.data")]
    assert stale_candidates(dst, str(tmp_path / "model.onnx_data"), [str(tmp_path / "model-00001-of-00002.data")]) == []


def test_more_than_100_transformers_js_chunks_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    arrays = {f"w{i}": np.full((4,), i, dtype=np.float32) for i in range(101)}
    src = make_external_model(tmp_path, arrays, name="src.onnx")
    before = sha256_of_tree(tmp_path)
    with pytest.raises(ValueError, match="at most 100 weights files"):
        align_external_data_streaming(src, tmp_path / "model.onnx", max_shard_size=16, shard_names="transformers.js")
    assert sha256_of_tree(tmp_path) == before


def test_cli_align_format_and_shard_names(tmp_path: Path) -> None:
    src = make_external_model(tmp_path, ARRAYS, name="src.onnx")
    out = run_cli(
        "align",
        str(src),
        str(tmp_path / "model.onnx"),
        "--format",
        "safetensors",
        "--max-shard-size",
        "6K",  # two 1 KiB tensors and their header (the cap counts it; padded to the default 4096 alignment)
        "--no-progress",
    )
    assert out.returncode == 0, out.stderr
    assert "model-00001-of-00002.safetensors (+1 shards: 2 files)" in out.stdout
    assert "index " + str(tmp_path / "model.safetensors.index.json") in out.stdout
    out = run_cli(
        "align",
        str(src),
        str(tmp_path / "t.onnx"),
        "--shard-names",
        "transformers.js",
        "--max-shard-size",
        "1K",
        "--no-progress",
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "t.onnx_data_2").exists()
    out = run_cli("align", str(src), str(tmp_path / "d.onnx"), "--format", "safetensors", "--dedup", "--no-progress")
    assert out.returncode == 1 and out.stderr.startswith("error: dedup=True is refused")
    assert not (tmp_path / "d.onnx").exists() and not (tmp_path / "d.safetensors").exists()


# A user's Hugging Face PyTorch checkpoint, sharded, in the destination folder: ``model.safetensors`` is every
# checkpoint's name, and so are its shards and index. None of them is a leftover of a run of ours unless the model
# at the destination used them: never listed as stale (the CLI's note would tell the user to delete them), never
# replaced.

PYTORCH = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]


def _pytorch_checkpoint(folder: Path) -> dict[str, str]:
    import json

    import safetensors.numpy as st_numpy

    shards = {PYTORCH[0]: {"layer.0": np.arange(8, dtype=np.float32)}, PYTORCH[1]: {"layer.1": np.ones(4, np.int64)}}
    for name, tensors in shards.items():
        st_numpy.save_file(tensors, str(folder / name), metadata={"format": "pt"})
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (folder / PYTORCH[2]).write_text(json.dumps({"metadata": {"total_size": 64}, "weight_map": weight_map}))
    return sha256_of_tree(folder)


def _checkpoint_kept(folder: Path, before: dict[str, str]) -> None:
    assert {name: sha256 for name, sha256 in sha256_of_tree(folder).items() if name in PYTORCH} == {
        name: before[name] for name in PYTORCH
    }


RUNS = {  # how the user writes model.onnx into the checkpoint's folder
    "align": ([], {}),
    "align-hf": (["--shard-names", "hf"], {"shard_names": "hf"}),
    "align-safetensors": (["--format", "safetensors"], {"weights_format": "safetensors"}),
    "align-safetensors-hf": (
        ["--format", "safetensors", "--shard-names", "hf"],
        {"weights_format": "safetensors", "shard_names": "hf"},
    ),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_a_pytorch_sharded_checkpoint_beside_the_destination_is_not_called_stale(tmp_path: Path, run: str) -> None:
    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", ARRAYS, name="src.onnx")
    folder = tmp_path / "hub"
    folder.mkdir()
    before = _pytorch_checkpoint(folder)
    argv, options = RUNS[run]
    dst = folder / "model.onnx"

    result = align_external_data_streaming(src, dst, None, 0, **options)  # type: ignore[arg-type]
    assert result.stale_weights_files == ()
    out = run_cli("align", str(src), str(dst), "--alignment", "0", "--no-progress", *argv)
    assert out.returncode == 0, out.stderr
    assert "note:" not in out.stdout and not any(name in out.stdout for name in PYTORCH)
    _checkpoint_kept(folder, before)
    for array, output in zip(ARRAYS.values(), run_onnxruntime(dst, {}), strict=True):
        assert np.array_equal(array, output)


def test_a_sharded_safetensors_run_over_a_pytorch_checkpoints_shard_names_is_refused(tmp_path: Path) -> None:
    """The run's own shards would take the checkpoint's names: rule 3 refuses, naming them; nothing is written."""
    from onnx_light_ref.errors import ExistingFileError

    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", ARRAYS, name="src.onnx")
    folder = tmp_path / "hub"
    folder.mkdir()
    before = _pytorch_checkpoint(folder)
    with pytest.raises(ExistingFileError, match=r"model-00001-of-00002\.safetensors' exists"):
        align_external_data_streaming(
            src, folder / "model.onnx", None, 0, weights_format="safetensors", max_shard_size=2560
        )
    assert sha256_of_tree(folder) == before


@pytest.mark.parametrize("checkpoint", ["its own file", "the sharded checkpoint's index"])
def test_link_beside_a_pytorch_sharded_checkpoint_does_not_call_it_stale(tmp_path: Path, checkpoint: str) -> None:
    import safetensors.numpy as st_numpy
    from onnx import numpy_helper

    from onnx_light_ref import link_external_data
    from tests.models import identity_model, save_external

    folder = tmp_path / "hub"
    folder.mkdir()
    before = _pytorch_checkpoint(folder)
    arrays = {"layer.0": np.arange(8, dtype=np.float32)}
    src = save_external(identity_model(arrays), tmp_path / "src.onnx", "src.data")
    if checkpoint == "its own file":
        target = folder / "other.safetensors"
        st_numpy.save_file(arrays, str(target))
    else:
        target = folder / PYTORCH[2]
    result = link_external_data(src, target, folder / "model.onnx")
    assert result.stale_weights_files == () and result.linked_tensors == 1
    _checkpoint_kept(folder, before)
    (output,) = run_onnxruntime(folder / "model.onnx", {})
    assert np.array_equal(output, numpy_helper.to_array(numpy_helper.from_array(arrays["layer.0"])))


def test_the_shards_and_index_of_an_earlier_safetensors_run_are_stale_once_the_model_used_them(
    tmp_path: Path,
) -> None:
    """Demonstrably ours: the model now at the destination references those shards, so a run that writes one file
    names them (and the index), as before."""
    src = make_external_model(tmp_path, ARRAYS, name="src.onnx")
    dst = tmp_path / "model.onnx"
    align_external_data_streaming(src, dst, None, 0, weights_format="safetensors", max_shard_size=1024)
    result = align_external_data_streaming(src, dst, None, 0, weights_format="safetensors")
    assert sorted(Path(p).name for p in result.stale_weights_files) == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    # A later run no longer sees a model that used them: they are not called the destination's any more.
    again = align_external_data_streaming(src, dst, None, 0, weights_format="safetensors")
    assert again.stale_weights_files == ()


def test_a_single_file_of_ours_beside_a_pytorch_checkpoint_does_not_make_its_shards_ours(tmp_path: Path) -> None:
    """A run of ours wrote ``model.safetensors`` beside the user's sharded checkpoint; a sharded run then would take
    the checkpoint's names: they are not the destination's (its model used the single file only), so rule 3 refuses
    until ``overwrite``, and nothing is written. It used to replace all three files without a word."""
    from onnx_light_ref.errors import ExistingFileError

    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", ARRAYS, name="src.onnx")
    folder = tmp_path / "hub"
    folder.mkdir()
    _pytorch_checkpoint(folder)
    align_external_data_streaming(src, folder / "model.onnx", None, 0, weights_format="safetensors")
    before = sha256_of_tree(folder)
    with pytest.raises(ExistingFileError) as refused:
        align_external_data_streaming(
            src, folder / "model.onnx", None, 0, weights_format="safetensors", max_shard_size=2560
        )
    assert all(f"{str(folder / name)!r} exists" in str(refused.value) for name in PYTORCH)
    assert sha256_of_tree(folder) == before
