"""External-data tools: re-align weights without loading them, and save variants that share weights.

Modules, one concept each: ``walker`` (every tensor of a model), ``locations`` (safe resolution and validation of
external references), ``alignment`` (offset arithmetic), ``copy_engine`` (kernel file-to-file copies),
``publish`` (atomic output), ``model_file`` (metadata-only parsing), ``align`` and ``shared_save`` (the public
functions). Nothing here imports ``onnx_light_ref.ops``.
"""

from __future__ import annotations

from onnx_light_ref.io.align import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io.shared_save import save_model_with_shared_external_data

__all__ = [
    "align_external_data_in_memory",
    "align_external_data_streaming",
    "save_model_with_shared_external_data",
]
