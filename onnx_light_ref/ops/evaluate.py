"""One call to evaluate a model with external weights lazily: :func:`reference_evaluator`.

``ReferenceEvaluator("model.onnx")`` reads every external weight into the proto and converts it again to numpy
(about twice the weights in peak memory). :func:`reference_evaluator` parses the ``.onnx`` only, turns its external
initializers into ``ai.rt::DelayedInitializer`` nodes (:func:`~onnx_light_ref.ops.convert.delay_initializers`) and
builds the evaluator with the op bound to the model's folder. With ``load_device="file"`` construction reads no
weight and each run reads the weights it uses, straight into the arrays it returns; with ``"cpu"`` construction
reads each weight once.

Confinement: the bound op reads only files inside the model's folder (symlinks followed, hard links refused), so
a ``DelayedInitializer`` node already in the model with ``filename="/etc/passwd"`` raises
:class:`~onnx_light_ref.errors.UnsafeLocationError` when the evaluator is built, before any byte is read.
``allow_outside_folder=True`` trusts the model's absolute filenames (the spec's examples use ``/tmp`` paths).

External tensors the converter leaves alone (initializers overridable by a graph input, tensors in node attributes
such as ``Constant``'s value, dtypes the op cannot produce, subgraph initializers named like an outer value) are
validated like the converted ones (inside the folder, in bounds, not hard-linked: the package's typed errors, before
any of them is read), then loaded eagerly with onnx's own loader, which applies onnx's location checks too (it also
refuses a symbolic link inside the folder: :class:`~onnx_light_ref.errors.ExternalDataError`).
Tensors of ``ModelProto.training_info`` graphs are neither converted nor loaded: inference never runs those graphs
(onnx's evaluator ignores them), so their files are not even opened.

This module must never load converted weights itself: only the kernel reads them, when the evaluator says so.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import onnx
from onnx.external_data_helper import load_external_data_for_tensor
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io.arguments import check_bool
from onnx_light_ref.io.locations import LocationResolver, check_not_hard_linked, is_external, parse_external_data
from onnx_light_ref.io.walker import iter_tensors
from onnx_light_ref.onnx_compat import refuse_unsupported_evaluator_options
from onnx_light_ref.ops.convert import delay_initializers
from onnx_light_ref.ops.delayed_initializer import DelayedInitializer

__all__ = ["reference_evaluator"]

logger = logging.getLogger(__name__)


def reference_evaluator(
    path: str | os.PathLike[str], load_device: str = "file", *, allow_outside_folder: bool = False, **kwargs: Any
) -> ReferenceEvaluator:
    """Build ``onnx.reference.ReferenceEvaluator`` for the model at ``path`` without loading its weights eagerly.

    External initializers become ``DelayedInitializer`` nodes bound to the model's folder; every
    ``DelayedInitializer`` filename (converted or already in the model) must resolve inside that folder.

    Args:
        path: the ``.onnx`` file.
        load_device: ``"file"`` (each run reads the weights, construction reads none) or ``"cpu"`` (construction
            reads each weight once; runs return copies).
        allow_outside_folder: trust absolute ``filename`` attributes pointing outside the model's folder (the
            spec's behaviour). Relative names stay confined either way.
        **kwargs: passed to ``ReferenceEvaluator`` (``verbose``, ``check_shape_annotations``, ``new_ops``...); your
            ``new_ops`` come after the bound ``DelayedInitializer``.

    Returns:
        The evaluator.

    Raises:
        UnsafeLocationError: a filename or location outside the model's folder, a hard-linked data file.
        FileNotFoundError: the model or a data file is missing.
        ExternalDataError: a tensor loaded eagerly (see the module docstring) has a malformed reference, or onnx's
            loader refuses it.
        ValueError: the errors of :func:`~onnx_light_ref.ops.convert.delay_initializers` and of the kernel's
            attribute checks (bad references are refused before anything is read).
        UnsupportedOnnxFeatureError: an evaluator keyword the installed onnx lacks (``check_shape_annotations``
            before onnx 1.23), refused before anything is read.
    """
    check_bool("allow_outside_folder", allow_outside_folder)
    refuse_unsupported_evaluator_options(kwargs)
    model_path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(model_path)
    converted = delay_initializers(model_path, load_device, base_dir=folder)
    eager = [site for site in iter_tensors(converted) if site.scope != "training" and is_external(site.tensor)]
    # Validated as the converted ones were (typed errors naming the tensor, nothing read) before onnx reads any.
    resolver = LocationResolver(folder)
    for site in eager:
        check_not_hard_linked(parse_external_data(site.tensor, resolver, label=site.label))
    for site in eager:
        try:
            load_external_data_for_tensor(site.tensor, folder)
            # Then mark it loaded, as onnx's load_external_data_for_model does: an older evaluator otherwise
            # (1.17) still sees an external tensor and asks for a LargeContainer.
            site.tensor.data_location = onnx.TensorProto.DEFAULT
            del site.tensor.external_data[:]
        except (onnx.checker.ValidationError, OSError, ValueError) as exc:
            # What our checks accept and onnx's loader still refuses (a symlink inside the folder), or a file
            # changed since it was validated: onnx's own exception type is no ValueError.
            raise ExternalDataError(
                f"tensor {site.label!r} ({site.where}): onnx cannot load its external data: {exc}"
            ) from exc
    if eager:
        logger.info(
            "loaded %d external tensors eagerly (graph-input defaults, attributes or sparse tensors): %s",
            len(eager),
            ", ".join(site.label for site in eager[:5]) + (", ..." if len(eager) > 5 else ""),
        )
    new_ops = [
        DelayedInitializer.bind(folder, allow_outside_folder=allow_outside_folder),
        *(kwargs.pop("new_ops", None) or []),
    ]
    return ReferenceEvaluator(converted, new_ops=new_ops, **kwargs)
