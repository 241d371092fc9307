"""The one place that knows how the supported onnx releases (1.17 to the newest) differ.

Every difference is detected from the installed onnx's own API (an attribute, a keyword in a signature, what a
helper returns), never from its version string, so a backport or a patched build gets the feature it has. The
version string only appears in messages. What differs:

* ``OpSchema.set_type_and_shape_inference_function`` exists from onnx 1.19: below it a Python schema cannot carry
  a shape-inference function (:data:`HAS_PYTHON_SHAPE_INFERENCE`).
* onnx 1.19 to 1.22 destroy a Python inference function left in the schema registry after the interpreter has
  finalized (hang on 1.19, segfault on 1.21/1.22): :func:`register_schema_until_exit` deregisters it before then.
* ``ReferenceEvaluator(check_shape_annotations=...)`` exists from onnx 1.23 (:func:`evaluator_checks_shapes`).
* ``onnx.helper.tensor_dtype_to_np_dtype`` maps bfloat16 and the float8 types to float32 before onnx 1.19 (their
  numpy dtypes came with ml_dtypes), so an ``itemsize`` read from it is the wrong byte size in ``raw_data``:
  :func:`raw_element_size` gives the stored size of those types whatever onnx says.
* ``numpy_helper.from_array`` refuses an odd number of INT4/UINT4 values on onnx 1.17 ("requires an even
  size"), although ``make_tensor`` writes them and ``to_array`` reads them: :func:`array_raw_bytes` (and
  :func:`typed_raw_bytes`) pad the values with zeros to whole bytes (onnx pads the last byte's unused bits with
  zeros) and keep the bytes the tensor needs.
* The numpy representation of the element types beyond numpy's (bfloat16, float8, int4/uint4, float4, int2/uint2,
  float6) differs: ml_dtypes types on current onnx, onnx's own structured dtypes on onnx 1.17 (bfloat16 is
  ``(np.uint16, [("bfloat16", "<u2")])``), none for a type the installed onnx does not define.
  :func:`evaluator_dtype` asks ``numpy_helper.to_array`` (what ``ReferenceEvaluator`` converts initializers with)
  and :func:`raw_type_refusal` says why a type cannot be produced from raw bytes here, if it cannot.
* onnx 1.17's ``numpy_helper.to_array`` ignores the ``raw_data`` of a BFLOAT16 tensor (it reads ``int32_data``
  only and returns uninitialized memory), so its own evaluator returns garbage for an external bfloat16
  initializer: :func:`to_array_reads_raw_data` detects it and :func:`onnx_readable_tensor` writes such values in the
  typed field that onnx reads.

This module must never change onnx's behaviour for the newest onnx (on it every shim is a pass-through), and must
never import ``onnx.reference`` at import time (the io tools import this module; the evaluator's signature is
read on first use).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, numpy_helper
from onnx.defs import OpSchema

from onnx_light_ref.errors import UnsupportedOnnxFeatureError

logger = logging.getLogger(__name__)

ONNX_VERSION: str = onnx.__version__
"""The installed onnx's version, for messages only (features are detected, not compared by version)."""

HAS_PYTHON_SHAPE_INFERENCE: bool = hasattr(OpSchema, "set_type_and_shape_inference_function")
"""True when a Python ``OpSchema`` can carry a shape-inference function (onnx >= 1.19)."""


@functools.cache
def _evaluator_keywords() -> frozenset[str]:
    # Imported on first use: onnx.reference is slow to import and the io tools never need it.
    from onnx.reference import ReferenceEvaluator

    return frozenset(inspect.signature(ReferenceEvaluator.__init__).parameters)


def evaluator_checks_shapes() -> bool:
    """True when ``ReferenceEvaluator`` takes ``check_shape_annotations`` (onnx >= 1.23)."""
    return "check_shape_annotations" in _evaluator_keywords()


# The first onnx release with each evaluator keyword we know of, named in the error when it is missing.
_EVALUATOR_KEYWORD_SINCE = {"check_shape_annotations": "1.23"}


