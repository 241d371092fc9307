"""CLI start-up (issues 29 and 42): wall time and peak RSS of ``onnx-light-ref --version``, ``--help``, ``inspect
--help``, and of ``inspect`` and ``verify`` of a small model (64 external tensors of 4 KiB, against a re-aligned
copy), in a fresh process, against ``python -c pass`` (the bare interpreter).

Every command pays its start-up before doing anything. A command that only prints needs none of onnx, numpy or
onnxruntime (target: at most 0.25 s above the bare interpreter, issue 29); ``inspect`` and ``verify`` of a small
model read its metadata through the protobuf classes alone (``io/_read/proto.py``: no numpy, no ml_dtypes, no onnx
package), target at most 0.3 s above the bare interpreter (issue 42). ``import onnx`` is measured beside them as a
reference: what a command that needs onnx pays on top, which is where the ml_dtypes release shows (0.7.0's import
took 0.67 s instead of 0.14 s for 0.6 on the machine of issue 42).

Unlike the other benchmarks, start-up *is* the figure here, so each method is the whole child process: wall time
from ``Popen`` to its exit, and its peak RSS (``VmHWM``, written by the child at exit). Methods run interleaved
(round 1: bare, version, help...; round 2 shifted by one...), 15 rounds when timed, one (and side by side with
nothing else) in the normal test run, which only proves every command still starts and prints.

**Several interpreters in one run**: ``ONNX_LIGHT_REF_BENCH_PYTHONS`` lists more interpreters (``os.pathsep``
between them), typically the ``python`` of a virtual environment made with a plain ``pip install .`` (ml_dtypes
0.7) beside the test extra's (ml_dtypes < 0.7). Every method runs with each, on this checkout's code
(``PYTHONPATH``), named ``METHOD@ml_dtypes-X`` after the first interpreter's and measured against its own bare
interpreter::

    ONNX_LIGHT_REF_BENCH_PYTHONS=/path/to/venv-users/bin/python \\
        python -m pytest benchmarks/test_bench_startup.py --benchmark-enable -s -n 0

prints the medians; the report (``python -m benchmarks.report``) shows the table and the targets. The test asserts
what each command printed, never a time: ``tests/test_cli.py`` checks what these commands import.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.conftest import BenchConfig
from benchmarks.models import KIB, make_align_model, make_aligned_copy

ENV_PYTHONS = "ONNX_LIGHT_REF_BENCH_PYTHONS"
ROOT = Path(__file__).resolve().parents[1]

# Each method: the command-line arguments (None: the bare interpreter; a str: Python code) and what its stdout must
# contain. "{model}" and "{copy}" are the small model and its re-aligned copy.
COMMANDS: dict[str, tuple[list[str] | str | None, str]] = {
    "bare": (None, ""),
    "version": (["--version"], "onnx-light-ref "),
    "help": (["--help"], "usage: onnx-light-ref"),
    "inspect_help": (["inspect", "--help"], "usage: onnx-light-ref inspect"),
    "inspect": (["inspect", "{model}"], "status: OK"),
    "verify": (["verify", "{model}", "{copy}"], "equal: 64 tensors"),
    "import_onnx": ("import onnx\nprint('onnx', onnx.__version__)", "onnx "),
}
LABELS = {
    "bare": "python -c pass (the bare interpreter)",
    "version": "onnx-light-ref --version",
    "help": "onnx-light-ref --help",
    "inspect_help": "onnx-light-ref inspect --help",
    "inspect": "onnx-light-ref inspect MODEL.onnx (64 external tensors)",
    "verify": "onnx-light-ref verify A.onnx B.onnx (64 tensors of 4 KiB each)",
    "import_onnx": "python -c 'import onnx' (reference: what a command needing onnx pays)",
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
# Read from the installed metadata, never by importing: the versions that make the figures.
_VERSIONS = """import importlib.metadata as m, json, sys
versions = {name: m.version(name) for name in ("onnx", "numpy", "ml_dtypes")}
print(json.dumps({"python": sys.version.split()[0], **versions}))
"""


@dataclass(frozen=True)
class Interpreter:
    """A Python to start the commands with, and the versions installed beside it."""

    executable: str
    versions: dict[str, str]
    suffix: str  # "" for the first interpreter, "@ml_dtypes-X" for the others


def interpreters() -> list[Interpreter]:
    """This interpreter, then every one listed in :data:`ENV_PYTHONS`."""
    found = []
    listed = [path for path in os.environ.get(ENV_PYTHONS, "").split(os.pathsep) if path]
    for index, executable in enumerate([sys.executable, *listed]):
        done = subprocess.run([executable, "-c", _VERSIONS], capture_output=True, text=True, check=True, timeout=60)
        versions = dict(json.loads(done.stdout))
        found.append(Interpreter(executable, versions, "" if index == 0 else f"@ml_dtypes-{versions['ml_dtypes']}"))
    return found


def start_once(python: str, arguments: list[str] | str | None, folder: str) -> dict[str, Any]:
    """Run ``onnx-light-ref *arguments`` (Python code for a str, ``python -c pass`` for None) with ``python``, on
    this checkout's code, to its end; return its wall time (s), peak RSS (MiB), exit status and output."""
    peak_file = os.path.join(folder, "peak")
    env = {key: value for key, value in os.environ.items() if key not in _IGNORED_ENVIRONMENT}
    env["OLR_BENCH_PEAK_FILE"] = peak_file
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if arguments is None:
        argv = [python, "-c", _REPORT_PEAK]
    elif isinstance(arguments, str):
        argv = [python, "-c", _REPORT_PEAK + arguments]
    else:
        argv = [python, "-c", _REPORT_PEAK + _RUN_CLI, *arguments]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    seconds = time.perf_counter() - start
    with open(peak_file) as peak:
        rss_mib = int(peak.read()) / 1024
    return {"seconds": seconds, "rss_mib": rss_mib, "status": done.returncode, "stdout": done.stdout,
            "stderr": done.stderr}  # fmt: skip


