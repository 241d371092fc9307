"""The wire-format reader: a model's metadata without its inline payloads, and where those payloads are in the file.

The oracle is onnx itself: the stripped model, with every stripped tensor given back the file bytes at the offset
the reader reported, must equal ``onnx.load`` of the same file, tensor by tensor and field by field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError, Message
from onnx import helper, numpy_helper

from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io._arguments import ArgumentTypeError
from onnx_light_ref.io._read import wire
from onnx_light_ref.io._read.wire import PLACEHOLDER_LENGTH, InlinePayload, StrippedModel, load_model_stripped
from tests.checks import sha256_of_tree
from tests.wire_writer import LEN, VARINT, Hole, encode_varint, field_key, len_field, write_model, write_segments

IR_VERSION = 10
OPSET = 18


# ---------------------------------------------------------------------------------------------------------------
# Helpers: a generic tensor walk (independent of the module's own field table) and the reconstruction oracle.


def all_tensors(message: Message) -> Iterator[onnx.TensorProto]:
    """Every TensorProto reachable from ``message``, found through protobuf's descriptors (no field list)."""
    for descriptor, value in message.ListFields():
        if descriptor.type != descriptor.TYPE_MESSAGE:
            continue
        items = value if descriptor.is_repeated else [value]
        for item in items:
            if isinstance(item, onnx.TensorProto):
                yield item
            yield from all_tensors(item)


def restored(stripped: StrippedModel) -> onnx.ModelProto:
    """The stripped model with every placeholder replaced by the bytes read at its recorded file range."""
    model = onnx.ModelProto()
    model.CopyFrom(stripped.model)
    with open(stripped.path, "rb") as f:
        for tensor in all_tensors(model):
            payload = stripped.payload(tensor)
            if payload is not None:
                f.seek(payload.offset)
                tensor.raw_data = f.read(payload.length)
    return model


def assert_round_trip(path: Path, min_length: int) -> StrippedModel:
    """Strip, check the placeholders are the expected tensors, restore, compare with onnx.load tensor by tensor."""
    stripped = load_model_stripped(path, min_length)
    original = onnx.load(str(path), load_external_data=False)
    expected_stripped = [
        t.name for t in all_tensors(original) if len(t.raw_data) >= max(min_length, PLACEHOLDER_LENGTH + 1)
    ]
    assert [t.name for t in all_tensors(stripped.model) if stripped.payload(t)] == expected_stripped
    assert len(stripped.payloads) == len(expected_stripped)
    back = restored(stripped)
    for got, want in zip(all_tensors(back), all_tensors(original), strict=True):
        assert got == want, got.name
    assert back == original
    assert stripped.file_size == path.stat().st_size
    return stripped


def floats(name: str, count: int, start: float = 0.0) -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(start, start + count, dtype=np.float32), name)


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def model(graph: onnx.GraphProto, **kwargs: object) -> onnx.ModelProto:
    kwargs.setdefault("opset_imports", [helper.make_opsetid("", OPSET)])
    return helper.make_model(graph, ir_version=IR_VERSION, **kwargs)  # type: ignore[arg-type]


def out(name: str, shape: list[int] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def sparse(name: str, count: int) -> onnx.SparseTensorProto:
    values = floats(name, count, 1.0)
    indices = numpy_helper.from_array(np.arange(count, dtype=np.int64) * 2, f"{name}_indices")
    return helper.make_sparse_tensor(values, indices, [count * 2])


def branch(name: str, count: int) -> onnx.GraphProto:
    """A graph with an initializer and a Constant node, both ``count`` floats."""
    return helper.make_graph(
        [
            helper.make_node("Constant", [], [f"{name}_c"], name=f"{name}_const", value=floats(f"{name}_attr", count)),
            helper.make_node("Add", [f"{name}_c", f"{name}_init"], [f"{name}_out"]),
        ],
        name,
        [],
        [out(f"{name}_out", [count])],
        initializer=[floats(f"{name}_init", count, 7.0)],
    )


# ---------------------------------------------------------------------------------------------------------------
# The field table matches onnx.proto.


def tensor_holding_fields() -> dict[str, dict[int, str]]:
    """For each message reachable from ModelProto that can hold a TensorProto: field number -> field message type."""
    holders = {"TensorProto"}
    descriptors = {}
    pending = [onnx.ModelProto.DESCRIPTOR]
    while pending:
        descriptor = pending.pop()
        if descriptor.name in descriptors:
            continue
        descriptors[descriptor.name] = descriptor
        pending.extend(f.message_type for f in descriptor.fields if f.message_type is not None)
    changed = True
    while changed:
        changed = False
        for name, descriptor in descriptors.items():
            if name not in holders and any(
                f.message_type is not None and f.message_type.name in holders for f in descriptor.fields
            ):
                holders.add(name)
                changed = True
    table = {
        name: {
            f.number: f.message_type.name
            for f in descriptors[name].fields
            if f.message_type and f.message_type.name in holders
        }
        for name in holders
        if name != "TensorProto"
    }
    table["TensorProto"] = {onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number: "raw_data"}
    return table


def test_the_field_table_covers_every_path_to_a_tensor_in_onnx_proto():
    assert tensor_holding_fields() == wire._SCHEMA
    assert onnx.FunctionProto.DESCRIPTOR.fields_by_name["node"].number == 7  # not 3: that one is reserved


# ---------------------------------------------------------------------------------------------------------------
# Real models saved by onnx: every place a raw_data tensor can sit.


def test_initializers_are_stripped_and_restored(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["big"], ["y"])],
        "main",
        [],
        [out("y", [1000])],
        initializer=[floats("big", 1000), floats("small", 4), floats("medium", 100), floats("empty", 0)],
    )
    path = save(model(graph), tmp_path / "m.onnx")
    stripped = assert_round_trip(path, 0)
    big, small, _medium, empty = stripped.model.graph.initializer
    assert stripped.payload(small) is None and small.raw_data == floats("small", 4).raw_data
    assert stripped.payload(empty) is None and empty.raw_data == b""
    assert len(big.raw_data) == PLACEHOLDER_LENGTH
    payload = stripped.payload(big)
    assert payload == stripped.payloads[0]
    assert payload.length == 4000
    assert path.read_bytes()[payload.offset : payload.offset + payload.length] == floats("big", 1000).raw_data
    assert stripped.metadata_size < path.stat().st_size - 4000 - 400 + 2 * PLACEHOLDER_LENGTH


