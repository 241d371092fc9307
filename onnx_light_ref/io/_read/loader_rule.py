"""Which of onnx's and onnxruntime's loaders would refuse an external reference, and why: ``inspect``'s verdict.

The package's promise (``docs/safety.md``, "The location rule") is that whatever ``inspect`` calls OK loads in
``onnx.load(path, load_external_data=True)`` (with no tensor left EXTERNAL), passes
``onnx.checker.check_model(path, full_check=True)`` and builds an ``onnxruntime.InferenceSession``. This module
states each loader's rule on one external tensor, as measured against onnx 1.23 and onnxruntime 1.32 (the hostile
tree property test, ``tests/hardening/test_oracles.py``, keeps it honest):

- a data path that goes through a symbolic link, below the model's folder: ``onnx.load`` refuses any of them (the
  file: "should be stored in ..., but it is a symlink"; a subfolder: "kernel rejected path", from ``openat2``
  with ``RESOLVE_NO_SYMLINKS`` in onnx's C++ ``_open_external_data``); ``check_model`` refuses a symlinked file but
  not a symlinked subfolder; onnxruntime accepts both while the real path stays inside the real folder of the
  model file (so it loads the Hugging Face cache layout, where the model and its data are symlinks into ``blobs/``);
- a data file with several hard links: ``onnx.load`` and ``check_model`` refuse it, onnxruntime accepts it;
- an ``external_data`` key other than ``location``, ``offset``, ``length``, ``checksum``: onnxruntime refuses the
  model ("model format error"), ``basepath`` included, which onnx itself accepts (onnx warns about and ignores the
  other unknown keys);
- an external tensor whose name is not UTF-8: ``onnx.load`` fails opening its data (its C++ opener takes the name
  as ``str``: ``TypeError``); ``check_model`` and onnxruntime accept it (as they accept non-UTF-8 names elsewhere,
  as long as the graph is consistent);
- an EXTERNAL tensor where ``onnx.load`` does not load external data (sparse tensors, function default attributes,
  ``training_info``: :attr:`~onnx_light_ref.io._read.walker.TensorSite.onnx_loads`): ``onnx.load`` leaves it EXTERNAL.

Each rule applies only for the loaders that open the tensor's data (:func:`readers_of`): ``check_model`` and
onnxruntime never look at ``training_info`` nor at function default attributes (a symlink or an unknown key there
passes them). Malformed entries, paths escaping the folder, missing files and out-of-bounds ranges are refused by
every loader that reads them;
``inspect`` reports them with its own statuses. This module only ``lstat``s path components; it never opens a file
and never reads or writes a byte.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from onnx_light_ref.io._read.entries import last_value
from onnx_light_ref.io._read.walker import TensorSite, inline_reason

if TYPE_CHECKING:
    import onnx

Loader = Literal["onnx.load", "check_model", "onnxruntime"]
"""``onnx.load(path, load_external_data=True)``, ``onnx.checker.check_model(path, full_check=True)``,
``onnxruntime.InferenceSession(path)``."""

LOADERS: tuple[Loader, ...] = get_args(Loader)

ORT_KEYS = frozenset({"location", "offset", "length", "checksum"})
"""The only ``external_data`` keys onnxruntime accepts (it refuses the model for any other, ``basepath`` too)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Loaders that refuse one tensor's reference for one reason (the others accept it for that reason)."""

    loaders: tuple[Loader, ...]
    reason: str
    symlink: bool = False  # about a symbolic link on the data path: what ``allow_outside_folder`` opts into

    def describe(self) -> str:
        """``"onnx.load, check_model refuse: <reason>; onnxruntime accepts it"``."""
        accept = [loader for loader in LOADERS if loader not in self.loaders]
        text = f"{', '.join(self.loaders)} refuse{'s' if len(self.loaders) == 1 else ''}: {self.reason}"
        return text + (f" ({', '.join(accept)} accept{'s' if len(accept) == 1 else ''} it)" if accept else "")


