"""Fuzzing the wire-format reader: damaged and random protobuf encodings of a small but complete ONNX model.

Inputs: every truncation of the seed model; the seed with bytes flipped; the seed with varints of random values and
random (also over-long) encodings spliced in; and random field trees (any field number, any wire type including the
invalid and group ones, nested messages with right or wrong lengths).

Properties of :func:`load_model_stripped` on each input:

* it returns or raises :class:`InvalidModelError`, nothing else (an ``AssertionError`` from the read guard below, a
  ``RecursionError``, an ``IndexError``... fail the test);
* it never asks the OS for a byte past the end of the file (the guard wraps the module's ``pread_exact``);
* it terminates (a SIGALRM guard turns a hang into a failure; hypothesis' deadline catches slowness);
* when it succeeds, protobuf parses the whole file too, and the stripped model with the payloads put back from the
  reported file ranges equals protobuf's parse; every payload lies inside the file;
* when it refuses, protobuf refuses the whole file too, unless the refusal is one of ours by design (nesting past
  protobuf's own limit); groups (wire types 3 and 4, legal in unknown fields) are skipped exactly as protobuf skips
  them, well formed or not, at any place of a model;
* no read overlaps a stripped payload by a whole read-ahead window (payloads are skipped, not read).

Every property also runs with tiny read-ahead windows (10 to 64 bytes), so window edges fall inside tags, varints
and payloads of these small inputs.

A second family starts from valid models (hypothesis builds them: tensors with ``raw_data`` longer than the
placeholder as initializers, sparse values and indices, attribute ``t``/``tensors``/``sparse_tensor(s)``, in
subgraphs two levels deep, in functions and ``training_info``), then damages them: truncation, flipped bytes, a
spliced varint, or a length prefix changed (found by an independent tolerant walk). Intact ones must be accepted with
exactly the payloads protobuf's parse has.

``WIRE_FUZZ_EXAMPLES`` sets the number of examples per property (200 by default, 100 for the model family, so the
suite stays fast).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from unittest import mock

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io._read import wire
from onnx_light_ref.io._read.wire import StrippedModel, load_model_stripped
from tests.wire_writer import encode_varint, field_key

EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "200"))
# Generating a model costs more than damaging bytes: fewer by default, as many as asked for in a campaign.
MODEL_EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
# Read-ahead windows: tiny ones put window edges inside tags, varints and payloads of small inputs (>= 10 bytes, the
# longest varint, which the reader relies on), and the real 64 KiB one.
WINDOWS = st.sampled_from([10, 16, 23, 64, 65536])
# Refusals protobuf itself would not make: nesting is capped at protobuf's default limit. (Groups are skipped as
# protobuf skips them: a refusal there must be protobuf's too.)
OURS_BY_DESIGN = ("nested deeper than",)


def floats(name: str, count: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(count, dtype=np.float32), name)


def seed_model() -> bytes:
    """A few hundred bytes holding a tensor in every kind of place the reader descends into."""
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["a"], value=floats("then_attr", 12))],
        "then",
        [],
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [12])],
        initializer=[floats("then_init", 10)],
    )
    sparse = helper.make_sparse_tensor(
        floats("sv", 10), numpy_helper.from_array(np.arange(10, dtype=np.int64), "si"), [20]
    )
    graph = helper.make_graph(
        [
            helper.make_node("If", ["c"], ["a"], then_branch=then, else_branch=then),
            helper.make_node("Custom", [], ["z"], domain="ai.test", ts=[floats("ts", 9)], sp=sparse),
        ],
        "main",
        [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [12])],
        initializer=[floats("w", 16), helper.make_tensor("typed", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])],
        sparse_initializer=[sparse],
    )
    function = helper.make_function(
        "ai.test", "F", [], ["Y"], [helper.make_node("Constant", [], ["Y"], value=floats("fn", 11))], []
    )
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 18)])
    model.training_info.add().algorithm.CopyFrom(then)
    return model.SerializeToString()


SEED = seed_model()


@pytest.fixture(scope="module", name="workdir")
def _workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wire_fuzz")


def all_tensors(message: Message) -> Iterator[onnx.TensorProto]:
    for descriptor, value in message.ListFields():
        if descriptor.type == descriptor.TYPE_MESSAGE:
            for item in value if descriptor.is_repeated else [value]:
                if isinstance(item, onnx.TensorProto):
                    yield item
                yield from all_tensors(item)


def _on_alarm(signum: int, frame: object) -> None:
    raise TimeoutError("the scan did not terminate within 10 s")


@contextlib.contextmanager
def guarded(module: ModuleType = wire) -> Iterator[list[tuple[int, int]]]:
    """Fail on any read past the end of the file, and on a scan that does not end (``module``'s ``pread_exact``:
    the wire reader's, or the reference scan's)."""
    reads: list[tuple[int, int]] = []
    real = module.pread_exact

    def checked(fd: int, buffer: memoryview, offset: int) -> int:
        size = os.fstat(fd).st_size
        assert offset >= 0 and offset + len(buffer) <= size, f"read of {len(buffer)} at {offset} past EOF {size}"
        reads.append((offset, len(buffer)))
        return real(fd, buffer, offset)

    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(10)
    try:
        with mock.patch.object(module, "pread_exact", checked):
            yield reads
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def protobuf_parse(data: bytes) -> onnx.ModelProto | None:
    """What protobuf makes of the whole file (None if it refuses it or it has no graph)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        return None
    return model if model.HasField("graph") else None


