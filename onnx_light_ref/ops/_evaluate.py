"""One call to evaluate a model with external weights lazily: :func:`reference_evaluator`.

``ReferenceEvaluator("model.onnx")`` reads every external weight into the proto and converts it again to numpy
(about twice the weights in peak memory). :func:`reference_evaluator` parses the ``.onnx`` only, turns its external
initializers into ``ai.rt::DelayedInitializer`` nodes (:func:`~onnx_light_ref.ops._convert.delay_initializers`) and
builds the evaluator with the op bound to the model's folder. With ``load_device="file"`` construction reads no
weight and each run reads the weights it uses, straight into the arrays it returns; with ``"cpu"`` construction
reads each weight once.

Confinement: the model's folder is opened once, when the evaluator is built, and held
(:class:`~onnx_light_ref.io._read.folder.ModelFolder`); the bound op opens every file relative to that descriptor, with
no symbolic link on the way and one hard link (onnx's loader rule), so a ``DelayedInitializer`` node already in the
model with ``filename="/etc/passwd"`` raises :class:`~onnx_light_ref.errors.UnsafeLocationError` when the evaluator
is built, before any byte is read, and a folder renamed away and replaced by a symbolic link to ``/etc`` after
construction changes nothing: the held folder is still read. In file mode each weights file is held open from
construction and read from that descriptor; a run refuses a weights file replaced or modified since then (typed
error naming the file). ``allow_outside_folder=True`` trusts the model's absolute filenames (the spec's examples use
``/tmp`` paths) and symbolic links (the Hugging Face cache): a relative name that is a link in the folder then reads
its target, outside the folder too.

Ownership: the evaluator returned (:class:`LazyReferenceEvaluator`) owns its kernel's descriptors and releases them
on ``close()``, at the end of a ``with`` block, or when it is dropped.

External tensors the converter leaves alone (initializers overridable by a graph input, tensors in node attributes
such as ``Constant``'s value, dtypes the op cannot produce, subgraph initializers named like an outer value) are
validated like the converted ones (the package's typed errors, before any of them is read), then read eagerly
through the same held folder. Every tensor handed to onnx's evaluator with ``raw_data`` (those, and the model's
inline ones) is put in the form the installed onnx reads (:func:`readable_model`): on onnx 1.17, whose loader ignores
a bfloat16 tensor's ``raw_data``, its values move to ``int32_data``.
Tensors of ``ModelProto.training_info`` graphs are neither converted nor loaded: inference never runs those graphs
(onnx's evaluator ignores them), so their files are not even opened.

This module must never load converted weights itself (only the kernel reads them, when the evaluator says so), and
never open a model-relative file by its path.
"""

from __future__ import annotations

import logging
import os
import weakref
from types import TracebackType
from typing import Any

import onnx
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._arguments import check_bool
from onnx_light_ref.io._posix import pread_exact
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.folder import ModelFolder
from onnx_light_ref.io._read.locations import ExternalRef, LocationResolver, check_not_hard_linked, parse_external_data
from onnx_light_ref.io._read.model_file import open_model_folder
from onnx_light_ref.io._read.onnx_compat import (
    ONNX_VERSION,
    make_onnx_readable,
    onnx_ignores_raw_data,
    refuse_unsupported_evaluator_options,
)
from onnx_light_ref.io._read.walker import iter_tensors
from onnx_light_ref.ops._convert import delay_initializers
from onnx_light_ref.ops._delayed_initializer import DelayedInitializer
from onnx_light_ref.ops._evaluator_cycle import weaken_log_callback
from onnx_light_ref.ops._transpose import Transpose

logger = logging.getLogger(__name__)


