"""Prove that a model holds a safetensors checkpoint's tensors: the check to run after every export.

:func:`verify_checkpoint` pairs every checkpoint key with a model tensor (by name, through a name map, by content, or
as a 2-D transpose: :mod:`~onnx_light_ref.io._checkpoint_pairing`), compares the bytes of every pairing (a tensor that
points at the key's very bytes, a linked one, is equal without being read), and lists every key no model tensor
holds, every pairing by name whose bytes differ, and every model weight (a floating-point initializer) the checkpoint
lacks. Streaming: two ``chunk_size`` buffers, nothing loaded whole; nothing is written.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from onnx_light_ref.io._arguments import PathLike, check_bool, check_int
from onnx_light_ref.io._checkpoint_pairing import checkpoint_tensors_bytes, model_tensors, pair_with_checkpoint
from onnx_light_ref.io._link import read_checkpoint
from onnx_light_ref.io._pairing import TensorBytes, TensorFiles, equal_bytes, pair_by_content
from onnx_light_ref.io._plan.name_map import check_name_map, check_name_map_targets
from onnx_light_ref.io._read.folder import ModelFolder
from onnx_light_ref.io._read.locations import LocationResolver
from onnx_light_ref.io._read.model_file import load_model_metadata, open_model_folder
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.io._results import TensorPairing

_FLOATS = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.DOUBLE,
    *(getattr(onnx.TensorProto, name) for name in ("FLOAT8E4M3FN", "FLOAT8E5M2") if hasattr(onnx.TensorProto, name)),
}


@dataclass(frozen=True, slots=True)
class CheckpointVerifyResult:
    """What :func:`~onnx_light_ref.verify_checkpoint` found: the verdict, every pairing, and what the model lacks.

    Attributes:
        holds: every checkpoint key is held by a model tensor with equal bytes (a transpose: equal once transposed).
        pairings: one per key held (model tensor ``name``, checkpoint ``key``, ``how``: ``"name"``, ``"map"``,
            ``"content"`` or ``"transpose"``), model order then key order.
        missing_keys: keys no model tensor holds.
        differing: pairings by name or map whose bytes differ.
        extra_weights: floating-point initializers of the model paired with no key (rotary tables and masks the
            exporter computed, or weights the checkpoint lacks).
        checkpoint_keys: the number of the checkpoint's keys.
        checkpoint_files: the checkpoint's files (absolute paths).
        model_tensors: the number of the model's tensors.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, with a safetensors copy of the weights
        as the checkpoint:

        >>> from onnx_light_ref import align_external_data_streaming, verify_checkpoint
        >>> _ = align_external_data_streaming("model.onnx", "checkpoint.onnx", weights_format="safetensors")
        >>> result = verify_checkpoint("new_head.onnx", "checkpoint.safetensors")
        >>> result.holds, result.differing
        (False, (TensorPairing(name='head.weight', key='head.weight', how='name'),
                 TensorPairing(name='head.bias', key='head.bias', how='name')))
        >>> result.checkpoint_keys, result.model_tensors, result.missing_keys
        (8, 9, ())
    """

    holds: bool
    pairings: tuple[TensorPairing, ...]
    missing_keys: tuple[str, ...]
    differing: tuple[TensorPairing, ...]
    extra_weights: tuple[str, ...]
    checkpoint_keys: int
    checkpoint_files: tuple[str, ...]
    model_tensors: int


def find_checkpoint(path: PathLike) -> str:
    """The checkpoint a path names: a ``.safetensors`` file, a ``*.safetensors.index.json``, or a folder holding one
    index or else exactly one ``.safetensors`` file.

    Raises:
        FileNotFoundError: nothing there, or a folder with no checkpoint.
        ValueError: a folder with several indexes, or several ``.safetensors`` files and no index.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"checkpoint not found: {path!r}")
        return path
    names = sorted(os.listdir(path))
    indexes = [name for name in names if name.endswith(".safetensors.index.json")]
    files = [name for name in names if name.endswith(".safetensors")]
    found = indexes or files
    if len(found) == 1:
        return os.path.join(path, found[0])
    if not found:
        raise FileNotFoundError(f"no .safetensors file or .safetensors.index.json in {path!r}")
    raise ValueError(f"{path!r} holds several checkpoints ({', '.join(found)}); name the file to verify against.")