def outcome(stripped: StrippedModel | str) -> str:
    """A short label for hypothesis' statistics (``pytest --hypothesis-show-statistics``)."""
    if isinstance(stripped, StrippedModel):
        return f"accepted with {len(stripped.payloads)} payloads"
    reason = re.search(r"model[:( ]+(.*?)(?: at byte offset| \(|$)", stripped)
    return "refused: " + re.sub(r"\d+", "N", reason.group(1) if reason else stripped)[:50]


def check(data: bytes, workdir: Path, min_length: int = 0, window: int | None = None) -> StrippedModel | str:
    """Run the reader on ``data`` and check every property in the module docstring; return the result or the error.

    ``window`` shrinks the read-ahead window (default 64 KiB) so that small inputs cross window edges everywhere.
    """
    path = workdir / "fuzz.onnx"
    path.write_bytes(data)
    expected = protobuf_parse(data)
    window = window or wire._WINDOW
    with guarded() as reads, mock.patch.object(wire, "_WINDOW", window):
        try:
            stripped = load_model_stripped(path, min_length)
        except InvalidModelError as exc:
            message = str(exc)
            assert "byte offset" in message or "protobuf cannot parse" in message or "no graph" in message
            assert expected is None or any(reason in message for reason in OURS_BY_DESIGN), message
            return message
    assert expected is not None, "accepted a file protobuf refuses"
    for payload in stripped.payloads:
        assert payload.offset >= 0 and payload.offset + payload.length <= len(data)
        for offset, length in reads:  # payloads are skipped: only a window's read-ahead may run into one
            overlap = min(offset + length, payload.offset + payload.length) - max(offset, payload.offset)
            assert overlap < window, f"read of {length} at {offset} covers payload {payload}"
    back = onnx.ModelProto()
    back.CopyFrom(stripped.model)
    for tensor in all_tensors(back):
        found = stripped.payload(tensor)
        if found is not None:
            tensor.raw_data = data[found.offset : found.offset + found.length]
    assert back == expected
    return stripped


@pytest.mark.parametrize("window", [65536, 10])
@pytest.mark.parametrize("min_length", [0, 48])
def test_every_truncation_of_the_seed(workdir, min_length, window):
    seed = check(SEED, workdir, min_length, window)
    assert isinstance(seed, StrippedModel)
    # w; then/else branches x (attr, init); ts; sparse values+indices, as initializer and attribute; fn; algorithm x 2
    assert len(seed.payloads) == (13 if min_length == 0 else 6)
    for end in range(len(SEED)):
        check(SEED[:end], workdir, min_length, window)


@FUZZ
@given(
    flips=st.lists(st.tuples(st.integers(0, len(SEED) - 1), st.integers(1, 255)), min_size=1, max_size=6),
    window=WINDOWS,
)
@example(flips=[(417, 1)], window=10)  # a field number 0 in an unknown group of a node (found by hypothesis)
def test_flipped_bytes(workdir, flips, window):
    data = bytearray(SEED)
    for position, mask in flips:
        data[position] ^= mask
    event(outcome(check(bytes(data), workdir, window=window)))


