"""The ONNX schema of ``ai.rt::DelayedInitializer`` v1, registered on demand with Python shape inference.

:func:`register_schemas` makes ``onnx.checker.check_model(model, check_custom_domain=True)`` validate the node
(six required attributes with their types, no inputs, one output ``output`` of type ``T``) and
``onnx.shape_inference.infer_shapes`` type its output from ``dtype`` and ``shape``. The inference function applies
the kernel's own rules (``onnx_light_ref.ops._attributes``, same messages) and raises
``onnx.shape_inference.InferenceError`` naming the node (``[ShapeInferenceError] node DelayedInitializer[ai.rt]
(name): ...``), as onnx's own operators do.

On onnx < 1.19 a Python schema cannot carry an inference function
(:mod:`onnx_light_ref.io._read.onnx_compat`): the schema then serves the checker only, and ``infer_shapes`` leaves the
output untyped. On every onnx the registration ends at interpreter exit (onnx 1.19-1.22 otherwise hang or crash).

Strict and non-strict inference (checked by the schema tests, onnx 1.23):

* An invalid DelayedInitializer node (missing, mistyped or out-of-range attribute, an input, a second output)
  raises ``InferenceError`` in BOTH modes, from ``infer_shapes`` and from ``check_model(full_check=True)``: onnx
  swallows errors of its C++ inference functions in non-strict mode, but never an exception raised by a Python
  inference function, and the function cannot tell which mode it runs in.
* What non-strict mode does swallow are the conflicts onnx detects itself around a valid node: an output declared
  (graph output or ``value_info``) with another element type or shape than the node's ``dtype``/``shape``, and
  errors of downstream standard operators. Those raise ``InferenceError`` with ``strict_mode=True`` only
  (``check_model(full_check=True)`` infers strictly; non-strict ``infer_shapes`` keeps the declared type).

Ordering matters (see the onnx pitfalls): the inference function is attached *before* ``register_schema`` (set
afterwards it is silently ignored), and a schema without inference would be worse than none. Registration is
process-local and explicit: importing this module never registers anything, and this module must never import
``onnx.reference`` (the kernel sets ``op_schema = None``, so the kernel does not depend on registration order).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import onnx
import onnx.defs
from onnx import AttributeProto
from onnx.defs import OpSchema

from onnx_light_ref.io._read.delayed_names import DELAYED_DOMAIN, DELAYED_OP_TYPE
from onnx_light_ref.io._read.onnx_compat import (
    HAS_PYTHON_SHAPE_INFERENCE,
    ONNX_VERSION,
    attach_inference_function,
    register_schema_until_exit,
)
from onnx_light_ref.ops._attributes import ATTRIBUTE_TYPES, DelayedInitializerParams, validate_attributes
from onnx_light_ref.ops._dtypes import ALLOWED_TYPE_STRINGS

logger = logging.getLogger(__name__)

DOMAIN = DELAYED_DOMAIN  # spelled once, in io/_read/delayed_names.py (io never imports ops)
OP_TYPE = DELAYED_OP_TYPE
SINCE_VERSION = 1
# The op's only runtime device in v1 (the schema's inference and the kernel refuse anything else).
RUNTIME_DEVICE = "cpu"

_ATTRIBUTE_DOCS = {
    "shape": "Shape of the output tensor.",
    "dtype": "Element type of the output tensor, encoded as a TensorProto::DataType value.",
    "load_device": "Device where the initializer is first loaded: 'cpu' (read once when the kernel is built) or "
    "'file' (read from the file at every execution).",
    "runtime_device": "Device where the initializer is moved at runtime; must be 'cpu'.",
    "filename": "File containing the tensor's raw little-endian bytes.",
    "offset": "Byte offset of the tensor payload within filename.",
}

_ATTR_TYPE_ENUM: dict[int, OpSchema.AttrType] = {
    AttributeProto.INTS: OpSchema.AttrType.INTS,
    AttributeProto.INT: OpSchema.AttrType.INT,
    AttributeProto.STRING: OpSchema.AttrType.STRING,
}

_DOC = (
    "Defers materialization of a tensor stored in an external weights file. load_device must be 'cpu' or 'file' "
    "and runtime_device must be 'cpu'. The static output shape comes from the required shape attribute and the "
    "element type from the required dtype attribute."
)

_lock = threading.Lock()


def make_delayed_initializer_node(
    output: str,
    *,
    shape: Sequence[int],
    dtype: int,
    load_device: str,
    filename: str,
    offset: int,
    runtime_device: str = RUNTIME_DEVICE,
    name: str = "",
) -> onnx.NodeProto:
    """Build an ``ai.rt::DelayedInitializer`` node, attributes in the reference order; the only builder there is.

    ``onnx.helper.make_node`` sorts keyword attributes by name; onnx-light writes shape, dtype, load_device,
    runtime_device, filename, offset (``ATTRIBUTE_TYPES`` order), so the attributes are appended explicitly, each
    with its declared type (``shape`` stays INTS even when empty, which ``make_attribute`` cannot guess). Values
    are not validated here: the checker (after :func:`register_schemas`) and the kernel do that, so tests can
    build invalid nodes with it too.

    Args:
        output: Name of the node's single output (the tensor it produces).
        shape: Dimensions of the output tensor (``[]`` for a scalar).
        dtype: ``TensorProto.DataType`` value of the output.
        load_device: ``"cpu"`` (read once at construction) or ``"file"`` (read at every run).
        filename: File holding the tensor's raw little-endian bytes, absolute or relative to the model's folder.
        offset: Byte offset of the tensor in ``filename``.
        runtime_device: Where the tensor lives at run time; ``"cpu"`` is the only value v1 allows.
        name: Node name (``""`` leaves it unnamed).

    Returns:
        A new ``NodeProto`` with no inputs, one output, domain ``ai.rt`` and the six attributes.

    Raises:
        TypeError: a value protobuf cannot store in its attribute (a ``shape`` entry or an ``offset`` that is not an
            int, a ``filename`` that is not a string).

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, a node reading the first tensor of
        ``model.onnx.data`` (``W0``, float32 [64, 336], at offset 0) at every run:

        >>> from onnx import TensorProto
        >>> from onnx_light_ref.ops import make_delayed_initializer_node
        >>> node = make_delayed_initializer_node(
        ...     "W0", shape=[64, 336], dtype=TensorProto.FLOAT, load_device="file", filename="model.onnx.data", offset=0
        ... )
        >>> node.domain, node.op_type, [attribute.name for attribute in node.attribute]
        ('ai.rt', 'DelayedInitializer', ['shape', 'dtype', 'load_device', 'runtime_device', 'filename', 'offset'])
    """
    node = onnx.helper.make_node(OP_TYPE, [], [output], domain=DOMAIN, name=name)
    values: dict[str, object] = {
        "shape": list(shape),
        "dtype": dtype,
        "load_device": load_device,
        "runtime_device": runtime_device,
        "filename": filename,
        "offset": offset,
    }
    node.attribute.extend(
        onnx.helper.make_attribute(key, values[key], attr_type=attr_type) for key, attr_type in ATTRIBUTE_TYPES.items()
    )
    return node


def _node_label(ctx: onnx.shape_inference.InferenceContext) -> str:
    # get_display_name ("node DelayedInitializer[ai.rt] (name)") exists in onnx >= 1.16; older ones name no node.
    display = getattr(ctx, "get_display_name", None)
    return str(display()) if callable(display) else f"node {OP_TYPE}[{DOMAIN}]"


def _validate_node(
    where: str, n_inputs: int, n_outputs: int, get_attribute: Callable[[str], AttributeProto | None]
) -> DelayedInitializerParams:
    """The inference function's checks, shared with :func:`check_delayed_initializer_node`; InferenceError."""
    try:
        if n_inputs != 0:
            raise ValueError(f"{where}: DelayedInitializer takes no inputs, got {n_inputs}.")
        if n_outputs != 1:
            raise ValueError(f"{where}: DelayedInitializer has exactly one output, got {n_outputs}.")
        values: dict[str, object] = {}
        for name, attr_type in ATTRIBUTE_TYPES.items():
            attr = get_attribute(name)
            if attr is None:
                continue  # reported as missing by validate_attributes, with all other missing names
            if attr.type != attr_type:
                raise ValueError(
                    f"{where}: attribute {name!r} must be {AttributeProto.AttributeType.Name(attr_type)}, got "
                    f"{AttributeProto.AttributeType.Name(attr.type)}."
                )
            values[name] = onnx.helper.get_attribute_value(attr)
        return validate_attributes(values, where=where)
    except ValueError as exc:
        raise onnx.shape_inference.InferenceError(str(exc)) from exc


