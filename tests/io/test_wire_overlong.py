"""Over-long varints: the wire scan refuses exactly the encodings ``onnx.load`` (upb) refuses, whatever ``min_length``.

A varint may be written non-minimally (``0x85 0x80 0x00`` is 5). upb, the protobuf of ``onnx.load``, reads a tag or
a length in at most 5 bytes and a value in at most 10, and refuses a longer encoding even of a small value (measured:
the table in ``docs/wire_format.md``). The scan re-encodes the key and the length of every message it strips a
payload from, so before this check an over-long one there reached protobuf minimal: a file no loader opens read as
valid above 16 MiB (``verify`` said equal, ``inspect`` OK, ``align --size-threshold`` wrote a valid model from it),
and the verdict depended on ``min_length``. Found by a random byte fuzzer (every disagreement of 276,265 cases was an
over-long tag or length in ``training_info``, ``functions`` or the graph); here the same class is enumerated
deterministically: every tag, every length and every varint value of a model holding tensors in each place the scan
walks, re-encoded in 5, 6, 10 and 11 bytes, compared with protobuf's verdict on the same bytes.

The tree below is parsed with onnx's own descriptors (no field table of the module under test), and re-encoded with
one varint widened, every enclosing length adjusted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from onnx_light_ref.errors import InvalidModelError
from onnx_light_ref.io import align_external_data_streaming, verify_models
from onnx_light_ref.io._read import wire
from onnx_light_ref.io._read.wire import load_model_lean, load_model_stripped
from tests.checks import sha256_of_tree
from tests.cli_runner import run_cli
from tests.wire_writer import LEN, VARINT, encode_varint

# 5: the longest tag or length upb reads; 6: the shortest it refuses; 10: the longest varint value; 11: refused for all.
WIDTHS = (5, 6, 10, 11)


@dataclasses.dataclass
class Field:
    """One field of a parsed message: its content is a value (VARINT), sub-fields (a message) or bytes."""

    number: int
    wire_type: int
    content: int | bytes | list[Field]
    kind: str  # the enclosing message's type name ("ModelProto"...)
    tag_width: int = 1
    length_width: int = 1
    value_width: int = 1


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        value |= (data[pos] & 0x7F) << shift
        pos += 1
        if data[pos - 1] < 0x80:
            return value, pos
        shift += 7


def parse(data: bytes, descriptor: Descriptor) -> list[Field]:
    """``data`` (a minimal encoding, as protobuf writes it) as a field tree; messages are descended into through
    onnx's descriptors, every other length-delimited field stays bytes."""
    fields: list[Field] = []
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        content: int | bytes | list[Field]
        if wire_type == VARINT:
            content, pos = _varint(data, pos)
        elif wire_type == LEN:
            length, pos = _varint(data, pos)
            body, pos = data[pos : pos + length], pos + length
            field = descriptor.fields_by_number.get(number)
            is_message = field is not None and field.type == FieldDescriptor.TYPE_MESSAGE
            content = parse(body, field.message_type) if is_message else body
        else:
            width = 8 if wire_type == 1 else 4
            content, pos = data[pos : pos + width], pos + width
        fields.append(Field(number, wire_type, content, descriptor.name))
    return fields


def encode(fields: list[Field], sites: dict[int, int] | None = None) -> bytes:
    """The fields' encoding with each varint as wide as its field asks; ``sites`` (if given) receives, for
    ``id(field)``, the byte offset of the field's first byte in the result."""
    out = bytearray()
    for field in fields:
        if sites is not None:
            sites[id(field)] = len(out)
        out += encode_varint(field.number << 3 | field.wire_type, min_bytes=field.tag_width)
        if isinstance(field.content, int):
            out += encode_varint(field.content, min_bytes=field.value_width)
        elif isinstance(field.content, list):
            inner: dict[int, int] = {}
            body = encode(field.content, inner)
            out += encode_varint(len(body), min_bytes=field.length_width)
            if sites is not None:
                sites.update((key, len(out) + offset) for key, offset in inner.items())
            out += body
        elif field.wire_type == LEN:
            out += encode_varint(len(field.content), min_bytes=field.length_width) + field.content
        else:
            out += field.content
    return bytes(out)


@dataclasses.dataclass(frozen=True)
class Site:
    """One varint of the tree: a field's tag, its length or its value; ``path`` names it for the test's id."""

    field: Field
    role: str  # "tag", "length", "value"
    path: str
    walked: bool  # the field sits in a message the scan walks (it names the byte offset there)

    def widen(self, width: int) -> None:
        setattr(self.field, f"{self.role}_width", width)