def evaluator_shape_checks() -> dict[str, Any]:
    """Keyword arguments turning on ``ReferenceEvaluator``'s output-shape checks where onnx has them.

    Returns:
        ``{"check_shape_annotations": True}`` on onnx >= 1.23, ``{}`` before (those evaluators do not check the
        declared output shapes, and do not accept the keyword).
    """
    return {"check_shape_annotations": True} if evaluator_checks_shapes() else {}


def refuse_unsupported_evaluator_options(options: dict[str, Any]) -> None:
    """Raise a clear error for a ``ReferenceEvaluator`` keyword this onnx does not take, before it is called.

    Without this, onnx's own ``TypeError`` ("unexpected keyword argument") names neither the keyword's origin
    nor the onnx version that has it.

    Args:
        options: The keyword arguments about to be passed to ``ReferenceEvaluator``.

    Raises:
        UnsupportedOnnxFeatureError: a keyword in :data:`_EVALUATOR_KEYWORD_SINCE` the installed onnx lacks.
    """
    for name, since in _EVALUATOR_KEYWORD_SINCE.items():
        if name in options and name not in _evaluator_keywords():
            raise UnsupportedOnnxFeatureError(
                f"ReferenceEvaluator keyword {name!r} needs onnx >= {since}; the installed onnx {ONNX_VERSION} "
                f"does not have it (drop the keyword or upgrade onnx)."
            )


def attach_inference_function(schema: OpSchema, function: Callable[[Any], None]) -> bool:
    """Attach a Python shape-inference function to an unregistered schema where onnx allows it.

    Args:
        schema: A schema not registered yet (onnx copies it at registration; a function set later is ignored).
        function: Called by onnx with an ``InferenceContext``.

    Returns:
        True when attached; False on onnx < 1.19, whose ``OpSchema`` cannot carry a Python function (the schema
        then serves the checker only, and shape inference leaves the node's outputs untyped).
    """
    if not HAS_PYTHON_SHAPE_INFERENCE:
        return False
    schema.set_type_and_shape_inference_function(function)
    return True


_registered_lock = threading.Lock()
_registered: list[tuple[str, int, str]] = []


def _deregister_all() -> None:
    # Runs at interpreter exit, GIL held: the registry drops its copies (and their Python function) now, not in
    # onnx's static destructors after finalization, where onnx 1.19-1.22 hang or crash taking the GIL.
    with _registered_lock:
        while _registered:
            op_type, version, domain = _registered.pop()
            try:
                onnx.defs.deregister_schema(op_type, version, domain)
            except onnx.defs.SchemaError:
                logger.debug("schema %s::%s v%d already deregistered at exit", domain, op_type, version)


def register_schema_until_exit(schema: OpSchema) -> None:
    """``onnx.defs.register_schema``, plus its deregistration when the interpreter exits.

    A schema holding a Python inference function must leave onnx's registry while Python still runs: otherwise
    onnx 1.19 hangs and 1.21/1.22 segfault at exit, destroying the function without the GIL. Deregistering it in
    an ``atexit`` hook is harmless on every onnx (nothing uses the registry after the hooks).

    Args:
        schema: The schema to register.

    Raises:
        onnx.defs.SchemaError: onnx refused it (for instance, the same op, domain and version is registered).
    """
    onnx.defs.register_schema(schema)
    with _registered_lock:
        first = not _registered
        _registered.append((schema.name, schema.since_version, schema.domain))
    if first:
        atexit.register(_deregister_all)


# Bytes per element in raw_data of the types whose numpy dtype depends on the onnx release (float32 before onnx
# 1.19 for all of these). Looked up by name: a type the installed onnx does not define is simply absent.
_FIXED_RAW_SIZES_BY_NAME = {
    "BFLOAT16": 2,
    "FLOAT8E4M3FN": 1,
    "FLOAT8E4M3FNUZ": 1,
    "FLOAT8E5M2": 1,
    "FLOAT8E5M2FNUZ": 1,
    "FLOAT8E8M0": 1,
}
_FIXED_RAW_SIZES = {
    getattr(TensorProto, name): size for name, size in _FIXED_RAW_SIZES_BY_NAME.items() if hasattr(TensorProto, name)
}


