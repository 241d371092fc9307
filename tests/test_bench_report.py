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


def test_a_group_the_report_does_not_know_keeps_its_measurements_and_fails_the_check(tmp_path: Path) -> None:
    """A 13-minute run used to end in a KeyError writing results.md (a group added to the suite, unknown to the
    report): the table now keeps that group's numbers under its raw name, and ``check_group``, which every benchmark
    calls at tiny size in the test suite, names what the report lacks."""
    summary = {"new_method": {"seconds": 1.0, "seconds_min": 1.0, "seconds_max": 1.0, "delta_mib": 2.0, "n": 1}}
    info = {"group": "brand-new", "size": "1G", "summary": summary}
    report.write_markdown({"1G": {"brand-new": info}}, [], tmp_path / "results.md", ["cmd"], _machine())
    text = (tmp_path / "results.md").read_text()
    assert "### brand-new (not rendered: " in text and '"new_method"' in text and '"seconds": 1.0' in text
    with pytest.raises(AssertionError, match="benchmark group 'brand-new': no labels or reference"):
        report.check_group("brand-new", info)


def _machine() -> dict[str, str]:
    return {key: "?" for key in ("cpu", "memory", "disk", "kernel", "python", "versions")}
