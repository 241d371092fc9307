"""External-data tools: re-align weights without loading them, save variants that share weights, verify rewrites.

The public names are the ones below (:data:`__all__`, docs/api.md); every module here is private. The private
packages are the stages of every writer's pipeline, and data flows one way (pyproject.toml's import-linter contract,
checked by ``tests/test_layers.py``: no module imports a later stage):

* ``_read/``: what a model names, opened safely through one folder descriptor, parsed without its weights;
* ``_plan/``: where each byte goes (alignment, thresholds, shards, dedup, safetensors layout, file names, the
  destination checks, the copy ranges);
* ``_write/``: the writer contract, the copy engine and the publisher (one transaction for every output).

On top, one private module per public function (``_align``, ``_align_models``, ``_shared_save``, ``_link``,
``_verify``, ``_verify_checkpoint``), ``_layout_report`` (``inspect``), what they return (``_results``,
``_differences``), and below every stage ``_pread_worker`` (one helper thread for a positional read: ``verify``
reads A and B at once) over the shared base: ``_arguments`` (argument checks) and ``_posix`` (exact positional reads
and writes). Nothing here imports ``onnx_light_ref.ops``.

The public functions are imported lazily (on first use of the name): importing ``onnx_light_ref.io._arguments`` runs
this file first, and must not import every writer, onnx and numpy with it (the command line's option parsing uses
the argument checks; ``inspect`` needs none of the writers).
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
