"""Rule 3 of the writer contract: which existing files a destination owns, and may therefore replace.

A writer may replace, without being told:

1. the destination ``.onnx`` itself, when it is an ONNX model (it parses as one) or is named like one (``*.onnx`` in
   any case): it is what the caller asked to write;
2. every file the destination ``.onnx`` now in place (its previous version) references: external data locations and
   ``ai.rt::DelayedInitializer`` filenames;
3. its own leftovers: files named after the destination model (``model.onnx.data``, ``model.onnx.data.3``,
   ``model.onnx_data_1``: the name starts with the model's file name and ``.`` or ``_``, in its folder), files named
   like shards of a weights set the previous ``.onnx`` uses (``W.3`` beside ``W`` and ``W.1``; the ``-0000i-of-0000N``
    names of another ``N``), and that set's ``.index.json``; for a set named ``*.safetensors`` (every PyTorch
    checkpoint's name) the ``-0000i-of-0000N`` shards and the index only when the previous ``.onnx`` uses an
    ``-of-`` shard of it (:func:`~onnx_light_ref.io._plan.shard_names.checkpoint_file_used`): a ``model.safetensors``
    of ours beside a user's ``model-00001-of-00002.safetensors`` does not make that checkpoint ours; and the files a
    killed publication of that set named in its journal (:func:`~onnx_light_ref.io._write.publish.journal_leftovers`:
    a family run, or a one-model run into weights not named after the model, killed after moving a weights name in
    and before any model referenced it, so that no previous ``.onnx`` can vouch for the file).

Any other existing file is someone else's (a PyTorch ``model.safetensors``, a checkpoint's index, a user's
``dataset.npy``): :mod:`~onnx_light_ref.io._write.contract` refuses to replace it unless the caller passes
``overwrite=True``. A file another model references is rule 1's (``replace_shared``), not this module's.

This module reads the destination ``.onnx`` files' metadata (the wire reader skips payloads) and lists folders; it
never writes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from onnx_light_ref.io._plan.shard_names import (
    ShardNames,
    checkpoint_file_used,
    existing_shards,
    index_path,
    is_checkpoint_set,
    is_named_after_model,
)
from onnx_light_ref.io._read.sharing import (
    FileKey,
    ModelReference,
    NotAModel,
    UnreadableModel,
    file_key,
    is_model_name,
    read_model_references,
)
from onnx_light_ref.io._write.publish import journal_leftovers


@dataclass(frozen=True, slots=True)
class ShardSet:
    """The weights set a file belongs to: its first file's path and the naming scheme of its shards."""

    base: str
    scheme: ShardNames = None
    safetensors: bool = False

    def family(self) -> frozenset[str]:
        """The set's first file and every existing file named like one of its shards (or its index)."""
        members = {os.path.normpath(self.base), os.path.normpath(index_path(self.base))}
        members.update(os.path.normpath(p) for p in existing_shards(self.base, [], self.scheme, safetensors=True))
        return frozenset(members)


ReferenceCache = dict[
    tuple[str, int, int, int, int, int], "dict[FileKey, ModelReference] | UnreadableModel | NotAModel | None"
]
"""Read references of destination models by (path, device, inode, size, mtime, ctime): a model unchanged between the
plan's check and its re-check under the lock is not read twice. An :class:`UnreadableModel` for one that cannot be
read, a :class:`NotAModel` for one protobuf refuses: either owns nothing by reference."""


class Ownership:
    """What the destination models of one plan own now (read when first needed: build a new one to see changes).

    Args:
        models: the destination ``.onnx`` paths (absolute).
        cache: parsed references to reuse for models unchanged since they were parsed (filled here).
    """

    def __init__(self, models: Sequence[str], cache: ReferenceCache | None = None) -> None:
        self.models = [os.path.normpath(os.path.abspath(path)) for path in models]
        self._cache: ReferenceCache = cache if cache is not None else {}
        self._previous: dict[str, dict[FileKey, ModelReference] | None] = {}
        self._families: dict[ShardSet, frozenset[str]] = {}
        self._journals: dict[str, frozenset[str]] = {}

    def is_model(self, path: str) -> bool:
        """Whether the destination ``.onnx`` at ``path`` is an ONNX model now (it parses as one)."""
        return self._references(os.path.normpath(os.path.abspath(path))) is not None

    def unreadable(self) -> list[UnreadableModel | NotAModel]:
        """The destination ``.onnx`` files that exist but cannot be read as models, or are none (they own nothing by
        reference), for the messages."""
        return [
            read for model in self.models if isinstance(read := self._read_cached(model), (UnreadableModel, NotAModel))
        ]

    def owns_model(self, path: str) -> bool:
        """Rule 3.1: the destination ``.onnx`` may be replaced (absent, named like a model, or a model)."""
        absolute = os.path.normpath(os.path.abspath(path))
        return not os.path.lexists(absolute) or is_model_name(os.path.basename(absolute)) or self.is_model(absolute)

    def owns(self, path: str, shard_set: ShardSet | None = None) -> bool:
        """Rules 3.2 and 3.3 for a file other than a destination ``.onnx`` (absent files are always writable)."""
        absolute = os.path.normpath(os.path.abspath(path))
        if not os.path.lexists(absolute):
            return True
        folder = os.path.dirname(absolute)
        if any(is_named_after_model(absolute, model) for model in self.models):
            return True  # named after the destination: no need to read the previous model
        referenced = self._referenced()
        if file_key(absolute) in referenced:
            return True
        if shard_set is None:
            return False
        if referenced and absolute in self._family(shard_set):
            base = os.path.normpath(os.path.abspath(shard_set.base))
            if is_checkpoint_set(base):  # a PyTorch checkpoint's names: ours only on evidence (module docstring)
                if checkpoint_file_used(absolute, os.path.basename(base), self._referenced_names(folder)):
                    return True
            elif any(file_key(member) in referenced for member in self._family(shard_set)):
                return True
        return absolute in self._journaled(shard_set)

    def _referenced_names(self, folder: str) -> set[str]:
        """Names of the files of ``folder`` the destination models reference now."""
        names = set()
        for model in self.models:
            for reference in (self._references(model) or {}).values():
                path = os.path.normpath(os.path.join(os.path.dirname(model), reference.location))
                if os.path.dirname(path) == folder:
                    names.add(os.path.basename(path))
        return names

    def _referenced(self) -> set[FileKey]:
        found: set[FileKey] = set()
        for model in self.models:
            found.update(self._references(model) or ())
        return found

    def _references(self, model: str) -> dict[FileKey, ModelReference] | None:
        if model not in self._previous:
            self._previous[model] = self._read(model)
        return self._previous[model]

    def _read(self, model: str) -> dict[FileKey, ModelReference] | None:
        read = self._read_cached(model)
        return None if isinstance(read, (UnreadableModel, NotAModel)) else read

    def _read_cached(self, model: str) -> dict[FileKey, ModelReference] | UnreadableModel | NotAModel | None:
        try:
            st = os.stat(model)
        except OSError:
            return None
        key = (model, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key not in self._cache:
            self._cache[key] = read_model_references(model)
        return self._cache[key]

    def _family(self, shard_set: ShardSet) -> frozenset[str]:
        known = self._families.get(shard_set)
        if known is None:
            known = self._families[shard_set] = shard_set.family()
        return known

    def _journaled(self, shard_set: ShardSet) -> frozenset[str]:
        base = os.path.normpath(os.path.abspath(shard_set.base))
        known = self._journals.get(base)
        if known is None:
            known = self._journals[base] = journal_leftovers(base)
        return known