class LazyReferenceEvaluator(ReferenceEvaluator):
    """What :func:`~onnx_light_ref.reference_evaluator` returns: onnx's ``ReferenceEvaluator``, closable.

    Its ``DelayedInitializer`` kernel keeps the model's folder open and, in file mode, each weights file (one
    descriptor per distinct file). They are released by :meth:`close`, at the end of a ``with`` block, or as soon as
    the evaluator is dropped (``del sess``): onnx's evaluator keeps itself in a reference cycle (its nodes' ``log``
    callback refers back to it), which would leave the descriptors open until the cyclic garbage collector runs;
    this class replaces that callback by one holding a weak reference, so the evaluator goes with its last
    reference. After :meth:`close`, a run that needs a ``DelayedInitializer`` raises ``ValueError``.

    Subgraph and function evaluators onnx builds from it are of this class too; they own nothing.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> import numpy as np
        >>> from onnx_light_ref import reference_evaluator
        >>> sess = reference_evaluator("model.onnx")
        >>> sess.run(None, {"x": np.ones((1, 64), np.float32)})[0].shape
        (1, 16)
        >>> sess.close()
        >>> sess.closed
        True
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._olr_closer: weakref.finalize | None = None
        for node in getattr(self, "rt_nodes_", ()):  # a graph without DelayedInitializer: no kernel did it
            weaken_log_callback(getattr(node, "run_params", None), self)

    def own(self, op: Any) -> None:
        """Close ``op`` (a class :meth:`DelayedInitializer.bind` made) when this evaluator is closed or dropped."""
        self._olr_closer = weakref.finalize(self, op.close)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._olr_closer is not None and not self._olr_closer.alive

    def close(self) -> None:
        """Release the model's folder and the weights files kept open for this evaluator (idempotent)."""
        if self._olr_closer is not None:
            self._olr_closer()

    def __enter__(self) -> LazyReferenceEvaluator:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def reference_evaluator(
    path: str | os.PathLike[str], load_device: str = "file", *, allow_outside_folder: bool = False, **kwargs: Any
) -> LazyReferenceEvaluator:
    """Build onnx's ``ReferenceEvaluator`` for the model at ``path``, its external weights read only when needed.

    A model of many gigabytes is ready at once and holds no weight in memory between runs (``load_device="file"``).
    External initializers become ``DelayedInitializer`` nodes (as :func:`~onnx_light_ref.delay_initializers` writes
    them) whose kernel is bound to the model's folder: every ``DelayedInitializer`` filename (converted or already in
    the model) must resolve inside that folder. The evaluator owns the open folder and files of its kernel (the
    weights files are kept open in file mode): use it in a ``with`` block or call ``close()``; dropping it releases
    them too (see :class:`~onnx_light_ref.ops.LazyReferenceEvaluator`).

    Args:
        path: the ``.onnx`` file.
        load_device: ``"file"`` (each run reads the weights, construction reads none) or ``"cpu"`` (construction
            reads each weight once; runs return copies).
        allow_outside_folder: trust the model's files: absolute ``filename`` attributes (and locations) outside the
            model's folder are read (the spec's behaviour: its examples use ``/tmp`` paths), and symbolic links are
            followed, so a relative name that is a symbolic link in the folder reads the file it points to, wherever
            it is (a trusted layout such as the Hugging Face cache). Relative names still may not contain ``..``.
            Without it, every name must resolve inside the folder with no symbolic link on the way.
        **kwargs: passed to ``ReferenceEvaluator`` (``verbose``, ``check_shape_annotations``, ``new_ops``...); your
            ``new_ops`` come after the bound ``DelayedInitializer``.

    Returns:
        The evaluator (a ``ReferenceEvaluator``, with ``close()`` and the context-manager protocol).

    Raises:
        UnsafeLocationError: a filename or location outside the model's folder, a hard-linked data file.
        FileNotFoundError: the model or a data file is missing.
        OSError: ``EMFILE``/``ENFILE``: the process (or the system) has no descriptor left; the message says so.
        ExternalDataError: a tensor loaded eagerly (an initializer ``delay_initializers`` keeps, such as a graph
            input's default) has a malformed reference, or onnx's loader refuses it.
        ValueError: the errors of :func:`~onnx_light_ref.delay_initializers` and of the kernel's attribute checks
            (bad references are refused before anything is read).
        UnsupportedOnnxFeatureError: (a ``NotImplementedError``) an evaluator keyword the installed onnx lacks
            (``check_shape_annotations`` before onnx 1.23), refused before anything is read.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes:

        >>> import numpy as np
        >>> from onnx_light_ref import reference_evaluator
        >>> x = np.ones((2, 64), dtype=np.float32)
        >>> with reference_evaluator("model.onnx") as sess:
        ...     (y,) = sess.run(None, {"x": x})
        >>> y.shape, y.dtype
        ((2, 16), dtype('float32'))
    """
    check_bool("allow_outside_folder", allow_outside_folder)
    refuse_unsupported_evaluator_options(kwargs)
    model_path = os.path.abspath(os.fspath(path))
    # Held while the model is converted and its eager tensors read; the bound kernel holds its own duplicate, which
    # the evaluator owns, and opens every weights file through it at each run, whatever happens to the folder's name.
    with open_model_folder(model_path, allow_outside_folder=allow_outside_folder) as folder:
        converted = _convert_and_load_eager(model_path, load_device, folder)
        op = DelayedInitializer.bind(folder, allow_outside_folder=allow_outside_folder)
    new_ops = [op, Transpose, *(kwargs.pop("new_ops", None) or [])]
    try:
        sess = LazyReferenceEvaluator(converted, new_ops=new_ops, **kwargs)
    except BaseException:
        op.close()
        raise
    sess.own(op)
    return sess