def raw_element_size(data_type: int) -> int | None:
    """Stored byte size of one element in ``raw_data`` for the types onnx releases map to different numpy dtypes.

    Args:
        data_type: A ``TensorProto.DataType`` value.

    Returns:
        2 for bfloat16, 1 for the float8 types, None for any other type (ask onnx's numpy mapping).
    """
    return _FIXED_RAW_SIZES.get(data_type)


# The largest int32_data entry of the types whose entries hold bit patterns: one element's (float16, bfloat16, float8,
# float6) or two packed 4-bit ones (float4). onnx.proto says they MUST fit; onnxruntime refuses a larger or negative
# entry ("data overflow") while onnx's numpy_helper keeps its low bits (0x13C00 read as 1.0), so bytes compared after
# onnx's conversion would call such a tensor equal to one no runtime loads. By number: onnx 1.17 lacks the newer ones.
_INT32_DATA_LIMITS = {
    TensorProto.FLOAT16: 0xFFFF,
    TensorProto.BFLOAT16: 0xFFFF,
    **dict.fromkeys((17, 18, 19, 20, 23, 24), 0xFF),  # FLOAT8E4M3FN(UZ), FLOAT8E5M2(FNUZ), FLOAT4E2M1, FLOAT8E8M0
    **dict.fromkeys((27, 28), 0x3F),  # FLOAT6E2M3, FLOAT6E3M2: "bits 6-31 MUST be zero"
}


def _check_int32_data(tensor: TensorProto) -> None:
    """Refuse ``int32_data`` entries that are no value of the tensor's type, or that the loaders read differently.

    A BOOL entry is true when it is not 0 for onnxruntime and onnx 1.17, when its low byte is not 0 for onnx 1.18 and
    newer (which keep the low byte): they agree except on a non-zero entry whose low byte is 0 (256...), refused.
    """
    limit = _INT32_DATA_LIMITS.get(tensor.data_type)
    if limit is None and tensor.data_type != TensorProto.BOOL:
        return
    values = np.asarray(tensor.int32_data, dtype=np.int64)
    if limit is not None:
        bad = np.flatnonzero((values < 0) | (values > limit))
        if bad.size:
            raise ValueError(
                f"int32_data[{bad[0]}] is {values[bad[0]]}, not a {element_type_name(tensor.data_type)} bit pattern "
                f"(0 to {limit:#x}): onnxruntime refuses it (data overflow), onnx keeps its low bits"
            )
        return
    bad = np.flatnonzero((values != 0) & (values & 0xFF == 0))
    if bad.size:
        raise ValueError(
            f"int32_data[{bad[0]}] is {values[bad[0]]}, a BOOL that onnxruntime and onnx 1.17 read as true and "
            "onnx 1.18 and newer as false (they keep its low byte); store 0 or 1"
        )


def typed_raw_bytes(tensor: TensorProto) -> bytes:
    """The ``raw_data`` bytes of a tensor held in typed fields, as the loaders convert them (sub-byte packing included).

    ``numpy_helper.from_array(numpy_helper.to_array(tensor))``, through :func:`array_raw_bytes` (which packs an odd
    count of sub-byte values where this onnx's ``from_array`` refuses to). ``int32_data`` entries that are no value
    of the type are refused: a float16, bfloat16, float8, float4 or float6 bit pattern out of its range (onnxruntime
    refuses the model, onnx would keep the low bits), a BOOL the loaders read differently (256: see
    :func:`_check_int32_data`). A BOOL entry such as 2 is true, one byte 1, as every loader reads it.

    Args:
        tensor: a tensor whose values are in its typed fields (``float_data``, ``int32_data``...).

    Returns:
        Its little-endian raw bytes.

    Raises:
        ValueError: the typed data do not fit the dims and data type (also ``TypeError`` or ``KeyError``, as onnx
            raises them for an unknown or unconvertible type).

    Example:
        >>> typed_raw_bytes(TensorProto(data_type=TensorProto.BOOL, dims=[2], int32_data=[2, 0]))
        b'\\x01\\x00'
    """
    _check_int32_data(tensor)
    array = numpy_helper.to_array(tensor)
    if tensor.data_type == TensorProto.BOOL:
        array = array.view(np.uint8) != 0  # onnx 1.18+ keeps a 2 as the byte 2
    return array_raw_bytes(array, tensor.data_type)


