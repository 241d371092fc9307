"""``python -m benchmarks.report``: the table without matplotlib (not in the test extra), one line, no traceback; every
group the suite produces rendered, at every size, with a title, a reference method and a target (``check_group``);
a group the report cannot render keeps its measurements; a run of the whole suite at tiny size ends with its report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

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
    assert "(not rendered" not in table and ": not evaluated" not in table
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


def test_every_committed_group_at_every_size_has_a_title_a_reference_and_a_target():
    results = report.load_results(sorted(RESULTS.glob("raw-*.json")))
    assert results
    for groups in results.values():
        for group, info in groups.items():
            report.check_group(group, info)


def summary_of(*methods: str) -> dict[str, Any]:
    return {m: {"seconds": 1.0, "seconds_min": 1.0, "seconds_max": 1.0, "delta_mib": 2.0, "n": 1} for m in methods}


def test_a_group_without_a_title_fails_the_check(monkeypatch):
    monkeypatch.setitem(report._LABELS, "untitled", {"ours": "ours", "ref": "reference"})
    monkeypatch.setitem(report._REFERENCE_METHOD, "untitled", "ref")
    info = {"group": "untitled", "size": "1G", "summary": summary_of("ours", "ref")}
    with pytest.raises(AssertionError, match=r"'untitled' cannot be rendered: KeyError: .*no title for the benchmark"):
        report.check_group("untitled", info)


def test_a_group_whose_reference_was_not_measured_fails_the_check():
    info = {"group": "shared-save", "size": "1G", "reused_bytes": 1, "new_bytes": 1,
            "summary": summary_of("write_alone", "onnx_full_save")}  # fmt: skip
    with pytest.raises(AssertionError, match="its reference 'shared_save' was not measured"):
        report.check_group("shared-save", info)


def test_a_group_that_gives_no_target_fails_the_check():
    """The reference measured, and titled, but every target needs a method the run did not measure."""
    info = {"group": "shared-save", "size": "1G", "reused_bytes": 1, "new_bytes": 1,
            "summary": summary_of("shared_save")}  # fmt: skip
    with pytest.raises(AssertionError, match="'shared-save': no target is measured from it"):
        report.check_group("shared-save", info)


def test_a_target_section_that_fails_on_a_group_fails_the_check_and_the_report_still_gets_written(tmp_path):
    info = {"group": "delayed", "size": "1G", "tensor_bytes": 2**28, "summary": summary_of("file", "np_fromfile")}
    info["summary"]["file"]["phases"] = []  # the table shows no phase; the target reads the run's phase
    targets = report.evaluate_targets({"1G": {"delayed": info}})
    failed = [t for t in targets if t.name.endswith(": not evaluated")]
    assert [t.name for t in failed] == ["DelayedInitializer: not evaluated"], failed
    assert failed[0].detail.startswith("AttributeError: ")
    assert len(targets) > 40  # every other section evaluated
    report.write_markdown({"1G": {"delayed": info}}, targets, tmp_path / "results.md", ["cmd"], _machine())
    text = (tmp_path / "results.md").read_text()
    assert "| DelayedInitializer: not evaluated | 1G | - |" in text and "### DelayedInitializer, one 256 MiB" in text
    with pytest.raises(AssertionError, match="'delayed': target sections failed on it"):
        report.check_group("delayed", info)


@pytest.mark.slow  # the whole benchmark suite at tiny size, one child after the other: 20-40 s
def test_the_whole_suite_at_tiny_size_ends_with_every_group_rendered(tmp_path, monkeypatch, capsys):
    """What a real run does, at tiny size: ``python -m benchmarks.report --size tiny --out DIR``. The 13-minute 1 GiB
    run used to end in a KeyError writing results.md, on a group added to the suite but unknown to the report."""
    _skip_below_the_benchmarks_versions()
    for key in [key for key in os.environ if key.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(key)  # else pytest-benchmark, in the child pytest, believes it runs under xdist: untimed
    monkeypatch.setenv("ONNX_LIGHT_REF_BENCH_ROUNDS", "1")

    assert report.main(["--size", "tiny", "--out", str(tmp_path)]) == 0

    raw = json.loads((tmp_path / "raw-tiny.json").read_text())
    groups = {bench["extra_info"]["group"]: bench["extra_info"] for bench in raw["benchmarks"]
              if bench["extra_info"].get("summary")}  # fmt: skip
    assert len(groups) >= 25, sorted(groups)  # every comparison of benchmarks/ (reflink-xfs needs root and XFS)
    table = (tmp_path / "results.md").read_text()
    assert "(not rendered" not in table and ": not evaluated" not in table
    for group, info in groups.items():
        report.check_group(group, info)
        assert f"### {report._group_title(group, info)}" in table
    assert "the chart could not be drawn" not in capsys.readouterr().out


def _skip_below_the_benchmarks_versions() -> None:
    """The benchmark suite compares with onnx-ir's aligned save (onnx-ir >= 1.1) and evaluates bfloat16 with onnx's
    evaluator (onnx >= 1.19): the floor pass (onnx 1.17, onnx-ir 1.0) skips the benchmarks, hence this run of them."""
    import inspect

    import onnx

    ir = pytest.importorskip("onnx_ir", reason="the bench extra is not installed")
    onnx_version = tuple(int(part) for part in onnx.__version__.split(".")[:2])
    if "alignment" not in inspect.signature(ir.save).parameters or onnx_version < (1, 19):
        pytest.skip(
            f"the benchmarks need onnx >= 1.19 and onnx-ir >= 1.1 (found onnx {onnx.__version__}, onnx-ir "
            f"{ir.__version__}): the floor pass skips them"
        )
