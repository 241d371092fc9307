"""``onnx-light-ref demo``: a newcomer's first command runs the whole job and says it worked."""

from __future__ import annotations

import errno
import os
import tempfile

import numpy as np
import onnx
import pytest

from onnx_light_ref._cli import main
from onnx_light_ref._commands import demo_scenario as demo
from onnx_light_ref._commands.sizes import parse_size
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._write import publish
from tests.checks import run_onnxruntime, sha256_of_tree


def test_demo_runs_end_to_end_in_a_temporary_folder(capsys):
    status = main(["demo", "--size", "2M", "--no-progress"])

    out = capsys.readouterr().out
    assert status == 0, out
    assert "re-aligned to 4096 (streaming)" in out
    assert "aligned  every offset aligned to 4096 bytes" in out
    assert "aligned  verify_models: same 9 tensors as the source (names, dtypes, dims," in out
    assert "result: OK, all outputs agree" in out
    workdir = out.splitlines()[0].rsplit(" in ", 1)[1]
    assert not os.path.exists(workdir)


def test_demo_keep_leaves_aligned_model_and_sharing_variant(tmp_path, capsys):
    keep = tmp_path / "demo"

    assert main(["demo", "--size", "1M", "--keep", str(keep), "--no-progress"]) == 0

    assert f"files kept in {keep}" in capsys.readouterr().out
    aligned = build_layout_report(keep / "model.onnx")
    assert aligned.ok and all(t.offset % 4096 == 0 for t in aligned.tensors)
    variant = onnx.load_model(str(keep / "new_head.onnx"), load_external_data=False)
    locations = {
        t.name: next((e.value for e in t.external_data if e.key == "location"), None) for t in variant.graph.initializer
    }
    assert locations["W0"] == locations["W2"] == "model.onnx.data"
    assert locations["head.weight"] == "new_head.onnx.data"
    assert locations["head.bias"] is None  # 64 bytes: under the saver's default 1 KiB size_threshold, stays inline
    assert os.path.getsize(keep / "new_head.onnx.data") < os.path.getsize(keep / "model.onnx.data")


def test_demo_keep_writes_the_readme_examples_inputs(tmp_path, capsys):
    """``model.onnx`` (input x [N, 64], head.weight, an inline Reshape shape) and ``light.onnx`` for onnx-light."""
    keep = tmp_path / "demo"

    assert main(["demo", "--size", "1M", "--keep", str(keep), "--no-progress"]) == 0

    assert "light    ReferenceEvaluator, op bound" in capsys.readouterr().out
    model = onnx.load_model(str(keep / "model.onnx"), load_external_data=False)
    (x,) = model.graph.input
    assert x.name == "x" and [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim] == ["batch", 64]
    initializers = {t.name: t for t in model.graph.initializer}
    assert {"head.weight", "head.bias", "W0"} <= set(initializers)
    assert initializers["shape"].data_location == onnx.TensorProto.DEFAULT  # the Reshape's shape stays inline
    onnx.checker.check_model(str(keep / "model.onnx"), full_check=True)
    light = onnx.load_model(str(keep / "light.onnx"))
    assert sum(node.op_type == "DelayedInitializer" for node in light.graph.node) == 8
    assert {t.name for t in light.graph.initializer} == {"shape"}


