"""External-data tools: re-align weights without loading them, save variants that share weights, verify rewrites.

Modules, one concept each:

* the public writers: ``align`` (re-align into one weights file, streaming or in memory), ``shared_save`` (save a
  variant writing only its new weights), ``link`` (point a model at a safetensors checkpoint's bytes), and what they
  return, ``results`` (``AlignResult``, ``SaveResult``, ``LinkResult``);
* formats: ``safetensors_header`` (write and parse safetensors headers), ``safetensors_layout`` (keys, dtypes and
  order of tensors in safetensors files), ``shard_names`` (ours, Hugging Face's and transformers.js's file names);
* reading models: ``model_file`` (metadata-only parsing), ``wire`` (parsing without inline payloads), ``walker``
  (every tensor of a model), ``entries`` (the one reader and writer of ``external_data`` entries), ``locations``
  (safe resolution and validation of external references), ``layout_report`` (how a model's weights are laid out),
  ``loader_rule`` (which of onnx.load, check_model and onnxruntime refuses a reference, and why), ``sharing``
  (which models of a folder use which weights files: the guard before replacing one), ``verify`` (two models hold
  the same tensors);
* laying out: ``alignment`` (offset arithmetic), ``placement`` (alignment threshold and shards), ``dedup``
  (identical blobs stored once);
* writing: ``copy_engine`` (kernel file-to-file copies), ``writeback`` (overlap writeback with copying), ``space``
  (free space and preallocation), ``posix`` (exact positional reads and writes, hard-link check), ``destinations``
  (where outputs land: inside the folder, through no symlink, never a source), ``publish`` (one transaction for
  every output: temp files, fsync, name exchanges with the ``.onnx`` as the commit point, rollback);
* ``arguments``: the argument types and checks every public function shares.

Nothing here imports ``onnx_light_ref.ops``.
"""

from __future__ import annotations

from onnx_light_ref.io.align import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io.link import link_external_data
from onnx_light_ref.io.results import AlignResult, LinkResult, SaveResult
from onnx_light_ref.io.shared_save import save_model_with_shared_external_data
from onnx_light_ref.io.verify import VerifyResult, verify_models

__all__ = [
    "AlignResult",
    "LinkResult",
    "SaveResult",
    "VerifyResult",
    "align_external_data_in_memory",
    "align_external_data_streaming",
    "link_external_data",
    "save_model_with_shared_external_data",
    "verify_models",
]
