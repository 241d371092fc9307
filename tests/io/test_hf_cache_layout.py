"""The Hugging Face cache layout: readable only with the opt-in, by every reader, from Python and from the shell.

``hub/models--org--name/snapshots/<rev>/model.onnx`` and ``model.onnx.data`` are symbolic links into
``../../blobs/<sha>``. onnx's loader refuses such a data path (it opens with ``RESOLVE_NO_SYMLINKS``), and so do our
readers by default; ``allow_outside_folder=True`` / ``--allow-outside-folder`` trusts the layout.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._verify import verify_models
from onnx_light_ref.ops import reference_evaluator
from tests.checks import onnx_loader_refuses_symlinks
from tests.cli_runner import run_cli
from tests.models import identity_model, save_external

VALUES = np.arange(64, dtype=np.float32) * 0.5


def _hf_cache(tmp_path: Path) -> Path:
    """Build the cache from a model saved by onnx; return ``snapshots/<rev>/model.onnx``."""
    staging = tmp_path / "staging"
    staging.mkdir()
    saved = save_external(identity_model({"w": VALUES}), staging / "model.onnx", "model.onnx.data")
    repo = tmp_path / "hub" / "models--org--name"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name in ("model.onnx", "model.onnx.data"):
        data = (saved.parent / name).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        (blobs / sha).write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/{sha}")
    return snapshot / "model.onnx"


def _tree_digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_onnx_itself_refuses_the_layout(tmp_path: Path) -> None:
    """The rule we follow: onnx's loader refuses a data file that is a symbolic link (onnx 1.17 still followed it)."""
    if not onnx_loader_refuses_symlinks():
        pytest.skip(f"onnx {onnx.__version__} follows symbolic links in data paths; our rule is the newer onnx's")
    model = _hf_cache(tmp_path)
    with pytest.raises(onnx.checker.ValidationError, match="symbolic link"):
        onnx.load(str(model))


def test_every_reader_refuses_it_by_default_and_writes_nothing(tmp_path: Path) -> None:
    model = _hf_cache(tmp_path)
    before = _tree_digest(tmp_path / "hub")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafeLocationError, match=r"symbolic link.*allow_outside_folder"):
        align_external_data_streaming(model, out / "m.onnx")
    with pytest.raises(UnsafeLocationError, match="symbolic link"):
        verify_models(model, model)
    with pytest.raises(UnsafeLocationError, match="symbolic link"):
        reference_evaluator(model, "file")
    report = build_layout_report(model)
    assert not report.ok and [t.status for t in report.tensors] == ["unsafe location"]
    assert list(out.iterdir()) == []
    assert _tree_digest(tmp_path / "hub") == before


@pytest.mark.parametrize("load_device", ["cpu", "file"])
def test_every_reader_accepts_it_with_the_opt_in(tmp_path: Path, load_device: str) -> None:
    model = _hf_cache(tmp_path)
    before = _tree_digest(tmp_path / "hub")
    out = tmp_path / "out"
    out.mkdir()
    result = align_external_data_streaming(model, out / "m.onnx", allow_outside_folder=True)
    assert result.tensors == 1
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(onnx.load(str(out / "m.onnx")).graph.initializer[0]), VALUES
    )
    assert verify_models(model, out / "m.onnx", allow_outside_folder=True).equal
    report = build_layout_report(model, allow_outside_folder=True)
    assert report.ok and report.files[0].path == str(model.parent / "model.onnx.data")
    got = reference_evaluator(model, load_device, allow_outside_folder=True).run(None, {})[0]
    np.testing.assert_array_equal(got, VALUES)
    assert _tree_digest(tmp_path / "hub") == before


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def test_the_cli_flag_on_align_verify_and_inspect(tmp_path: Path) -> None:
    model = str(_hf_cache(tmp_path))
    out = tmp_path / "out" / "m.onnx"
    refused = _cli("align", model, str(out), "--no-progress")
    assert refused.returncode == 1 and "symbolic link" in refused.stderr and not out.exists()
    assert _cli("align", model, str(out), "--no-progress", "--allow-outside-folder").returncode == 0
    assert _cli("verify", model, str(out), "--no-progress").returncode == 1
    assert _cli("verify", model, str(out), "--no-progress", "--allow-outside-folder").returncode == 0
    assert _cli("inspect", model).returncode == 1
    shown = _cli("inspect", model, "--allow-outside-folder")
    assert shown.returncode == 0, shown.stdout + shown.stderr
