"""``inspect`` says which loader refuses what (issue 18, section 2), and ``inspect FOLDER`` lists shared files.

Each claim printed is checked against the real loader here too: onnx.load, check_model(full_check=True),
onnxruntime.InferenceSession.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx_light_ref.cli import main
from onnx_light_ref.io.shared_save import save_model_with_shared_external_data
from tests.checks import needs_onnx_with_the_newer_loader_rule
from tests.models import identity_model, save_external


def _inspect(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["inspect", str(path)])
    return status, capsys.readouterr().out


def _accepts(path: Path) -> dict[str, bool]:
    verdict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, load in (
            ("onnx.load", lambda: onnx.load(str(path))),
            ("check_model", lambda: onnx.checker.check_model(str(path), full_check=True)),
            ("onnxruntime", lambda: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])),
        ):
            try:
                load()
                verdict[name] = True
            except Exception:
                verdict[name] = False
    return verdict


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return save_external(identity_model({"w": np.arange(16, dtype=np.float32)}), tmp_path / "m.onnx", "w.bin")


def _relocate(path: Path, location: str, extra: tuple[str, str] | None = None) -> None:
    proto = onnx.load(str(path), load_external_data=False)
    tensor = proto.graph.initializer[0]
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location
    if extra is not None:
        entry = tensor.external_data.add()
        entry.key, entry.value = extra
    path.write_bytes(proto.SerializeToString())


@needs_onnx_with_the_newer_loader_rule
def test_a_symlinked_subfolder_inside_the_folder_is_refused_by_onnx_only(model, tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "w.bin").rename(tmp_path / "real" / "w.bin")
    (tmp_path / "sub").symlink_to("real", target_is_directory=True)
    _relocate(model, "sub/w.bin")

    status, out = _inspect(model, capsys)

    assert status == 1 and "status: 1 error(s)" in out and "loader refuses" in out
    assert "onnx.load refuses: data path 'sub/w.bin' goes through the symbolic link(s) 'sub'" in out
    assert "(check_model, onnxruntime accept it)" in out
    assert _accepts(model) == {"onnx.load": False, "check_model": True, "onnxruntime": True}


@needs_onnx_with_the_newer_loader_rule
def test_a_symlinked_data_file_is_refused_by_onnx_and_its_checker(model, tmp_path, capsys):
    (tmp_path / "w.bin").rename(tmp_path / "real.bin")
    (tmp_path / "w.bin").symlink_to("real.bin")

    status, out = _inspect(model, capsys)

    assert status == 1
    assert "onnx.load, check_model refuse: data file 'w.bin' is a symbolic link (onnxruntime accepts it)" in out
    assert _accepts(model) == {"onnx.load": False, "check_model": False, "onnxruntime": True}


def test_a_basepath_key_is_refused_by_onnxruntime_only(model, capsys):
    _relocate(model, "w.bin", ("basepath", ""))

    status, out = _inspect(model, capsys)

    assert status == 1
    assert "onnxruntime refuses: external_data key(s) ['basepath']" in out
    assert "(onnx.load, check_model accept it)" in out
    assert _accepts(model) == {"onnx.load": True, "check_model": True, "onnxruntime": False}


def test_a_clean_model_is_ok_and_every_loader_agrees(model, capsys):
    status, out = _inspect(model, capsys)
    assert status == 0 and out.rstrip().endswith("status: OK")
    assert _accepts(model) == {"onnx.load": True, "check_model": True, "onnxruntime": True}


def test_inspect_a_folder_lists_which_models_share_which_files(tmp_path, capsys):
    first = save_external(
        identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "first.onnx", "first.onnx.data"
    )
    variant = onnx.load(str(first), load_external_data=False)
    variant.graph.name = "variant"
    save_model_with_shared_external_data(variant, tmp_path / "second.onnx")
    (tmp_path / "notes.txt").write_text("not a model")

    status, out = _inspect(tmp_path, capsys)

    assert status == 0
    assert "  first.onnx: OK" in out and "  second.onnx: OK" in out
    assert "  first.onnx.data: used by first.onnx, second.onnx (shared by 2 models)" in out
    assert out.rstrip().endswith("status: OK")


def test_inspect_a_folder_with_a_broken_model_exits_1(tmp_path, capsys):
    save_external(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "a.onnx", "a.data")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")

    status, out = _inspect(tmp_path, capsys)

    assert status == 1 and "  a.onnx: OK" in out and "  broken.onnx: not readable" in out


@needs_onnx_with_the_newer_loader_rule
def test_the_hugging_face_cache_layout_is_accepted_by_onnxruntime_only(tmp_path, capsys):
    """``snapshots/<rev>/model.onnx`` and ``model.onnx.data`` are symlinks into ``../../blobs/``."""
    (tmp_path / "build").mkdir()
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snapshots" / "rev").mkdir(parents=True)
    built = save_external(
        identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "build" / "model.onnx", "model.onnx.data"
    )
    built.rename(tmp_path / "blobs" / "aaa")
    (tmp_path / "build" / "model.onnx.data").rename(tmp_path / "blobs" / "bbb")
    model = tmp_path / "snapshots" / "rev" / "model.onnx"
    model.symlink_to("../../blobs/aaa")
    (tmp_path / "snapshots" / "rev" / "model.onnx.data").symlink_to("../../blobs/bbb")

    status, out = _inspect(model, capsys)

    assert status == 1
    expected = "onnx.load, check_model refuse: data file 'model.onnx.data' is a symbolic link (onnxruntime accepts it)"
    assert expected in out
    assert _accepts(model) == {"onnx.load": False, "check_model": False, "onnxruntime": True}