def array_raw_bytes(array: np.ndarray, data_type: int | None = None) -> bytes:
    """The ``raw_data`` onnx writes for an array of its own representation (``numpy_helper.from_array``).

    Where this onnx's ``from_array`` cannot pack an odd count of sub-byte values (INT4/UINT4 on onnx 1.17), the
    values are padded with zeros (of their own numpy type) to whole bytes, packed by onnx, and cut to the bytes the
    tensor's count needs: the bytes newer onnx writes.

    Args:
        array: values in the numpy type onnx maps the element type to (:func:`evaluator_dtype`).
        data_type: the ``TensorProto.DataType`` the array stands for (default: what onnx maps its dtype to).

    Returns:
        The little-endian raw bytes, packed as onnx.proto documents.

    Raises:
        ValueError: onnx cannot convert the array (also ``TypeError`` or ``KeyError``, as onnx raises them).
    """
    try:
        return numpy_helper.from_array(array).raw_data
    except ValueError:
        # Imported here: onnx_light_ref.io's package imports modules that import this one (an import cycle).
        from onnx_light_ref.io._read.dtype_sizes import element_bits, packed_nbytes

        if data_type is None:
            data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        bits = element_bits(data_type)
        if bits is None or bits >= 8 or (array.size * bits) % 8 == 0:
            raise  # not the odd-count packing refusal: a real mismatch
        count = array.size
        while (count * bits) % 8:
            count += 1
        padded = np.zeros(count, dtype=array.dtype)  # keeps onnx's custom sub-byte dtype, which from_array packs
        padded[: array.size] = array.ravel()
        needed = packed_nbytes(data_type, array.size)
        assert needed is not None
        return numpy_helper.from_array(padded).raw_data[:needed]


# Element types of onnx.proto that an older supported onnx may not define, by number, so that a refusal can name
# the type on every release (the names are onnx.proto's).
_NAMES_OF_NEWER_TYPES = {
    23: "FLOAT4E2M1",
    24: "FLOAT8E8M0",
    25: "UINT2",
    26: "INT2",
    27: "FLOAT6E2M3",
    28: "FLOAT6E3M2",
}


def element_type_name(data_type: int) -> str | None:
    """onnx.proto's upper-case name of an element type, also for types newer than the installed onnx; else None."""
    try:
        return str(TensorProto.DataType.Name(data_type))
    except ValueError:
        return _NAMES_OF_NEWER_TYPES.get(data_type)


def _defined(data_type: int) -> bool:
    try:
        TensorProto.DataType.Name(data_type)
    except ValueError:
        return False
    return True


@functools.cache
def evaluator_dtype(data_type: int) -> np.dtype | None:
    """The numpy dtype onnx's evaluator holds a tensor of ``data_type`` in, or None when this onnx has none.

    It is the dtype of ``numpy_helper.to_array`` on an empty tensor of that type: ``ReferenceEvaluator`` converts
    initializers with that function, so it is the representation every operator of this onnx expects (an
    ml_dtypes type on current onnx, an onnx structured dtype on onnx 1.17). ``helper.tensor_dtype_to_np_dtype``
    is not asked: onnx 1.17 maps bfloat16 and the float8 types to float32 there.

    Args:
        data_type: a ``TensorProto.DataType`` value (any int).

    Returns:
        The dtype; None for UNDEFINED, STRING, a type this onnx does not define or cannot convert.
    """
    if data_type in (TensorProto.UNDEFINED, TensorProto.STRING) or not _defined(data_type):
        return None
    try:
        return numpy_helper.to_array(TensorProto(data_type=data_type, dims=[0])).dtype
    except (KeyError, TypeError, ValueError, NotImplementedError):
        return None


# Every 4-bit code twice, as packed bytes: 0x10, 0x32, ... (low nibble first, as onnx.proto packs them).
_SUB_BYTE_PROBE = bytes(range(256))


