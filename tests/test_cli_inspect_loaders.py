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

from onnx_light_ref._cli import main
from onnx_light_ref.io._shared_save import save_model_with_shared_external_data
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


def test_inspect_a_folder_lists_which_models_share_which_files(tmp_path, capsys, monkeypatch):
    first = save_external(
        identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "first.onnx", "first.onnx.data"
    )
    variant = onnx.load(str(first), load_external_data=False)
    variant.graph.name = "variant"
    save_model_with_shared_external_data(variant, tmp_path / "second.onnx")
    (tmp_path / "notes.txt").write_text("not a model")

    monkeypatch.chdir(tmp_path.parent)
    status, out = _inspect(Path(f"./{tmp_path.name}/"), capsys)  # relative, as a user types it

    assert status == 0
    assert out.startswith(f"folder: {tmp_path}\n")  # absolute, as every path a command prints
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


# A zero-length reference inside its file: onnx 1.17 (the oldest onnx this package supports) treats length 0 as no
# length and reads the rest of the file; every onnx (1.23 too) does so for a reference without 'length'. The tensor
# then holds bytes for 0 elements: numpy_helper.to_array and the reference evaluator fail, check_model of the loaded
# model refuses it (measured on onnx 1.17.0 and 1.23.2). inspect flags it, whatever onnx is installed.

ZERO_LENGTH = {  # name -> (entries, dims, misread by every onnx, flagged)
    "length 0 inside the file": ({"offset": "16", "length": "0"}, [0], False, True),
    "length 0 at offset 0": ({"offset": "0", "length": "0"}, [0], False, True),
    "length 0, no offset": ({"length": "0"}, [0], False, True),
    "no length, 0 elements inside": ({"offset": "16"}, [2, 0], True, True),
    "length 0 at the end": ({"offset": "64", "length": "0"}, [0], False, False),
    "no length, 0 elements at the end": ({"offset": "64"}, [0], False, False),
}


def _zero_length_model(folder: Path, entries: dict[str, str], dims: list[int]) -> Path:
    (folder / "w.bin").write_bytes(np.arange(16, dtype=np.float32).tobytes())
    tensor = onnx.TensorProto(name="e", data_type=onnx.TensorProto.FLOAT, dims=dims)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", **entries}.items():
        tensor.external_data.add(key=key, value=value)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["e"], ["y"])],
        "g",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, dims)],
        [tensor],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9)
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _onnx_misreads(path: Path) -> bool:
    """The oracle: the installed onnx's loader gives the tensor bytes although it has no element."""
    model = onnx.load(str(path), load_external_data=False)
    onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    return len(model.graph.initializer[0].raw_data) > 0


@pytest.mark.parametrize("case", list(ZERO_LENGTH))
def test_a_zero_length_reference_inside_its_file_is_flagged(tmp_path, capsys, case):
    import json

    entries, dims, misread_everywhere, flagged = ZERO_LENGTH[case]
    path = _zero_length_model(tmp_path, entries, dims)
    misread = _onnx_misreads(path)
    if misread_everywhere or (flagged and onnx.__version__.startswith("1.17.")):  # the floor, .ci/floor-constraints
        assert misread  # length 0 read as "the rest of the file"
    if not flagged:
        assert not misread
    np.testing.assert_array_equal(  # onnxruntime reads exactly 0 bytes either way
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {})[0], np.zeros(dims, np.float32)
    )
    status, out = _inspect(path, capsys)
    assert main(["inspect", "--json", str(path)]) == status
    (tensor,) = json.loads(capsys.readouterr().out)["tensors"]
    if not flagged:
        assert status == 0 and "status: OK" in out and tensor["status"] == "ok"
        return
    assert status == 1 and "status: 1 error(s)" in out
    assert tensor["status"] == "zero-length mid-file" and tensor["error"] is True
    offset = int(entries.get("offset", "0"))
    assert f"zero-length reference at offset {offset} of 'w.bin' (64 bytes), not at its end" in tensor["message"]
    assert f"zero-length mid-file: {tensor['message']}" in out
    which = "every onnx" if "length" not in entries else "onnx 1.17"
    assert which in tensor["message"] and "offset 64" in tensor["message"]