@pytest.mark.parametrize("value", [b"\x00\x05", b"\x01" + bytes(8), b"\x05" + bytes(4), b"\x02\x01z", b"\x03\x04"])
@pytest.mark.parametrize("place", ["a node holding a tensor", "a small node"])
def test_a_field_number_0_inside_a_group_is_skipped_as_onnx_load_skips_it(workdir, value, place):
    """A group (field 20 of a node, unknown) holding a field number 0 of each wire type (a nested group of field 0
    too): upb, the protobuf of ``onnx.load``, skips it with the group, and so does the reader, in a node it walks (one
    with a tensor attribute) and in one it leaves to protobuf. Found by hypothesis: the reader refused it where it
    walked the node. (C++ protobuf, which onnx's checker and onnxruntime parse with, refuses the file: shown here so
    that a change of either side shows.)"""
    import onnxruntime as ort

    if place == "a small node":
        node = helper.make_node("Identity", ["x"], ["y"])
    else:
        node = helper.make_node("Add", ["x", "c"], ["y"])
        node.attribute.append(helper.make_attribute("unused", floats("t", 64)))  # 256 bytes: the reader walks it
    carrier = onnx.NodeProto()
    carrier.ParseFromString(node.SerializeToString() + b"\xa3\x01" + value + b"\xa4\x01")
    info = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("x", "y")]
    graph = helper.make_graph([carrier], "g", info[:1], info[1:])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()

    assert protobuf_parse(data) is not None
    result = check(data, workdir)  # equal to protobuf's parse, payloads put back
    assert isinstance(result, StrippedModel), result
    assert len(result.payloads) == (1 if place == "a node holding a tensor" else 0)
    path = workdir / "group.onnx"
    path.write_bytes(data)
    with pytest.raises(Exception, match=r"(?i)unable to parse proto"):
        onnx.checker.check_model(str(path))
    with pytest.raises(Exception, match=r"INVALID_PROTOBUF"):
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])


@FUZZ
@given(
    position=st.integers(0, len(SEED)),
    replaced=st.integers(0, 4),
    value=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1), st.sampled_from([2**31, 2**32, 2**63])),
    width=st.integers(1, 12),
    window=WINDOWS,
)
def test_spliced_varints(workdir, position, replaced, value, width, window):
    data = SEED[:position] + encode_varint(value, min_bytes=width) + SEED[position + replaced :]
    event(outcome(check(data, workdir, window=window)))


FIELD_NUMBERS = st.one_of(st.sampled_from([1, 2, 5, 6, 7, 9, 10, 11, 15, 20, 22, 23, 25]), st.integers(0, 2**29 + 3))


def encode_tree(fields: list) -> bytes:
    out = bytearray()
    for number, wire_type, content, length_delta in fields:
        out += field_key(number, wire_type) if number < 2**29 else encode_varint((number << 3) | wire_type)
        if wire_type == 2:
            body = encode_tree(content) if isinstance(content, list) else content
            out += encode_varint(max(0, len(body) + length_delta)) + body
        elif isinstance(content, bytes):
            out += content
    return bytes(out)


LEAF = st.tuples(FIELD_NUMBERS, st.integers(0, 7), st.binary(max_size=40), st.sampled_from([0, 0, 0, -1, 1, 1000]))
TREES = st.recursive(
    st.lists(LEAF, max_size=4),
    lambda children: st.lists(
        st.tuples(FIELD_NUMBERS, st.just(2), children, st.sampled_from([0, 0, 0, 0, -1, 1, 7])), max_size=4
    ),
    max_leaves=30,
)


@FUZZ
@given(tree=TREES, with_graph=st.booleans())
def test_random_field_trees(workdir, tree, with_graph):
    data = encode_tree(tree)
    if with_graph:
        data += field_key(7, 2) + encode_varint(len(data)) + data
    event(outcome(check(data, workdir)))


