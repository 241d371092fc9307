"""transformers.js's ``use_external_data_format``: the count a model needs, and a ``config.json`` updated with it.

transformers.js (3.x, 4.x: ``utils/model_registry``/``models.js``) reads ``config.json``'s
``transformers.js_config.use_external_data_format`` to know how many external data files to fetch for a model file
``NAME.onnx``: a number (``true`` is 1) for every model of the repository, or an object giving it per file name
(``{"model.onnx": 3}``; the file name without ``.onnx`` is looked up too). It then fetches ``NAME.onnx_data``,
``NAME.onnx_data_1``, ... ``NAME.onnx_data_{N-1}`` from the model's folder (at most 100) and, in a browser, hands
them to onnxruntime-web under those names: a model loads by count only when its weights files are exactly those.

:func:`chunk_count` says which count a written model needs (None when its files are not so named: nothing
transformers.js can load by count). :func:`plan_config_update` reads the ``config.json`` the caller named and returns
its new content as a :class:`~onnx_light_ref.io._write.contract.PlannedFile` of the writer's plan, so that the model,
its weights and the config are published as one transaction, plus a source check re-reading it under the folder
lock. The entry is written per file name, the one form that changes no other model's count:

* no entry yet: ``{"NAME.onnx": N}``; an object: its ``NAME.onnx`` key set (kept in place, or added last);
* a number or ``true``/``false`` (every model's count): left as it is when it already means N for this model; else
  it becomes an object giving every other ``.onnx`` of the model's folder the old value and ``NAME.onnx`` N.

Every other key of the file keeps its place and its value (numbers as the doubles JSON readers see); the file is
written back with its indentation (2 when none is found), UTF-8, a final newline. Refused (``ConfigFileError``,
nothing written): a missing file, one that is not UTF-8 JSON, has a key twice, is not an object, or whose
``transformers.js_config`` or entry has another type. This module reads the config and lists the model's folder;
it never writes (the executor does).
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from onnx_light_ref.errors import ConfigFileError
from onnx_light_ref.io._plan.shard_names import TRANSFORMERS_JS_MAX_CHUNKS
from onnx_light_ref.io._read.locations import FileIdentity
from onnx_light_ref.io._read.sharing import file_key
from onnx_light_ref.io._write.contract import PlannedFile

SECTION = "transformers.js_config"
ENTRY = "use_external_data_format"
_MAX_CONFIG_SIZE = 16 * 1024 * 1024  # a config.json is a few KB: a larger file is not one
_DEFAULT_INDENT = 2  # what transformers' save_pretrained writes


def chunk_names(model_path: str, count: int) -> list[str]:
    """The files transformers.js fetches for ``model_path`` with a count of ``count``: ``NAME.onnx_data``,
    ``NAME.onnx_data_1``, ... beside it (absolute paths)."""
    base = os.path.abspath(model_path) + "_data"
    return [base if index == 0 else f"{base}_{index}" for index in range(count)]


def chunk_count(model_path: str, weights_files: Sequence[str]) -> int | None:
    """The ``use_external_data_format`` value transformers.js needs for the model written at ``model_path``.

    Args:
        model_path: the ``.onnx`` written.
        weights_files: every weights file it references, in shard order.

    Returns:
        0 when it has none; their number when they are exactly :func:`chunk_names` (at most 100); else None (its
        weights are named otherwise: transformers.js cannot load them by count).
    """
    wanted = chunk_names(model_path, len(weights_files))
    found = [os.path.abspath(path) for path in weights_files]
    if found != wanted or len(found) > TRANSFORMERS_JS_MAX_CHUNKS:
        return None
    return len(found)


def model_counts(models: Sequence[tuple[str, Sequence[str]]], writer: str, hint: str) -> dict[str, int]:
    """Each written model's count by file name (:func:`chunk_count`), for ``update_config``.

    Args:
        models: each model written and the weights files it references.
        writer: the writer's name, for messages.
        hint: what the caller can do instead, for the message.

    Raises:
        ValueError: a model's weights are not named as transformers.js fetches them (nothing was written).
    """
    counts = {}
    for model, files in models:
        count = chunk_count(model, files)
        if count is None:
            wanted = ", ".join(repr(os.path.basename(name)) for name in chunk_names(model, min(len(files), 2)))
            found = ", ".join(repr(os.path.basename(name)) for name in files[:2])
            raise ValueError(
                f"{writer}: update_config: transformers.js fetches the external data of {os.path.basename(model)!r} "
                f"from files named after it beside it ({wanted}...), but it references {found}...: transformers.js "
                f"could not load it by count; {hint}; nothing was written."
            )
        counts[os.path.basename(model)] = count
    return counts


@dataclass(frozen=True, slots=True)
class ConfigUpdate:
    """A ``config.json``'s new content as a planned file, the check that it is still the file read, and the value
    now stored under ``use_external_data_format``."""

    planned: PlannedFile
    check: Callable[[], None]
    value: object


def plan_config_update(config_path: str, counts: Mapping[str, int], model_folder: str, writer: str) -> ConfigUpdate:
    """Read ``config_path`` and plan it with ``counts`` (model file name -> count) written into
    ``transformers.js_config.use_external_data_format`` (module docstring).

    Args:
        config_path: the ``config.json`` to update (it must exist).
        counts: the count of each written model, by its file name (``{"model.onnx": 3}``).
        model_folder: the models' folder (the other ``.onnx`` files there keep a replaced number's value).
        writer: the writer's name, for messages.

    Returns:
        The planned file (its identity recorded: rule 3 lets the writer replace that very file) and a source check
        re-reading it under the folder lock.

    Raises:
        FileNotFoundError: ``config_path`` does not exist.
        ConfigFileError: the file is not a UTF-8 JSON object (or too large to be a config), has a key twice, or
            holds a ``transformers.js_config`` or an entry of another type.
    """
    path = os.path.abspath(config_path)
    original = _read(path, writer)
    identity = file_key(path)
    config = _parse(original, path, writer)
    section = config.setdefault(SECTION, {})
    if not isinstance(section, dict):
        raise ConfigFileError(
            f"{writer}: {path!r}: {SECTION!r} is a JSON {_kind(section)}, not an object; transformers.js reads its "
            "options from an object; nothing was written."
        )
    section[ENTRY] = _entry(section.get(ENTRY), counts, model_folder, path, writer)
    data = (json.dumps(config, indent=_indent(original), ensure_ascii=False) + "\n").encode("utf-8")

    def unchanged() -> None:
        if _read(path, writer) != original or file_key(path) != identity:
            raise ConfigFileError(
                f"{writer}: {path!r} changed while this run worked; run it again to update the new version; "
                "nothing was written."
            )

    planned = PlannedFile(path, "data", len(data), writes=[(0, data)], format="json", replaces=_identity(identity))
    return ConfigUpdate(planned, unchanged, section[ENTRY])


def _identity(key: object) -> FileIdentity | None:
    return key if isinstance(key, FileIdentity) else None


def _read(path: str, writer: str) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_CONFIG_SIZE + 1)
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT,
            f"{writer}: the config to update {path!r} does not exist (transformers.js reads the model's config.json: "
            "point at it); nothing was written",
            path,
        ) from None
    except IsADirectoryError:
        raise ConfigFileError(
            f"{writer}: the config to update {path!r} is a folder, not a file; nothing was written."
        ) from None
    if len(data) > _MAX_CONFIG_SIZE:
        raise ConfigFileError(
            f"{writer}: {path!r} is larger than {_MAX_CONFIG_SIZE:,} bytes: not a config.json; nothing was written."
        )
    return data


def _parse(data: bytes, path: str, writer: str) -> dict[str, object]:
    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        found: dict[str, object] = {}
        for key, value in pairs:
            if key in found:
                raise ConfigFileError(
                    f"{writer}: {path!r} has the key {key!r} twice in one object (readers keep either one); fix it "
                    "first; nothing was written."
                )
            found[key] = value
        return found

    try:
        config = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates)
    except UnicodeDecodeError as exc:
        raise ConfigFileError(
            f"{writer}: {path!r} is not UTF-8 text (byte {exc.start}): not a config.json; nothing was written."
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigFileError(
            f"{writer}: {path!r} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); nothing was written."
        ) from None
    if not isinstance(config, dict):
        raise ConfigFileError(
            f"{writer}: {path!r} is a JSON {_kind(config)}, not an object: transformers.js reads a config.json "
            "object; nothing was written."
        )
    return config


def _entry(current: object, counts: Mapping[str, int], folder: str, path: str, writer: str) -> object:
    """``use_external_data_format``'s new value (module docstring)."""
    if current is None:
        return dict(counts)
    if isinstance(current, dict):
        current.update(counts)  # an existing key keeps its place
        return current
    if isinstance(current, (bool, int, float)):
        if all(count == current for count in counts.values()):
            return current  # already exact for these models, and the others keep it
        others = sorted(name for name in _onnx_files(folder) if name not in counts)
        return {**dict.fromkeys(others, current), **counts}
    raise ConfigFileError(
        f"{writer}: {path!r}: {SECTION}.{ENTRY} is a JSON {_kind(current)}; transformers.js reads a number, "
        "true/false or an object of them; fix it first; nothing was written."
    )


def _onnx_files(folder: str) -> list[str]:
    try:
        return [name for name in os.listdir(folder) if name.lower().endswith(".onnx")]
    except OSError:
        return []


def _indent(data: bytes) -> int:
    """The indentation of the file's first nested line (2 when it has none)."""
    found = re.search(rb"\n( +)\S", data)
    return len(found.group(1)) if found is not None and len(found.group(1)) <= 8 else _DEFAULT_INDENT


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "object"
