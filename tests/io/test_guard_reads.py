"""What rule 1 of the writer contract reads of the ``.onnx`` files near a destination (issue 38, item 5), through
the public API and the command line.

Scene: ``root/src/model.onnx`` (the source), ``root/a/b/out/`` (the destination, written once before each test),
and ``.onnx`` files put in ``root`` (two folders above the destination's folder, so they reach its files):

* a valid model over protobuf's 2 GiB (a 2 GiB doc string, a hole of a sparse file) that references the
  destination's weights: read in a few small reads, it still blocks the write (``SharedWeightsError`` naming it;
  it used to count as unreadable, which blocked every write below it whatever it referenced);
* a file protobuf refuses (cut short, garbage, an unclosed group) or that holds no model (empty): ``onnx.load``
  refuses it too (or reads an empty model), it loads no file, so the write goes on, a warning naming it;
* a model whose references cannot be read (nested past protobuf's 100 levels, a file this process may not open, an
  I/O error): it may still be a model someone loads, so it blocks (naming it and ``replace_shared``).

Each refusal checks that nothing was written (the tree byte for byte; the 2 GiB file by size and time, without
reading it) and that the message names the model and the option.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError

from onnx_light_ref import align_external_data_streaming, save_model_with_shared_external_data
from onnx_light_ref.errors import SharedWeightsError
from onnx_light_ref.io._read import reference_scan, sharing
from onnx_light_ref.io._read.sharing import reading_references, scan_users
from onnx_light_ref.io._write.ownership import Ownership
from tests.checks import run_onnxruntime, sha256_of_tree
from tests.cli_runner import run_cli
from tests.contract.sharers import TEST_FIELD_BUDGET, external_model, too_large
from tests.models import identity_model, save_external, write_model
from tests.wire_writer import Hole, encode_varint, field_key, write_segments

BEFORE = np.arange(4, dtype=np.float32)
AFTER = np.array([7, 8, 9, 10], dtype=np.float32)
OVER_2_GIB = 2**31 + 4096


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The scene of the module docstring, the destination written once (it computes :data:`BEFORE`)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "a" / "b" / "out").mkdir(parents=True)
    save_external(identity_model({"w": BEFORE}), tmp_path / "src" / "before.onnx", "before.bin")
    save_external(identity_model({"w": AFTER}), tmp_path / "src" / "model.onnx", "model.bin")
    align_external_data_streaming(tmp_path / "src" / "before.onnx", _destination(tmp_path))
    return tmp_path


def _destination(root: Path) -> Path:
    return root / "a" / "b" / "out" / "model.onnx"


def _weights(root: Path) -> Path:
    return root / "a" / "b" / "out" / "model.onnx.data"


def _write(root: Path, how: str, **options: bool) -> None:
    """Re-write the destination from ``src/model.onnx``: by the streaming aligner, or as a shared save over the same
    weights file."""
    if how == "align":
        align_external_data_streaming(root / "src" / "model.onnx", _destination(root), **options)
    else:
        model = onnx.load(str(root / "src" / "model.onnx"))
        save_model_with_shared_external_data(
            model, _destination(root), location="model.onnx.data", size_threshold=0, **options
        )


def _big_model_using_the_weights(root: Path) -> Path:
    """``root/big.onnx``: over 2 GiB, valid, reading the destination's weights (``a/b/out/model.onnx.data``)."""
    data = external_model("a/b/out/model.onnx.data").SerializeToString()
    path = root / "big.onnx"
    write_segments(path, [data, field_key(6, 2) + encode_varint(OVER_2_GIB), Hole(OVER_2_GIB)])
    return path


def _snapshot(root: Path, big: Path | None = None) -> tuple[dict[str, str], tuple[int, int] | None]:
    """Every file's bytes, the big one (if any) by size and time only (it is never read whole)."""
    files = {name: digest for name, digest in sha256_of_tree(root).items() if big is None or name != big.name}
    return files, None if big is None else (big.stat().st_size, big.stat().st_mtime_ns)