def test_cli_startup(benchmark: Any, bench_config: BenchConfig, tmp_path: Path) -> None:
    model = make_align_model(tmp_path / "model", "large", 64 * 4 * KIB)
    copy = make_aligned_copy(model, tmp_path / "copy")
    pythons = interpreters()
    commands: dict[str, tuple[Interpreter, list[str] | str | None, str]] = {}
    for python in pythons:
        for name, (arguments, expected) in COMMANDS.items():
            filled = (
                [a.format(model=model.onnx_path, copy=copy.onnx_path) for a in arguments]
                if isinstance(arguments, list)
                else arguments
            )
            commands[name + python.suffix] = (python, filled, expected)
    methods = list(commands)
    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in methods}
    done = 0

    def one_round() -> None:
        nonlocal done
        shift = done % len(methods)
        for method in [*methods[shift:], *methods[:shift]]:
            python, arguments, _ = commands[method]
            runs[method].append(start_once(python.executable, arguments, str(tmp_path)))
        done += 1

    benchmark.pedantic(one_round, rounds=1 if benchmark.disabled else TIMED_ROUNDS, iterations=1, warmup_rounds=0)

    for method, (_, arguments, expected) in commands.items():
        for run in runs[method]:
            assert run["status"] == 0, f"{arguments}: {run['stderr']}"
            assert expected in run["stdout"], f"{arguments} printed {run['stdout']!r}"
    summary = {}
    for python in pythons:
        bare = runs["bare" + python.suffix]
        bare_seconds = statistics.median(r["seconds"] for r in bare)
        bare_rss = statistics.median(r["rss_mib"] for r in bare)
        for name in COMMANDS:
            seconds = [r["seconds"] for r in runs[name + python.suffix]]
            rss = statistics.median(r["rss_mib"] for r in runs[name + python.suffix])
            summary[name + python.suffix] = {
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
        labels={
            name + python.suffix: f"{LABELS[name]}{python.suffix and f' [{python.suffix[1:]}]'}"
            for python in pythons
            for name in COMMANDS
        },
        interpreters=[{"suffix": python.suffix, **python.versions} for python in pythons],
        python=sys.version.split()[0],
    )
    for python in pythons:
        print(f"startup with Python {python.versions['python']}, onnx {python.versions['onnx']}, numpy "
              f"{python.versions['numpy']}, ml_dtypes {python.versions['ml_dtypes']}:")  # fmt: skip
        for name in COMMANDS:
            row = summary[name + python.suffix]
            print(
                f"  {name:<13} {row['seconds']:.3f} s ({row['above_bare_s']:+.3f} s above bare), "
                f"peak RSS {row['rss_mib']:.1f} MiB ({row['delta_mib']:+.1f} MiB)"
            )
