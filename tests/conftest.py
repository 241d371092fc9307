"""Fixtures over the shared test helpers, for the test modules that take them as arguments.

The helpers themselves live in :mod:`tests.models` (model builders) and :mod:`tests.checks` (what a run left behind);
new tests import them directly (``from tests.models import make_external_model``). Each fixture here only returns the
function of the same name, for the tests that still receive it as a fixture argument.

It also registers the hypothesis profile ``ci`` (see :data:`HYPOTHESIS_CI_PROFILE`), loaded when the environment has
``HYPOTHESIS_PROFILE=ci`` or ``CI`` set (CI runs ``.ci/run`` with ``CI=true``): the same examples on every run, so a
test passes or fails alike on every clone. Developers' runs keep hypothesis' random exploration, which is how new
failing examples are found; each one found gets pinned with ``@example`` in its test. ``HYPOTHESIS_PROFILE=thorough``
(:data:`HYPOTHESIS_THOROUGH_PROFILE`) explores randomly with 20 times each test's examples, for a one-off hunt.

Every test process (each xdist worker) gets a system temp folder of its own (:func:`_private_system_temp_dir`), and
collects the garbage a test left in reference cycles when its memory grew (:func:`pytest_runtest_protocol`).
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import onnx
import pytest
from hypothesis import settings

from tests.checks import assert_no_temp_files, sha256_of_tree
from tests.models import externalize, identity_model, make_external_model

HYPOTHESIS_CI_PROFILE = "ci"
"""``derandomize=True``: each test's examples come from a seed derived from the test itself, so every CI run (and
every clone) tries the same ones, and ``HYPOTHESIS_PROFILE=ci python -m pytest TEST`` replays a CI failure anywhere.
A failure also prints its ``@reproduce_failure`` blob (``print_blob``), to replay it under any profile. No example
database: hypothesis implies none with ``derandomize`` (a fresh clone would not have it anyway)."""

settings.register_profile(HYPOTHESIS_CI_PROFILE, derandomize=True, print_blob=True, database=None)

HYPOTHESIS_THOROUGH_PROFILE = "thorough"
"""A much larger random budget, for a one-off hunt (``HYPOTHESIS_PROFILE=thorough python -m pytest tests``): random
exploration (``derandomize=False``), no deadline, every failure's ``@reproduce_failure`` blob printed, and each
property test's number of examples multiplied by :data:`THOROUGH_FACTOR`, its own ``@settings(max_examples=...)``
included (:func:`thorough_settings`). Never CI's: a failure it finds is pinned with ``@example``."""

THOROUGH_FACTOR = 20

settings.register_profile(
    HYPOTHESIS_THOROUGH_PROFILE,
    max_examples=settings.default.max_examples * THOROUGH_FACTOR,
    derandomize=False,
    deadline=None,
    print_blob=True,
    database=None,
)


def thorough_settings(own: settings) -> settings:
    """A test's settings with :data:`THOROUGH_FACTOR` times its examples, unless they are the thorough profile's
    (the test sets none); a deadline it sets is lifted too (the budget is examples, not time)."""
    profile = settings.get_profile(HYPOTHESIS_THOROUGH_PROFILE)
    if own.max_examples == profile.max_examples:
        return own
    return settings(own, max_examples=own.max_examples * THOROUGH_FACTOR, deadline=None)


def _hypothesis_profile(environ: os._Environ[str] | dict[str, str]) -> str | None:
    """The profile to load: ``HYPOTHESIS_PROFILE`` when set, else ``ci`` when ``CI`` is set (not ``""``/``0``/
    ``false``), else None (hypothesis' default: random exploration)."""
    explicit = environ.get("HYPOTHESIS_PROFILE")
    if explicit:
        return explicit
    if environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return HYPOTHESIS_CI_PROFILE
    return None


_PROFILE = _hypothesis_profile(os.environ)
if _PROFILE is not None:
    settings.load_profile(_PROFILE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under the thorough profile, scale each property test's own ``max_examples`` (see :func:`thorough_settings`)."""
    if _PROFILE != HYPOTHESIS_THOROUGH_PROFILE:
        return
    scaled: set[int] = set()
    for item in items:
        test = getattr(item, "obj", None)
        if not getattr(test, "is_hypothesis_test", False) or id(test) in scaled:
            continue  # a parametrized test is one function for all its items: scaled once
        scaled.add(id(test))
        test._hypothesis_internal_use_settings = thorough_settings(test._hypothesis_internal_use_settings)


@pytest.fixture(scope="session", autouse=True)
def _private_system_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``tempfile.gettempdir()`` and the ``TMPDIR`` children inherit: a folder of this test process's own.

    Some code writes fixed names in the system temp folder by design (the two seed conformance cases' weights,
    ``/tmp/onnx_light_backend_delayedinitializer_*.bin``, as onnx-light does). Two xdist workers, or two test runs on
    one machine (CI's pass 1 and floor pass run side by side), generating them at once collided: one removed the
    file the other had just created, whose exclusive create then failed. Each process now has its own.
    """
    folder = tmp_path_factory.mktemp("system-tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield folder


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown to pytest without xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores this process may run on.

    The crash, race and kill-point tests spend much of their time waiting (for a forked writer, a child process, a
    mount): with one worker per core, a core idled while its worker waited. On 2 cores, 3 workers ran the suite in
    2 min 55 s where 2 took 3 min 20 s (the same commit, one after the other). benchmarks/conftest.py's hook runs
    first (``tryfirst``): no workers when timings are asked for.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores + 1


GREW_BYTES = 32 * 2**20
"""A test after which this process holds this much more memory than before it has its garbage collected at once."""


def resident_bytes() -> int | None:
    """This process's resident memory (Linux's ``/proc/self/statm``), or None where there is none to read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Collect the garbage of a test that grew this process's memory by :data:`GREW_BYTES` or more.

    A test that catches an exception (``pytest.raises``) keeps its traceback, its frames and their locals (a model of
    100 MB, say) in a reference cycle, freed only at a later collection of the oldest generation: after the
    10^8-character name test its worker held 771 MB for the rest of the run instead of ~250 MB. Every later test of
    that worker pays for it: a ``fork()`` and the child's exit handle the page tables of all the memory the process
    holds (3 ms at 86 MB, 20 ms at 387 MB, measured), and the crash, fault and race tests fork hundreds of times a run.
    """
    before = resident_bytes()
    yield
    after = resident_bytes()
    if before is not None and after is not None and after - before >= GREW_BYTES:
        gc.collect()


@pytest.fixture(name="make_external_model")
def _make_external_model_fixture() -> Callable[..., Path]:
    return make_external_model


@pytest.fixture(name="build_identity_model")
def _build_identity_model_fixture() -> Callable[..., onnx.ModelProto]:
    return identity_model


@pytest.fixture(name="externalize")
def _externalize_fixture() -> Callable[..., None]:
    return externalize


@pytest.fixture(name="sha256_of_tree")
def _sha256_of_tree_fixture() -> Callable[..., dict[str, str]]:
    return sha256_of_tree


@pytest.fixture(name="assert_no_temp_files")
def _assert_no_temp_files_fixture() -> Callable[..., None]:
    return assert_no_temp_files
