"""Every refusal of ``align_models``, through the API and the CLI: the exception type and message, and that nothing
was written (the whole tree, sources and destination, hashed before and after; no temp file left)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref import align_models
from onnx_light_ref._cli import main
from onnx_light_ref.errors import (
    DestinationConflictError,
    ExistingFileError,
    InvalidModelError,
    SafetensorsError,
    SharedWeightsError,
    UnsafeLocationError,
)
from onnx_light_ref.io._arguments import ArgumentTypeError
from tests.checks import assert_no_temp_files, sha256_of_tree
from tests.family.family_models import Family, write_family
from tests.models import identity_model, save_external

Setup = Callable[[Path, Family, Path], tuple[list[object], dict[str, object]]]  # -> (sources, options)


def _same_basename(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    other = tmp / "elsewhere"
    other.mkdir()
    shutil.copy(family.with_past, other / family.decoder.name)
    shutil.copy(family.with_past.parent / "model.onnx_data", other / "model.onnx_data")
    return [family.decoder, other / family.decoder.name], {}


def _source_inside_the_folder(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    shutil.copy(family.decoder, out / family.decoder.name)
    shutil.copy(family.decoder.parent / "model.onnx_data", out / "model.onnx_data")
    return [out / family.decoder.name, family.with_past], {}


def _source_data_is_the_weights_file(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    """A source's data file is the weights file the run writes (a hard link of it into the folder)."""
    (tmp / "src").mkdir()
    save_external(identity_model({"w": np.arange(512, dtype=np.float32)}), tmp / "src" / "m.onnx", "data.bin")
    (out / "weights.data").hardlink_to(tmp / "src" / "data.bin")
    return [family.decoder, tmp / "src" / "m.onnx"], {}


