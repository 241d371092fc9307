"""``Transpose`` for our evaluator: onnx's, with a C-contiguous output.

onnx's reference ``Transpose`` returns a numpy view (``np.transpose``); a ``MatMul`` fed that view hands BLAS a
transposed operand, which sums in another order than over the same values stored row-major. ``link --transpose``
replaces a pre-transposed initializer by ``Transpose(checkpoint key)``: with this op the ``MatMul`` sees exactly the
array the pre-transposed initializer held, so the outputs stay bit-identical (as in onnxruntime, which folds the
``Transpose`` into a new initializer). It costs one copy of each ``Transpose`` output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.reference.op_run import OpRun


class Transpose(OpRun):
    """The standard ``Transpose`` (every opset: ``perm`` defaults to reversing the axes), contiguous output."""

    op_domain = ""

    def _run(self, data: np.ndarray, perm: Any = None) -> tuple[np.ndarray]:
        axes = None if perm is None or len(perm) == 0 else tuple(perm)
        return (np.ascontiguousarray(np.transpose(data, axes)),)
