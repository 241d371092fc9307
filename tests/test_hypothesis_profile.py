"""The test suite is the same on every run in CI: the hypothesis profile ``ci`` and when it is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from tests.conftest import (
    HYPOTHESIS_CI_PROFILE,
    HYPOTHESIS_THOROUGH_PROFILE,
    THOROUGH_FACTOR,
    _hypothesis_profile,
    thorough_settings,
)

ROOT = Path(__file__).resolve().parent.parent

# Draws 30 examples of a hypothesis test in a fresh interpreter, with the profile conftest.py selects, and prints them.
DRAW_EXAMPLES = """
from hypothesis import given, settings, strategies as st
import tests.conftest  # registers and selects the profile, as pytest does
seen = []
@settings(max_examples=30, database=None)
@given(st.lists(st.integers(0, 1000), max_size=5))
def test_draw(values):
    seen.append(values)
test_draw()
print(settings.default.derandomize, seen)
"""


@pytest.mark.parametrize(
    ("environ", "profile"),
    [
        ({"CI": "true"}, HYPOTHESIS_CI_PROFILE),
        ({"CI": "1"}, HYPOTHESIS_CI_PROFILE),
        ({"HYPOTHESIS_PROFILE": "ci"}, HYPOTHESIS_CI_PROFILE),
        ({"CI": "true", "HYPOTHESIS_PROFILE": "default"}, "default"),  # an explicit choice wins
        ({}, None),
        ({"CI": ""}, None),
        ({"CI": "false"}, None),
        ({"CI": "0"}, None),
    ],
)
def test_the_ci_profile_is_chosen_by_ci_or_hypothesis_profile(environ, profile):
    assert _hypothesis_profile(environ) == profile


def test_the_ci_profile_is_derandomized_and_prints_the_blob_of_a_failure():
    ci = settings.get_profile(HYPOTHESIS_CI_PROFILE)

    assert ci.derandomize is True
    assert ci.print_blob is True
    assert ci.database is None


def draw_examples(cwd: Path, ci: bool) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    if ci:
        environ["CI"] = "true"
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", DRAW_EXAMPLES], cwd=cwd, env=environ, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_two_ci_runs_draw_the_same_examples_and_two_developer_runs_do_not(tmp_path):
    first, second = draw_examples(tmp_path, ci=True), draw_examples(tmp_path, ci=True)

    assert first.startswith("True [")
    assert first == second
    # Developers keep the random exploration (30 draws of up to 5 integers: equal by chance ~never).
    developer = [draw_examples(tmp_path, ci=False) for _ in range(2)]
    assert developer[0].startswith("False [")
    assert developer[0] != developer[1]


def test_the_thorough_profile_explores_randomly_with_twenty_times_the_examples():
    thorough = settings.get_profile(HYPOTHESIS_THOROUGH_PROFILE)
    assert thorough.derandomize is False and thorough.database is None and thorough.deadline is None
    assert thorough.max_examples == 100 * THOROUGH_FACTOR == 2000
    assert thorough_settings(settings(thorough, max_examples=30, deadline=500)).max_examples == 600
    assert thorough_settings(settings(thorough, max_examples=30, deadline=500)).deadline is None
    assert thorough_settings(thorough) is thorough  # a test that sets no max_examples has the profile's


COUNTED = """
from hypothesis import given, settings, strategies as st
import pytest

@settings(max_examples=3)
@given(st.integers())
@pytest.mark.parametrize("p", [1, 2])
def test_counted(p, value):
    with open(f"calls-{p}", "a") as calls:
        calls.write("x")
"""


def test_the_thorough_profile_scales_a_tests_own_max_examples_once(tmp_path):
    """A real pytest run with the suite's conftest: ``max_examples=3`` becomes 60 examples, for each parameter."""
    (tmp_path / "test_counted.py").write_text(COUNTED)
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    environ.update(HYPOTHESIS_PROFILE=HYPOTHESIS_THOROUGH_PROFILE, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "0"]
    done = subprocess.run(
        [*command, "--rootdir", str(tmp_path), "-c", os.devnull, "test_counted.py"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [len((tmp_path / f"calls-{p}").read_text()) for p in (1, 2)] == [60, 60]