def test_demo_keep_refuses_a_non_empty_folder(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")

    assert main(["demo", "--size", "1M", "--keep", str(tmp_path), "--no-progress"]) == 1
    assert "not empty" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["precious.txt"]


def test_demo_reports_a_mismatch_with_exit_status_1(monkeypatch, capsys):
    monkeypatch.setattr(demo, "_new_head", lambda model, shape, seed: None)  # the variant would equal the base

    assert main(["demo", "--size", "1M", "--no-progress"]) == 1
    assert "MISMATCH: variant's output equals the base model's" in capsys.readouterr().err


def test_demo_proves_the_aligned_model_with_verify_models(monkeypatch, capsys):
    """A re-alignment that corrupted one byte is caught by verify_models, naming the tensor, not only by outputs."""
    real_align = demo.align_external_data_streaming

    def align_then_corrupt(src, dst, *args, **kwargs):
        written = real_align(src, dst, *args, **kwargs)
        model = onnx.load_model(dst, load_external_data=False)
        w1 = next(t for t in model.graph.initializer if t.name == "W1")
        entries = {e.key: e.value for e in w1.external_data}
        with open(os.path.join(os.path.dirname(dst), entries["location"]), "r+b") as data:
            data.seek(int(entries["offset"]) + 5)
            byte = data.read(1)
            data.seek(-1, os.SEEK_CUR)
            data.write(bytes([byte[0] ^ 0x40]))
        return written

    monkeypatch.setattr(demo, "align_external_data_streaming", align_then_corrupt)

    assert main(["demo", "--size", "1M", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "aligned  verify_models: DIFFERENT from the source" in captured.out
    assert "MISMATCH: aligned model differs from the source (verify_models):" in captured.err
    assert "'W1'" in captured.err.split("(verify_models):", 1)[1].splitlines()[0]


def test_demo_checks_its_sharing_claim_from_the_variants_references(monkeypatch, capsys):
    """A variant that copies every weight instead of sharing them runs fine: only its references can tell."""

    def save_everything(model, path, alignment, progress=None):
        folder = os.path.dirname(path)
        onnx.load_external_data_for_model(model, folder)
        onnx.save_model(model, path, save_as_external_data=True, location="new_head.onnx.data")
        return os.path.getsize(os.path.join(folder, "new_head.onnx.data"))

    monkeypatch.setattr(demo, "save_model_with_shared_external_data", save_everything)

    assert main(["demo", "--size", "1M", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "shares 0 bytes with model.onnx.data (read back from its references)" in captured.out
    assert "MISMATCH: variant: references 0 bytes of model.onnx.data, expected" in captured.err
    assert "its weights were not shared" in captured.err


@pytest.mark.parametrize(("text", "size"), [("2M", 2 * 2**20), ("64MiB", 64 * 2**20), ("8k", 8192), ("1000", 1000)])
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_size_too_small_or_malformed(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--size", "two"])
    assert "optional K/M/G suffix" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["demo", "--size", "1K", "--no-progress"])
    assert done.value.code == 2  # a bad value is a usage error, as a malformed one is
    assert "argument --size: size must be at least 65536 bytes (64K), got 1024." in capsys.readouterr().err


def test_mlp_shape_stays_under_the_requested_size():
    for size in (2**16, 2**21, 2**26):
        shape = demo.mlp_shape(size)
        assert shape.nbytes <= size
        assert shape.nbytes > size * 0.8 or size == 2**16


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "file.txt", "exists and is not a folder"),
        (lambda root: root / "file.txt" / "sub" / "demo", "cannot be created: '{root}/file.txt' is not a folder"),
        (lambda root: root / "link", "exists and is not a folder"),
    ],
    ids=["file", "under-a-file", "dangling-symlink"],
)
def test_demo_keep_that_is_not_a_folder_is_one_error_line(tmp_path, capsys, make, message):
    (tmp_path / "file.txt").write_text("user data")
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    keep = make(tmp_path)
    before = sha256_of_tree(tmp_path)
    entries = sorted(os.listdir(tmp_path))

    assert main(["demo", "--size", "1M", "--keep", str(keep), "--no-progress"]) == 1

    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("error: --keep ") and message.format(root=tmp_path) in line
    assert sha256_of_tree(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == entries


@pytest.mark.parametrize("keep", [True, False], ids=["keep", "temporary-folder"])
def test_demo_exits_3_when_its_model_is_published_but_a_step_after_the_commit_failed(
    tmp_path, capsys, monkeypatch, keep
):
    """Like every writing command: 3 says the model is in place, 1 would say nothing was written (it exited 1 with
    a traceback). The aligned model's folder ``fsync`` after its commit answers EIO."""
    folder = tmp_path / "demo"
    seen = []

    def fail_after_the_commit(name):
        # The aligned model exists only once committed (until then it is a hidden temp file).
        models = [folder / "model.onnx"] if keep else list(tmp_path.glob("tmp/onnx-light-ref-demo-*/model.onnx"))
        if name == "fsync" and any(path.exists() for path in models):
            seen.extend(str(path) for path in models)
            raise OSError(errno.EIO, "fsync failed (injected)")

    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setattr(publish, "before_syscall", fail_after_the_commit)
    args = ["demo", "--size", "1M", "--no-progress"] + (["--keep", str(folder)] if keep else [])

    status = main(args)

    out, err = capsys.readouterr()
    assert status == 3, (out, err)
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(
        f"error: {seen[0]!r} is published (the new model is in place and loads), but the fsync of "
    ), err
    assert "that makes it durable failed (Input/output error)" in err
    monkeypatch.setattr(publish, "before_syscall", None)
    if keep:  # published and loadable: what the source computes
        model = folder / "model.onnx"
        onnx.checker.check_model(str(model), full_check=True)
        x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
        (got,) = run_onnxruntime(model, {"x": x})
        (expected,) = run_onnxruntime(folder / "source" / "mlp.onnx", {"x": x})
        assert np.array_equal(got, expected)
        assert sorted(p.name for p in folder.iterdir()) == ["model.onnx", "model.onnx.data", "source"]
    else:  # the temporary folder is removed all the same
        assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("existing", [False, True], ids=["created", "existing-empty"])
@pytest.mark.parametrize("raised", [KeyboardInterrupt, ValueError], ids=["interrupted", "failed"])
def test_demo_keep_that_fails_or_is_interrupted_removes_what_it_wrote(tmp_path, capsys, monkeypatch, existing, raised):
    """Everything in ``DIR`` is the run's (it was absent or empty): a run that fails (exit 1) or is interrupted
    (130) leaves the tree as it was. The full-disk case, on a real tmpfs: ``tests/fs/test_demo_full_disk.py``."""
    keep = tmp_path / "parent" / "demo"
    if existing:
        keep.mkdir(parents=True)
    before = sha256_of_tree(tmp_path, every_entry=True)

    def fail(path):  # step 4, after the source, the aligned model and the variant are written
        raise raised("injected")

    monkeypatch.setattr(demo, "delay_initializers", fail)
    status = main(["demo", "--size", "1M", "--keep", str(keep), "--no-progress"])

    assert status == (130 if raised is KeyboardInterrupt else 1)
    assert capsys.readouterr().err.splitlines() == ["error: interrupted" if status == 130 else "error: injected"]
    assert sha256_of_tree(tmp_path, every_entry=True) == before
