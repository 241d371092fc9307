"""Run a folder written by ``generate-tests`` in onnx's own backend-test ``Runner``.

onnx's loader ``onnx.backend.test.loader.load_model_tests(data_dir, kind)`` reads ``<data_dir>/<kind>/<case>/``
for every kind except ``"node"``: since onnx 1.23 that kind returns onnx's own in-memory node cases and ignores
``data_dir``, so the documented call cannot load our ``<output_dir>/node`` folder. :func:`load_cases` returns the
same ``TestCase`` records the loader builds for an on-disk kind (``model_dir`` set, model and data loaded by the
Runner at run time), and on an onnx whose loader still reads ``<data_dir>/node`` it simply calls the loader.

A ``Runner`` has no public way to add cases: its constructor loads onnx's cases (about 4,000, several seconds).
:func:`make_runner` builds one holding only ours by handing the constructor a loader that returns them (the name
``load_model_tests`` the runner module calls, swapped under a lock for the duration of the constructor), or, with
``include_onnx_cases=True`` or on an onnx whose runner does not call that name, builds the full Runner and adds
ours with its ``_add_model_test`` (private; a clear error if an onnx release removes it). Either way every case is
run by onnx's code: ``onnx.load(<case>/model.onnx)``, ``backend.prepare(model, device, **test_kwargs[name])``, then
the outputs compared with ``Runner.assert_similar_outputs``.

Recipe (from any working directory)::

    from onnx_light_ref.backend import DelayedInitializerBackend
    from onnx_light_ref.backend._runner import make_runner

    runner = make_runner("OUTPUT_DIR", DelayedInitializerBackend)
    unittest.TextTestRunner().run(runner.test_suite)   # or globals().update(runner.test_cases) under pytest

A relocatable suite (``generate-tests --relocatable``) needs the op bound to each case directory:
``make_runner(out, test_kwargs=bound_test_kwargs(out))``.

This module never writes a file and leaves onnx's module state as it found it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import onnx
import onnx.backend.test.loader as onnx_loader
import onnx.backend.test.runner as onnx_runner
from onnx.backend.base import Backend
from onnx.backend.test.case.test_case import TestCase
from onnx.backend.test.runner import Runner

from onnx_light_ref.backend._backend import DelayedInitializerBackend
from onnx_light_ref.backend._expect import DEFAULT_ATOL, DEFAULT_RTOL
from onnx_light_ref.backend._generate import MODEL_FILENAME
from onnx_light_ref.ops._schema import DOMAIN, OP_TYPE

CATEGORY = "NodeModel"
"""The Runner category on-disk node cases land in (unittest class ``OnnxBackendNodeModelTest``)."""

_swap_lock = threading.Lock()


def _node_dir(output_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.path.abspath(os.fspath(output_dir)), "node")


def _loader_ignores_data_dir_for_node() -> bool:
    # onnx >= 1.23 routes kind "node" to load_node_model_tests (its own cases); earlier releases read data_dir.
    return hasattr(onnx_loader, "load_node_model_tests")


def load_cases(output_dir: str | os.PathLike[str]) -> list[TestCase]:
    """The cases of a ``generate-tests`` folder as onnx's loader describes on-disk cases, sorted by name.

    Args:
        output_dir: The folder given to ``generate-tests`` (the cases are in its ``node`` subfolder).

    Returns:
        One ``TestCase`` per ``node/<case>/model.onnx``: ``kind="node"``, ``model_dir`` the absolute case folder,
        ``model`` and ``data_sets`` ``None`` (the Runner loads them), tolerances from ``data.json`` when present.

    Raises:
        FileNotFoundError: ``output_dir/node`` does not exist.

    Example:
        In any folder:

        >>> import os
        >>> from onnx_light_ref.backend import generate, load_cases
        >>> _ = generate("cases")
        >>> case = {case.name: case for case in load_cases("cases")}["test_cc_delayedinitializer_cpu"]
        >>> case.kind, os.path.relpath(case.model_dir)
        ('node', 'cases/node/test_cc_delayedinitializer_cpu')
    """
    node_dir = _node_dir(output_dir)
    if not os.path.isdir(node_dir):
        raise FileNotFoundError(f"no generated cases: {node_dir!r} is not a folder (run generate-tests first).")
    if not _loader_ignores_data_dir_for_node():
        cases = onnx_loader.load_model_tests(data_dir=os.path.dirname(node_dir), kind="node")
        return sorted(cases, key=lambda case: case.name)
    cases = []
    for name in sorted(os.listdir(node_dir)):
        case_dir = os.path.join(node_dir, name)
        if not os.path.isfile(os.path.join(case_dir, MODEL_FILENAME)):
            continue
        rtol, atol = DEFAULT_RTOL, DEFAULT_ATOL
        data_json = os.path.join(case_dir, "data.json")
        if os.path.exists(data_json):
            with open(data_json, encoding="utf-8") as f:
                data = json.load(f)
            rtol, atol = data.get("rtol", rtol), data.get("atol", atol)
        cases.append(
            TestCase(
                name=name,
                model_name=name.removeprefix("test_"),
                url=None,
                model_dir=case_dir,
                model=None,
                data_sets=None,
                kind="node",
                rtol=rtol,
                atol=atol,
            )
        )
    return cases


def bound_test_kwargs(output_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """``test_kwargs`` binding the op to each case folder whose model names a file relatively.

    Cases naming their files absolutely (the seed cases, every case of a default ``generate-tests`` run) get
    nothing: they run with the unbound op, as the spec describes.

    Args:
        output_dir: The folder given to ``generate-tests``.

    Returns:
        ``{case name: {"base_dir": case folder}}`` for the cases with a relative ``filename``.

    Raises:
        FileNotFoundError: ``output_dir/node`` does not exist.

    Example:
        In any folder, with a relocatable suite (``generate-tests --relocatable``):

        >>> import os
        >>> from onnx_light_ref.backend import bound_test_kwargs, generate
        >>> _ = generate("cases", relocatable=True)
        >>> kwargs = bound_test_kwargs("cases")
        >>> os.path.relpath(kwargs["test_cc_delayedinitializer_float_cpu"]["base_dir"])
        'cases/node/test_cc_delayedinitializer_float_cpu'
        >>> "test_cc_delayedinitializer_cpu" in kwargs  # a seed case names its weights absolutely
        False
    """
    kwargs: dict[str, dict[str, Any]] = {}
    for case in load_cases(output_dir):
        assert case.model_dir is not None
        model = onnx.load_model(os.path.join(case.model_dir, MODEL_FILENAME))
        for node in model.graph.node:
            if node.domain != DOMAIN or node.op_type != OP_TYPE:
                continue
            filename = next((a.s.decode("utf-8") for a in node.attribute if a.name == "filename"), "")
            if not os.path.isabs(filename):
                kwargs[case.name] = {"base_dir": case.model_dir}
    return kwargs


@contextmanager
def _runner_loads_only(cases: list[TestCase]) -> Iterator[None]:
    """Make ``Runner.__init__`` see ``cases`` as the node cases and no others, for the duration of the block."""

    def load_model_tests(data_dir: str = "", kind: str | None = None) -> list[TestCase]:
        return list(cases) if kind == "node" else []

    with _swap_lock:
        original = onnx_runner.load_model_tests
        onnx_runner.load_model_tests = load_model_tests
        try:
            yield
        finally:
            onnx_runner.load_model_tests = original


def _test_names(runner: Runner) -> set[str]:
    return {name for test_case in runner.test_cases.values() for name in vars(test_case) if name.startswith("test_")}


def _add_to_runner(runner: Runner, cases: list[TestCase]) -> None:
    add = getattr(runner, "_add_model_test", None)
    if not callable(add):
        raise RuntimeError(
            f"onnx {onnx.__version__}'s Runner has no _add_model_test: cannot add cases to a Runner holding onnx's "
            "own cases; use make_runner(..., include_onnx_cases=False)."
        )
    for case in cases:
        add(case, "Node")


def make_runner(
    output_dir: str | os.PathLike[str],
    backend: type[Backend] = DelayedInitializerBackend,
    *,
    parent_module: str | None = None,
    test_kwargs: Mapping[str, dict[str, Any]] | None = None,
    include_onnx_cases: bool = False,
) -> Runner:
    """An ``onnx.backend.test.runner.Runner`` for ``backend`` holding the cases of a ``generate-tests`` folder.

    Each case becomes two tests, ``<case>_cpu`` and ``<case>_cuda`` (skipped by a CPU-only backend), in category
    ``OnnxBackendNodeModelTest``. Use ``runner.test_suite`` / ``runner.test_cases`` as with any Runner.

    Args:
        output_dir: The folder given to ``generate-tests``.
        backend: The backend under test (default ours).
        parent_module: Passed to ``Runner`` (the module the generated unittest classes claim).
        test_kwargs: Passed to ``Runner``: per-case keyword arguments of ``backend.prepare`` (see
            :func:`bound_test_kwargs` for a relocatable suite).
        include_onnx_cases: Also hold onnx's own cases (several seconds to build; filter with
            ``runner.include(...)``/``exclude(...)`` as usual).

    Returns:
        The Runner.

    Raises:
        FileNotFoundError: ``output_dir/node`` does not exist.
        RuntimeError: this onnx's Runner offers no way to add the cases.

    Example:
        In any folder:

        >>> import io, unittest
        >>> from onnx_light_ref.backend import generate, make_runner
        >>> _ = generate("cases")
        >>> result = unittest.TextTestRunner(stream=io.StringIO()).run(make_runner("cases").test_suite)
        >>> result.wasSuccessful(), len(result.skipped) * 2 == result.testsRun  # every _cuda test skips
        (True, True)
    """
    cases = load_cases(output_dir)
    kwargs = dict(test_kwargs) if test_kwargs is not None else None
    if not include_onnx_cases and hasattr(onnx_runner, "load_model_tests"):
        with _runner_loads_only(cases):
            runner = Runner(backend, parent_module, kwargs)
        # A future Runner might load its cases another way: then fall back to adding them one by one.
        if {f"{case.name}_cpu" for case in cases} <= _test_names(runner):
            return runner
    runner = Runner(backend, parent_module, kwargs)
    _add_to_runner(runner, cases)
    return runner
