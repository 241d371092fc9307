"""Let onnx's ``ReferenceEvaluator`` go with its last reference, so the descriptors its kernels hold go with it.

onnx's ``ReferenceEvaluator._init`` gives every node one shared ``run_params`` dict whose ``"log"`` entry is
``lambda pattern, *args: self._log(10, pattern, *args)``: evaluator -> ``rt_nodes_`` -> node -> ``run_params`` ->
lambda -> evaluator, a reference cycle. ``del sess`` then frees nothing until the cyclic garbage collector runs,
and with it neither the weights files a file-mode ``DelayedInitializer`` holds open nor its folder: 40 build/run/del
cycles under ``RLIMIT_NOFILE`` = base + 16 failed with "Too many open files" (issue 26).

:func:`weaken_log_callback` replaces that entry by a function that reaches the evaluator through a weak reference:
the same messages while the evaluator lives, and no cycle. It relies on onnx's structure (the dict, the key, the
lambda's one closure cell holding the evaluator), checked at each call: on an onnx that differs it changes nothing,
and the descriptors are released when the garbage collector frees the evaluator (or by ``close()``);
``tests/ops/test_descriptors.py`` checks that the installed onnx is the first case.

This module must never change what onnx logs or computes, and never keep an evaluator alive.
"""

from __future__ import annotations

import weakref
from typing import Any


def _evaluator_of(log: Any) -> Any | None:
    """The evaluator onnx's ``log`` lambda closes over, or None if it is not that lambda."""
    cells = getattr(log, "__closure__", None)
    if not cells or len(cells) != 1 or getattr(log, "__name__", "") != "<lambda>":
        return None
    try:
        evaluator = cells[0].cell_contents
    except ValueError:  # an empty cell
        return None
    return evaluator if callable(getattr(evaluator, "_log", None)) else None


def weaken_log_callback(run_params: Any, evaluator: Any | None = None) -> None:
    """Replace ``run_params["log"]`` (onnx's lambda holding ``evaluator``) by one holding it weakly.

    Args:
        run_params: the dict onnx's evaluator hands each node (``OpRun.run_params``).
        evaluator: the evaluator, when the caller knows it; otherwise taken from the lambda's closure.
    """
    if not isinstance(run_params, dict):
        return
    log = run_params.get("log")
    owner = _evaluator_of(log)
    if owner is None or (evaluator is not None and owner is not evaluator):
        return  # already weakened, or not onnx's lambda: leave it
    ref = weakref.ref(owner)

    def weak_log(pattern: str, *args: Any) -> None:
        alive = ref()
        if alive is not None:
            alive._log(10, pattern, *args)

    run_params["log"] = weak_log
