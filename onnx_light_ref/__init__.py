"""onnx_light_ref: ``ai.rt::DelayedInitializer`` for onnx's reference evaluator, and external-data tools.

Public API (names are stable)::

    from onnx_light_ref import (
        DelayedInitializer,                    # OpRun subclass, op_domain "ai.rt"
        register_schemas,                      # registers ai.rt::DelayedInitializer v1 (idempotent)
        align_external_data_streaming,         # re-align external weights, memory bounded by one chunk
        align_external_data_in_memory,         # same output, reads every weight into memory (the oracle)
        align_models,                          # a family of models over one set of weights, each payload once
        FamilyResult,                          # what align_models returns: an int (the size) with the facts
        save_model_with_shared_external_data,  # save a variant writing only its new weights
        AlignResult,                           # what the aligners return: an int (the size) with the facts
        SaveResult,                            # what the shared saver returns: an int (the size) with the facts
        verify_models,                         # prove two models hold the same tensors (streamed)
        verify_checkpoint,                     # prove a model holds a safetensors checkpoint's tensors (streamed)
        link_external_data,                    # point a model at a safetensors checkpoint's bytes (none copied)
        LinkResult,                            # what link_external_data returns
        reference_evaluator,                   # onnx's ReferenceEvaluator, external weights read lazily
        delay_initializers,                    # external initializers -> DelayedInitializer nodes (no byte read)
        undelay_initializers,                  # DelayedInitializer nodes -> standard external initializers
    )

Everything a user calls is importable from here; the submodules (``onnx_light_ref.io``, ``onnx_light_ref.ops``)
hold the same objects, and the documentation always imports from ``onnx_light_ref``. Each public function's and
class's docstring ends with an ``Example:`` that runs as written in the folder ``onnx-light-ref demo --size 1M --keep
demo`` writes; the words the docstrings share (the writer contract, what a destination owns, a tensor kept inline)
are defined in ``docs/safety.md#glossary``.

Attributes are imported lazily: ``import onnx_light_ref`` alone does not import ``onnx.reference`` (slow, and
irrelevant to the io functions), and importing the io functions does not register any schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnx_light_ref._lazy import lazy_attributes

__version__ = "0.1.0"

__all__ = [
    "AlignResult",
    "DelayedInitializer",
    "FamilyResult",
    "LinkResult",
    "SaveResult",
    "__version__",
    "align_external_data_in_memory",
    "align_external_data_streaming",
    "align_models",
    "delay_initializers",
    "link_external_data",
    "reference_evaluator",
    "register_schemas",
    "save_model_with_shared_external_data",
    "undelay_initializers",
    "verify_checkpoint",
    "verify_models",
]

_LAZY = {
    "DelayedInitializer": "onnx_light_ref.ops",
    "register_schemas": "onnx_light_ref.ops",
    "delay_initializers": "onnx_light_ref.ops",
    "undelay_initializers": "onnx_light_ref.ops",
    "reference_evaluator": "onnx_light_ref.ops",
    "align_external_data_streaming": "onnx_light_ref.io",
    "align_external_data_in_memory": "onnx_light_ref.io",
    "align_models": "onnx_light_ref.io._align_models",
    "FamilyResult": "onnx_light_ref.io._results",
    "save_model_with_shared_external_data": "onnx_light_ref.io",
    "AlignResult": "onnx_light_ref.io._results",
    "SaveResult": "onnx_light_ref.io._results",
    "LinkResult": "onnx_light_ref.io._results",
    "link_external_data": "onnx_light_ref.io",
    "verify_models": "onnx_light_ref.io",
    "verify_checkpoint": "onnx_light_ref.io",
}

if TYPE_CHECKING:
    from onnx_light_ref.io import (
        AlignResult,
        FamilyResult,
        LinkResult,
        SaveResult,
        align_external_data_in_memory,
        align_external_data_streaming,
        align_models,
        link_external_data,
        save_model_with_shared_external_data,
        verify_checkpoint,
        verify_models,
    )
    from onnx_light_ref.ops import (
        DelayedInitializer,
        delay_initializers,
        reference_evaluator,
        register_schemas,
        undelay_initializers,
    )


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