def verify_checkpoint(
    model_onnx_path: PathLike,
    checkpoint: PathLike,
    *,
    name_map: Mapping[str, str] | None = None,
    chunk_size: int = 4 * 1024 * 1024,
    allow_outside_folder: bool = False,
) -> CheckpointVerifyResult:
    """Prove that a model holds every tensor of a safetensors checkpoint, and list what it lacks.

    Each checkpoint key is paired with a model tensor by name (same data type and shape), through ``name_map``, by
    content (a streaming hash, then a byte comparison), or as a 2-D transpose (an export with torch's
    ``optimize=True`` stores Linear weights pre-transposed); a key whose values several model tensors share, or one
    the exporter stored once for several keys (tied or equal weights), is held by any tensor of equal bytes. Every
    pairing's bytes are compared, streamed ``chunk_size`` at a time; a tensor that points at the key's own bytes
    (``link``) is equal without being read. The checkpoint is read where it is (its folder opened once, its headers
    parsed as hostile input); it need not sit beside the model.

    Args:
        model_onnx_path: the ``.onnx`` (external data resolved from its folder, as every reader does).
        checkpoint: a ``.safetensors`` file, a sharded set's ``*.safetensors.index.json``, or a folder holding
            one (its index, else its only ``.safetensors`` file).
        name_map: model tensor name -> checkpoint key, for names that differ (checked like ``link``'s).
        chunk_size: bytes read per system call; the two buffers are at most this size.
        allow_outside_folder: follow symbolic links to data files and checkpoint files (the Hugging Face cache).

    Returns:
        A :class:`~onnx_light_ref.io.CheckpointVerifyResult`; ``holds`` is the verdict, ``missing_keys`` the keys
        no model tensor holds.

    Raises:
        FileNotFoundError: the model, the checkpoint or a data file is missing.
        SafetensorsError: a malformed checkpoint header or index.
        ValueError: a folder with several checkpoints, a name map that does not fit, a bad argument.
        ExternalDataError, UnsafeLocationError, InvalidModelError: the model's references or the model itself,
            as for every reader.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, with a safetensors copy of the weights in
        a folder as the checkpoint:

        >>> import os
        >>> from onnx_light_ref import align_external_data_streaming, verify_checkpoint
        >>> os.mkdir("checkpoint")
        >>> _ = align_external_data_streaming("model.onnx", "checkpoint/model.onnx", weights_format="safetensors")
        >>> result = verify_checkpoint("model.onnx", "checkpoint/")
        >>> result.holds, result.missing_keys, len(result.pairings)
        (True, (), 8)
    """
    check_int("chunk_size", chunk_size, minimum=1)
    check_bool("allow_outside_folder", allow_outside_folder)
    mapping = check_name_map(name_map)
    model_path = os.path.abspath(os.fspath(model_onnx_path))
    with contextlib.ExitStack() as held:
        model_folder = held.enter_context(open_model_folder(model_path, allow_outside_folder=allow_outside_folder))
        proto = load_model_metadata(model_path, folder=model_folder)  # the model first: its errors come first
        checkpoint_path = find_checkpoint(checkpoint)
        folder = os.path.dirname(checkpoint_path)
        checkpoint_folder = held.enter_context(ModelFolder.open(folder, allow_outside_folder=allow_outside_folder))
        files = held.enter_context(TensorFiles(chunk_size))
        found = read_checkpoint(checkpoint_path, os.path.join(folder, "model.onnx"), folder=checkpoint_folder)
        check_name_map_targets(mapping, iter_tensors(proto), found)
        sites = model_tensors(proto, LocationResolver(model_folder))
        keys = checkpoint_tensors_bytes(found, checkpoint_folder)
        model = [tensor for _, tensor in sites]
        pairing = pair_with_checkpoint(model, keys, files, name_map=mapping, by_content=True)
        by_name = {tensor.name: tensor for tensor in model}
        differing = [
            p
            for p in pairing.pairings
            if p.how in ("name", "map") and not equal_bytes(by_name[p.name], keys[p.key], files)
        ]
        equal = [p for p in pairing.pairings if p not in differing]
        shared = _shared_keys({p.key for p in equal} | {p.key for p in differing}, keys, model, files)
        paired_names = {p.name for p in pairing.pairings}
        extra = [
            site.tensor.name
            for site, tensor in sites
            if site.kind == "initializer" and site.tensor.data_type in _FLOATS and tensor.name not in paired_names
        ]
    pairings = equal + shared
    missing = sorted(set(keys) - {p.key for p in pairings} - {p.key for p in differing})
    return CheckpointVerifyResult(
        holds=not missing and not differing,
        pairings=tuple(pairings),
        missing_keys=tuple(missing),
        differing=tuple(differing),
        extra_weights=tuple(extra),
        checkpoint_keys=len(keys),
        checkpoint_files=tuple(sorted({tensor.path for tensor in found.values()})),
        model_tensors=len(model),
    )


def _shared_keys(
    held: set[str], keys: Mapping[str, TensorBytes], model: list[TensorBytes], files: TensorFiles
) -> list[TensorPairing]:
    """Keys left unpaired that a model tensor holds anyway: equal (or transposed) bytes a tensor already paired
    holds too (the exporter stored equal weights once). Found by pairing the other way round, keys to tensors."""
    left = [keys[key] for key in sorted(keys) if key not in held]
    if not left:
        return []
    tensors = {tensor.name: tensor for tensor in model}
    found = pair_by_content(left, tensors, files, taken=set(), reuse=True)
    return [TensorPairing(p.key, p.name, p.how) for p in found]