def sites_of(fields: list[Field], path: str = "", walked: bool = True) -> Iterator[Site]:
    """Every varint of the tree, in file order."""
    for index, field in enumerate(fields):
        where = f"{path}/{field.kind}.{field.number}[{index}]"
        yield Site(field, "tag", where, walked)
        if field.wire_type == VARINT:
            yield Site(field, "value", where, walked)
        elif field.wire_type == LEN:
            yield Site(field, "length", where, walked)
            if isinstance(field.content, list):
                descends = walked and field.number in wire._SCHEMA.get(field.kind, {})
                yield from sites_of(field.content, where, descends)


def floats(name: str, count: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(count, dtype=np.float32), name)


def tree_model(big: int = 0) -> onnx.ModelProto:
    """A valid model with a tensor (longer than the placeholder) in the graph, a subgraph, a function and
    ``training_info``; ``big`` more floats in one initializer (for a file over the lean limit)."""
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=floats("sub_attr", 12))],
        "body",
        [],
        [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [12])],
        initializer=[floats("sub_init", 10)],
    )
    initializers = [floats("w", 16)] + ([floats("big", big)] if big else [])
    graph = helper.make_graph(
        [
            helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body),
            helper.make_node("F", [], ["z"], domain="ai.test"),
        ],
        "main",
        [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [12])],
        initializer=initializers,
    )
    function = helper.make_function(
        "ai.test", "F", [], ["Y"], [helper.make_node("Constant", [], ["Y"], value=floats("fn", 11))], []
    )
    model = helper.make_model(
        graph,
        functions=[function],
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.test", 1)],
        ir_version=10,
    )
    model.training_info.add().algorithm.CopyFrom(body)
    return model


def protobuf_accepts(data: bytes) -> bool:
    try:
        onnx.ModelProto().ParseFromString(data)
    except DecodeError:
        return False
    return True


def scan_verdict(path: Path, min_length: int) -> str:
    try:
        load_model_stripped(path, min_length)
    except InvalidModelError as exc:
        return str(exc)
    return "accepted"


TREE = parse(tree_model().SerializeToString(), onnx.ModelProto.DESCRIPTOR)
SITES = list(sites_of(TREE))


def test_the_tree_round_trips_and_every_place_is_enumerated():
    assert encode(TREE) == tree_model().SerializeToString()
    paths = {site.path for site in SITES}
    # a tag and a length of the graph, of training_info and of functions, and their tensors' raw_data
    for prefix in ("/ModelProto.7[", "/ModelProto.20[", "/ModelProto.25["):
        assert any(path.startswith(prefix) for path in paths), prefix
    assert sum(site.role == "length" and "/TensorProto.9[" in site.path for site in SITES) >= 6  # raw_data lengths


@pytest.mark.parametrize("width", WIDTHS)
def test_every_varint_widened_gets_protobufs_verdict_whatever_min_length(tmp_path, width):
    """Every tag, length and value of the model re-encoded in ``width`` bytes: the scan accepts exactly the files
    protobuf accepts, with ``min_length`` 0 (every payload stripped, every message on the way re-encoded) and with a
    ``min_length`` above the file (nothing stripped, the file's own bytes handed to protobuf); where it refuses, it
    names the varint's byte offset when the varint sits in a message it walks (elsewhere protobuf's words)."""
    path = tmp_path / "m.onnx"
    checked = disagreements = 0
    for site in SITES:
        if site.role == "value" and width < 10:
            continue  # a value of 5 or 6 bytes is valid for both: the other widths say more
        site.widen(width)
        offsets: dict[int, int] = {}
        try:
            data = encode(TREE, sites=offsets)
        finally:
            site.widen(1)
        path.write_bytes(data)
        accepts = protobuf_accepts(data)
        longest = 10 if site.role == "value" else 5
        assert accepts == (width <= longest), (site.path, site.role, width)
        verdicts = {scan_verdict(path, min_length) for min_length in (0, len(data) + 1)}
        assert len(verdicts) == 1, (site.path, site.role, verdicts)
        (verdict,) = verdicts
        disagreements += (verdict == "accepted") != accepts
        if not accepts and site.walked:
            offset = offsets[id(site.field)]
            if site.role != "tag":  # after the (minimal) tag
                offset += len(encode_varint(site.field.number << 3 | site.field.wire_type))
            what = "field tag" if site.role == "tag" else f"field {site.field.number} {site.role}"
            assert f"{what} varint longer than {longest} bytes at byte offset {offset} " in verdict, verdict
        elif not accepts:
            assert "(protobuf cannot parse it: Error parsing message" in verdict, verdict
        checked += 1
    assert disagreements == 0
    assert checked > 100


