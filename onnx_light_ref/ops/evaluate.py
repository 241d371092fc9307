"""One call to evaluate a model with external weights lazily: :func:`reference_evaluator`.

``ReferenceEvaluator("model.onnx")`` reads every external weight into the proto and converts it again to numpy
(about twice the weights in peak memory). :func:`reference_evaluator` parses the ``.onnx`` only, turns its external
initializers into ``ai.rt::DelayedInitializer`` nodes (:func:`~onnx_light_ref.ops.convert.delay_initializers`) and
builds the evaluator with the op bound to the model's folder. With ``load_device="file"`` construction reads no
weight and each run reads the weights it uses, straight into the arrays it returns; with ``"cpu"`` construction
reads each weight once.

External tensors the converter leaves alone (initializers overridable by a graph input, tensors in node attributes
such as ``Constant``'s value) are loaded eagerly with onnx's own loader, which applies onnx's location checks.

This module must never load converted weights itself: only the kernel reads them, when the evaluator says so.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from onnx.external_data_helper import load_external_data_for_tensor
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.io.locations import is_external
from onnx_light_ref.io.walker import iter_tensors
from onnx_light_ref.ops.convert import delay_initializers
from onnx_light_ref.ops.delayed_initializer import DelayedInitializer

__all__ = ["reference_evaluator"]

logger = logging.getLogger(__name__)


def reference_evaluator(path: str | os.PathLike[str], load_device: str = "file", **kwargs: Any) -> ReferenceEvaluator:
    """Build ``onnx.reference.ReferenceEvaluator`` for the model at ``path`` without loading its weights eagerly.

    ``load_device``: ``"file"`` (each run reads the weights, construction reads none) or ``"cpu"`` (construction
    reads each weight once; runs return copies). Other keyword arguments go to ``ReferenceEvaluator``
    (``verbose``, ``check_shape_annotations``, ``new_ops``...); your ``new_ops`` come after the bound
    ``DelayedInitializer``, whose folder is the model's. Errors: those of
    :func:`~onnx_light_ref.ops.convert.delay_initializers` (bad references are refused before anything is read).
    """
    model_path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(model_path)
    converted = delay_initializers(model_path, load_device, base_dir=folder)
    eager = [site for site in iter_tensors(converted) if is_external(site.tensor)]
    for site in eager:
        load_external_data_for_tensor(site.tensor, folder)
    if eager:
        logger.info(
            "loaded %d external tensors eagerly (graph-input defaults, attributes or sparse tensors): %s",
            len(eager),
            ", ".join(site.label for site in eager[:5]) + (", ..." if len(eager) > 5 else ""),
        )
    new_ops = [DelayedInitializer.bind(folder), *(kwargs.pop("new_ops", None) or [])]
    return ReferenceEvaluator(converted, new_ops=new_ops, **kwargs)