@functools.cache
def raw_type_refusal(data_type: int) -> str | None:
    """Why raw bytes of ``data_type`` cannot become onnx's own array on the installed onnx; None when they can.

    A type qualifies when this onnx defines it, it has a fixed size in ``raw_data``, ``numpy_helper.to_array``
    gives it a numpy representation (:func:`evaluator_dtype`), and that representation holds the raw layout: one
    element per ``itemsize`` bytes for byte-sized types, and for packed sub-byte types (two int4 per byte, four
    int2, four float6 in three bytes) onnx's own unpacking (``to_array``) and packing (``from_array``) agree on
    every code.

    Args:
        data_type: a ``TensorProto.DataType`` value (any int).

    Returns:
        None, or a sentence naming the type, the installed onnx and what is missing.
    """
    from onnx_light_ref.io._read.dtype_sizes import element_bits

    name = element_type_name(data_type)
    label = f"element type {data_type} ({name})" if name else f"element type {data_type}"
    if not _defined(data_type):
        if name is None:
            return f"{label} is not an ONNX element type"
        return f"the installed onnx {ONNX_VERSION} does not define {label}; a newer onnx does"
    if data_type == TensorProto.STRING:
        return f"{label} is not stored as raw bytes"
    bits = element_bits(data_type)
    dtype = evaluator_dtype(data_type)
    if bits is None or dtype is None:
        return f"onnx {ONNX_VERSION}'s numpy_helper.to_array has no numpy representation for {label}"
    if bits % 8 == 0:
        if dtype.itemsize * 8 != bits:
            return (
                f"onnx {ONNX_VERSION} represents {label} as {dtype} ({dtype.itemsize} bytes), not in its {bits // 8}-"
                "byte raw layout"
            )
        return None
    return _sub_byte_refusal(data_type, label, bits, dtype)


def _sub_byte_refusal(data_type: int, label: str, bits: int, dtype: np.dtype) -> str | None:
    """The packed types: onnx must unpack every code and pack it back to the same bytes."""
    nbytes = len(_SUB_BYTE_PROBE) // 24 * 24  # whole groups of every packing (3 bytes hold four 6-bit values)
    raw = _SUB_BYTE_PROBE[:nbytes]
    count = nbytes * 8 // bits
    try:
        array = numpy_helper.to_array(TensorProto(data_type=data_type, dims=[count], raw_data=raw))
        packed = array_raw_bytes(array, data_type)
    except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
        return f"onnx {ONNX_VERSION} cannot unpack and pack {label} ({type(exc).__name__}: {exc})"
    if array.dtype != dtype or array.shape != (count,) or packed != raw:
        return f"onnx {ONNX_VERSION}'s numpy_helper does not unpack and pack {label} back to the same bytes"
    return None


@functools.cache
def to_array_reads_raw_data(data_type: int) -> bool:
    """Whether ``numpy_helper.to_array`` reads the ``raw_data`` of ``data_type`` back as those bytes.

    onnx 1.17's BFLOAT16 branch does not: it reads ``int32_data`` only and returns uninitialized memory.

    Args:
        data_type: a ``TensorProto.DataType`` value.

    Returns:
        True when eight elements written as raw bytes come back as the same bytes (packed types: packed again by
        onnx); False for a type without a representation.
    """
    from onnx_light_ref.io._read.dtype_sizes import element_bits, packed_nbytes

    bits = element_bits(data_type)
    if evaluator_dtype(data_type) is None or bits is None:
        return False
    count = 8  # whole bytes in every packing: 8 six-bit values are 6 bytes
    nbytes = packed_nbytes(data_type, count)
    assert nbytes is not None
    # bool: only 0 and 1 are values; elsewhere distinct bytes no uninitialized buffer is likely to hold.
    raw = bytes(i % 2 if data_type == TensorProto.BOOL else 0x41 + i for i in range(nbytes))
    try:
        array = numpy_helper.to_array(TensorProto(data_type=data_type, dims=[count], raw_data=raw))
        back = array_raw_bytes(array, data_type) if bits % 8 else array.tobytes()
    except (KeyError, TypeError, ValueError, NotImplementedError):
        return False
    return bool(back == raw)