def widened_file(path: Path, place: str | None, width: int, *, big: bool) -> Path:
    """The model (with 4 Mi more floats when ``big``: 16 MiB, which the readers scan) written to ``path`` with the
    varint ``place`` names (``"<site path> <role>"``) re-encoded in ``width`` bytes."""
    tree = parse(tree_model(4 * 2**20 if big else 0).SerializeToString(), onnx.ModelProto.DESCRIPTOR)
    if place is not None:
        (site,) = [site for site in sites_of(tree) if f"{site.path} {site.role}" == place]
        site.widen(width)
    path.write_bytes(encode(tree))
    return path


# The places the fuzzer found laundered: the graph's key and length, training_info's and functions', and a length
# deep inside each (an initializer of the graph, the algorithm's initializer, a function node's attribute tensor).
PLACES = [
    "/ModelProto.7[1] tag",
    "/ModelProto.7[1] length",
    "/ModelProto.7[1]/GraphProto.5[3] length",
    "/ModelProto.20[4] tag",
    "/ModelProto.20[4] length",
    "/ModelProto.20[4]/TrainingInfoProto.2[0]/GraphProto.5[2] length",
    "/ModelProto.25[5] tag",
    "/ModelProto.25[5]/FunctionProto.7[2]/NodeProto.5[2]/AttributeProto.5[1] length",
]


@pytest.mark.parametrize("big", [0, 8])
def test_the_places_exist(big):
    tree = parse(tree_model(big).SerializeToString(), onnx.ModelProto.DESCRIPTOR)
    assert set(PLACES) <= {f"{site.path} {site.role}" for site in sites_of(tree)}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("big", [False, True], ids=["below 16 MiB", "above 16 MiB"])
def test_load_model_lean_refuses_what_onnx_load_refuses(tmp_path, place, big):
    """The readers' parse (protobuf's whole below 16 MiB, the scan above) against ``onnx.load`` on the same bytes: a
    5-byte encoding is accepted by both, a 6-byte one refused by both, the scan naming the byte offset."""
    for width, accepted in ((5, True), (6, False)):
        path = widened_file(tmp_path / f"m{width}.onnx", place, width, big=big)
        assert (path.stat().st_size > wire.WHOLE_PARSE_LIMIT) == big
        try:
            onnx.load(str(path))
        except DecodeError:
            loads = False
        else:
            loads = True
        assert loads == accepted
        if accepted:
            assert load_model_lean(path)[0].graph.name == "main"
            continue
        before = sha256_of_tree(tmp_path)
        expected = "varint longer than 5 bytes at byte offset" if big else "cannot parse it: .*Wire format was corrupt"
        pattern = rf"^{re.escape(repr(str(path)))} is not a valid ONNX model.*{expected}"
        with pytest.raises(InvalidModelError, match=pattern):
            load_model_lean(path)
        assert sha256_of_tree(tmp_path) == before


@pytest.fixture(scope="module", name="big_pair")
def _big_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("overlong")
    good = widened_file(folder / "good.onnx", None, 1, big=True)
    bad = widened_file(folder / "bad.onnx", "/ModelProto.7[1] length", 6, big=True)
    return good, bad


def test_verify_inspect_and_align_refuse_a_file_no_loader_opens(big_pair, tmp_path):
    """What the issue saw above 16 MiB: ``verify`` called the over-long file equal to the good one, ``inspect``
    said OK and ``align --size-threshold`` wrote a valid model from it. Now each refuses it, naming the offset,
    and writes nothing."""
    import onnxruntime as ort

    good, bad = big_pair
    with pytest.raises(DecodeError):
        onnx.load(str(bad))
    with pytest.raises(Exception, match="INVALID_PROTOBUF"):
        ort.InferenceSession(str(bad), providers=["CPUExecutionProvider"])
    message = f"{str(bad)!r} is not a valid ONNX model: field 7 length varint longer than 5 bytes at byte offset"
    before = sha256_of_tree(bad.parent)
    with pytest.raises(InvalidModelError, match=message):
        verify_models(good, bad)
    inspected = run_cli("inspect", str(bad))
    assert inspected.returncode == 1
    assert "field 7 length varint longer than 5 bytes at byte offset" in inspected.stdout + inspected.stderr
    with pytest.raises(InvalidModelError, match=message):
        align_external_data_streaming(bad, tmp_path / "out.onnx", size_threshold=1024)
    assert sha256_of_tree(bad.parent) == before
    assert list(tmp_path.iterdir()) == []