def loader_refusals(site: TensorSite, base_dir: str, real_model_dir: str | None = None) -> list[Refusal]:
    """What each loader would refuse about the EXTERNAL tensor of ``site``, resolved from ``base_dir``.

    Args:
        site: an external tensor of the walk.
        base_dir: the model's folder (as the loaders see it: the folder of the path they are given).
        real_model_dir: the folder of the model file's real path (default: ``base_dir``'s real path). onnxruntime
            accepts a symlinked data file whose target is inside it: in the Hugging Face cache layout
            (``snapshots/<rev>/model.onnx`` and ``model.onnx.data`` both symlinks into ``blobs/``) onnxruntime
            loads the model, onnx refuses it.

    Returns:
        The refusals, in the order of the rules in the module docstring; empty when no rule here refuses it.
    """
    tensor = site.tensor
    found: list[Refusal] = []
    location = _entry(tensor, "location")
    if location:
        # A folder renamed while it is looked at (a race) gives no claim here; the opener's own checks report it.
        with contextlib.suppress(OSError):
            found.extend(_path_refusals(base_dir, location, real_model_dir or os.path.realpath(base_dir)))
    keys = [_text(entry.key) for entry in tensor.external_data]
    extra = sorted({key for key in keys if key not in ORT_KEYS})
    if extra:
        found.append(
            Refusal(
                ("onnxruntime",),
                f"external_data key(s) {extra}: onnxruntime accepts only location, offset, length, checksum",
            )
        )
    if isinstance(tensor.name, bytes):
        # onnx.load hands the name to its C++ opener, which takes str only (TypeError); check_model and onnxruntime
        # accept the name (measured: a consistently named non-UTF-8 initializer loads and runs).
        found.append(Refusal(("onnx.load",), "the tensor name is not valid UTF-8 (onnx's data opener needs text)"))
    readers = readers_of(site)
    refusals = []
    for refusal in found:  # a loader that never opens this tensor's data cannot refuse it for its data
        loaders = tuple(loader for loader in refusal.loaders if loader in readers)
        if loaders:
            refusals.append(Refusal(loaders, refusal.reason, refusal.symlink))
    reason = inline_reason(site)
    if reason is not None:
        what = "a tensor in training_info" if reason == "training_info" else f"a {reason}"
        refusals.append(
            Refusal(("onnx.load",), f"onnx's loader never reads the external data of {what} (it stays EXTERNAL)")
        )
    return refusals


def readers_of(site: TensorSite) -> frozenset[Loader]:
    """The loaders that open this tensor's external data (measured): ``onnx.load`` where it loads it back
    (:attr:`~onnx_light_ref.io._read.walker.TensorSite.onnx_loads`); ``check_model`` and onnxruntime everywhere but in
    ``training_info`` and function default attributes, which neither looks at.

    Args:
        site: a tensor of the walk.

    Returns:
        The loaders concerned by this tensor's reference.
    """
    readers: set[Loader] = {"onnx.load"} if site.onnx_loads else set()
    if site.scope != "training" and site.kind not in _FUNCTION_DEFAULT_KINDS:
        readers |= {"check_model", "onnxruntime"}
    return frozenset(readers)


_FUNCTION_DEFAULT_KINDS = frozenset(
    {"function_default", "sparse_function_default_values", "sparse_function_default_indices"}
)


def _path_refusals(base_dir: str, location: str, real_model_dir: str) -> list[Refusal]:
    """Symlinks on the path below ``base_dir`` and a hard-linked file; a missing component ends the walk."""
    parts = [part for part in location.split("/") if part not in ("", ".")]
    if not parts or ".." in parts or os.path.isabs(location):
        return []  # malformed: every loader refuses it, inspect says so with its own status
    current = base_dir
    links: list[str] = []
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except (OSError, ValueError):
            return []  # missing (or not reachable): inspect reports it with its own status
        if stat.S_ISLNK(st.st_mode):
            links.append("/".join(parts[: index + 1]))
    refusals: list[Refusal] = []
    if links:
        file_is_link = links[-1] == "/".join(parts)
        inside = _stays_inside(real_model_dir, current)
        ort: tuple[Loader, ...] = () if inside else ("onnxruntime",)
        check: tuple[Loader, ...] = ("check_model",) if file_is_link or not inside else ()
        named = ", ".join(repr(link) for link in links)
        what = (
            f"data file {location!r} is a symbolic link"
            if links == ["/".join(parts)]
            else f"data path {location!r} goes through the symbolic link(s) {named}"
        )
        refusals.append(Refusal(("onnx.load", *check, *ort), what, symlink=True))
    try:
        target = os.stat(current)
    except (OSError, ValueError):
        return refusals
    if stat.S_ISREG(target.st_mode) and target.st_nlink > 1:
        refusals.append(
            Refusal(("onnx.load", "check_model"), f"data file {location!r} has {target.st_nlink} hard links")
        )
    return refusals


def _stays_inside(real_base: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == real_base or real.startswith(real_base.rstrip(os.sep) + os.sep)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", errors="backslashreplace") if isinstance(value, bytes) else value


def _entry(tensor: onnx.TensorProto, key: str) -> str:
    """The last ``key`` entry (the one onnx's loader uses), when it is text."""
    value = last_value(tensor, key)
    return value if isinstance(value, str) else ""