def _foreign_file(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    (out / "weights.data").write_bytes(b"a file of the user's")
    return family.sources, {}  # type: ignore[return-value]


def _foreign_shard(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    (out / "weights.data.1").write_bytes(b"a file of the user's")
    return family.sources, {"max_shard_size": 8192}  # type: ignore[return-value]


def _weights_is_a_folder(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    (out / "weights.data").mkdir()
    return family.sources, {}  # type: ignore[return-value]


def _a_member_left_out(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    align_models(family.sources, out)
    return [family.decoder], {}


def _another_model_uses_the_weights(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    save_external(identity_model({"w": np.arange(512, dtype=np.float32)}), out / "user.onnx", "weights.data")
    return family.sources, {"overwrite": True}  # type: ignore[return-value]


def _outside_the_folder(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    return family.sources, {"weights_name": "../weights.data"}  # type: ignore[return-value]


def _missing_source(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    return [family.decoder, tmp / "missing.onnx"], {}


def _not_a_model(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    (tmp / "garbage.onnx").write_bytes(b"\xff\xff\xff\xff not a model")
    return [family.decoder, tmp / "garbage.onnx"], {}


def _hard_linked_source_data(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    (tmp / "link").hardlink_to(family.with_past.parent / "model.onnx_data")
    return family.sources, {}  # type: ignore[return-value]


def _unnamed_safetensors_key(tmp: Path, family: Family, out: Path) -> tuple[list[object], dict[str, object]]:
    (tmp / "unnamed").mkdir()
    model = identity_model({"w": np.arange(512, dtype=np.float32)})
    model.graph.initializer[0].name = ""
    model.graph.node[0].input[0] = ""
    save_external(model, tmp / "unnamed" / "u.onnx", "u.data")
    return [family.decoder, tmp / "unnamed" / "u.onnx"], {"weights_format": "safetensors"}


REFUSALS: dict[str, tuple[Setup, type[BaseException], str]] = {
    "same-basename": (_same_basename, DestinationConflictError, "would both be written as 'decoder_model.onnx'"),
    "source-inside-the-folder": (_source_inside_the_folder, DestinationConflictError, "is the source file"),
    "source-data-is-the-weights": (_source_data_is_the_weights_file, DestinationConflictError, "is the source file"),
    "foreign-file": (_foreign_file, ExistingFileError, r"weights\.data' exists and is not an output of"),
    "foreign-shard": (_foreign_shard, ExistingFileError, r"weights\.data\.1' exists and is not an output of"),
    "weights-is-a-folder": (_weights_is_a_folder, DestinationConflictError, "exists and is a directory"),
    "a-member-left-out": (_a_member_left_out, SharedWeightsError, "decoder_with_past_model.onnx"),
    "another-model-uses-the-weights": (_another_model_uses_the_weights, SharedWeightsError, "user.onnx"),
    "outside-the-folder": (_outside_the_folder, UnsafeLocationError, "outside the destination model's folder"),
    "missing-source": (_missing_source, FileNotFoundError, "missing.onnx"),
    "not-a-model": (_not_a_model, InvalidModelError, "garbage.onnx"),
    "hard-linked-source-data": (_hard_linked_source_data, UnsafeLocationError, "hard link"),
    "unnamed-safetensors-key": (_unnamed_safetensors_key, SafetensorsError, "without a name"),
}


@pytest.fixture
def setting(tmp_path: Path) -> tuple[Path, Family, Path]:
    out = tmp_path / "family"
    out.mkdir()
    return tmp_path, write_family(tmp_path / "exports"), out


@pytest.mark.parametrize("name", REFUSALS)
def test_a_refused_family_writes_nothing(name: str, setting: tuple[Path, Family, Path]) -> None:
    tmp, family, out = setting
    setup, error, message = REFUSALS[name]
    sources, options = setup(tmp, family, out)
    before = sha256_of_tree(tmp, every_entry=True)

    with pytest.raises(error, match=message):
        align_models(sources, out, **options)  # type: ignore[arg-type]

    assert sha256_of_tree(tmp, every_entry=True) == before
    assert_no_temp_files(out)


@pytest.mark.parametrize("name", ["same-basename", "foreign-file", "a-member-left-out", "missing-source"])
def test_the_command_refuses_alike_with_one_error_line(
    name: str, setting: tuple[Path, Family, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp, family, out = setting
    setup, _, message = REFUSALS[name]
    sources, options = setup(tmp, family, out)
    argv = ["align-models", *map(str, sources), "--out", str(out), "--no-progress"]
    if options.get("max_shard_size"):
        argv += ["--max-shard-size", str(options["max_shard_size"])]
    capsys.readouterr()
    before = sha256_of_tree(tmp, every_entry=True)

    assert main(argv) == 1

    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert pytest.importorskip("re").search(message, err[0])
    assert sha256_of_tree(tmp, every_entry=True) == before


def test_the_command_removes_the_folder_it_created_when_refused(
    setting: tuple[Path, Family, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp, family, _ = setting
    before = sha256_of_tree(tmp, every_entry=True)

    assert main(["align-models", str(family.decoder), str(family.decoder), "--out", str(tmp / "new" / "dir")]) == 1

    assert "is given twice" in capsys.readouterr().err
    assert sha256_of_tree(tmp, every_entry=True) == before


@pytest.mark.parametrize(
    ("arguments", "options", "error", "message"),
    [
        ("string", {}, ArgumentTypeError, "src_onnx_paths must be a list of model paths"),
        ("empty", {}, ValueError, "src_onnx_paths is empty"),
        ("numbers", {}, ArgumentTypeError, "src_onnx_paths must hold paths"),
        ("family", {"alignment": 3}, ValueError, "alignment"),
        ("family", {"overwrite": 1}, ArgumentTypeError, "overwrite must be a bool"),
        ("family", {"chunk_size": 0}, ValueError, "chunk_size must be >= 1"),
        ("family", {"max_shard_size": 0}, ValueError, "max_shard_size must be >= 1"),
        ("family", {"weights_format": "npz"}, ValueError, "weights_format must be"),
        ("family", {"shard_names": "x"}, ValueError, "shard_names must be"),
        ("family", {"weights_name": 3}, ArgumentTypeError, "weights_name must be a path"),
        ("missing-folder", {}, FileNotFoundError, "destination folder does not exist"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_read(
    arguments: str, options: dict[str, object], error: type[BaseException], message: str, tmp_path: Path
) -> None:
    family = write_family(tmp_path / "exports")
    out = tmp_path / "family"
    out.mkdir()
    sources: object = {
        "string": str(family.decoder),
        "empty": [],
        "numbers": [1, 2],
    }.get(arguments, family.sources)
    folder = tmp_path / "absent" if arguments == "missing-folder" else out
    before = sha256_of_tree(tmp_path, every_entry=True)

    with pytest.raises(error, match=message):
        align_models(sources, folder, **options)  # type: ignore[arg-type]

    assert sha256_of_tree(tmp_path, every_entry=True) == before