# ---------------------------------------------------------------------------------------------------------------
# Valid-ish models with strippable payloads at random places, then damaged. The field trees above almost never form
# a TensorProto with a long raw_data inside the right chain of messages; these do, so the stripping and
# re-encoding paths (and the refusals inside them) are what gets fuzzed.

NAMES = st.text("abcxyz_0123456789", min_size=1, max_size=6)
# Mostly longer than the 32-byte placeholder, some at or below it (they stay inline), some far above the windows.
RAW = st.one_of(st.binary(min_size=33, max_size=80), st.binary(max_size=33), st.binary(min_size=100, max_size=300))


@st.composite
def tensors(draw: st.DrawFn) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name=draw(NAMES), data_type=onnx.TensorProto.UINT8)
    raw = draw(RAW)
    tensor.dims.append(len(raw))
    tensor.raw_data = raw
    extra = draw(st.sampled_from(["", "", "typed", "external", "doc"]))
    if extra == "typed":  # raw_data and a typed field together: invalid for onnx, still protobuf
        tensor.float_data.extend(draw(st.lists(st.sampled_from([0.0, 1.5, -2.0, 3e38]), max_size=3)))
    elif extra == "external":
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", draw(NAMES)
    elif extra == "doc":
        tensor.doc_string = draw(st.text(max_size=20))
    return tensor


@st.composite
def sparse_tensors(draw: st.DrawFn) -> onnx.SparseTensorProto:
    sparse = onnx.SparseTensorProto()
    sparse.values.CopyFrom(draw(tensors()))
    if draw(st.booleans()):
        sparse.indices.CopyFrom(draw(tensors()))
    sparse.dims.extend(draw(st.lists(st.integers(0, 50), max_size=2)))
    return sparse


def attributes(graphs: st.SearchStrategy[onnx.GraphProto]) -> st.SearchStrategy[onnx.AttributeProto]:
    A = onnx.AttributeProto

    @st.composite
    def build(draw: st.DrawFn) -> onnx.AttributeProto:
        attribute = onnx.AttributeProto(name=draw(NAMES))
        kind = draw(st.sampled_from(["t", "tensors", "sparse_tensor", "sparse_tensors", "g", "graphs", "i", "s"]))
        if kind == "t":
            attribute.type = A.TENSOR
            attribute.t.CopyFrom(draw(tensors()))
        elif kind == "tensors":
            attribute.type = A.TENSORS
            attribute.tensors.extend(draw(st.lists(tensors(), max_size=3)))
        elif kind == "sparse_tensor":
            attribute.type = A.SPARSE_TENSOR
            attribute.sparse_tensor.CopyFrom(draw(sparse_tensors()))
        elif kind == "sparse_tensors":
            attribute.type = A.SPARSE_TENSORS
            attribute.sparse_tensors.extend(draw(st.lists(sparse_tensors(), max_size=2)))
        elif kind == "g":
            attribute.type = A.GRAPH
            attribute.g.CopyFrom(draw(graphs))
        elif kind == "graphs":
            attribute.type = A.GRAPHS
            attribute.graphs.extend(draw(st.lists(graphs, max_size=2)))
        elif kind == "i":
            attribute.type, attribute.i = A.INT, draw(st.integers(-(2**63), 2**63 - 1))
        else:
            attribute.type, attribute.s = A.STRING, draw(st.binary(max_size=60))
        return attribute

    return build()


def nodes(graphs: st.SearchStrategy[onnx.GraphProto]) -> st.SearchStrategy[onnx.NodeProto]:
    @st.composite
    def build(draw: st.DrawFn) -> onnx.NodeProto:
        node = onnx.NodeProto(op_type=draw(st.sampled_from(["Constant", "If", "Loop", "Custom"])), name=draw(NAMES))
        node.input.extend(draw(st.lists(NAMES, max_size=2)))
        node.output.append(draw(NAMES))
        node.attribute.extend(draw(st.lists(attributes(graphs), max_size=3)))
        return node

    return build()


