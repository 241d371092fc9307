"""A private ``expect()`` registry for node conformance cases, in the shape of onnx's backend test cases.

onnx's own ``onnx.backend.test.case.node.expect`` appends to a process-global list (``_NodeTestCases``), needs a
registered schema, and reserves a name even when it fails. This module keeps cases in a :class:`CaseRegistry` the
caller owns, builds the same single-node model onnx would (graph named after the case, producer ``backend-test``,
value infos from the arrays), and records the side files (weights) each case needs.

It must never touch onnx's global test lists and never write a file: writing is ``generate``'s job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper as oh

from onnx_light_ref.ops._schema import DOMAIN, SINCE_VERSION

# Tolerances of onnx's node test cases (TestCase rtol/atol), which onnx's Runner compares with.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7

# onnx-light's cases are written with IR 13; older onnx releases cannot express it, so fall back to theirs.
DEFAULT_IR_VERSION = min(13, onnx.IR_VERSION)

DEFAULT_OPSET_IMPORTS: tuple[tuple[str, int], ...] = (("", 18), (DOMAIN, SINCE_VERSION))


@dataclass(frozen=True)
class SideFile:
    """A file a case needs next to its model: ``path`` is absolute, or relative to the case directory.

    :func:`~onnx_light_ref.backend.generate` writes ``data`` there with the case.

    Example:
        In any folder (describing a case writes nothing):

        >>> from onnx_light_ref.backend import build_cases
        >>> side_file = build_cases()["test_cc_delayedinitializer_float_cpu"].side_files[0]
        >>> side_file.path, len(side_file.data)  # eight float32 values
        ('weights.bin', 32)
    """

    path: str
    data: bytes


@dataclass(frozen=True)
class NodeCase:
    """One node conformance case: a single-node model, one data set, the tolerances and its side files.

    What :meth:`CaseRegistry.expect` registers and :func:`~onnx_light_ref.backend.build_cases` returns, in onnx's
    own shape for node test cases (``model``, ``inputs``, ``outputs``, ``rtol``, ``atol``).

    Example:
        In any folder (describing a case writes nothing):

        >>> from onnx_light_ref.backend import build_cases
        >>> case = build_cases()["test_cc_delayedinitializer_cpu"]
        >>> case.model.graph.node[0].op_type, case.inputs, case.outputs[0].shape, len(case.side_files)
        ('DelayedInitializer', (), (3,), 1)
    """

    name: str
    model: onnx.ModelProto
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[np.ndarray, ...]
    side_files: tuple[SideFile, ...] = field(default=())
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


def _value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    elem_type = oh.np_dtype_to_tensor_dtype(array.dtype)
    return oh.make_tensor_value_info(name, elem_type, list(array.shape))


class CaseRegistry:
    """Ordered, name-unique collection of :class:`NodeCase`; :meth:`expect` mirrors onnx's ``expect()``.

    onnx's own ``expect()`` appends to a list global to the process; a registry is the caller's, and
    :func:`~onnx_light_ref.backend.generate` writes it (``registry=``) in onnx's backend-test layout.

    Example:
        In any folder (describing a case writes nothing):

        >>> import numpy as np
        >>> from onnx import TensorProto, helper
        >>> from onnx_light_ref.backend import CaseRegistry, SideFile
        >>> weights = np.arange(4, dtype=np.float32)
        >>> node = helper.make_node("DelayedInitializer", [], ["y"], domain="ai.rt", filename="w.bin", offset=0,
        ...     shape=[4], dtype=TensorProto.FLOAT, load_device="file", runtime_device="cpu")
        >>> registry, weights_file = CaseRegistry(), SideFile("w.bin", weights.tobytes())
        >>> _ = registry.expect(node, [], [weights], "test_four_floats", side_files=[weights_file])
        >>> registry.names()
        ['test_four_floats']
    """

    def __init__(self) -> None:
        self._cases: dict[str, NodeCase] = {}

    def expect(
        self,
        node: onnx.NodeProto,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        name: str,
        *,
        side_files: Sequence[SideFile] = (),
        opset_imports: Sequence[tuple[str, int]] = DEFAULT_OPSET_IMPORTS,
        ir_version: int = DEFAULT_IR_VERSION,
        producer_name: str = "backend-test",
        rtol: float = DEFAULT_RTOL,
        atol: float = DEFAULT_ATOL,
        followed_by: Sequence[onnx.NodeProto] = (),
    ) -> NodeCase:
        """Register the case ``name`` running ``node`` on ``inputs`` and expecting ``outputs``; return it.

        Graph inputs and outputs are typed from the arrays, in the node's input/output order. A name must start with
        ``test_`` (as onnx's runner expects) and be new to this registry; nothing is registered on error.

        Args:
            node: the node under test.
            inputs: one array per input of ``node``.
            outputs: one array per output of the last node (``node``, or the last of ``followed_by``).
            name: the case's name (``test_...``, new to this registry).
            side_files: the files the case needs next to its model (its weights).
            opset_imports: ``(domain, version)`` pairs of the model (default ``"": 18`` and ``ai.rt: 1``).
            ir_version: the model's IR version.
            producer_name: the model's producer.
            rtol: relative tolerance of the comparison.
            atol: absolute tolerance of the comparison.
            followed_by: nodes run after ``node`` (a probe making something visible that a comparison of the node's
                own output cannot see); the graph's outputs are then the last node's outputs.

        Returns:
            The registered :class:`NodeCase`.

        Raises:
            ValueError: a name not starting with ``test_`` or already registered, or arrays that do not match the
                nodes' inputs and outputs.
        """
        if not name.startswith("test_"):
            raise ValueError(f"case name must start with 'test_', got {name!r}.")
        if name in self._cases:
            raise ValueError(f"case {name!r} is already registered.")
        last = followed_by[-1] if followed_by else node
        if len(inputs) != len(node.input) or len(outputs) != len(last.output):
            raise ValueError(
                f"case {name!r}: node has {len(node.input)} inputs and {len(last.output)} outputs, got "
                f"{len(inputs)} input arrays and {len(outputs)} output arrays."
            )
        inputs = tuple(np.asarray(a) for a in inputs)
        outputs = tuple(np.asarray(a) for a in outputs)
        graph = oh.make_graph(
            [node, *followed_by],
            name,
            [_value_info(n, a) for n, a in zip(node.input, inputs, strict=True)],
            [_value_info(n, a) for n, a in zip(last.output, outputs, strict=True)],
        )
        model = oh.make_model(
            graph,
            producer_name=producer_name,
            opset_imports=[oh.make_opsetid(domain, version) for domain, version in opset_imports],
        )
        model.ir_version = ir_version
        case = NodeCase(
            name=name,
            model=model,
            inputs=inputs,
            outputs=outputs,
            side_files=tuple(side_files),
            rtol=rtol,
            atol=atol,
        )
        self._cases[name] = case
        return case

    def __iter__(self) -> Iterator[NodeCase]:
        return iter(self._cases.values())

    def __len__(self) -> int:
        return len(self._cases)

    def __contains__(self, name: object) -> bool:
        return name in self._cases

    def __getitem__(self, name: str) -> NodeCase:
        return self._cases[name]

    def names(self) -> list[str]:
        """Case names in registration order."""
        return list(self._cases)
