"""pytest-benchmark's usual flags work on our suite, and the default run stays untimed.

Each case starts pytest in a child process (collection only: the flags are read at configure time, which is where
``--benchmark-only`` used to stop with "Can't have both --benchmark-only and --benchmark-disable") and reports
whether pytest-benchmark's session ended up disabled. The children run side by side to keep the suite quick.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys, pytest

class Probe:
    def pytest_collection_finish(self, session):
        print("BENCHMARK-DISABLED", session.config._benchmarksession.disabled)

sys.exit(pytest.main(sys.argv[1:], plugins=[Probe()]))
"""

CASES = {
    "default": ((), True),
    "only": (("--benchmark-only",), False),
    "enable": (("--benchmark-enable",), False),
    "save": (("--benchmark-save=run",), False),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    tmp = tmp_path_factory.mktemp("benchmark-flags")
    # A child of an xdist worker inherits PYTEST_XDIST_WORKER, which pytest-benchmark reads as "running under xdist"
    # (it then disables timing): the children are started as a user would start pytest, without it.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    children = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-c",
                PROBE,
                "-p",
                "no:cacheprovider",
                "--collect-only",
                "-q",
                "benchmarks",
                f"--benchmark-storage={tmp / 'storage'}",
                *(flag.format(tmp=tmp) for flag in flags),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, (flags, _) in CASES.items()
    }
    return {name: (child.wait(timeout=300), child.communicate()[0]) for name, child in children.items()}


@pytest.mark.parametrize("case", CASES)
def test_benchmarks_are_timed_only_when_a_timing_flag_asks(outcomes, case):
    status, out = outcomes[case]
    disabled = CASES[case][1]

    assert status == 0, out
    assert f"BENCHMARK-DISABLED {disabled}" in out
    assert "Can't have both" not in out
