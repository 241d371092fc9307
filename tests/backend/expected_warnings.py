"""The warnings the backend tests cause on purpose, filtered on the tests that cause them, each by its message and
the module that raises it: every other warning still ends the run's summary, where a new one stands out.

* the conformance cases feed every bit pattern of the float-like types (NaN, infinities, subnormals) to
  ``Reciprocal`` (``onnx_light_ref/backend/_typed_cases.py``, ``cases.py``): numpy warns in onnx's kernel, and numpy
  < 2 again when the outputs are compared (``np.isclose`` multiplies the infinities by 0);
* onnx's own node cases, built when a Runner includes them, compute NaN, infinities and overflowing casts on purpose,
  and reshape arrays the way numpy 2.5 deprecates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

__all__ = ["EVERY_BIT_PATTERN", "onnx_own_cases"]

_Test = TypeVar("_Test", bound=Callable[..., object])

EVERY_BIT_PATTERN = [
    pytest.mark.filterwarnings(
        r"ignore:(overflow|invalid value) encountered in reciprocal:RuntimeWarning:onnx\.reference\.ops\.op_reciprocal"
    ),
    pytest.mark.filterwarnings(r"ignore:invalid value encountered in multiply:RuntimeWarning:numpy\.core\.numeric"),
]
"""For the modules whose tests evaluate the generated cases (``pytestmark``)."""


def onnx_own_cases(test: _Test) -> _Test:
    """For a test that builds onnx's own node cases (a Runner with ``include_onnx_cases=True``)."""
    runtime = pytest.mark.filterwarnings(r"ignore::RuntimeWarning:onnx\.backend\.test\.case\.node\.")
    reshape = pytest.mark.filterwarnings(
        r"ignore:Setting the shape on a NumPy array has been deprecated:DeprecationWarning:"
        r"onnx\.backend\.test\.case\.node\."
    )
    return reshape(runtime(test))
