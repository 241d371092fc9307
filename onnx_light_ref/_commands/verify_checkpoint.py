"""``onnx-light-ref verify MODEL.onnx CHECKPOINT``: prove that a model holds a safetensors checkpoint's tensors.

``verify`` takes this path when its second argument is a ``.safetensors`` file, a ``*.safetensors.index.json`` or a
folder: a thin front end of :func:`onnx_light_ref.io._verify_checkpoint.verify_checkpoint`. Text: one ``different:``
line per key paired by name whose bytes differ, one ``missing:`` line per key the model lacks, one ``extra:`` line per
model weight the checkpoint lacks, then the verdict (``holds: ...``, exit 0, or ``incomplete: ...``, exit 1).
``--json`` prints the ``checkpoint`` document of ``verify-1.json`` instead (``docs/json.md``). Never writes a file.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from onnx_light_ref._commands.errors import error_exit
from onnx_light_ref._commands.json_output import SCHEMA_VERSIONS
from onnx_light_ref._commands.text import printable

if TYPE_CHECKING:
    from onnx_light_ref.io._verify_checkpoint import CheckpointVerifyResult

_HOW = (("name", "by name"), ("map", "through the map"), ("content", "by content"), ("transpose", "as transposes"))
_MODEL_ONLY = (
    ("by_name", "--by-name"),
    ("check_checksums", "--check-checksums"),
    ("allow_hard_links", "--allow-hard-links"),
)


def is_checkpoint(path: str) -> bool:
    """Whether ``verify``'s second argument names a checkpoint rather than a model."""
    return path.endswith((".safetensors", ".json")) or os.path.isdir(path)


def verify_checkpoint_command(args: argparse.Namespace) -> int:
    """Run ``verify MODEL.onnx CHECKPOINT``; return the exit status."""
    from onnx_light_ref.io._verify_checkpoint import verify_checkpoint

    try:
        for option, flag in _MODEL_ONLY:
            if getattr(args, option, False):
                raise ValueError(f"{flag} compares two models; it does not apply to a checkpoint ({args.b!r}).")
        name_map = _read_map(args.map) if args.map is not None else None
        result = verify_checkpoint(
            args.a,
            args.b,
            name_map=name_map,
            chunk_size=args.chunk_size,
            allow_outside_folder=args.allow_outside_folder,
        )
    except (ValueError, OSError) as exc:
        if args.json:
            from onnx_light_ref._commands.json_output import error_document, write_document

            write_document(error_document("verify", exc))
        return error_exit(exc)
    if args.json:
        from onnx_light_ref._commands.json_output import write_document

        write_document(checkpoint_document(result, args.a, args.b, chunk_size=args.chunk_size))
    else:
        print("\n".join(printable(line) for line in checkpoint_lines(result)))
    return 0 if result.holds else 1


def _read_map(path: str) -> dict[str, str]:
    from onnx_light_ref.io._plan.name_map import MAX_NAME_MAP_SIZE, parse_name_map

    with open(path, "rb") as file:
        return parse_name_map(file.read(MAX_NAME_MAP_SIZE + 1), f"--map {path!r}")


def checkpoint_lines(result: CheckpointVerifyResult) -> list[str]:
    """The text ``verify`` prints for a checkpoint (escaped by the caller)."""
    lines = [
        f"different: model tensor {p.name!r} and checkpoint key {p.key!r} have the same name, data type and shape but "
        "other bytes"
        for p in result.differing
    ]
    lines += [f"missing: checkpoint key {key!r}: no model tensor holds its values" for key in result.missing_keys]
    lines += [f"extra: model weight {name!r} is not in the checkpoint" for name in result.extra_weights]
    if result.holds:
        counts: Counter[str] = Counter(p.how for p in result.pairings)
        how = ", ".join(f"{counts[kind]} {words}" for kind, words in _HOW if counts[kind])
        lines.append(f"holds: the model holds all {result.checkpoint_keys} checkpoint tensors ({how})")
    else:
        lacking = len(result.missing_keys) + len(result.differing)
        lines.append(f"incomplete: the model lacks {lacking} of the {result.checkpoint_keys} checkpoint tensors")
    return lines


def checkpoint_document(
    result: CheckpointVerifyResult, model_path: str, checkpoint_path: str, *, chunk_size: int
) -> dict[str, Any]:
    """The ``verify --json MODEL.onnx CHECKPOINT`` document (``kind``: ``checkpoint``)."""
    return {
        "schema_version": SCHEMA_VERSIONS["verify"],
        "command": "verify",
        "kind": "checkpoint",
        "ok": result.holds,
        "status": "holds" if result.holds else "incomplete",
        "model": {"path": os.path.abspath(model_path), "tensors": result.model_tensors},
        "checkpoint": {
            "path": os.path.abspath(checkpoint_path),
            "keys": result.checkpoint_keys,
            "files": list(result.checkpoint_files),
        },
        "chunk_size": chunk_size,
        "pairings": [_pairing(p) for p in result.pairings],
        "missing_keys": list(result.missing_keys),
        "differing": [_pairing(p) for p in result.differing],
        "extra_weights": list(result.extra_weights),
    }


def _pairing(pairing: Any) -> dict[str, Any]:
    return {"name": pairing.name, "key": pairing.key, "how": pairing.how}
