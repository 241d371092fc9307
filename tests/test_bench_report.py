"""``python -m benchmarks.report`` without matplotlib (not in the test extra): the table, one line, no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import report

RESULTS = Path(report.__file__).resolve().parent / "results"


@pytest.mark.parametrize("matplotlib_installed", [False, True])
def test_report_without_matplotlib_writes_the_table_and_says_how_to_get_the_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], matplotlib_installed: bool
) -> None:
    if matplotlib_installed:
        pytest.importorskip("matplotlib", reason="the bench extra is not installed")
    else:
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    sources = sorted(RESULTS.glob("raw-*.json"))
    before = {p: p.read_bytes() for p in RESULTS.iterdir()}

    assert report.main(["--json", *map(str, sources), "--out", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    table = (tmp_path / "results.md").read_text()
    assert table in out
    hint = "install the bench extra for the chart"
    if matplotlib_installed:
        assert hint not in out
        assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md", "results.png"]
    else:
        assert out.rstrip().splitlines()[-1] == (
            "matplotlib is missing: install the bench extra for the chart (pip install '.[bench]')"
        )
        assert out.count(hint) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]
    assert {p: p.read_bytes() for p in RESULTS.iterdir()} == before
