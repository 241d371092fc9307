"""An ``onnx.backend.base.Backend`` running models with onnx's ReferenceEvaluator and the ``ai.rt`` kernels.

onnx-style harnesses (``onnx.backend.test.runner.Runner``, ``run_model``, ``prepare(model, **test_kwargs)``) hand
a backend a ``ModelProto``, never the model's folder. Where ``filename`` attributes resolve:

* no ``base_dir`` and a proto (what onnx's Runner does): the unbound op, with the spec's behaviour: absolute names
  are read where they point, relative ones against the current directory at ``prepare``. The cases
  ``generate-tests`` writes by default name their files absolutely, so they run this way from any directory;
* ``base_dir=<case or model folder>`` (a keyword, e.g. through the Runner's ``test_kwargs``), or a model given as
  a path (its folder): the op bound to that folder, ``DelayedInitializer.bind(base_dir)``, which resolves relative
  names there and refuses files outside that folder unless ``allow_outside_folder=True``.

Ownership: a bound op holds the folder's descriptor and, in file mode, each weights file
(:mod:`~onnx_light_ref.ops._delayed_initializer`). The prepared model (:class:`DelayedInitializerBackendRep`) owns the
op it was built with and releases those descriptors on ``close()``, at the end of a ``with`` block, or as soon as it
is dropped (a class lives in reference cycles: left to the op, they would wait for the cyclic garbage collector);
``run_model`` and ``run_node`` release theirs before returning, and a ``prepare`` that fails releases what it opened.

This backend must never mutate the model it is given and never runs on anything but the CPU.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import onnx
from onnx import helper as oh
from onnx.backend.base import Backend, BackendRep, Device, DeviceType
from onnx.reference import ReferenceEvaluator

from onnx_light_ref.backend._expect import DEFAULT_IR_VERSION, DEFAULT_OPSET_IMPORTS
from onnx_light_ref.io._read.onnx_compat import refuse_unsupported_evaluator_options
from onnx_light_ref.ops._delayed_initializer import DelayedInitializer
from onnx_light_ref.ops._evaluate import readable_model
from onnx_light_ref.ops._schema import register_schemas


def _kernel(base_dir: str | os.PathLike[str] | None, allow_outside_folder: bool) -> type[DelayedInitializer]:
    """The unbound kernel without a folder, else the kernel bound to ``base_dir``."""
    if base_dir is None:
        return DelayedInitializer
    return DelayedInitializer.bind(base_dir, allow_outside_folder=allow_outside_folder)


def _evaluator(
    model: onnx.ModelProto, op: type[DelayedInitializer], kwargs: dict[str, Any]
) -> DelayedInitializerBackendRep:
    """The prepared model owning ``op``; ``op``'s descriptors are released if the evaluator cannot be built."""
    try:
        # A copy where onnx would misread a tensor (bfloat16 raw_data on onnx 1.17); the given model is never mutated.
        session = ReferenceEvaluator(readable_model(model), new_ops=[op], **kwargs)
    except BaseException:
        if op is not DelayedInitializer:
            op.close()
        raise
    return DelayedInitializerBackendRep(session, op)