def graphs(depth: int) -> st.SearchStrategy[onnx.GraphProto]:
    """Graphs with subgraphs down to ``depth`` more levels."""
    inner = graphs(depth - 1) if depth > 0 else st.builds(onnx.GraphProto, name=NAMES)

    @st.composite
    def build(draw: st.DrawFn) -> onnx.GraphProto:
        graph = onnx.GraphProto(name=draw(NAMES))
        graph.node.extend(draw(st.lists(nodes(inner), max_size=3)))
        graph.initializer.extend(draw(st.lists(tensors(), max_size=4)))
        graph.sparse_initializer.extend(draw(st.lists(sparse_tensors(), max_size=2)))
        if draw(st.booleans()):
            graph.output.append(helper.make_tensor_value_info(draw(NAMES), onnx.TensorProto.FLOAT, [3]))
        return graph

    return build()


@st.composite
def models(draw: st.DrawFn) -> onnx.ModelProto:
    model = onnx.ModelProto(ir_version=10, producer_name=draw(st.text(max_size=8)))
    model.opset_import.append(helper.make_opsetid("", 18))
    model.graph.CopyFrom(draw(graphs(2)))
    for _ in range(draw(st.integers(0, 2))):
        function = model.functions.add(name=draw(NAMES), domain="ai.test")
        function.node.extend(draw(st.lists(nodes(graphs(0)), max_size=2)))
        function.attribute_proto.extend(draw(st.lists(attributes(graphs(0)), max_size=2)))
    for _ in range(draw(st.integers(0, 1))):
        info = model.training_info.add()
        info.initialization.CopyFrom(draw(graphs(1)))
        if draw(st.booleans()):
            info.algorithm.CopyFrom(draw(graphs(0)))
    return model


def length_prefixes(data: bytes, start: int = 0, end: int | None = None) -> list[tuple[int, int, int]]:
    """(offset, width, value) of every length varint in ``data``, descending into whatever parses as a message.

    Independent of the module under test: a tolerant walk that treats each length-delimited field as a possible
    message (a string that happens to parse as one only adds more places to damage).
    """
    end = len(data) if end is None else end
    found: list[tuple[int, int, int]] = []
    pos = start

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        for i in range(at, min(at + 10, end)):
            value |= (data[i] & 0x7F) << shift
            if data[i] < 0x80:
                return value, i + 1
            shift += 7
        raise ValueError

    try:
        while pos < end:
            tag, pos = varint(pos)
            wire_type = tag & 7
            if wire_type == 0:
                _, pos = varint(pos)
            elif wire_type in (1, 5):
                pos += 8 if wire_type == 1 else 4
            elif wire_type == 2:
                length, after = varint(pos)
                if after + length > end:
                    raise ValueError
                found.append((pos, after - pos, length))
                found.extend(length_prefixes(data, after, after + length))
                pos = after + length
            else:
                raise ValueError
    except ValueError:
        pass
    return found


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> tuple[str, bytes]:
    """``data`` damaged one way: truncated, bytes flipped, a varint spliced in, a length prefix changed, or intact."""
    # "intact" comes last: hypothesis draws the first choice more often, and length damage is the one that matters.
    how = draw(st.sampled_from(["length", "truncate", "flip", "splice", "length", "intact"]))
    if how == "truncate":
        return how, data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(out) - 1))] ^= draw(st.integers(1, 255))
        return how, bytes(out)
    value = st.one_of(st.integers(0, 300), st.sampled_from([2**31, 2**32, 2**63, 2**64 - 1]))
    if how == "splice":
        at = draw(st.integers(0, len(data)))
        spliced = encode_varint(draw(value), min_bytes=draw(st.integers(1, 11)))
        return how, data[:at] + spliced + data[at + draw(st.integers(0, 3)) :]
    prefixes = length_prefixes(data)
    if how == "intact" or not prefixes:
        return "intact", data
    at, width, length = draw(st.sampled_from(prefixes))
    new = draw(st.one_of(st.integers(max(0, length - 3), length + 3), value))
    return how, data[:at] + encode_varint(new, min_bytes=draw(st.sampled_from([1, 1, width, 10, 11]))) + data[
        at + width :
    ]


