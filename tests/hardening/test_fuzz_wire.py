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
* when it refuses, protobuf refuses the whole file too, unless the refusal is one of ours by design (group wire
  types, which ONNX never writes; nesting past protobuf's own limit).

``WIRE_FUZZ_EXAMPLES`` raises the number of examples per property (200 by default, so the suite stays fast).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from wire_writer import encode_varint, field_key

from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io import wire
from onnx_light_ref.io.wire import StrippedModel, load_model_stripped

EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
# Refusals protobuf itself would not make: ONNX never uses groups, and nesting is capped at protobuf's default limit.
OURS_BY_DESIGN = ("group wire type", "nested deeper than")


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
    raise TimeoutError("load_model_stripped did not terminate within 10 s")


@contextlib.contextmanager
def guarded() -> Iterator[list[tuple[int, int]]]:
    """Fail on any read past the end of the file, and on a scan that does not end."""
    reads: list[tuple[int, int]] = []
    real = wire.pread_exact

    def checked(fd: int, buffer: memoryview, offset: int) -> int:
        size = os.fstat(fd).st_size
        assert offset >= 0 and offset + len(buffer) <= size, f"read of {len(buffer)} at {offset} past EOF {size}"
        reads.append((offset, len(buffer)))
        return real(fd, buffer, offset)

    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(10)
    try:
        with mock.patch.object(wire, "pread_exact", checked):
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


def check(data: bytes, workdir: Path, min_length: int = 0) -> StrippedModel | str:
    """Run the reader on ``data`` and check every property in the module docstring; return the result or the error."""
    path = workdir / "fuzz.onnx"
    path.write_bytes(data)
    expected = protobuf_parse(data)
    with guarded():
        try:
            stripped = load_model_stripped(path, min_length)
        except InvalidModelError as exc:
            message = str(exc)
            assert "byte offset" in message or "protobuf cannot parse" in message or "no graph" in message
            assert expected is None or any(reason in message for reason in OURS_BY_DESIGN), message
            return message
    assert expected is not None, "accepted a file protobuf refuses"
    back = onnx.ModelProto()
    back.CopyFrom(stripped.model)
    for tensor in all_tensors(back):
        payload = stripped.payload(tensor)
        if payload is not None:
            assert payload.offset >= 0 and payload.offset + payload.length <= len(data)
            tensor.raw_data = data[payload.offset : payload.offset + payload.length]
    assert back == expected
    return stripped


@pytest.mark.parametrize("min_length", [0, 48])
def test_every_truncation_of_the_seed(workdir, min_length):
    seed = check(SEED, workdir, min_length)
    assert isinstance(seed, StrippedModel)
    # w; then/else branches x (attr, init); ts; sparse values+indices, as initializer and attribute; fn; algorithm x 2
    assert len(seed.payloads) == (13 if min_length == 0 else 6)
    for end in range(len(SEED)):
        check(SEED[:end], workdir, min_length)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, len(SEED) - 1), st.integers(1, 255)), min_size=1, max_size=6))
def test_flipped_bytes(workdir, flips):
    data = bytearray(SEED)
    for position, mask in flips:
        data[position] ^= mask
    event(outcome(check(bytes(data), workdir)))


@FUZZ
@given(
    position=st.integers(0, len(SEED)),
    replaced=st.integers(0, 4),
    value=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1), st.sampled_from([2**31, 2**32, 2**63])),
    width=st.integers(1, 12),
)
def test_spliced_varints(workdir, position, replaced, value, width):
    data = SEED[:position] + encode_varint(value, min_bytes=width) + SEED[position + replaced :]
    event(outcome(check(data, workdir)))


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