def test_constant_attributes_t_and_tensors_and_subgraphs(tmp_path):
    if_node = helper.make_node("If", ["cond"], ["r"], then_branch=branch("then", 64), else_branch=branch("else", 64))
    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Constant", [], ["k"], value=floats("loop_attr", 50)),
            helper.make_node("Add", ["v_in", "k"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
            out("v_in", [50]),
        ],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []), out("v_out", [50])],
        initializer=[floats("loop_init", 50)],
    )
    # An If nested in the then-branch of another If: tensors at depth two.
    nested = helper.make_node(
        "If", ["cond"], ["n"], then_branch=branch("inner_then", 40), else_branch=branch("inner_else", 40)
    )
    outer_then = helper.make_graph([nested], "outer_then", [], [out("n", [40])], initializer=[floats("outer_init", 40)])
    outer = helper.make_node("If", ["cond"], ["o"], then_branch=outer_then, else_branch=branch("outer_else", 40))
    custom = helper.make_node(
        "Custom", [], ["z"], domain="ai.test", ts=[floats("ts0", 30), floats("ts1", 2), floats("ts2", 31)]
    )
    graph = helper.make_graph(
        [
            if_node,
            helper.make_node("Loop", ["trip", "cond", "v0"], ["v_final"], body=loop_body),
            outer,
            custom,
        ],
        "main",
        [
            helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("trip", onnx.TensorProto.INT64, []),
        ],
        [out("r", [64]), out("v_final", [50]), out("o", [40])],
        initializer=[floats("v0", 50)],
    )
    path = save(
        model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.test", 1)]),
        tmp_path / "m.onnx",
    )
    stripped = assert_round_trip(path, 100)
    names = {t.name for t in all_tensors(stripped.model) if stripped.payload(t)}
    assert names == {
        "then_attr", "then_init", "else_attr", "else_init", "loop_attr", "loop_init", "v0",
        "inner_then_attr", "inner_then_init", "inner_else_attr", "inner_else_init", "outer_init",
        "outer_else_attr", "outer_else_init", "ts0", "ts2",
    }  # fmt: skip
    # The stripped model still runs through protobuf and onnx's own helpers: only raw_data changed.
    assert (
        helper.get_attribute_value(stripped.model.graph.node[3].attribute[0])[1].raw_data == floats("ts1", 2).raw_data
    )


def test_sparse_initializers_and_sparse_attributes(tmp_path):
    custom = helper.make_node(
        "Custom", [], ["z"], domain="ai.test", one=sparse("attr_sparse", 20), many=[sparse("s0", 20), sparse("s1", 3)]
    )
    constant = helper.make_node("Constant", [], ["c"], sparse_value=sparse("const_sparse", 25))
    graph = helper.make_graph(
        [custom, constant], "main", [], [out("z"), out("c")], sparse_initializer=[sparse("init_sparse", 30)]
    )
    path = save(model(graph), tmp_path / "m.onnx")
    stripped = assert_round_trip(path, 0)
    found = {t.name for t in all_tensors(stripped.model) if stripped.payload(t)}
    assert found == {
        "attr_sparse", "attr_sparse_indices", "s0", "s0_indices", "const_sparse", "const_sparse_indices",
        "init_sparse", "init_sparse_indices",
    }  # fmt: skip


def test_functions_with_nodes_and_default_attribute_tensors(tmp_path):
    function = helper.make_function(
        "ai.test",
        "F",
        ["X"],
        ["Y"],
        [
            helper.make_node("Constant", [], ["K"], value=floats("fn_const", 80)),
            helper.make_node("If", ["X"], ["Y"], then_branch=branch("fn_then", 80), else_branch=branch("fn_else", 80)),
        ],
        opset_imports=[helper.make_opsetid("", OPSET)],
        attributes=[],
    )
    function.attribute_proto.append(helper.make_attribute("scale", floats("fn_default", 90)))
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["y"], domain="ai.test")],
        "main",
        [helper.make_tensor_value_info("x", onnx.TensorProto.BOOL, [])],
        [out("y", [80])],
    )
    m = model(
        graph, functions=[function], opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.test", 1)]
    )
    path = save(m, tmp_path / "m.onnx")
    stripped = assert_round_trip(path, 0)
    assert {t.name for t in all_tensors(stripped.model.functions[0]) if stripped.payload(t)} == {
        "fn_const", "fn_then_attr", "fn_then_init", "fn_else_attr", "fn_else_init", "fn_default",
    }  # fmt: skip


