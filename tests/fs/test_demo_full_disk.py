"""``demo --keep DIR`` on a real full filesystem (an 8 MiB tmpfs): refused before writing, or one error line naming
the file and the cause, and nothing left behind.

Before: ``error: 1048576 requested and 497664 written`` (numpy's ``tofile``: no file, no cause) and the partly
written ``DIR`` stayed. The demo now checks free space first, as the aligners do; a disk that fills after the check
(another writer) fails the write that hits it, named, and the run removes what it wrote and the folders it created.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onnx_light_ref._cli import main
from onnx_light_ref._commands import demo_scenario as demo
from tests.checks import sha256_of_tree


def free_bytes(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("error: ") and "Traceback" not in captured.err
    return line


@pytest.mark.parametrize("existing", [False, True], ids=["created", "existing-empty"])
def test_a_demo_larger_than_the_free_space_is_refused_before_anything_is_written(small_tmpfs, capsys, existing):
    keep = small_tmpfs / "demo"
    if existing:
        keep.mkdir()
    before, free = sha256_of_tree(small_tmpfs, every_entry=True), free_bytes(small_tmpfs)
    needed = demo.disk_bytes(5 * 2**20)
    assert needed > free  # 5 MiB of weights, written twice: more than the 8 MiB tmpfs holds

    assert main(["demo", "--size", "5M", "--keep", str(keep), "--no-progress"]) == 1

    line = one_error_line(capsys)
    assert line == (
        f"error: not enough free space on {str(small_tmpfs)!r} (tmpfs) for the demo in {str(keep)!r}: {needed} bytes "
        f"needed ({needed / 2**20:.1f} MiB), {free} bytes free ({free / 2**20:.1f} MiB); nothing was written (a "
        "smaller --size needs less)"
    )
    assert sha256_of_tree(small_tmpfs, every_entry=True) == before
    assert free_bytes(small_tmpfs) == free


@pytest.mark.parametrize("existing", [False, True], ids=["created", "existing-empty"])
@pytest.mark.parametrize(
    ("size", "failure"),
    [
        ("16M", "error: No space left on device: '{keep}/source/mlp_a.data'"),  # the first write that hits the end
        ("5M", "error: not enough free space on '{mount}' (tmpfs) for '{keep}/"),  # the aligner's own check
    ],
    ids=["source-weights", "aligned-copy"],
)
def test_a_disk_filled_after_the_check_names_the_file_and_the_run_removes_what_it_wrote(
    small_tmpfs, capsys, monkeypatch, existing, size, failure
):
    """The check passes (another writer filled the disk after it: here the check is skipped), then a write fails."""
    keep = small_tmpfs / "parent" / "demo"
    if existing:
        keep.mkdir(parents=True)
    before, free = sha256_of_tree(small_tmpfs, every_entry=True), free_bytes(small_tmpfs)
    monkeypatch.setattr(demo, "check_free_space", lambda size, folder: None)

    assert main(["demo", "--size", size, "--keep", str(keep), "--no-progress"]) == 1

    line = one_error_line(capsys)
    assert line.startswith(failure.format(keep=keep, mount=small_tmpfs)), line
    assert sha256_of_tree(small_tmpfs, every_entry=True) == before  # the folders it created are gone too
    assert free_bytes(small_tmpfs) == free


def test_the_estimate_covers_what_a_kept_demo_writes(tmp_path, capsys):
    keep = tmp_path / "demo"
    assert main(["demo", "--size", "1M", "--keep", str(keep), "--no-progress"]) == 0
    capsys.readouterr()
    written = sum(
        os.lstat(os.path.join(folder, name)).st_blocks * 512
        for folder, folders, files in os.walk(keep)
        for name in files + folders
    )
    assert written <= demo.disk_bytes(2**20) <= written + 256 * 1024
