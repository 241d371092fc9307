"""Writers never write through a symlink (issue 18, section 2): ``out/sub/w.bin`` where ``out/sub`` is a symlink,
even one staying inside ``out/``, is refused by both aligners (API and ``align --weights``), the shared saver
(``location=``) and undelay, with a typed error and nothing written; onnx itself refuses such a layout on load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref.errors import ExistingFileError, UnsafeLocationError
from onnx_light_ref.io._align import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io._shared_save import save_model_with_shared_external_data
from tests.checks import onnx_loader_refuses_symlinks, sha256_of_tree
from tests.models import identity_model, make_external_model


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``src/model.onnx`` with external weights; ``out/real/`` and ``out/sub -> real`` (inside ``out``)."""
    (tmp_path / "src").mkdir()
    make_external_model(tmp_path / "src", {"a": np.arange(8, dtype=np.float32), "b": np.ones(4, dtype=np.int64)})
    (tmp_path / "out" / "real").mkdir(parents=True)
    (tmp_path / "out" / "sub").symlink_to("real", target_is_directory=True)
    (tmp_path / "out" / "real" / "deeper").mkdir()
    return tmp_path


def _src(tree: Path) -> Path:
    (onnx_file,) = (tree / "src").glob("*.onnx")
    return onnx_file


@pytest.mark.parametrize("aligner", [align_external_data_streaming, align_external_data_in_memory])
@pytest.mark.parametrize("weights", ["sub/w.bin", "sub/deeper/w.bin", "real/../sub/w.bin"])
def test_aligners_refuse_weights_through_a_symlinked_subfolder(tree, aligner, weights):
    before = sha256_of_tree(tree, every_entry=True)
    with pytest.raises(UnsafeLocationError, match="through the symbolic link 'sub'") as raised:
        aligner(_src(tree), tree / "out" / "m.onnx", f"{tree}/out/{weights}")
    assert "onnx refuses to load a data file through any symlink" in str(raised.value)
    assert sha256_of_tree(tree, every_entry=True) == before


def test_align_command_refuses_weights_through_a_symlinked_subfolder(tree):
    before = sha256_of_tree(tree, every_entry=True)
    command = [sys.executable, "-m", "onnx_light_ref", "align", str(_src(tree)), str(tree / "out" / "m.onnx")]
    done = subprocess.run(
        [*command, "--weights", str(tree / "out" / "sub" / "w.bin"), "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "through the symbolic link 'sub'" in done.stderr
    assert "Traceback" not in done.stderr
    assert sha256_of_tree(tree, every_entry=True) == before


def test_shared_saver_refuses_a_location_through_a_symlinked_subfolder(tree):
    model = identity_model({"w": np.arange(16, dtype=np.float32)})
    before = sha256_of_tree(tree, every_entry=True)
    original = model.SerializeToString()
    with pytest.raises(UnsafeLocationError, match="through the symbolic link 'sub'"):
        save_model_with_shared_external_data(model, tree / "out" / "v.onnx", location="sub/v.bin", size_threshold=0)
    assert sha256_of_tree(tree, every_entry=True) == before
    assert model.SerializeToString() == original


def test_the_real_folder_works_and_onnx_agrees_with_the_refusal(tree):
    """The same layout through the real folder is accepted and loads; onnx refuses the symlinked spelling."""
    dst = tree / "out" / "m.onnx"
    align_external_data_streaming(_src(tree), dst, tree / "out" / "real" / "w.bin")
    onnx.checker.check_model(str(dst), full_check=True)
    onnx.load(str(dst))
    model = onnx.load(str(dst), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "sub/w.bin"
    onnx.save_model(model, str(tree / "out" / "through_link.onnx"))
    if onnx_loader_refuses_symlinks():  # onnx >= 1.18; 1.17 follows the link (our rule is the newer one)
        with pytest.raises(Exception, match="kernel rejected path"):
            onnx.load(str(tree / "out" / "through_link.onnx"))


def test_a_symlink_at_the_weights_name_is_replaced_not_followed(tree):
    """The file name itself may be a symlink: publication renames over it (the link's target is untouched).

    The destination does not own the link (rule 3 of the writer contract): ``overwrite=True`` says to replace it.
    """
    target = tree / "out" / "real" / "target.bin"
    target.write_bytes(b"keep me")
    (tree / "out" / "w.bin").symlink_to("real/target.bin")
    dst = tree / "out" / "m.onnx"
    with pytest.raises(ExistingFileError, match=r"w\.bin"):
        align_external_data_streaming(_src(tree), dst, tree / "out" / "w.bin")
    assert (tree / "out" / "w.bin").is_symlink() and not dst.exists()
    align_external_data_streaming(_src(tree), dst, tree / "out" / "w.bin", overwrite=True)
    assert not (tree / "out" / "w.bin").is_symlink()
    assert target.read_bytes() == b"keep me"
    onnx.checker.check_model(str(dst), full_check=True)