def _convert_and_load_eager(model_path: str, load_device: str, folder: ModelFolder) -> onnx.ModelProto:
    """The model with its external initializers delayed, and every external tensor left (see the module docstring)
    validated, then read through ``folder``."""
    converted = delay_initializers(model_path, load_device, base_dir=folder)
    eager = [site for site in iter_tensors(converted) if site.scope != "training" and is_external(site.tensor)]
    # Validated as the converted ones were (typed errors naming the tensor, nothing read) before any is read.
    resolver = LocationResolver(folder)
    refs = []
    for site in eager:
        ref = parse_external_data(site.tensor, resolver, label=site.label)
        check_not_hard_linked(ref)
        refs.append(ref)
    for site, ref in zip(eager, refs, strict=True):
        _load_through_folder(site.tensor, ref, site.label)
    if eager:
        logger.info(
            "loaded %d external tensors eagerly (graph-input defaults, attributes or sparse tensors): %s",
            len(eager),
            ", ".join(site.label for site in eager[:5]) + (", ..." if len(eager) > 5 else ""),
        )
    _make_readable(converted)
    return converted


def _make_readable(model: onnx.ModelProto) -> None:
    """Rewrite in place every tensor onnx's evaluator would misread (:func:`make_onnx_readable`). Training graphs
    are skipped: inference never runs them."""
    rewritten = [
        site.label for site in iter_tensors(model) if site.scope != "training" and make_onnx_readable(site.tensor)
    ]
    if rewritten:
        logger.info(
            "onnx %s ignores the raw_data of %d tensors (bfloat16): given as int32_data instead: %s",
            ONNX_VERSION,
            len(rewritten),
            ", ".join(rewritten[:5]) + (", ..." if len(rewritten) > 5 else ""),
        )


def readable_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy in the form the installed onnx's evaluator reads exactly, when it would misread it.

    onnx 1.17's loader ignores the ``raw_data`` of a bfloat16 tensor and evaluates uninitialized memory instead: the
    copy holds such values in ``int32_data`` (:func:`~onnx_light_ref.io._read.onnx_compat.make_onnx_readable`). On the
    newest onnx, and for a model without such a tensor, ``model`` itself is returned; it is never mutated.

    Args:
        model: the model about to be handed to ``onnx.reference.ReferenceEvaluator``.

    Returns:
        ``model`` or the rewritten copy.

    Example:
        >>> import onnx
        >>> readable_model(onnx.ModelProto()).ByteSize()
        0
    """
    if not any(site.scope != "training" and onnx_ignores_raw_data(site.tensor) for site in iter_tensors(model)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _make_readable(copy)
    return copy


def _load_through_folder(tensor: onnx.TensorProto, ref: ExternalRef, label: str) -> None:
    """Make ``tensor`` inline with the bytes ``ref`` validated, read through the held folder.

    What onnx's ``load_external_data_for_tensor`` does, but through the descriptor held since construction (onnx's
    loader opens the folder by its name again) and refusing a file replaced since it was validated.
    """
    assert ref.folder is not None
    with ref.folder.open_file(ref.location, tensor_name=label) as opened:
        if opened.identity != ref.identity:
            raise ExternalDataError(
                f"tensor {label!r}: external data file {ref.location!r} was replaced after it was validated; "
                "nothing was read."
            )
        buffer = bytearray(ref.length)
        try:
            done = pread_exact(opened.fd, memoryview(buffer), ref.offset)
        except OSError as exc:
            raise ExternalDataError(
                f"tensor {label!r}: external data file {ref.location!r} cannot be read: {exc.strerror or exc}."
            ) from exc
    if done < ref.length:
        raise ExternalDataError(
            f"tensor {label!r}: external data file {ref.location!r} ended at byte {ref.offset + done}, "
            f"{ref.length - done} bytes short of its range (it changed after it was validated)."
        )
    tensor.raw_data = bytes(buffer)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
