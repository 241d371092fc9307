"""The child's opt-in profiler: ``ONNX_LIGHT_REF_BENCH_PROFILE`` leaves one readable cProfile file per phase."""

from __future__ import annotations

import pstats
from pathlib import Path

import pytest

from benchmarks.child import ENV_PROFILE, run_in_child


def test_profile_folder_gets_one_stats_file_per_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PROFILE, str(tmp_path / "prof"))
    record = run_in_child("write_alone", {"dst": str(tmp_path / "out.bin"), "new_bytes": 8192})

    assert record["extra"] == {"bytes_written": 8192}
    (stats_file,) = (tmp_path / "prof").iterdir()
    assert stats_file.name.startswith("write_alone-write-") and stats_file.suffix == ".prof"
    functions = {name for _, _, name in pstats.Stats(str(stats_file)).stats}  # type: ignore[attr-defined]
    assert "fsync" in " ".join(functions)


def test_no_profile_without_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PROFILE, raising=False)
    run_in_child("write_alone", {"dst": str(tmp_path / "out.bin"), "new_bytes": 8192})

    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
