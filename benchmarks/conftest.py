"""Fixtures of the benchmark suite: the size, generated models (once per session), and interleaved comparisons.

How a comparison is measured, and why this way:

* every measured operation runs in a fresh child process (:mod:`benchmarks.child`), which reports the operation's
  own wall time and its peak RSS above an import-only baseline;
* the methods of one comparison run *interleaved*: round 1 runs A, B, C; round 2 runs B, C, A; ... The machine is
  shared and noisy, so a burst of load hits every method of a round instead of all the rounds of one method. The
  report uses medians per method and the ratios of those medians;
* every child gets a fresh, empty destination, and ``os.sync()`` runs first (outside the measurement), so writeback
  of the previous run's dirty pages does not land on the next one. Sources are warm (in the page cache);
* at tiny size (the normal test run) the children are forks of the test process (no interpreter start-up and
  imports each), without ``os.sync()``: those numbers are noise, the run only proves every scenario still works.

pytest-benchmark integration: one test = one comparison. ``benchmark.pedantic(one_round, rounds=N)`` drives the
rounds; what pytest-benchmark times is a whole round of child processes (interpreter start-up included), which is
*not* the figure we compare. The child-reported numbers go into ``benchmark.extra_info`` (``results``: every record;
``summary``: medians), and ``python -m benchmarks.report`` reads them from pytest-benchmark's JSON. Disabled (the
normal test run) pedantic runs one round, so every scenario still runs once at tiny size.

Timing is off unless asked for: :func:`pytest_configure` disables pytest-benchmark unless a flag that wants timings
was given (``--benchmark-only``, ``--benchmark-enable``, ``--benchmark-save``, ``--benchmark-autosave``,
``--benchmark-json``, ``--benchmark-compare``, ``--benchmark-compare-fail``, ``--benchmark-histogram``). It used to
be ``--benchmark-disable`` in ``addopts``, which made pytest-benchmark's usual ``--benchmark-only`` a usage error.
"""

from __future__ import annotations

import os
import shutil
import statistics
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.child import ScenarioUnavailableError, run_in_child
from benchmarks.models import (
    ENV_SIZE,
    GIB,
    AlignModel,
    DelayedModel,
    MlpModel,
    TypedModel,
    make_align_model,
    make_delayed_model,
    make_mlp_model,
    make_packed_model,
    make_typed_model,
    parse_size,
    scaled,
)

ENV_ROUNDS = "ONNX_LIGHT_REF_BENCH_ROUNDS"

# pytest-benchmark options whose use means "I want timed benchmarks"; each is falsy (False, None or []) when not given.
_TIMING_OPTIONS = (
    "benchmark_only",
    "benchmark_enable",
    "benchmark_save",
    "benchmark_autosave",
    "benchmark_json",
    "benchmark_compare",
    "benchmark_compare_fail",
    "benchmark_histogram",
)


def pytest_configure(config: pytest.Config) -> None:
    """Disable pytest-benchmark's timing unless a timing flag was given (the default run stays fast and untimed).

    Runs before pytest-benchmark's own ``pytest_configure`` (``trylast``), which reads ``benchmark_disable`` once to
    build its session. This conftest is an initial conftest whenever benchmarks are collected (``benchmarks`` is in
    ``testpaths``, or named on the command line), so it is registered in time.
    """
    if not config.pluginmanager.hasplugin("benchmark"):
        return
    if not _timing_requested(config):
        config.option.benchmark_disable = True


