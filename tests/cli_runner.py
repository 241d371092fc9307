"""The command line run in this process: exit status, stdout and stderr, as a child's would be.

A ``python -m onnx_light_ref`` child costs 0.3-0.5 s of CPU before it does anything (the interpreter, onnx, numpy);
the suite started ~150 of them, most only to read what a command printed. :func:`run_cli` calls
``onnx_light_ref._cli.main`` here and returns a :class:`subprocess.CompletedProcess` with the same three facts: the
status ``main`` returns (or argparse's ``SystemExit`` code), everything printed to ``sys.stdout`` and ``sys.stderr``,
and the package's log records formatted as ``main`` formats them on a terminal (``LEVEL message``, WARNING and above,
DEBUG with ``--verbose``: under pytest, ``logging.basicConfig`` in ``main`` does nothing, the root logger already has
pytest's handlers).

What only a real process shows stays tested in one: the console script and ``python -m`` (``tests/test_cli.py``),
signals (``tests/test_cli_interrupt.py``), start-up imports (``benchmarks/test_bench_startup.py``), the README's
commands (``tests/test_readme.py``), file descriptors and races (``tests/ops/test_descriptors.py``,
``tests/hardening``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess

from onnx_light_ref._cli import main

__all__ = ["run_cli"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``onnx-light-ref *args`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.setLevel(logging.DEBUG if "--verbose" in args or "-v" in args else logging.WARNING)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(min(level or logging.WARNING, handler.level))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as exc:  # argparse: a usage error (2), --help and --version (0)
                status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return subprocess.CompletedProcess(["onnx-light-ref", *args], status, out.getvalue(), err.getvalue())