def _infer_delayed_initializer(ctx: onnx.shape_inference.InferenceContext) -> None:
    """Shape inference: validate like the kernel, then type output 0 as (dtype, shape). No file access.

    Raises ``onnx.shape_inference.InferenceError`` naming the node, as onnx's own inference does. onnx propagates
    any exception of a Python inference function whatever ``strict_mode`` says (see the module docstring).
    """
    where = f"[ShapeInferenceError] {_node_label(ctx)}"
    params = _validate_node(where, ctx.get_num_inputs(), ctx.get_num_outputs(), ctx.get_attribute)
    ctx.set_output_type(0, onnx.helper.make_tensor_type_proto(params.dtype, list(params.shape)))


def check_delayed_initializer_node(node: onnx.NodeProto) -> None:
    """Apply the shape-inference checks to one node without onnx: for onnx < 1.19, which cannot run them.

    Args:
        node: An ``ai.rt::DelayedInitializer`` node.

    Raises:
        onnx.shape_inference.InferenceError: the node is invalid; the message is the inference function's.
    """
    attributes = {attr.name: attr for attr in node.attribute}
    label = f"node {OP_TYPE}[{DOMAIN}] ({node.name})" if node.name else f"node {OP_TYPE}[{DOMAIN}]"
    _validate_node(f"[ShapeInferenceError] {label}", len(node.input), len(node.output), attributes.get)


