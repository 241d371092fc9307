"""``--update-config config.json`` / ``update_config=``: transformers.js's ``use_external_data_format`` written into a
real ``config.json`` (the fixture's ``save_pretrained`` one), in the model's transaction.

transformers.js (``resolveExternalDataFormat``) reads ``transformers.js_config.use_external_data_format`` as a count
for every model or as an object per model file name, then fetches ``NAME.onnx_data``, ``NAME.onnx_data_1``... from
the model's folder (``onnx/`` in a transformers.js repository, beside ``config.json``'s folder).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming, align_models
from onnx_light_ref.errors import ConfigFileError
from onnx_light_ref.io._write import publish
from tests.checks import snapshot_tree, temp_files_under
from tests.cli_runner import run_cli
from tests.hf.fixtures import copy_fixture, run_ort

SHARD = 40 * 1024  # the llama export's 106 KB of weights in three transformers.js chunks


def _repository(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A transformers.js layout: ``repo/config.json`` (the checkpoint's) and ``repo/onnx/`` (to write); the source
    export; the config."""
    folder = copy_fixture("llama", tmp_path)
    repo = tmp_path / "repo"
    (repo / "onnx").mkdir(parents=True)
    shutil.copyfile(folder / "checkpoint" / "config.json", repo / "config.json")
    return folder / "dynamo" / "model.onnx", repo / "onnx" / "model.onnx", repo / "config.json"


def _chunks(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("model.onnx_data"))


