"""External-data tools: re-align weights without loading them, save variants that share weights, verify rewrites.

The folders are the stages of every writer's pipeline (data flows one way, no module imports a later stage):

* ``read/``: what a model names, opened safely through the held folder, parsed without its weights;
* ``plan/``: where each byte goes (alignment, thresholds, shards, dedup, safetensors layout, file names);
* ``write/``: the checks on destinations, the copy engine and the publisher (one transaction for every output).

On top, the public functions: the writers ``align`` (re-align, streaming or in memory), ``align_models`` (a
family of models over one set of weights files), ``shared_save`` (a variant
writing only its new weights), ``link`` (point a model at a safetensors checkpoint's bytes), the readers ``verify``
(two models hold the same tensors), ``verify_checkpoint`` (a model holds a checkpoint's tensors) and
``layout_report`` (``inspect``), what they return (``results``), and the two
modules every stage shares: ``arguments`` (argument types and checks) and ``posix`` (exact positional reads and
writes, the checks made on an open file).

Nothing here imports ``onnx_light_ref.ops``.

The public functions are imported lazily (on first use of the name): importing a submodule such as
``onnx_light_ref.io._arguments`` runs this file first, and must not import every writer, onnx and numpy with it (the
command line's option parsing uses the argument checks; ``inspect`` needs none of the writers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnx_light_ref._lazy import lazy_attributes

__all__ = [
    "AlignResult",
    "CheckpointVerifyResult",
    "ChecksumMismatch",
    "Difference",
    "FamilyResult",
    "LinkResult",
    "SaveResult",
    "TensorRef",
    "VerifyResult",
    "align_external_data_in_memory",
    "align_external_data_streaming",
    "align_models",
    "link_external_data",
    "save_model_with_shared_external_data",
    "verify_checkpoint",
    "verify_models",
]

_LAZY = {
    "ChecksumMismatch": "onnx_light_ref.io._differences",
    "Difference": "onnx_light_ref.io._differences",
    "TensorRef": "onnx_light_ref.io._differences",
    "AlignResult": "onnx_light_ref.io._results",
    "FamilyResult": "onnx_light_ref.io._results",
    "LinkResult": "onnx_light_ref.io._results",
    "SaveResult": "onnx_light_ref.io._results",
    "VerifyResult": "onnx_light_ref.io._verify",
    "CheckpointVerifyResult": "onnx_light_ref.io._verify_checkpoint",
    "verify_checkpoint": "onnx_light_ref.io._verify_checkpoint",
    "align_external_data_in_memory": "onnx_light_ref.io._align",
    "align_external_data_streaming": "onnx_light_ref.io._align",
    "align_models": "onnx_light_ref.io._align_models",
    "link_external_data": "onnx_light_ref.io._link",
    "save_model_with_shared_external_data": "onnx_light_ref.io._shared_save",
    "verify_models": "onnx_light_ref.io._verify",
}

if TYPE_CHECKING:
    from onnx_light_ref.io._align import align_external_data_in_memory, align_external_data_streaming
    from onnx_light_ref.io._align_models import align_models
    from onnx_light_ref.io._differences import ChecksumMismatch, Difference, TensorRef
    from onnx_light_ref.io._link import link_external_data
    from onnx_light_ref.io._results import AlignResult, FamilyResult, LinkResult, SaveResult
    from onnx_light_ref.io._shared_save import save_model_with_shared_external_data
    from onnx_light_ref.io._verify import VerifyResult, verify_models
    from onnx_light_ref.io._verify_checkpoint import CheckpointVerifyResult, verify_checkpoint


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
