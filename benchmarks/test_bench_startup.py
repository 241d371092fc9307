"""CLI start-up (issue 29): wall time and peak RSS of ``onnx-light-ref --version``, ``--help`` and ``inspect --help``
in a fresh process, against ``python -c pass`` (the bare interpreter).

Every command pays its start-up before doing anything, and a command that only prints needs none of onnx, numpy or
onnxruntime (0.7 s and 60 MiB to import): the target is at most 0.25 s above the bare interpreter. Unlike the other
benchmarks, start-up *is* the figure here, so each method is the whole child process: wall time from ``Popen`` to
its exit, and its peak RSS (``ru_maxrss`` from ``os.wait4``, that one child's high-water mark). Methods run
interleaved (round 1: bare, version, help, inspect-help; round 2 shifted by one...), 15 rounds when timed, one (and
side by side with nothing else) in the normal test run, which only proves every command still starts and prints.

``python -m pytest benchmarks/test_bench_startup.py --benchmark-enable -s`` prints the medians; the report
(``python -m benchmarks.report``) shows the table and the target. The test asserts what each command printed, never
a time: ``tests/test_cli.py`` checks that these commands import neither onnx nor numpy.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.conftest import BenchConfig

# Each method: the command-line arguments (None: the bare interpreter) and what its stdout must contain.
COMMANDS: dict[str, tuple[list[str] | None, str]] = {
    "bare": (None, ""),
    "version": (["--version"], "onnx-light-ref "),
    "help": (["--help"], "usage: onnx-light-ref"),
    "inspect_help": (["inspect", "--help"], "usage: onnx-light-ref inspect"),
}
TIMED_ROUNDS = 15  # start-up is short and noisy: more rounds than the other comparisons' 7
# Not part of the measurement: with PYTHONSTARTUP or a PYTHONPROFILEIMPORTTIME the figures would mean something else.
_IGNORED_ENVIRONMENT = ("PYTHONSTARTUP", "PYTHONPROFILEIMPORTTIME", "PYTHONTRACEMALLOC")
# The child writes its own VmHWM at exit: a child's ru_maxrss (os.wait4) starts from the forking pytest process's
# high-water mark, not from zero, while VmHWM belongs to the exec'd image alone. Same preamble for every method.
_REPORT_PEAK = """import atexit, os, sys
def _peak():
    with open("/proc/self/status") as status, open(os.environ["OLR_BENCH_PEAK_FILE"], "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
atexit.register(_peak)
"""
_RUN_CLI = "import runpy\nsys.argv[0] = 'onnx-light-ref'\nrunpy.run_module('onnx_light_ref', run_name='__main__')\n"


def start_once(arguments: list[str] | None, folder: str) -> dict[str, Any]:
    """Run ``onnx-light-ref *arguments`` (or ``python -c pass``) to its end; return its wall time (s), peak RSS
    (MiB), exit status and output."""
    peak_file = os.path.join(folder, "peak")
    env = {key: value for key, value in os.environ.items() if key not in _IGNORED_ENVIRONMENT}
    env["OLR_BENCH_PEAK_FILE"] = peak_file
    code = _REPORT_PEAK if arguments is None else _REPORT_PEAK + _RUN_CLI
    argv = [sys.executable, "-c", code, *(arguments or [])]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    seconds = time.perf_counter() - start
    with open(peak_file) as peak:
        rss_mib = int(peak.read()) / 1024
    return {"seconds": seconds, "rss_mib": rss_mib, "status": done.returncode, "stdout": done.stdout,
            "stderr": done.stderr}  # fmt: skip


def test_cli_startup(benchmark: Any, bench_config: BenchConfig, tmp_path: Path) -> None:
    methods = list(COMMANDS)
    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in methods}
    done = 0

    def one_round() -> None:
        nonlocal done
        shift = done % len(methods)
        for method in [*methods[shift:], *methods[:shift]]:
            runs[method].append(start_once(COMMANDS[method][0], str(tmp_path)))
        done += 1

    benchmark.pedantic(one_round, rounds=1 if benchmark.disabled else TIMED_ROUNDS, iterations=1, warmup_rounds=0)

    for method, (arguments, expected) in COMMANDS.items():
        for run in runs[method]:
            assert run["status"] == 0, f"{arguments}: {run['stderr']}"
            assert expected in run["stdout"], f"{arguments} printed {run['stdout']!r}"
    bare_seconds = statistics.median(r["seconds"] for r in runs["bare"])
    bare_rss = statistics.median(r["rss_mib"] for r in runs["bare"])
    summary = {}
    for method in methods:
        seconds = [r["seconds"] for r in runs[method]]
        rss = statistics.median(r["rss_mib"] for r in runs[method])
        summary[method] = {
            "n": len(seconds),
            "seconds": statistics.median(seconds),
            "seconds_min": min(seconds),
            "seconds_max": max(seconds),
            "above_bare_s": statistics.median(seconds) - bare_seconds,
            "rss_mib": rss,
            "delta_mib": rss - bare_rss,  # the report's "peak RSS Δ": above the bare interpreter
            "phases": {},
        }
    benchmark.extra_info.update(
        group="startup",
        size=bench_config.size_name,  # start-up does not depend on it: the report shows it with that run
        rounds=done,
        order=methods,
        summary=summary,
        python=sys.version.split()[0],
    )
    for method, row in summary.items():
        print(
            f"startup {method:<13} {row['seconds']:.3f} s ({row['above_bare_s']:+.3f} s above bare), "
            f"peak RSS {row['rss_mib']:.1f} MiB ({row['delta_mib']:+.1f} MiB)"
        )