NO_MODELS = {
    "cut-short": lambda: external_model("a/b/out/model.onnx.data").SerializeToString()[:60],
    "garbage": lambda: b"\xff" * 64,
    "text": lambda: b"this is not a model\n",
    "unclosed-group": lambda: external_model("a/b/out/model.onnx.data").SerializeToString() + field_key(999, 3),
    "empty": lambda: b"",
}


@pytest.mark.parametrize("how", ["align", "shared-save"])
@pytest.mark.parametrize("kind", sorted(NO_MODELS))
def test_a_file_that_is_no_model_above_the_destination_warns_and_blocks_nothing(
    root: Path, kind: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    junk = root / "junk.onnx"
    junk.write_bytes(NO_MODELS[kind]())
    if kind != "empty":
        with pytest.raises(DecodeError):
            onnx.load(str(junk))  # onnx refuses it too: it loads no file
    with caplog.at_level(logging.WARNING, logger="onnx_light_ref"):
        _write(root, how)
    np.testing.assert_array_equal(run_onnxruntime(_destination(root), {})[0], AFTER)
    assert junk.read_bytes() == NO_MODELS[kind]()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(w.startswith(f"{str(junk)!r} is not an ONNX model: ") for w in warnings), warnings
    assert all("onnx.load refuses it too" in w for w in warnings if str(junk) in w)


@pytest.mark.parametrize("how", ["align", "shared-save"])
def test_a_valid_model_over_2_gib_above_the_destination_still_blocks_naming_itself(root: Path, how: str) -> None:
    big = _big_model_using_the_weights(root)
    before = _snapshot(root, big)
    with pytest.raises(SharedWeightsError) as raised:
        _write(root, how)
    message = str(raised.value)
    assert f"file {str(_weights(root))!r} is used by {str(big)!r} (1 tensor, e.g. 's')" in message
    assert "replace_shared=True (--replace-shared)" in message and "nothing was written" in message
    assert _snapshot(root, big) == before
    _write(root, how, replace_shared=True)  # the caller's word on that file
    np.testing.assert_array_equal(run_onnxruntime(_destination(root), {})[0], AFTER)


def test_reading_a_model_over_2_gib_reads_a_few_kib_once_per_write(root: Path, monkeypatch: pytest.MonkeyPatch):
    """Every read of the scan is recorded: a few KiB of the 2 GiB file, whatever the doc string holds; inside one
    :func:`reading_references` block, each model is read once by every pass of the guard."""
    big = _big_model_using_the_weights(root)
    reads: list[tuple[int, int]] = []
    real = reference_scan.pread_exact

    def recorded(fd: int, buffer: memoryview, offset: int) -> int:
        reads.append((offset, len(buffer)))
        return real(fd, buffer, offset)

    monkeypatch.setattr(reference_scan, "pread_exact", recorded)
    scans: list[str] = []
    real_scan = sharing.named_files

    def counted(fd: int, size: int, path: str) -> reference_scan.NamedFiles:
        if Path(path).is_relative_to(root):  # a model in /tmp or / (another job's) is read as well: not counted
            scans.append(os.path.basename(path))
        return real_scan(fd, size, path)

    monkeypatch.setattr(sharing, "named_files", counted)
    targets = [str(_weights(root))]
    with reading_references():
        first = scan_users(targets, exclude=[str(_destination(root))])  # check_plan
        again = scan_users(targets, exclude=[str(_destination(root))])  # recheck_plan, under the lock
        sharing.files_referenced_near(str(_weights(root).parent))  # the publication's sweep
        assert Ownership([str(_destination(root))]).owns(str(_weights(root)))  # rule 3
    assert first == again and [r.model for r in first.users[targets[0]]] == [str(big)]
    assert sorted(scans) == ["big.onnx", "model.onnx"]  # each read once
    assert sum(length for _, length in reads) <= 3 * 4096  # of 2 GiB and the destination's few hundred bytes
    with reading_references():
        scan_users(targets)
    assert sorted(scans) == ["big.onnx", "big.onnx", "model.onnx", "model.onnx"]  # another write reads again


def test_a_model_changed_between_two_passes_is_read_again(root: Path) -> None:
    """The reader keys by identity (device, inode, size, times): a variant saved between the check and the
    re-check is seen."""
    variant = root / "a" / "b" / "out" / "variant.onnx"
    targets = [str(_weights(root))]
    with reading_references():
        write_model(variant, identity_model({"w": BEFORE}))  # uses nothing
        assert scan_users(targets, exclude=[str(_destination(root))]).users == {}
        write_model(variant, external_model("model.onnx.data"))
        assert list(scan_users(targets, exclude=[str(_destination(root))]).users) == targets


def _refused_open(monkeypatch: pytest.MonkeyPatch, name: str, error: int) -> None:
    """Opening ``name`` fails with ``error`` (the tests run as root: a mode of 000 would not stop them)."""
    real = sharing._open_model

    def refused(path: str) -> int:
        if os.path.basename(path) == name:
            raise OSError(error, os.strerror(error), path)
        return real(path)

    monkeypatch.setattr(sharing, "_open_model", refused)


@pytest.mark.parametrize("how", ["align", "shared-save"])
@pytest.mark.parametrize("kind", ["too-large", "no-permission", "io-error"])
def test_a_model_that_cannot_be_read_above_the_destination_still_blocks(
    root: Path, kind: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = root / "other.onnx"
    if kind == "too-large":  # a real model using the weights, too large for the scan's budget
        monkeypatch.setattr(reference_scan, "MAX_FIELDS", TEST_FIELD_BUDGET)
        other.write_bytes(too_large("a/b/out/model.onnx.data").SerializeToString())
        reason = "its references could not be read: more than 5,000 fields"
    else:  # a model using nothing, but that cannot be opened: what it uses is unknown
        write_model(other, identity_model({"w": BEFORE}))
        _refused_open(monkeypatch, "other.onnx", errno.EACCES if kind == "no-permission" else errno.EIO)
        reason = os.strerror(errno.EACCES if kind == "no-permission" else errno.EIO)
    before = _snapshot(root)
    with pytest.raises(SharedWeightsError) as raised:
        _write(root, how)
    message = str(raised.value)
    assert f"file {str(_weights(root))!r} may be used by {str(other)!r}, which cannot be read as a model ({reason}" in (
        message
    )
    assert "move it away (or repair it)" in message and "replace_shared=True (--replace-shared)" in message
    assert _snapshot(root) == before
    _write(root, how, replace_shared=True)
    np.testing.assert_array_equal(run_onnxruntime(_destination(root), {})[0], AFTER)


def test_the_command_warns_about_a_file_that_is_no_model_and_refuses_a_model_that_uses_the_file(
    root: Path, monkeypatch: pytest.MonkeyPatch
):
    junk = root / "junk.onnx"
    junk.write_bytes(NO_MODELS["cut-short"]())
    command = ["align", str(root / "src" / "model.onnx"), str(_destination(root)), "--no-progress"]
    done = run_cli(*command)
    assert done.returncode == 0, done.stderr
    assert f"WARNING {str(junk)!r} is not an ONNX model: " in done.stderr

    big = _big_model_using_the_weights(root)
    before = _snapshot(root, big)
    refused = run_cli(*command)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.count("error: ") == 1 and str(big) in refused.stderr and "--replace-shared" in refused.stderr
    assert _snapshot(root, big) == before

    big.unlink()
    monkeypatch.setattr(reference_scan, "MAX_FIELDS", TEST_FIELD_BUDGET)
    (root / "other.onnx").write_bytes(too_large("a/b/out/model.onnx.data").SerializeToString())
    before = _snapshot(root)
    refused = run_cli(*command)
    assert refused.returncode == 1 and "cannot be read as a model" in refused.stderr
    assert "--replace-shared" in refused.stderr and _snapshot(root) == before
    assert run_cli(*command, "--replace-shared").returncode == 0