def test_training_info_graphs(tmp_path):
    graph = helper.make_graph([], "main", [], [], initializer=[floats("w", 64)])
    m = model(graph)
    info = m.training_info.add()
    info.initialization.CopyFrom(branch("init_graph", 70))
    info.algorithm.CopyFrom(branch("algo_graph", 75))
    info.initialization_binding.add(key="w", value="init_graph_out")
    path = save(m, tmp_path / "m.onnx")
    stripped = assert_round_trip(path, 0)
    assert {t.name for t in all_tensors(stripped.model.training_info[0]) if stripped.payload(t)} == {
        "init_graph_attr", "init_graph_init", "algo_graph_attr", "algo_graph_init",
    }  # fmt: skip


def test_typed_fields_and_external_tensors_are_left_alone(tmp_path):
    typed = helper.make_tensor("typed", onnx.TensorProto.FLOAT, [500], np.ones(500, dtype=np.float32).tolist())
    ints = helper.make_tensor("ints", onnx.TensorProto.INT64, [300], list(range(300)))
    strings = helper.make_tensor("strings", onnx.TensorProto.STRING, [2], [b"x" * 100, b"y" * 100])
    graph = helper.make_graph([], "main", [], [], initializer=[typed, ints, strings, floats("ext", 200)])
    m = model(graph)
    onnx.save_model(m, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=600)
    stripped = assert_round_trip(tmp_path / "m.onnx", 0)
    assert stripped.payloads == ()
    ext = stripped.model.graph.initializer[3]
    assert ext.data_location == onnx.TensorProto.EXTERNAL and stripped.payload(ext) is None
    assert list(stripped.model.graph.initializer[1].int64_data) == list(range(300))


@pytest.mark.parametrize(
    ("length", "min_length", "stripped"),
    [
        (PLACEHOLDER_LENGTH, 0, False),  # would not shrink
        (PLACEHOLDER_LENGTH + 1, 0, True),
        (PLACEHOLDER_LENGTH + 1, PLACEHOLDER_LENGTH + 1, True),
        (PLACEHOLDER_LENGTH + 1, PLACEHOLDER_LENGTH + 2, False),
        (1024, 1024, True),
        (1024, 1025, False),
        (1024, 1023, True),
        (0, 0, False),
    ],
)
def test_min_length_boundaries(tmp_path, length, min_length, stripped):
    tensor = numpy_helper.from_array(np.arange(length, dtype=np.uint8), "t")
    path = save(model(helper.make_graph([], "main", [], [], initializer=[tensor])), tmp_path / "m.onnx")
    result = assert_round_trip(path, min_length)
    assert (result.payload(result.model.graph.initializer[0]) is not None) is stripped


def test_payload_of_a_tensor_from_another_scan_is_none(tmp_path):
    path = save(model(helper.make_graph([], "main", [], [], initializer=[floats("w", 100)])), tmp_path / "m.onnx")
    first, second = load_model_stripped(path, 0), load_model_stripped(path, 0)
    assert second.payload(second.model.graph.initializer[0]) == first.payloads[0]
    assert first.payload(second.model.graph.initializer[0]) is None  # each scan draws its own nonce
    assert first.payload(onnx.TensorProto()) is None


# ---------------------------------------------------------------------------------------------------------------
# Hand-made encodings protobuf accepts but onnx never writes.


def test_repeated_raw_data_and_split_graph_merge_like_protobuf(tmp_path):
    first, last = bytes(range(100)), bytes(range(100, 250))
    tensor = (
        field_key(9, LEN)
        + encode_varint(100)
        + first
        + field_key(1, VARINT)
        + b"\x02"
        + field_key(9, LEN)
        + encode_varint(150)
        + last
    )
    graph_a = field_key(5, LEN) + encode_varint(len(tensor)) + tensor
    graph_b = field_key(2, LEN) + encode_varint(4) + b"main" + field_key(5, LEN) + encode_varint(len(tensor)) + tensor
    # The graph field twice (protobuf merges them), a non-minimal length and an unknown field (kept verbatim).
    data = (
        field_key(1, VARINT) + b"\x0a"
        + field_key(7, LEN) + encode_varint(len(graph_a), min_bytes=5) + graph_a
        + field_key(999, VARINT) + b"\x05"
        + field_key(7, LEN) + encode_varint(len(graph_b)) + graph_b
    )  # fmt: skip
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    stripped = load_model_stripped(path, 0)
    assert len(stripped.payloads) == 4
    initializers = stripped.model.graph.initializer
    assert [stripped.payload(t).length for t in initializers] == [150, 150]  # last raw_data wins, as in protobuf
    expected = onnx.ModelProto()
    expected.ParseFromString(data)
    assert restored(stripped) == expected
    assert stripped.model.graph.name == "main"