MODEL_FUZZ = settings(
    max_examples=MODEL_EXAMPLES,
    deadline=None,  # generation time varies a lot; the SIGALRM guard still catches a scan that does not end
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@MODEL_FUZZ
@given(
    model=models(),
    data=st.data(),
    min_length=st.sampled_from([0, 0, 40, 64, 200]),
    window=WINDOWS,
)
def test_models_with_payloads_everywhere_damaged(workdir, model, data, min_length, window):
    encoded = model.SerializeToString()
    how, damaged_bytes = data.draw(damaged(encoded), label="damage")
    result = check(damaged_bytes, workdir, min_length, window)
    if isinstance(result, StrippedModel):
        count = len(result.payloads)
        event(f"{how}: accepted, {'no' if not count else '1-9' if count < 10 else '10+'} payloads")
    else:
        event(f"{how}: {outcome(result)}")
    if how == "intact":
        assert isinstance(result, StrippedModel), result
        strip_from = max(min_length, wire.PLACEHOLDER_LENGTH + 1)
        assert len(result.payloads) == sum(len(t.raw_data) >= strip_from for t in all_tensors(model))


# ---------------------------------------------------------------------------------------------------------------
# Groups in unknown fields, at any place of a generated model: protobuf keeps them (onnx.load accepts the file), so
# the reader must skip them the same way, and refuse exactly the malformed ones protobuf refuses.

# 0: invalid as a message's field, skipped by protobuf inside a group (a case the reader once refused).
GROUP_NUMBERS = st.one_of(st.sampled_from([0, 1, 5, 7, 9, 999]), st.integers(1, 2**29 - 1))


@st.composite
def group_fields(draw: st.DrawFn, depth: int = 0) -> bytes:
    """Unknown fields holding groups (nested, with every wire type inside), sometimes damaged: a mismatched or
    missing end tag, an invalid wire type."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["group", "group", "varint", "len", "fixed", "group", "bad"]))
        number = draw(GROUP_NUMBERS)
        if kind == "varint":
            out += field_key(number, 0) + encode_varint(draw(st.integers(0, 2**64 - 1)))
        elif kind == "len":
            body = draw(st.binary(max_size=40))
            out += field_key(number, 2) + encode_varint(len(body)) + body
        elif kind == "fixed":
            wire_type = draw(st.sampled_from([1, 5]))
            out += field_key(number, wire_type) + bytes(8 if wire_type == 1 else 4)
        elif kind == "bad":
            out += field_key(number, draw(st.sampled_from([4, 6, 7])))
        else:
            inner = draw(group_fields(depth + 1)) if depth < 3 and draw(st.booleans()) else b""
            end = draw(st.sampled_from([number, number, number, number + 1]))  # sometimes a mismatched end tag
            closed = draw(st.sampled_from([True, True, True, True, False]))
            out += field_key(number, 3) + inner + (field_key(end, 4) if closed else b"")
    return bytes(out)


def messages_of(message: Message) -> list[Message]:
    """``message`` and every message below it, in a fixed order."""
    found = [message]
    for descriptor, value in message.ListFields():
        if descriptor.type == descriptor.TYPE_MESSAGE:
            for item in value if descriptor.is_repeated else [value]:
                found.extend(messages_of(item))
    return found


@MODEL_FUZZ
@given(model=models(), data=st.data(), min_length=st.sampled_from([0, 0, 40, 200]), window=WINDOWS)
def test_groups_anywhere_in_a_model_are_skipped_as_protobuf_skips_them(workdir, model, data, min_length, window):
    raw = data.draw(group_fields(), label="groups")
    places = messages_of(model)
    place = places[data.draw(st.integers(0, len(places) - 1), label="place")]
    try:
        carrier = type(place)()
        carrier.ParseFromString(place.SerializeToString() + raw)  # protobuf keeps the groups as unknown fields
    except DecodeError:
        encoded = model.SerializeToString() + raw  # malformed: only raw bytes at the top level can hold them
        well_formed = False
    else:
        place.CopyFrom(carrier)
        encoded = model.SerializeToString()
        well_formed = True
    result = check(encoded, workdir, min_length, window)
    if well_formed:
        assert isinstance(result, StrippedModel), result
        strip_from = max(min_length, wire.PLACEHOLDER_LENGTH + 1)
        assert len(result.payloads) == sum(len(t.raw_data) >= strip_from for t in all_tensors(model))
    event(("well formed: " if well_formed else "malformed: ") + outcome(result))