class DelayedInitializerBackendRep(BackendRep):
    """A prepared model: one ReferenceEvaluator, reused by every :meth:`run`, and the op bound for it.

    What :meth:`DelayedInitializerBackend.prepare` returns. It owns the bound op's open folder and, in file mode, its
    open weights files: :meth:`close`, the end of a ``with`` block, or the rep being dropped releases them. After
    :meth:`close`, :meth:`run` raises ``ValueError``.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``light.onnx`` holds
        ``DelayedInitializer`` nodes:

        >>> import numpy as np
        >>> from onnx_light_ref.backend import DelayedInitializerBackend
        >>> rep = DelayedInitializerBackend.prepare("light.onnx")
        >>> rep.run({"x": np.ones((3, 64), np.float32)})[0].shape
        (3, 16)
        >>> rep.close()
        >>> rep.closed
        True
    """

    def __init__(self, session: ReferenceEvaluator, op: type[DelayedInitializer] | None = None) -> None:
        self._session: ReferenceEvaluator | None = session
        # A finalizer, not __del__: it runs once, at close() or when the rep goes, and holds the op, not the rep. The
        # unbound op owns nothing (its nodes hold the current directory, released with the evaluator).
        bound = op is not None and op is not DelayedInitializer
        self._closer = weakref.finalize(self, op.close) if op is not None and bound else None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._session is None

    def close(self) -> None:
        """Release the op's descriptors and the evaluator (idempotent)."""
        self._session = None  # an unbound op's nodes release their hold on the current directory with it
        if self._closer is not None:
            self._closer()

    def __enter__(self) -> DelayedInitializerBackendRep:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run once; ``inputs`` is a list of arrays (graph input order), a name->array mapping, or one array.

        Args:
            inputs: the graph's inputs.
            **kwargs: ignored (onnx's ``BackendRep.run`` signature).

        Returns:
            The graph's outputs, in order.

        Raises:
            ValueError: the rep was closed, or ``inputs`` does not match the graph's inputs.
        """
        if self._session is None:
            raise ValueError(
                "this prepared model was closed (close(), or the end of its 'with' block); prepare it again."
            )
        names = list(self._session.input_names)
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        elif isinstance(inputs, np.ndarray):
            feeds = dict(zip(names, [inputs], strict=True))
        else:
            values = list(inputs) if inputs is not None else []
            if len(values) != len(names):
                raise ValueError(f"the model takes {len(names)} inputs {names}, got {len(values)} arrays.")
            feeds = dict(zip(names, values, strict=True))
        return tuple(self._session.run(None, feeds))


class DelayedInitializerBackend(Backend):
    """An ``onnx.backend`` backend for models using ``ai.rt::DelayedInitializer`` (CPU only).

    What onnx's backend-test harnesses take (``Runner``, ``run_model``, ``prepare(model, **test_kwargs)``): ``prepare``
    checks the model with ``check_custom_domain=True`` after registering the op's schema, then builds a
    ``ReferenceEvaluator`` with ``new_ops=[DelayedInitializer.bind(base_dir)]``. A model given as a proto (what
    onnx's Runner hands over) runs with the unbound op, relative filenames read from the current directory, unless
    ``base_dir`` is given (``docs/delayed_initializer.md#conformance-cases``).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``light.onnx`` holds
        ``DelayedInitializer`` nodes:

        >>> import numpy as np
        >>> from onnx_light_ref.backend import DelayedInitializerBackend
        >>> with DelayedInitializerBackend.prepare("light.onnx") as rep:
        ...     (y,) = rep.run(np.ones((2, 64), np.float32))
        >>> y.shape, DelayedInitializerBackend.supports_device("CUDA")
        ((2, 16), False)
    """

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether ``device`` (``"CPU"``, ``"CUDA:0"``...) is the CPU, the only device this backend runs on."""
        try:
            return Device(device).type == DeviceType.CPU
        except (AttributeError, ValueError):
            return False

    @classmethod
    def prepare(
        cls,
        model: onnx.ModelProto | str | os.PathLike[str],
        device: str = "CPU",
        *,
        base_dir: str | os.PathLike[str] | None = None,
        allow_outside_folder: bool = False,
        **kwargs: Any,
    ) -> DelayedInitializerBackendRep:
        """Check ``model`` and build its evaluator.

        Args:
            model: A ModelProto (never mutated) or the path of a ``.onnx`` file.
            device: ``"CPU"``, the only device supported.
            base_dir: Folder the op is bound to; default the model's folder for a path, none for a proto (the
                unbound op: absolute names as they are, relative ones against the current directory).
            allow_outside_folder: Passed to ``DelayedInitializer.bind``: a bound op may then read absolute
                filenames outside ``base_dir`` and follows symbolic links (a relative name that is a link reads its
                target, wherever it is). Ignored without a folder (the unbound op is not confined).
            **kwargs: Passed to ``ReferenceEvaluator`` (``verbose``, ``check_shape_annotations``...).

        Returns:
            The prepared model; it owns the bound op's descriptors: ``close()`` it or use it in a ``with`` block
            (dropping it releases them too).

        Raises:
            ValueError: a device other than the CPU.
            UnsupportedOnnxFeatureError: an evaluator keyword the installed onnx lacks (``check_shape_annotations``
                before onnx 1.23).
            onnx.checker.ValidationError: the model fails ``check_model(..., check_custom_domain=True)``.
        """
        if not cls.supports_device(device):
            raise ValueError(f"{cls.__name__} runs on CPU only, got device {device!r}.")
        if not isinstance(model, onnx.ModelProto):
            path = os.fspath(model)
            if base_dir is None:
                base_dir = os.path.dirname(os.path.abspath(path))
            model = onnx.load_model(path)
        refuse_unsupported_evaluator_options(kwargs)
        register_schemas()
        onnx.checker.check_model(model, check_custom_domain=True)
        return _evaluator(model, _kernel(base_dir, allow_outside_folder), kwargs)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        """Prepare ``model`` (``prepare``'s keywords), run it once on ``inputs``, release it; return the outputs."""
        with cls.prepare(model, device, **kwargs) as rep:
            return rep.run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node: it is wrapped in a model importing ``"": 18`` and ``ai.rt: 1`` (``opset_imports=``)."""
        opset_imports = kwargs.pop("opset_imports", DEFAULT_OPSET_IMPORTS)
        values = list(inputs) if inputs is not None else []
        graph_inputs = [
            oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
            for name, v in zip(node.input, values, strict=True)
        ]
        if outputs_info is not None:
            graph_outputs = [
                oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape))
                for name, (dt, shape) in zip(node.output, outputs_info, strict=True)
            ]
        else:
            graph_outputs = [oh.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in node.output]
        model = oh.make_model(
            oh.make_graph([node], "run_node", graph_inputs, graph_outputs),
            opset_imports=[oh.make_opsetid(domain, version) for domain, version in opset_imports],
        )
        model.ir_version = DEFAULT_IR_VERSION
        refuse_unsupported_evaluator_options(kwargs)
        op = _kernel(kwargs.pop("base_dir", None), kwargs.pop("allow_outside_folder", False))
        with _evaluator(model, op, kwargs) as rep:
            return rep.run(values)