def test_wire_writer_output_is_read_by_onnx_and_by_the_reader(tmp_path):
    empty = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[300])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "main", [], [out("y", [300])], initializer=[empty, floats("b", 3)]
    )
    data = floats("w", 300).raw_data
    offsets = write_model(tmp_path / "m.onnx", model(graph), {"w": data})
    assert onnx.load(str(tmp_path / "m.onnx")).graph.initializer[0].raw_data == data
    stripped = assert_round_trip(tmp_path / "m.onnx", 0)
    assert stripped.payloads == (InlinePayload(*offsets["w"]),)


# ---------------------------------------------------------------------------------------------------------------
# Memory: payload bytes are seeked over; a file over 2 GiB parses.


@pytest.fixture(name="read_log")
def _read_log(monkeypatch):
    """Record every (offset, length) the reader asks the OS for, and fail on any read past the end of the file."""
    log: list[tuple[int, int]] = []
    real = wire.pread_exact

    def checked(fd: int, buffer: memoryview, offset: int) -> int:
        assert offset + len(buffer) <= os.fstat(fd).st_size, "read past the end of the file"
        log.append((offset, len(buffer)))
        return real(fd, buffer, offset)

    monkeypatch.setattr(wire, "pread_exact", checked)
    return log


def test_payloads_beyond_the_read_ahead_window_are_never_read(tmp_path, read_log):
    sizes = [300_000, 1_000_000, 200_000]
    graph = helper.make_graph(
        [], "main", [], [], initializer=[floats(f"w{i}", n // 4) for i, n in enumerate(sizes)] + [floats("tail", 20)]
    )
    path = save(model(graph), tmp_path / "m.onnx")
    stripped = assert_round_trip(path, 1024)
    for payload in stripped.payloads:
        untouched = (payload.offset + wire._WINDOW, payload.offset + payload.length)
        for offset, length in read_log:
            assert offset + length <= untouched[0] or offset >= untouched[1], (offset, length, payload)
    assert sum(length for _, length in read_log) <= stripped.metadata_size + 2 * len(sizes) * wire._WINDOW


def test_a_model_over_2_gib_parses_from_a_sparse_file(tmp_path, read_log):
    length = 2**31 + 4096  # protobuf refuses any message this large
    big = onnx.TensorProto(name="big", data_type=onnx.TensorProto.FLOAT, dims=[length // 4])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=floats("c", 100)), helper.make_node("Add", ["big", "c"], ["y"])],
        "main",
        [],
        [out("y", [length // 4])],
        initializer=[floats("before", 50), big, floats("after", 60)],
    )
    path = tmp_path / "big.onnx"
    offsets = write_model(path, model(graph), {"big": Hole(length)})
    st = path.stat()
    assert st.st_size > 2**31
    if st.st_blocks * 512 > 64 * 2**20:
        pytest.skip(f"{tmp_path} does not keep holes in sparse files")
    stripped = load_model_stripped(path, 1024)
    assert stripped.payloads == (InlinePayload(*offsets["big"]),)
    assert stripped.payload(stripped.model.graph.initializer[1]) == InlinePayload(*offsets["big"])
    assert [t.name for t in stripped.model.graph.initializer] == ["before", "big", "after"]
    assert stripped.model.graph.initializer[2].raw_data == floats("after", 60).raw_data
    assert helper.get_attribute_value(stripped.model.graph.node[0].attribute[0]).raw_data == floats("c", 100).raw_data
    assert sum(n for _, n in read_log) < 2**20  # the hole was seeked over


# ---------------------------------------------------------------------------------------------------------------
# Refusals: typed error naming the byte offset, no file written, no byte changed.

VALID_TENSOR = field_key(9, LEN) + encode_varint(64) + bytes(64)
VALID_GRAPH = field_key(2, LEN) + b"\x01g" + field_key(5, LEN) + encode_varint(len(VALID_TENSOR)) + VALID_TENSOR
VALID_MODEL = field_key(1, VARINT) + b"\x0a" + field_key(7, LEN) + encode_varint(len(VALID_GRAPH)) + VALID_GRAPH


def nested_graphs(levels: int) -> bytes:
    """GraphProto → NodeProto → AttributeProto(g) → GraphProto ... ``levels`` times, as a ModelProto."""
    graph = b""
    for _ in range(levels):
        attribute = field_key(6, LEN) + encode_varint(len(graph)) + graph
        node = field_key(5, LEN) + encode_varint(len(attribute)) + attribute
        graph = field_key(1, LEN) + encode_varint(len(node)) + node
    return field_key(7, LEN) + encode_varint(len(graph)) + graph


def in_graph(content: bytes) -> bytes:
    return field_key(7, LEN) + encode_varint(len(content)) + content


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "it has no graph"),
        (b"\x00", "invalid field tag 0 (field number 0) at byte offset 0"),
        (field_key(1, 6), "field 1 has the invalid wire type 6 at byte offset 0"),
        (field_key(1, 7) + b"\x00", "field 1 has the invalid wire type 7 at byte offset 0"),
        (field_key(1, 3) + field_key(1, 4), "it has no graph"),  # an empty group: an unknown field, no graph
        (field_key(2, 4), "end-group tag of field 2 without a matching start-group tag at byte offset 0"),
        (encode_varint(2**29 << 3), f"invalid field tag {2**32} (field number {2**29}) at byte offset 0"),
        (field_key(1, VARINT) + b"\x80" * 10 + b"\x01", "field 1 value varint longer than 10 bytes at byte offset 1"),
        (field_key(1, VARINT) + b"\x80\x80", "field 1 value varint truncated by the end of the file at byte offset 1"),
        (b"\x88", "field tag varint truncated by the end of the file at byte offset 0"),
        (
            field_key(7, LEN) + encode_varint(100) + b"abc",
            "field 7 (length 100) runs past the end of the file at byte offset 0",
        ),
        (field_key(6, LEN) + encode_varint(2**35 - 1), "runs past the end of the file at byte offset 0"),
        (field_key(6, LEN) + encode_varint(2**63), "field 6 length varint longer than 5 bytes at byte offset 1"),
        (encode_varint(7 << 3 | LEN, min_bytes=6) + b"\x00", "field tag varint longer than 5 bytes at byte offset 0"),
        (field_key(9, 5) + b"\x00\x00", "field 9 (4-byte value) runs past the end of the file at byte offset 0"),
        (field_key(9, 1) + bytes(7), "field 9 (8-byte value) runs past the end of the file at byte offset 0"),
        (
            VALID_MODEL[:-1],
            f"field 7 (length {len(VALID_GRAPH)}) runs past the end of the file at byte offset 2",
        ),
        (
            in_graph(field_key(5, LEN) + encode_varint(3) + field_key(9, LEN) + encode_varint(10) + b"x") + b"\x08\x0a",
            "field 9 (length 10) runs past the end of the enclosing message (which ends at byte offset 7) at byte "
            "offset 4 (in a TensorProto)",
        ),
        (
            in_graph(field_key(5, LEN) + encode_varint(1) + b"\x80") + b"\x08\x0a",
            "truncated by the end of the enclosing message at byte offset 4",
        ),
        (nested_graphs(34), "messages nested deeper than 100 levels at byte offset"),
        (in_graph(field_key(11, LEN) + encode_varint(1) + b"\x07"), "protobuf cannot parse it"),
        (in_graph(field_key(11, LEN) + b"\x02" + field_key(1, LEN) + b"\x05"), "protobuf cannot parse it"),
    ],
)
def test_malformed_files_are_refused_with_the_byte_offset(tmp_path, data, message):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(InvalidModelError) as info:
        load_model_stripped(path, 0)
    assert message in str(info.value)
    assert repr(str(path)) in str(info.value)
    assert sha256_of_tree(tmp_path) == before


def test_nesting_at_the_limit_is_accepted(tmp_path):
    # 33 levels of graph → node → attribute is 99 nested messages below ModelProto: accepted by us and by protobuf.
    path = tmp_path / "m.onnx"
    path.write_bytes(nested_graphs(33))
    assert load_model_stripped(path, 0).model.HasField("graph")


def test_a_truncated_real_model_names_the_field_cut_short(tmp_path):
    graph = helper.make_graph([], "main", [], [], initializer=[floats("w", 1000)])
    data = save(model(graph), tmp_path / "full.onnx").read_bytes()
    payload = load_model_stripped(tmp_path / "full.onnx", 0).payloads[0]
    (tmp_path / "cut.onnx").write_bytes(data[: payload.offset + 10])
    before = sha256_of_tree(tmp_path)
    with pytest.raises(InvalidModelError, match="runs past the end of the file at byte offset"):
        load_model_stripped(tmp_path / "cut.onnx", 0)
    assert sha256_of_tree(tmp_path) == before


def test_huge_metadata_is_refused_before_it_is_read(tmp_path, read_log):
    # A 3 GiB doc_string (metadata, not a tensor) could never reach protobuf: refused without reading it.
    path = tmp_path / "m.onnx"
    write_segments(path, [*len_field(6, [Hole(3 * 2**30)]), in_graph(b"")])
    if path.stat().st_blocks * 512 > 64 * 2**20:
        pytest.skip(f"{tmp_path} does not keep holes in sparse files")
    with pytest.raises(InvalidModelError, match=r"metadata .* exceeds protobuf's 2 GiB limit \(reached at byte offset"):
        load_model_stripped(path, 0)
    assert sum(n for _, n in read_log) < 2**20


def test_missing_or_non_regular_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="ONNX model file not found"):
        load_model_stripped(tmp_path / "missing.onnx", 0)
    with pytest.raises(FileNotFoundError, match="ONNX model file not found"):
        load_model_stripped(tmp_path / "missing" / "m.onnx", 0)
    with pytest.raises(FileNotFoundError, match="is a directory, not a model file"):
        load_model_stripped(tmp_path, 0)
    os.mkfifo(tmp_path / "fifo.onnx")
    with pytest.raises(FileNotFoundError, match="not a regular file"):  # and does not block waiting for a writer
        load_model_stripped(tmp_path / "fifo.onnx", 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.onnx"]


def test_min_length_is_checked(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(VALID_MODEL)
    with pytest.raises(ValueError, match="min_length must be >= 0, got -1"):
        load_model_stripped(path, -1)
    with pytest.raises(ArgumentTypeError, match="min_length must be an int"):
        load_model_stripped(path, 1.5)  # type: ignore[arg-type]
    assert load_model_stripped(str(path), 64).payloads == (InlinePayload(11, 64),)
    assert load_model_stripped(path, 65).payloads == ()


# ---------------------------------------------------------------------------------------------------------------
# The scanned file's identity: what a caller checks before copying payload ranges out of the path.


def test_the_identity_is_the_scanned_files(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(VALID_MODEL)
    before = path.stat()
    stripped = load_model_stripped(path, 0)
    assert (stripped.device, stripped.inode, stripped.mtime_ns) == (before.st_dev, before.st_ino, before.st_mtime_ns)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert stripped.same_file(os.fstat(fd))
    finally:
        os.close(fd)
    assert "device=" in repr(stripped) and "_prefix" not in repr(stripped)


def test_a_file_swapped_or_rewritten_after_the_scan_is_not_the_same_file(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(VALID_MODEL)
    stripped = load_model_stripped(path, 0)
    scanned = path.stat()
    # Same bytes, other inode (an editor's save, a rename over the path).
    other = tmp_path / "other.onnx"
    other.write_bytes(VALID_MODEL)
    os.replace(other, path)
    assert path.read_bytes() == VALID_MODEL
    assert not stripped.same_file(path.stat())
    # Same inode rewritten in place: another size, or the same size at another time.
    stripped = load_model_stripped(path, 0)
    with open(path, "r+b") as f:
        f.write(b"\x00" * 8)
    os.utime(path, ns=(scanned.st_atime_ns, stripped.mtime_ns + 1_000_000_000))
    assert path.stat().st_ino == stripped.inode and path.stat().st_size == stripped.file_size
    assert not stripped.same_file(path.stat())
    with open(path, "ab") as f:
        f.write(b"\x00")
    os.utime(path, ns=(scanned.st_atime_ns, stripped.mtime_ns))
    assert not stripped.same_file(path.stat())


def test_the_identity_comes_from_the_descriptor_read_not_from_the_path(tmp_path, monkeypatch):
    # The path is swapped for another file while the scan reads the original: the identity is the original's.
    path = tmp_path / "m.onnx"
    path.write_bytes(VALID_MODEL)
    original = path.stat()
    swapped = tmp_path / "swapped.onnx"
    swapped.write_bytes(VALID_MODEL)
    real = wire.pread_exact

    def swapping(fd: int, buffer: memoryview, offset: int) -> int:
        if swapped.exists():
            os.replace(swapped, path)
        return real(fd, buffer, offset)

    monkeypatch.setattr(wire, "pread_exact", swapping)
    stripped = load_model_stripped(path, 0)
    assert (stripped.device, stripped.inode) == (original.st_dev, original.st_ino)
    assert path.stat().st_ino != original.st_ino
    assert not stripped.same_file(path.stat())


def test_a_hand_built_stripped_model_matches_no_file(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(VALID_MODEL)
    loaded = load_model_stripped(path, 0)
    # The positional construction of earlier versions still works; its identity is unknown.
    by_hand = StrippedModel(loaded.model, loaded.path, loaded.file_size, loaded.payloads, loaded.metadata_size, b"x")
    assert (by_hand.device, by_hand.inode, by_hand.mtime_ns) == (-1, -1, -1)
    assert not by_hand.same_file(path.stat())


# ---------------------------------------------------------------------------------------------------------------
# The fast scan: what it leaves to protobuf, and that it changes nothing in the result.


def test_a_fault_left_to_protobuf_is_still_named_by_its_byte_offset(tmp_path):
    # A 3-byte TensorProto cannot hold a payload: the scan leaves it to protobuf; protobuf's refusal has no offset,
    # so the file is rescanned walking every tensor-holding message, and that error is the one raised.
    path = tmp_path / "m.onnx"
    data = in_graph(field_key(5, LEN) + encode_varint(3) + field_key(9, LEN) + encode_varint(10) + b"x") + b"\x08\x0a"
    path.write_bytes(data)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(InvalidModelError) as info:
        load_model_stripped(path, 0)
    assert str(info.value) == (
        f"{str(path)!r} is not a valid ONNX model: field 9 (length 10) runs past the end of the enclosing message "
        "(which ends at byte offset 7) at byte offset 4 (in a TensorProto)."
    )
    assert "protobuf cannot parse it" in str(info.value.__cause__)
    assert sha256_of_tree(tmp_path) == before
    # With a min_length so large that nothing is walked at all, deep nesting is still refused by name.
    path.write_bytes(nested_graphs(34))
    before = sha256_of_tree(tmp_path)
    with pytest.raises(InvalidModelError, match="messages nested deeper than 100 levels at byte offset"):
        load_model_stripped(path, 10**9)
    assert sha256_of_tree(tmp_path) == before


def test_a_group_inside_a_message_too_short_for_a_payload_is_protobufs_call(tmp_path):
    # A sub-message too short to hold a payload is not walked: protobuf skips the group there (an unknown field), as
    # onnx.load does; where the scan walks, it skips groups the same way (the tests below).
    group = field_key(30, 3) + field_key(30, 4)
    path = tmp_path / "m.onnx"
    path.write_bytes(in_graph(field_key(5, LEN) + encode_varint(len(group)) + group))
    stripped = load_model_stripped(path, 0)
    assert stripped.model == onnx.load(str(path)) and stripped.payloads == ()
    assert stripped.metadata_size == path.stat().st_size


def test_a_model_where_nothing_is_stripped_is_parsed_from_its_own_bytes(tmp_path, read_log):
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=floats("c", 4))], "main", [], [out("y", [4])]
    )
    graph.initializer.extend(floats(f"w{i}", 100) for i in range(50))
    path = save(model(graph), tmp_path / "m.onnx")
    stripped = load_model_stripped(path, 10**6)
    assert stripped.payloads == () and stripped.metadata_size == path.stat().st_size
    assert stripped.model == onnx.load(str(path))
    # One read of the whole file (the scan itself never needed a window: every message was longer than its need).
    assert sum(n for _, n in read_log) <= 2 * path.stat().st_size


@pytest.mark.parametrize("window", [10, 11, 17, 64, 4096])
def test_read_ahead_window_edges_anywhere(tmp_path, monkeypatch, window):
    # Tiny windows put an edge inside every kind of tag, length and payload; the result must not change.
    monkeypatch.setattr(wire, "_WINDOW", window)
    loop_body = branch("body", 40)
    graph = helper.make_graph(
        [
            helper.make_node("If", ["c"], ["r"], then_branch=loop_body, else_branch=branch("else", 9)),
            helper.make_node("Constant", [], ["k"], value=floats("k", 300)),
        ],
        "main",
        [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [out("r", [40])],
        initializer=[floats(f"w{i}", 5 + 13 * i) for i in range(30)],
        sparse_initializer=[sparse("sp", 20)],
    )
    graph.doc_string = "d" * 300  # a two-byte length in a message the scan walks
    path = save(model(graph), tmp_path / "m.onnx")
    for min_length in (0, 100):
        assert_round_trip(path, min_length)


# ---------------------------------------------------------------------------------------------------------------
# Groups (wire types 3 and 4): legal in the encoding of unknown fields, kept by protobuf as unknown fields. The scan
# must skip them exactly as protobuf does: the oracle is ``ModelProto.ParseFromString`` of the whole file.


def group(number: int, content: bytes = b"", end: int | None = None) -> bytes:
    """A start-group tag of field ``number``, ``content``, an end-group tag (of field ``end``, default ``number``)."""
    return field_key(number, 3) + content + field_key(number if end is None else end, 4)


def nested_groups(levels: int, number: int = 5) -> bytes:
    content = b""
    for _ in range(levels):
        content = group(number, content)
    return content


def with_unknown(message: Message, raw: bytes) -> Message:
    """A copy of ``message`` carrying ``raw`` (fields it does not know, e.g. a group) after its own fields."""
    copy = type(message)()
    copy.ParseFromString(message.SerializeToString() + raw)
    return copy


def grouped_model(where: str, raw: bytes) -> bytes:
    """A model with a strippable initializer, a Constant attribute tensor and ``raw`` appended to one message."""
    tensor = floats("w", 16)  # 64 bytes of raw_data: longer than the placeholder, stripped at min_length 0
    constant = helper.make_node("Constant", [], ["c"], value=floats("c", 16))
    if where == "tensor":
        tensor = with_unknown(tensor, raw)
    elif where == "attribute":
        constant.attribute[0].CopyFrom(with_unknown(constant.attribute[0], raw))
    elif where == "attribute tensor":
        constant.attribute[0].t.CopyFrom(with_unknown(constant.attribute[0].t, raw))
    elif where == "node":
        constant = with_unknown(constant, raw)
    graph = helper.make_graph([constant], "main", [], [out("c", [16])], initializer=[tensor])
    if where == "graph":
        graph = with_unknown(graph, raw)
    proto = model(graph)
    data = proto.SerializeToString()
    return data + raw if where == "model" else data


def protobuf_parse(data: bytes) -> onnx.ModelProto | None:
    parsed = onnx.ModelProto()
    try:
        parsed.ParseFromString(data)
    except DecodeError:
        return None
    return parsed


GROUP_PLACES = ["model", "graph", "node", "attribute", "attribute tensor", "tensor"]

GROUPS = {  # name -> unknown fields appended to a message; protobuf accepts each (checked by the test)
    "empty group": group(999),
    "varint, fixed32, fixed64 inside": group(999, field_key(1, VARINT) + b"\x96\x01" + field_key(2, 5) + bytes(4)
                                             + field_key(3, 1) + bytes(8)),
    "length-delimited inside, not parsed": group(999, field_key(3, LEN) + encode_varint(3) + b"\xff\xff\xff"),
    "payload-like bytes inside": group(9, field_key(9, LEN) + encode_varint(100) + bytes(100)),
    "a known field number as a group": group(7, field_key(9, LEN) + encode_varint(64) + bytes(64)),
    "nested groups": group(999, group(998, group(997, field_key(1, VARINT) + b"\x01"))),
    "same number nested": group(5, group(5, group(5))),
    "largest field number": encode_varint((2**29 - 1) << 3 | 3) + encode_varint((2**29 - 1) << 3 | 4),
    "non-minimal tags": encode_varint(999 << 3 | 3, min_bytes=5) + encode_varint(999 << 3 | 4, min_bytes=5),
    "two groups": group(999) + group(998, field_key(1, VARINT) + b"\x00"),
    "a large length-delimited field inside": group(999, field_key(3, LEN) + encode_varint(200_000) + bytes(200_000)),
}  # fmt: skip


@pytest.mark.parametrize("where", GROUP_PLACES)
@pytest.mark.parametrize("name", list(GROUPS))
def test_a_group_in_an_unknown_field_is_skipped_as_protobuf_skips_it(tmp_path, where, name):
    data = grouped_model(where, GROUPS[name])
    expected = protobuf_parse(data)
    assert expected is not None  # the oracle: protobuf (hence onnx.load) accepts the file
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    stripped = load_model_stripped(path, 0)
    back = restored(stripped)
    assert back == expected and back.SerializeToString() == data
    assert back == onnx.load(str(path))
    assert sorted(t.name for t in all_tensors(stripped.model) if stripped.payload(t)) == ["c", "w"]


def test_a_group_nested_to_protobufs_depth_limit_is_accepted_and_one_deeper_refused(tmp_path):
    path = tmp_path / "m.onnx"
    # ModelProto is depth 0, its graph 1: protobuf accepts groups down to depth 100 and refuses depth 101.
    for where, allowed in (("model", 100), ("graph", 99)):
        for levels, accepted in ((allowed, True), (allowed + 1, False)):
            data = grouped_model(where, nested_groups(levels))
            assert (protobuf_parse(data) is not None) is accepted, (where, levels)
            path.write_bytes(data)
            if accepted:
                assert restored(load_model_stripped(path, 0)) == protobuf_parse(data)
                continue
            before = sha256_of_tree(tmp_path)
            with pytest.raises(InvalidModelError, match="messages nested deeper than 100 levels at byte offset"):
                load_model_stripped(path, 0)
            assert sha256_of_tree(tmp_path) == before


TENSOR = field_key(9, LEN) + encode_varint(64) + bytes(64)


def in_tensor(content: bytes) -> bytes:
    """A model whose graph's initializer holds a strippable payload followed by ``content``."""
    tensor = TENSOR + content
    return in_graph(field_key(5, LEN) + encode_varint(len(tensor)) + tensor)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (VALID_MODEL + field_key(999, 4), "end-group tag of field 999 without a matching start-group tag at byte "
                                          f"offset {len(VALID_MODEL)} (in a ModelProto)"),
        (in_tensor(field_key(7, 4)), "end-group tag of field 7 without a matching start-group tag at byte offset 70 "
                                     "(in a TensorProto)"),
        (VALID_MODEL + group(999, end=998), "end-group tag of field 998 does not close the group of field 999 "
                                            f"(started at byte offset {len(VALID_MODEL)}) at byte offset "
                                            f"{len(VALID_MODEL) + 2}"),
        (VALID_MODEL + field_key(999, 3), f"group of field 999 (started at byte offset {len(VALID_MODEL)}) is not "
                                          "closed before the end of the file"),
        (in_tensor(field_key(999, 3)) + field_key(999, 4), "group of field 999 (started at byte offset 70) is not "
                                                           "closed before the end of the enclosing message"),
        # Field number 0 is skipped inside a group as protobuf skips it: a varint, whose value here is the end tag.
        (VALID_MODEL + group(999, b"\x00"), f"group of field 999 (started at byte offset {len(VALID_MODEL)}) is not "
                                             "closed before the end of the file"),
        (VALID_MODEL + group(999, field_key(1, 7)), "field 1 has the invalid wire type 7"),
        (VALID_MODEL + field_key(999, 3) + field_key(1, VARINT) + b"\x80", "field 1 value varint truncated by the end "
                                                                           "of the file"),
        (VALID_MODEL + field_key(999, 3) + field_key(3, LEN) + encode_varint(50) + b"x", "field 3 (length 50) runs "
                                                                                         "past the end of the file"),
        (VALID_MODEL + field_key(999, 3) + field_key(3, 1) + bytes(3), "field 3 (8-byte value) runs past the end of "
                                                                       "the file"),
    ],
    ids=["stray end", "stray end in a tensor", "mismatched end", "unclosed", "unclosed in a tensor",
         "field 0 eats the end", "wire type 7", "truncated varint", "length past the end", "fixed64 past the end"],
)  # fmt: skip
def test_a_malformed_group_is_refused_where_protobuf_refuses_it(tmp_path, data, message):
    assert protobuf_parse(data) is None  # the oracle refuses each
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(InvalidModelError) as info:
        load_model_stripped(path, 0)
    assert message in str(info.value)
    assert repr(str(path)) in str(info.value)
    assert sha256_of_tree(tmp_path) == before


def test_a_group_is_skipped_in_a_file_over_the_lean_limit(tmp_path, read_log):
    """``load_model_lean`` scans a ``.onnx`` over 16 MiB: a group there (beside 20 MiB of inline weights) parses
    as ``onnx.load`` parses it, and no read goes past the end of the file."""
    graph = helper.make_graph([], "main", [], [], initializer=[floats("big", 5 * 1024 * 1024)])
    graph = with_unknown(graph, group(999, field_key(3, LEN) + encode_varint(10) + bytes(10)))
    path = save(model(graph), tmp_path / "m.onnx")
    assert path.stat().st_size > wire.WHOLE_PARSE_LIMIT
    lean, stripped = wire.load_model_lean(path)
    assert stripped is not None and stripped.payloads
    assert lean is stripped.model and restored(stripped) == onnx.load(str(path))
