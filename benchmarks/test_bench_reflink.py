"""Reflinks (issue 13): on a loop-mounted XFS made with ``mkfs.xfs -m reflink=1``, re-aligning a model whose
tensors already sit at 4096-aligned offsets lets ``copy_file_range`` clone extents (no data moves, no new blocks),
against the same model from unaligned offsets (bytes copied, except every 64th tensor, which the 64-byte gaps
happen to bring back to a 4096 boundary).

Group ``reflink-xfs``: the ``large`` shape twice on the XFS, ``gap=0`` (aligned) and the usual 64-byte gaps
(unaligned); the outputs go next to their sources on the same filesystem (cloning needs one filesystem). Each child
also reports ``fs_new_bytes``: the filesystem's free space before minus after the operation (``statvfs``), the
blocks it really took, and the aligner's ``clone_eligible_bytes`` (checked against the source offsets).

Mounting needs root, ``mount``/``umount`` and ``mkfs.xfs`` (``.ci/run`` installs xfsprogs when it can); otherwise
the test is skipped with that reason. The filesystem image is a sparse file under pytest's temp folder, and the
mount is always undone (lazily as the last resort) when the module ends, passed or failed.

No assertion here is about time or memory: targets are checked and printed by ``python -m benchmarks.report``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from benchmarks.checks import ALIGNMENT, DEFAULT_CHUNK, aligned_size, require
from benchmarks.conftest import BenchConfig, Method
from benchmarks.models import MIB, AlignModel, make_align_model


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _unmount(target: Path) -> None:
    if _run("umount", str(target)).returncode != 0:
        lazy = _run("umount", "-l", str(target))  # something still holds it: detach now, freed when released
        if lazy.returncode != 0:
            raise RuntimeError(f"could not unmount {target}: {lazy.stderr.strip()}")


@pytest.fixture(scope="module")
def xfs_models(tmp_path_factory: pytest.TempPathFactory, bench_config: BenchConfig) -> Iterator[dict[str, AlignModel]]:
    """The aligned and unaligned ``large`` models on a fresh loop-mounted reflink XFS (unmounted at the end)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop XFS needs root")
    missing = [tool for tool in ("mount", "umount", "mkfs.xfs") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (xfsprogs; .ci/run installs it with apt-get when it can)")
    root = tmp_path_factory.mktemp("bench-xfs")
    image, target = root / "xfs.img", root / "mnt"
    # Two sources and one copied output at a time, plus room for XFS's own metadata (>= 300 MiB for mkfs.xfs).
    with open(image, "wb") as sparse:
        sparse.truncate(max(512 * MIB, 3 * bench_config.total + 512 * MIB))
    made = _run("mkfs.xfs", "-q", "-f", "-m", "reflink=1", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.xfs -m reflink=1 failed here: {made.stderr.strip()}")
    target.mkdir()
    mounted = _run("mount", "-o", "loop", str(image), str(target))
    if mounted.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"mount -o loop refused here: {mounted.stderr.strip()}")
    try:
        yield {
            "aligned": make_align_model(target / "aligned", "large", bench_config.total, gap=0),
            "unaligned": make_align_model(target / "unaligned", "large", bench_config.total),
        }
    finally:
        _unmount(target)
        shutil.rmtree(root, ignore_errors=True)


def _realign(label: str, model: AlignModel) -> Method:
    dst = os.path.join(os.path.dirname(model.onnx_path), "out-{run_id}.onnx")
    args = {"src": model.onnx_path, "dst": dst, "alignment": ALIGNMENT, "chunk_size": DEFAULT_CHUNK,
            "measure_fs": True}  # fmt: skip
    return Method(label, "align_streaming", args, cleanup=(dst, dst + ".data"))


def _block_aligned_bytes(model: AlignModel) -> int:
    """Bytes of the tensors whose source offset is a multiple of 4096: those the aligner can clone.

    All of them with ``gap=0``; with the default 64-byte gaps, every 64th tensor (the gaps add up to 4096).
    """
    proto = onnx.load(model.onnx_path, load_external_data=False)
    total = 0
    for tensor in proto.graph.initializer:
        entries = {entry.key: int(entry.value) for entry in tensor.external_data if entry.key in ("offset", "length")}
        if entries["offset"] % ALIGNMENT == 0:
            total += entries["length"] // ALIGNMENT * ALIGNMENT
    return total


def test_reflink_xfs(compare: Any, benchmark: Any, xfs_models: dict[str, AlignModel]) -> None:
    aligned, unaligned = xfs_models["aligned"], xfs_models["unaligned"]
    assert aligned.data_bytes == aligned.payload_bytes  # gap=0: tensors back to back at 4096-aligned offsets
    summary = compare(
        "reflink-xfs",
        [_realign("aligned", aligned), _realign("unaligned", unaligned)],
        shape="large",
        tensor_count=aligned.tensor_count,
        tensor_bytes=aligned.tensor_bytes,
        payload_bytes=aligned.payload_bytes,
        chunk_size=DEFAULT_CHUNK,
    )
    require(summary, ["aligned", "unaligned"], benchmark.extra_info.get("skipped"))
    expected = aligned_size(aligned.tensor_count, aligned.tensor_bytes)
    for label in ("aligned", "unaligned"):
        assert summary[label]["extra"]["bytes_written"] == expected
        assert "fs_new_bytes" in summary[label]["extra"]
    # Whether the kernel really shared the extents is what fs_new_bytes measures; the aligner's own accounting says
    # which bytes it handed to copy_file_range between block-aligned offsets on a reflink filesystem.
    for label, model in (("aligned", aligned), ("unaligned", unaligned)):
        assert summary[label]["extra"]["clone_eligible_bytes"] == _block_aligned_bytes(model), label