def onnx_readable_tensor(data_type: int, dims: list[int], raw: bytes, name: str = "") -> TensorProto:
    """A TensorProto holding ``raw`` (a tensor's raw bytes) in the form the installed onnx reads back exactly.

    ``raw_data`` where ``numpy_helper.to_array`` reads it; otherwise (BFLOAT16 on onnx 1.17) the typed field
    onnx.proto stores the type in, ``int32_data``, one element's bits per entry. Conformance outputs and test
    oracles are written this way, so that onnx's own loader and evaluator see the intended values.

    Args:
        data_type: the element type.
        dims: the tensor's dimensions.
        raw: its little-endian raw bytes (``ceil(count * bits / 8)`` of them).
        name: the tensor's name.

    Returns:
        A new TensorProto.

    Raises:
        ValueError: onnx ignores the raw bytes of a type without a known typed field (no onnx release is known to).
    """
    tensor = TensorProto(name=name, data_type=data_type, dims=dims)
    if evaluator_dtype(data_type) is None or to_array_reads_raw_data(data_type):
        tensor.raw_data = raw
        return tensor
    size = _FIXED_RAW_SIZES.get(data_type)
    if size is None:
        raise ValueError(
            f"onnx {ONNX_VERSION}'s numpy_helper.to_array ignores raw_data of element type {data_type} "
            f"({element_type_name(data_type)}), and no typed field is known to hold it."
        )
    # From the array itself: a list of Python ints would cost ~36 bytes per element for a moment.
    tensor.int32_data.extend(np.frombuffer(raw, dtype=f"<u{size}").astype(np.int32))
    return tensor


def onnx_ignores_raw_data(tensor: TensorProto) -> bool:
    """Whether the installed onnx's ``numpy_helper.to_array`` (so its evaluator) would ignore ``tensor``'s inline
    ``raw_data``: a BFLOAT16 tensor on onnx 1.17, read as uninitialized memory there. False on the newest onnx."""
    data_type = tensor.data_type
    return (
        tensor.HasField("raw_data")
        and evaluator_dtype(data_type) is not None
        and not to_array_reads_raw_data(data_type)
        and data_type in _FIXED_RAW_SIZES
    )


def make_onnx_readable(tensor: TensorProto) -> bool:
    """Move ``tensor``'s ``raw_data`` into the typed field the installed onnx reads, where it would ignore it.

    Every path that hands onnx's evaluator a tensor with ``raw_data`` calls it (eagerly loaded external tensors,
    inline initializers and attribute tensors, the backend's models): on onnx 1.17 a BFLOAT16 tensor becomes
    ``int32_data`` (:func:`onnx_readable_tensor`), elsewhere nothing changes. A tensor whose ``raw_data`` does not
    fit its dims is left as it is, for onnx to refuse.

    Args:
        tensor: the tensor, rewritten in place.

    Returns:
        Whether it was rewritten.

    Example:
        >>> t = TensorProto(data_type=TensorProto.BFLOAT16, dims=[1], raw_data=b"\\x80\\x3f")
        >>> make_onnx_readable(t) == (not to_array_reads_raw_data(TensorProto.BFLOAT16))
        True
    """
    if not onnx_ignores_raw_data(tensor):
        return False
    raw = tensor.raw_data
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if len(raw) != count * _FIXED_RAW_SIZES[tensor.data_type]:
        return False
    readable = onnx_readable_tensor(tensor.data_type, list(tensor.dims), raw)
    tensor.ClearField("raw_data")
    tensor.int32_data.extend(readable.int32_data)
    return True


def readable_tensor_from_array(array: np.ndarray, name: str = "") -> TensorProto:
    """``numpy_helper.from_array``, in the form the installed onnx reads back as the same array.

    Differs from ``from_array`` only where that would not round-trip: an odd count of int4/uint4 (refused by
    onnx 1.17's ``from_array``, see :func:`array_raw_bytes`) and bfloat16 on onnx 1.17 (written in ``int32_data``,
    see :func:`onnx_readable_tensor`). Used for conformance outputs, which onnx's Runner loads with ``to_array``.

    Args:
        array: values in onnx's representation of their type (strings: any numpy string or object array).
        name: the tensor's name.

    Returns:
        A new TensorProto.
    """
    if array.dtype == object or np.issubdtype(array.dtype, np.str_):
        return numpy_helper.from_array(array, name)
    data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    return onnx_readable_tensor(data_type, list(array.shape), array_raw_bytes(array, data_type), name)