def _timing_requested(config: pytest.Config) -> bool:
    return any(config.getoption(dest, None) for dest in _TIMING_OPTIONS)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before tests/conftest.py's (one worker more than the cores)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """No worker processes when timings are asked for: ``-n auto`` (in ``addopts``) would disable pytest-benchmark.

    pytest-benchmark refuses to time under xdist (its figures would share the two cores); the default untimed run
    keeps ``-n auto``. Returning None leaves the choice to xdist.
    """
    return 0 if _timing_requested(config) else None


@dataclass(frozen=True)
class BenchConfig:
    size_name: str
    total: int
    rounds: int

    @property
    def is_tiny(self) -> bool:
        return self.total < 64 * 1024 * 1024


@dataclass(frozen=True)
class Method:
    """One contender of a comparison: a child scenario and its arguments.

    In every string of ``args`` (and of the optional ``cleanup`` list), ``{fresh}`` becomes an empty folder made for
    this one run (deleted after it) and ``{run_id}`` a unique token, for outputs that must live elsewhere (a variant
    saved next to its base model); ``cleanup`` names such outputs, deleted after the run.
    """

    label: str
    scenario: str
    args: dict[str, Any]
    cleanup: tuple[str, ...] = ()

    def resolve(self, fresh: str, run_id: str) -> tuple[dict[str, Any], list[str]]:
        def fill(value: Any) -> Any:
            if isinstance(value, str):
                return value.replace("{fresh}", fresh).replace("{run_id}", run_id)
            if isinstance(value, list):
                return [fill(item) for item in value]
            return value

        return {key: fill(value) for key, value in self.args.items()}, [fill(path) for path in self.cleanup]


class ModelCache:
    """Generates each benchmark model on first use, once per session, and deletes them all at the end."""

    def __init__(self, root: Path, total: int) -> None:
        self.root = root
        self.total = total
        self._align: dict[str, AlignModel] = {}
        self._delayed: DelayedModel | None = None
        self._mlp: MlpModel | None = None
        self._typed: TypedModel | None = None
        self._packed: TypedModel | None = None

    def align(self, shape: str) -> AlignModel:
        if shape not in self._align:
            self._align[shape] = make_align_model(self.root / shape, shape, self.total)
            os.sync()  # sources clean and warm: no writeback of generation during the first measurement
        return self._align[shape]

    def delayed(self) -> DelayedModel:
        if self._delayed is None:
            self._delayed = make_delayed_model(self.root / "delayed", scaled(self.total, 256 * 1024 * 1024))
            os.sync()
        return self._delayed

    def mlp(self) -> MlpModel:
        if self._mlp is None:
            self._mlp = make_mlp_model(self.root / "mlp", scaled(self.total, 512 * 1024 * 1024))
            os.sync()
        return self._mlp

    def typed(self) -> TypedModel:
        """The bfloat16 model, with as many weights as the float32 MLP (512 MiB at the 1G reference size)."""
        if self._typed is None:
            self._typed = make_typed_model(self.root / "typed", scaled(self.total, 512 * 1024 * 1024))
            os.sync()
        return self._typed

    def packed(self) -> TypedModel:
        """One int4 weight of 16 MiB packed bytes at the 1G reference size (the issue-40 case)."""
        if self._packed is None:
            self._packed = make_packed_model(self.root / "packed", scaled(self.total, 16 * 1024 * 1024))
            os.sync()
        return self._packed

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def bench_config() -> BenchConfig:
    size_name = os.environ.get(ENV_SIZE, "tiny")
    total = parse_size(size_name)
    default_rounds = 1 if total < GIB // 4 else 7
    rounds = int(os.environ.get(ENV_ROUNDS, default_rounds))
    return BenchConfig(size_name, total, max(1, rounds))


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory, bench_config: BenchConfig) -> Iterator[ModelCache]:
    cache = ModelCache(tmp_path_factory.mktemp("bench-models"), bench_config.total)
    yield cache
    cache.remove()  # GiB-sized files must not outlive the session (pytest keeps old basetemps around)


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("bench-runs")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and min/max) of one method's records: total and per-phase seconds and peak-RSS deltas."""
    seconds = [r["seconds"] for r in records]
    summary: dict[str, Any] = {
        "n": len(records),
        "seconds": _median(seconds),
        "seconds_min": min(seconds),
        "seconds_max": max(seconds),
        "delta_mib": _median([r["delta_mib"] for r in records]),
        "baseline_mib": _median([r["baseline_hwm_mib"] for r in records]),
        "phases": {},
    }
    for phase in records[0]["phases"]:
        summary["phases"][phase] = {
            "seconds": _median([r["phases"][phase]["seconds"] for r in records]),
            "delta_mib": _median([r["phases"][phase]["delta_mib"] for r in records]),
        }
    if "extra" in records[0]:
        summary["extra"] = records[0]["extra"]
    return summary


@pytest.fixture
def compare(benchmark: Any, bench_config: BenchConfig, scratch: Path) -> Callable[..., dict[str, dict[str, Any]]]:
    """``compare(group, methods, **info)``: run the methods interleaved for the configured rounds; return summaries."""

    def run(group: str, methods: Sequence[Method], **info: Any) -> dict[str, dict[str, Any]]:
        results: dict[str, list[dict[str, Any]]] = {m.label: [] for m in methods}
        skipped: dict[str, str] = {}
        rounds_done = 0

        def run_one(position: int, method: Method) -> None:
            run_id = uuid.uuid4().hex[:8]
            fresh = scratch / f"{group}-{run_id}"
            fresh.mkdir()
            args, cleanup = method.resolve(str(fresh), run_id)
            if not bench_config.is_tiny:
                os.sync()
            try:
                record = run_in_child(method.scenario, args, fork=bench_config.is_tiny)
            except ScenarioUnavailableError as exc:
                skipped[method.label] = str(exc)
                return
            finally:
                shutil.rmtree(fresh, ignore_errors=True)
                for path in cleanup:
                    if os.path.exists(path):
                        os.remove(path)
            record.update(round=rounds_done, position=position)
            results[method.label].append(record)

        def one_round() -> None:
            nonlocal rounds_done
            shift = rounds_done % len(methods)
            order = [m for m in [*methods[shift:], *methods[:shift]] if m.label not in skipped]
            # Tiny runs only prove that every scenario works (their numbers are start-up noise): their children are
            # forks of this process (run_in_child(fork=True)), which start at once, so one after the other is quick.
            for position, method in enumerate(order):
                run_one(position, method)
            rounds_done += 1

        benchmark.pedantic(one_round, rounds=bench_config.rounds, iterations=1, warmup_rounds=0)
        summaries = {label: summarize(records) for label, records in results.items() if records}
        benchmark.extra_info.update(
            group=group,
            size=bench_config.size_name,
            total_bytes=bench_config.total,
            rounds=rounds_done,
            order=[m.label for m in methods],
            skipped=skipped,
            summary=summaries,
            results=results,
            **info,
        )
        if skipped and not summaries:
            pytest.skip("; ".join(f"{label}: {reason}" for label, reason in skipped.items()))
        from benchmarks.report import check_group  # every group measured is one the report renders and judges

        check_group(group, dict(benchmark.extra_info))
        for label, reason in skipped.items():
            warnings.warn(f"benchmark {group}/{label} skipped: {reason}", UserWarning, stacklevel=2)
        return summaries

    return run