def build_schema() -> OpSchema:
    """A fresh, unregistered OpSchema for ``ai.rt::DelayedInitializer`` v1, inference function attached.

    On onnx < 1.19 (no ``OpSchema.set_type_and_shape_inference_function``) the schema has no inference function:
    the checker still validates the node, shape inference leaves its output untyped. Registering it yourself with
    ``onnx.defs.register_schema`` on onnx 1.19 to 1.22 makes the interpreter hang or crash at exit unless you
    deregister it before: :func:`register_schemas` does both.
    """
    schema = OpSchema(
        OP_TYPE,
        DOMAIN,
        SINCE_VERSION,
        doc=_DOC,
        inputs=[],
        outputs=[OpSchema.FormalParameter("output", "T", "Tensor produced by the delayed initializer.")],
        type_constraints=[
            (
                "T",
                list(ALLOWED_TYPE_STRINGS),
                "Constrain output to tensor types backed by raw byte storage.",
            )
        ],
        attributes=[
            OpSchema.Attribute(name, _ATTR_TYPE_ENUM[attr_type], _ATTRIBUTE_DOCS[name], required=True)
            for name, attr_type in ATTRIBUTE_TYPES.items()
        ],
    )
    # Must precede register_schema: onnx copies the schema at registration. onnx < 1.19 cannot attach one.
    attach_inference_function(schema, _infer_delayed_initializer)
    return schema


def _is_registered() -> bool:
    try:
        onnx.defs.get_schema(OP_TYPE, SINCE_VERSION, DOMAIN)
    except onnx.defs.SchemaError:
        return False
    return True


def register_schemas() -> None:
    """Register ``ai.rt::DelayedInitializer`` v1 with onnx in this process; calling it again does nothing.

    onnx's checker and shape inference know the op afterwards: ``check_model(model, check_custom_domain=True)``
    validates its nodes' attributes, and ``onnx.shape_inference.infer_shapes`` types its output from ``dtype`` and
    ``shape``. Neither the evaluator nor the io functions need it (importing the package registers nothing).
    Thread-safe. A schema registered by someone else under the same name, domain and version is left in place
    (onnx refuses duplicates). The schema is deregistered when the interpreter exits (``atexit``), before onnx could
    destroy its Python inference function without the GIL (a hang on onnx 1.19, a segfault on 1.21 and 1.22). On
    onnx < 1.19 the schema has no shape inference (onnx's Python schemas cannot carry one there); a warning says so
    once.

    Returns:
        None.

    Raises:
        Nothing for an earlier registration, ours or someone else's: that one stays in place.

    Example:
        In the folder ``onnx-light-ref demo --size 1M --keep demo`` writes, ``light.onnx`` holds
        ``DelayedInitializer`` nodes:

        >>> import onnx
        >>> from onnx_light_ref import register_schemas
        >>> register_schemas()
        >>> onnx.defs.has("DelayedInitializer", "ai.rt")
        True
        >>> onnx.checker.check_model(onnx.load("light.onnx"), check_custom_domain=True)
    """
    with _lock:
        if _is_registered():
            return
        if not HAS_PYTHON_SHAPE_INFERENCE:
            logger.warning(
                "onnx %s cannot attach a Python shape-inference function to a schema (onnx >= 1.19 can): "
                "ai.rt::DelayedInitializer is registered for the checker only, and onnx.shape_inference leaves its "
                "output untyped.",
                ONNX_VERSION,
            )
        try:
            register_schema_until_exit(build_schema())
        except onnx.defs.SchemaError as exc:
            if not _is_registered():
                raise
            logger.debug("ai.rt::DelayedInitializer schema registered concurrently: %s", exc)
            return
        logger.debug("registered schema %s::%s v%d", DOMAIN, OP_TYPE, SINCE_VERSION)