def test_the_exact_count_goes_into_a_real_config_and_every_other_key_is_kept(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    original = json.loads(config.read_text())

    result = align_external_data_streaming(
        source, dst, max_shard_size=SHARD, shard_names="transformers.js", update_config=config, durable=False
    )

    written = json.loads(config.read_text())  # parses
    assert result.config_file == str(config)
    assert _chunks(dst.parent) == ["model.onnx_data", "model.onnx_data_1", "model.onnx_data_2"]
    assert written["transformers.js_config"] == {"use_external_data_format": {"model.onnx": 3}}
    assert list(written)[:-1] == list(original) and {k: written[k] for k in original} == original
    # Written as save_pretrained writes it: the untouched part is byte for byte the same.
    before = (source.parent.parent / "checkpoint" / "config.json").read_text()
    assert config.read_text().startswith(before.rstrip().rstrip("}").rstrip())
    for got, want in zip(run_ort(dst), run_ort(source), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_existing_entry_keeps_the_other_models_counts(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    settings = {"dtype": "fp32", "use_external_data_format": {"model_fp16.onnx": 1, "model.onnx": True}, "x": 1}
    config.write_text(json.dumps({"model_type": "llama", "transformers.js_config": settings}, indent=4))

    align_external_data_in_memory(
        source, dst, max_shard_size=SHARD, shard_names="transformers.js", update_config=config
    )

    section = json.loads(config.read_text())["transformers.js_config"]
    assert section == {"dtype": "fp32", "use_external_data_format": {"model_fp16.onnx": 1, "model.onnx": 3}, "x": 1}
    assert list(section["use_external_data_format"]) == ["model_fp16.onnx", "model.onnx"]  # kept in place
    assert config.read_text().startswith('{\n    "model_type"')  # the file's own indentation


def test_a_number_for_every_model_becomes_a_map_that_keeps_the_others(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    (dst.parent / "model_q4.onnx").write_bytes(b"")  # another model of the repository, loaded with the old value
    config.write_text(json.dumps({"transformers.js_config": {"use_external_data_format": True}}))

    align_external_data_streaming(
        source, dst, max_shard_size=SHARD, shard_names="transformers.js", update_config=config, durable=False
    )

    section = json.loads(config.read_text())["transformers.js_config"]
    assert section == {"use_external_data_format": {"model_q4.onnx": True, "model.onnx": 3}}


def test_a_number_already_exact_is_left_as_it_is(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    config.write_text(json.dumps({"transformers.js_config": {"use_external_data_format": 3}}))
    align_external_data_streaming(
        source, dst, max_shard_size=SHARD, shard_names="transformers.js", update_config=config, durable=False
    )
    assert json.loads(config.read_text()) == {"transformers.js_config": {"use_external_data_format": 3}}


def test_the_command_updates_the_config_and_says_so(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    done = run_cli(
        "align", str(source), str(dst), "--max-shard-size", "40K", "--shard-names", "transformers.js",
        "--update-config", str(config), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f'updated {config}: "transformers.js_config": "use_external_data_format" {{"model.onnx": 3}}'
        in done.stdout.splitlines()
    )
    assert json.loads(config.read_text())["transformers.js_config"]["use_external_data_format"] == {"model.onnx": 3}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('["a", "list"]', r"is a JSON array, not an object: transformers\.js reads a config\.json object"),
        # Python 3.13 names the trailing comma; older versions the key it expected
        ('{"a": 1,}', r"is not JSON \((Illegal trailing comma before end of object|Expecting property name).* line 1"),
        ('{"a": 1, "a": 2}', r"has the key 'a' twice in one object"),
        ('{"transformers.js_config": "fp16"}', r"'transformers\.js_config' is a JSON string, not an object"),
        (
            '{"transformers.js_config": {"use_external_data_format": "3"}}',
            r"transformers\.js_config\.use_external_data_format is a JSON string; transformers\.js reads a number",
        ),
        ('{"a": "\xff"}', r"is not UTF-8 text \(byte 7\)"),
    ],
)
def test_a_config_that_cannot_be_updated_is_refused_and_nothing_is_written(
    tmp_path: Path, content: str, message: str
) -> None:
    source, dst, config = _repository(tmp_path)
    config.write_bytes(content.encode("latin-1"))
    before = snapshot_tree(tmp_path)
    with pytest.raises(ConfigFileError, match=message) as raised:
        align_external_data_streaming(
            source, dst, max_shard_size=SHARD, shard_names="transformers.js", update_config=config
        )
    assert str(config) in str(raised.value) and str(raised.value).endswith("nothing was written.")
    assert "\n" not in str(raised.value)
    assert snapshot_tree(tmp_path) == before and temp_files_under(tmp_path) == []


def test_weights_transformers_js_does_not_fetch_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    before = snapshot_tree(tmp_path)
    with pytest.raises(ValueError, match=r"fetches the external data of 'model\.onnx' from files named after it") as e:
        align_external_data_streaming(source, dst, max_shard_size=SHARD, update_config=config)  # ours: model.onnx.data
    assert "shard_names='transformers.js'" in str(e.value) and "'model.onnx.data'" in str(e.value)
    assert snapshot_tree(tmp_path) == before


def test_a_missing_config_is_refused_by_the_command_in_one_line(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    config.unlink()
    before = snapshot_tree(tmp_path)
    done = run_cli(
        "align", str(source), str(dst), "--shard-names", "transformers.js", "--update-config", str(config),
        "--no-progress",
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "does not exist" in done.stderr and str(config) in done.stderr
    assert snapshot_tree(tmp_path) == before


@pytest.mark.parametrize("change", ["edited", "replaced by a copy"])
def test_a_config_changed_while_the_run_worked_is_refused_under_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """Re-read under the folder lock: other bytes, or the same bytes in another file (an editor's save: rule 3's
    evidence is that very file)."""
    source, dst, config = _repository(tmp_path)
    real_publish = publish.OutputTransaction.publish
    copy = config.with_name("config.json.new")
    copy.write_text('{"edited": "meanwhile"}' if change == "edited" else config.read_text())
    expected = json.loads(copy.read_text())

    def change_then_publish(self: publish.OutputTransaction, *args: object, **kwargs: object) -> object:
        copy.replace(config)
        return real_publish(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(publish.OutputTransaction, "publish", change_then_publish)
    with pytest.raises(ConfigFileError, match="changed while this run worked"):
        align_external_data_streaming(source, dst, shard_names="transformers.js", update_config=config)
    assert json.loads(config.read_text()) == expected
    assert sorted(p.name for p in dst.parent.iterdir()) == [] and temp_files_under(tmp_path) == []


def test_a_family_member_named_like_its_weights_gets_its_count(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    result = align_models(
        {source: "model.onnx"},
        dst.parent,
        weights_name="model.onnx_data",
        shard_names="transformers.js",
        max_shard_size=SHARD,
        update_config=config,
        durable=False,
    )
    assert result.config_file == str(config) and len(result.weights_files) == 3
    written = json.loads(config.read_text())
    assert written["transformers.js_config"] == {"use_external_data_format": {"model.onnx": 3}}


def test_members_sharing_one_set_are_refused_naming_the_member(tmp_path: Path) -> None:
    source, dst, config = _repository(tmp_path)
    before = snapshot_tree(tmp_path)
    with pytest.raises(ValueError, match=r"'decoder_model\.onnx' from files named after it") as raised:
        align_models(
            {source: "decoder_model.onnx", source.parent.parent / "dynamo_optimized" / "model.onnx": "past.onnx"},
            dst.parent,
            shard_names="transformers.js",
            update_config=config,
        )
    assert "shared by several members cannot be loaded by count" in str(raised.value)
    assert snapshot_tree(tmp_path) == before
    done = run_cli(
        "align-models", f"{source}=decoder_model.onnx", "--out", str(dst.parent), "--shard-names", "transformers.js",
        "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "note: transformers.js fetches the external data of decoder_model.onnx from files named after it "
        "(decoder_model.onnx_data, decoder_model.onnx_data_1...), so it cannot load decoder_model.onnx by count from "
        "weights.onnx_data*"
    ) in done.stdout.splitlines()
