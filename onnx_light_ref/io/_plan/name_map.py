"""The name map of ``link``: which checkpoint key each model tensor links to, checked before anything is written.

``link_external_data(..., name_map={model tensor name: checkpoint key})`` (``link --map NAMES.json``) links a tensor
to the key its name maps to, and every other tensor to the key of its own name. A map that does not say what its
author meant changes what the linked model computes without a word, so it is refused, all its problems listed in one
message:

* a key naming no tensor of the model (a typo: the tensor it meant is then linked by its own name, or not at all);
* a value naming no key of the checkpoint (the tensor would be silently written instead of linked);
* two model tensors sent to one checkpoint key, through the map or a mapped one and another by its own name (both
  would read the same bytes: at least one of them computes with another tensor's weights);
* a tensor sent to another key while its own name is a key of the checkpoint too (a swap ``{"a": "b", "b": "a"}``):
  every reader checks a reference against the key of its tensor's name
  (:func:`~onnx_light_ref.io._read.safetensors_refs.check_reference`: from the files alone it is a checkpoint
  re-saved with its tensors moved), so the linked model would be refused by all of them.

:func:`parse_name_map` reads the JSON text of a map file as untrusted input: UTF-8, one flat object of strings, no
repeated name (``json`` would keep the last one silently), no nesting (a deep one is refused, never a
``RecursionError``). Pure: this module never opens a file.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from onnx_light_ref.io._arguments import ArgumentTypeError
from onnx_light_ref.io._read.strict_json import RepeatedKeyError, loads_strict
from onnx_light_ref.io._read.walker import TensorSite

MAX_NAME_MAP_SIZE = 64 * 1024 * 1024
"""Largest map file read (64 MiB): a name map holds names only, a larger file is not one."""

_LISTED = 20  # problems listed in one message; the rest are counted


def check_name_map(name_map: Mapping[str, str] | None) -> dict[str, str]:
    """The map as a plain dict (empty for None), or raise.

    Raises:
        ArgumentTypeError: not a mapping of ``str`` to non-empty ``str`` (also a ``TypeError`` and a ``ValueError``).
    """
    if name_map is None:
        return {}
    if not isinstance(name_map, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in name_map.items()
    ):
        raise ArgumentTypeError("name_map must map model tensor names (str) to checkpoint keys (non-empty str).")
    return dict(name_map)


def parse_name_map(text: bytes, source: str) -> dict[str, str]:
    """Parse a map file's bytes: one JSON object of model tensor name -> checkpoint key.

    Args:
        text: the file's content.
        source: what the file is, for messages (e.g. ``"--map 'names.json'"``).

    Returns:
        The map.

    Raises:
        ValueError: larger than :data:`MAX_NAME_MAP_SIZE`, not UTF-8 JSON, nested too deeply, a repeated name, not
            an object of non-empty strings.
    """
    if len(text) > MAX_NAME_MAP_SIZE:
        raise ValueError(f"{source} is larger than {MAX_NAME_MAP_SIZE} bytes; a name map holds names only.")
    try:
        names = loads_strict(text)
    except RepeatedKeyError as exc:
        raise ValueError(
            f"{source} repeats the model tensor name {exc.key!r}; each tensor maps to one checkpoint key."
        ) from None
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ValueError(
            f"{source} is not UTF-8 JSON ({exc}); a name map is one flat JSON object of strings."
        ) from None
    if not isinstance(names, dict) or not all(isinstance(v, str) and v for v in names.values()):
        raise ValueError(
            f"{source} must be one JSON object mapping model tensor names to checkpoint keys (non-empty strings)."
        )
    return names


def check_name_map_targets(
    name_map: Mapping[str, str], sites: Iterable[TensorSite], checkpoint_keys: Collection[str]
) -> None:
    """Refuse a map whose names or keys do not exist, that sends two model tensors to one checkpoint key, or that
    sends a tensor away from the key of its own name.

    Args:
        name_map: model tensor name -> checkpoint key (already through :func:`check_name_map`).
        sites: the model's tensor sites; sparse ones are skipped, as ``link`` never links them.
        checkpoint_keys: every key of the checkpoint.

    Raises:
        ValueError: listing every name the model lacks, every key the checkpoint lacks, every key several model
            tensors would read and every tensor mapped away from a key of its own name; nothing has been written.
    """
    if not name_map:
        return
    readers: dict[str, list[tuple[str, bool]]] = {}  # checkpoint key -> (label, through the map) of each tensor
    names: set[str] = set()
    for site in sites:
        if site.sparse is not None:
            continue
        name = site.tensor.name if isinstance(site.tensor.name, str) else ""
        names.add(name)
        key = name_map.get(name, name)
        if key in checkpoint_keys:
            readers.setdefault(key, []).append((site.label, name in name_map))
    problems = [f"{name!r} names no tensor of the model" for name in name_map if name not in names]
    problems += [
        f"{name!r} -> {key!r}: the checkpoint has no key {key!r}"
        for name, key in name_map.items()
        if name in names and key not in checkpoint_keys
    ]
    problems += [_shared(key, tensors) for key, tensors in readers.items() if len(tensors) > 1 and _mapped(tensors)]
    problems += [
        f"{name!r} -> {key!r}: the checkpoint also has a key {name!r}, and every reader checks a tensor against the "
        f"key of its own name (the linked model would be refused as a re-saved checkpoint); rename the tensor first"
        for name, key in name_map.items()
        if name in names and key != name and key in checkpoint_keys and name in checkpoint_keys
    ]
    if problems:
        shown = "; ".join(problems[:_LISTED])
        more = f"; and {len(problems) - _LISTED} more" if len(problems) > _LISTED else ""
        raise ValueError(
            f"the name map does not fit the model and the checkpoint: {shown}{more}. Its names are model tensor "
            "names, its values checkpoint keys, and each key may be read by one model tensor. Nothing written."
        )


def _mapped(tensors: Sequence[tuple[str, bool]]) -> bool:
    return any(through_map for _, through_map in tensors)


def _shared(key: str, tensors: Sequence[tuple[str, bool]]) -> str:
    listed = ", ".join(f"{label!r} ({'mapped' if mapped else 'by its own name'})" for label, mapped in tensors[:4])
    more = f" and {len(tensors) - 4} more" if len(tensors) > 4 else ""
    return f"checkpoint key {key!r} would be read by {len(tensors)} model tensors: {listed}{more}"
