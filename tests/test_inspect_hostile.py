"""``inspect`` on models a careless tool or a hostile author wrote: it must stay fast, truthful and safe to print.

Each test builds a real model and real data files, runs the command (or the report it prints) and checks the verdict
a user reads: the status of each tensor, the exit status, and that nothing the model contains reaches the terminal
as a control sequence.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import get_args

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref._cli import main
from onnx_light_ref._commands.text import printable
from onnx_light_ref.errors import UnsafeLocationError
from onnx_light_ref.io._layout_report import ERROR_STATUSES, LayoutStatus, build_layout_report
from tests.checks import sha256_of_tree
from tests.models import OPSET, make_model, write_model


def external_tensor(name: str, entries: dict[str, str], dims: list[int] | None = None) -> TensorProto:
    """A float32 tensor whose external_data entries are exactly ``entries`` (any text, valid or not)."""
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[16] if dims is None else dims)
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def save_initializers(folder: Path, tensors: list[TensorProto], files: dict[str, int]) -> Path:
    """A model whose initializers are ``tensors``; ``files`` are zero-filled data files (inspect never reads them)."""
    for name, size in files.items():
        (folder / name).write_bytes(b"\0" * size)
    graph = helper.make_graph([], "hostile", [], [], initializer=tensors)
    path = folder / "model.onnx"
    write_model(path, make_model(graph))
    return path


def inspect(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["inspect", str(path)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def statuses(path: Path) -> dict[str, str]:
    return {tensor.name: tensor.status for tensor in build_layout_report(path).tensors}


def test_every_error_status_is_a_layout_status():
    assert set(get_args(LayoutStatus)) - ERROR_STATUSES == {"ok", "shared", "linked"}


def test_thousands_of_mutually_overlapping_ranges_are_all_reported(tmp_path, capsys):
    # 4,000 tensors of 8 KiB starting one byte apart: every range overlaps every other one. The old pairwise scan
    # took 34 s on such a model; this test is part of the normal run so that a quadratic regression shows as slow.
    count, length = 4000, 8192
    tensors = [
        external_tensor(f"t{i}", {"location": "w.data", "offset": str(i), "length": str(length)}, [length // 4])
        for i in range(count)
    ]
    path = save_initializers(tmp_path, tensors, {"w.data": count + length})

    report = build_layout_report(path)
    status, out = inspect(path, capsys)

    assert {tensor.status for tensor in report.tensors} == {"overlap"}
    first = report.tensors[0]
    assert first.message == (
        f"tensor 't0': range [0, +{length} bytes) of 'w.data' partially overlaps [1, +{length} bytes) of 't1' "
        f"and {count - 2} other ranges."
    )
    assert report.tensors[-1].message.startswith(f"tensor 't{count - 1}': range [{count - 1}, +{length} bytes)")
    assert report.files[0].bytes_used == count - 1 + length
    assert status == 1
    assert f"status: {count} error(s)" in out


def test_overlapping_a_range_shared_by_thousands_of_tensors_names_a_few_of_them(tmp_path, capsys):
    # 3,000 tensors share one big range and 3,000 small ranges sit inside it: each small one's message named every
    # tensor of the shared group, 3,000 x 3,000 names (the text grew to ~570 MB for 8,000 + 8,000).
    count, big = 3000, 65536
    shared = [
        external_tensor(f"s{i}", {"location": "w.data", "offset": "0", "length": str(big)}, [big // 4])
        for i in range(count)
    ]
    inside = [
        external_tensor(f"t{i}", {"location": "w.data", "offset": str(4 + 16 * i), "length": "8"}, [2])
        for i in range(count)
    ]
    path = save_initializers(tmp_path, shared + inside, {"w.data": big})

    report = build_layout_report(path)
    status, out = inspect(path, capsys)

    assert {tensor.status for tensor in report.tensors} == {"overlap"}
    assert report.tensors[count].message == (
        f"tensor 't0': range [4, +8 bytes) of 'w.data' partially overlaps [0, +{big} bytes) of 's0', 's1', 's2' "
        f"(and {count - 3} more tensors on that range)."
    )
    assert max(len(tensor.message) for tensor in report.tensors) < 300
    assert status == 1
    assert len(out) < 2 * 300 * len(report.tensors)


def brute_force_overlaps(ranges: list[tuple[int, int]]) -> dict[int, int]:
    """Index -> number of distinct ranges it partially overlaps (the definition, checked pair by pair)."""
    distinct = {r for r in ranges if r[1] > 0}
    result = {}
    for index, (start, length) in enumerate(ranges):
        if length == 0:
            continue
        others = [(s, n) for s, n in distinct if (s, n) != (start, length) and s < start + length and s + n > start]
        if others:
            result[index] = len(others)
    return result


def expected_partner_text(message: str, byte_ranges: list[tuple[int, int]]) -> str:
    """How an overlap message must name the partner range it quotes: its first three tensors, then how many more
    tensors share that range (names are capped so that messages stay linear in size)."""
    match = re.search(r"overlaps \[(\d+), \+(\d+) bytes\) of ", message)
    assert match is not None, message
    partner = (int(match[1]), int(match[2]))
    holders = [f"'t{i}'" for i, r in enumerate(byte_ranges) if r == partner]
    assert holders, (message, byte_ranges)
    shown, hidden = ", ".join(holders[:3]), len(holders) - 3
    return shown if hidden <= 0 else f"{shown} (and {hidden} more tensor{'s' if hidden > 1 else ''} on that range)"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), min_size=1, max_size=12))
# Found by hypothesis: one range overlapping a range that four tensors share. One other range (so no "and N other
# ranges"), but its names are capped at three: "(and 1 more tensor on that range)". Both counts are right.
@example([(0, 1), (1, 1), (1, 1), (1, 1), (1, 1)])
def test_overlaps_match_the_pairwise_definition(tmp_path_factory, ranges):
    folder = tmp_path_factory.mktemp("overlaps")
    tensors = [
        external_tensor(f"t{i}", {"location": "w.data", "offset": str(s), "length": str(4 * n)}, [n])
        for i, (s, n) in enumerate(ranges)
    ]
    path = save_initializers(folder, tensors, {"w.data": 100})
    byte_ranges = [(s, 4 * n) for s, n in ranges]

    report = build_layout_report(path)

    expected = brute_force_overlaps(byte_ranges)
    for index, tensor in enumerate(report.tensors):
        if index in expected:
            assert tensor.status == "overlap", (byte_ranges, index)
            more = expected[index] - 1
            other_ranges = f" and {more} other range{'s' if more > 1 else ''}" if more else ""
            assert tensor.message.endswith(f"{expected_partner_text(tensor.message, byte_ranges)}{other_ranges}."), (
                byte_ranges,
                index,
                tensor.message,
            )
        elif byte_ranges[index][1] == 0:  # a zero-length range overlaps nothing, but inside the file it is an error
            assert tensor.status == "zero-length mid-file", (byte_ranges, index, tensor.message)
        else:
            assert tensor.status in ("ok", "shared"), (byte_ranges, index, tensor.message)
            shared = [i for i, r in enumerate(byte_ranges) if r == byte_ranges[index]]
            assert tensor.status == ("shared" if len(shared) > 1 else "ok")


def model_with_function_default(location: str) -> onnx.ModelProto:
    function = helper.make_function(
        "ai.test", "F", ["X"], ["Y"], [helper.make_node("Identity", ["X"], ["Y"])], [helper.make_opsetid("", OPSET)]
    )
    function.attribute_proto.append(
        helper.make_attribute("value", external_tensor("secret", {"location": location, "length": "64"}))
    )
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["y"], domain="ai.test")],
        "main",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
    )
    return helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("location", ["/etc/passwd", "../../../../etc/passwd", "sub/../../etc/passwd"])
def test_a_function_default_naming_a_system_file_is_unsafe(tmp_path, capsys, location):
    path = tmp_path / "model.onnx"
    onnx.save_model(model_with_function_default(location), str(path))

    status, out = inspect(path, capsys)

    assert status == 1
    assert statuses(path) == {"secret": "unsafe location"}
    assert "in function ai.test::F / default of attribute 'value'" in out
    assert "status: OK" not in out


def test_a_training_graph_initializer_is_checked_too(tmp_path, capsys):
    graph = helper.make_graph([], "main", [], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.training_info.add().initialization.CopyFrom(
        helper.make_graph([], "init", [], [], initializer=[external_tensor("state", {"location": "/etc/passwd"})])
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path))

    status, out = inspect(path, capsys)

    assert status == 1
    assert statuses(path) == {"state": "unsafe location"}
    assert "training_info[0] initialization graph 'init'" in out


def test_a_hard_linked_data_file_is_an_error_as_align_refuses_it(tmp_path, capsys):
    path = save_initializers(
        tmp_path, [external_tensor("w", {"location": "w.data", "offset": "0", "length": "64"})], {"w.data": 64}
    )
    os.link(tmp_path / "w.data", tmp_path / "other-name.data")
    before = sha256_of_tree(tmp_path)

    status, out = inspect(path, capsys)

    assert status == 1
    assert statuses(path) == {"w": "hard-linked"}
    assert "has 2 hard links" in out
    with pytest.raises(UnsafeLocationError, match="hard links"):
        align_external_data_streaming(path, tmp_path / "aligned.onnx")
    assert sha256_of_tree(tmp_path) == before


def test_terminal_escape_sequences_in_names_and_locations_are_printed_escaped(tmp_path, capsys):
    evil_name = "w\x1b[2J\x1b]0;pwned\x07\u202e"
    evil_location = "gone\x1b[31m.data"
    path = save_initializers(
        tmp_path,
        [
            external_tensor(evil_name, {"location": "w.data", "offset": "0", "length": "64"}),
            external_tensor("x\r\x1b[1A", {"location": evil_location, "offset": "0", "length": "64"}),
        ],
        {"w.data": 64},
    )

    status, out = inspect(path, capsys)

    assert status == 1  # the second tensor's file is missing
    assert all(char.isprintable() for line in out.splitlines() for char in line)
    assert "w\\x1b[2J\\x1b]0;pwned\\x07\\u202e" in out
    assert "gone\\x1b[31m.data" in out
    assert printable("tab\there\u2028") == "tab\\x09here\\u2028"


def replace_in_model(path: Path, replacements: dict[bytes, bytes]) -> None:
    """Patch the serialized model: the only way to store strings that are not UTF-8 (onnx's API refuses them)."""
    data = path.read_bytes()
    for old, new in replacements.items():
        assert len(old) == len(new) and old in data
        data = data.replace(old, new)
    path.write_bytes(data)


def test_names_and_locations_that_are_not_utf8_do_not_crash_inspect(tmp_path, capsys):
    path = save_initializers(
        tmp_path,
        [
            external_tensor("NAME_A", {"location": "w.data", "offset": "0", "length": "64"}),
            external_tensor("b", {"location": "LOCATION_B", "offset": "0", "length": "64"}),
        ],
        {"w.data": 64},
    )
    replace_in_model(path, {b"NAME_A": b"n\xff\x1bme!", b"LOCATION_B": b"loc\xfe\xffb.bin"})

    status, out = inspect(path, capsys)

    assert status == 1
    report = build_layout_report(path)
    # An external tensor whose name is not UTF-8: onnx.load cannot open its data (issue 18), so it is not "ok".
    assert [(t.name, t.status) for t in report.tensors] == [("n\\xff\x1bme!", "loader refuses"), ("b", "invalid")]
    assert "onnx.load refuses: the tensor name is not valid UTF-8" in report.tensors[0].message
    assert "is not valid UTF-8" in report.tensors[1].message
    assert report.notes and "not valid UTF-8" in report.notes[0]
    assert "n\\xff\\x1bme" in out  # undecodable byte as a backslash escape, the control character escaped
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("entries", "dims", "expected"),
    [
        ({"location": "w.data", "offset": "0"}, [-16], "negative dims"),
        ({"location": "w.data", "offset": "0"}, [4, -4], "negative dims"),
        ({"location": "w.data", "offset": "+0", "length": "64"}, [16], "ASCII digits"),
        ({"location": "w.data", "offset": " 0", "length": "64"}, [16], "ASCII digits"),
        ({"location": "w.data", "offset": "0", "length": "6_4"}, [16], "ASCII digits"),
        ({"location": "w.data", "offset": "0", "length": "\u0666\u0664"}, [16], "ASCII digits"),
        ({"location": "w.data", "offset": "0", "length": "64", "owner": "x"}, [16], "unknown external_data keys"),
        ({"offset": "0", "length": "64"}, [16], "location"),
    ],
)
def test_malformed_entries_are_invalid_never_ok(tmp_path, capsys, entries, dims, expected):
    path = save_initializers(tmp_path, [external_tensor("w", entries, dims)], {"w.data": 64})

    status, out = inspect(path, capsys)

    report = build_layout_report(path)
    assert report.tensors[0].status == "invalid"
    assert expected in report.tensors[0].message
    assert status == 1
    assert "status: 1 error(s)" in out
    assert "MISSING" not in out  # a malformed entry names no file; it is not reported as a missing one


def test_identical_ranges_of_many_tensors_are_shared(tmp_path):
    tensors = [external_tensor(f"t{i}", {"location": "w.data", "offset": "0", "length": "64"}) for i in range(3)]
    path = save_initializers(tmp_path, tensors, {"w.data": 64})

    report = build_layout_report(path)

    assert [t.status for t in report.tensors] == ["shared"] * 3
    assert report.tensors[1].shared_with == ["t0", "t2"]
    assert np.all([len(t.shared_range) == 3 for t in report.tensors])
