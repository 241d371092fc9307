"""The safetensors header writer and its hostile-input parser, against the ``safetensors`` library as the oracle."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from onnx_light_ref.errors import ExternalDataError, SafetensorsError
from onnx_light_ref.io._read.safetensors_header import (
    MAX_HEADER_SIZE,
    SafetensorsEntry,
    SafetensorsHeader,
    encode_header,
    read_header,
    require_covered,
)


def _write(path: Path, header: bytes | dict[str, object], data: bytes) -> Path:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _read(path: Path) -> SafetensorsHeader:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_header(fd, str(path), os.fstat(fd).st_size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096, 65536])
def test_encoded_header_starts_the_data_section_aligned_and_loads_in_safetensors(
    tmp_path: Path, alignment: int
) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, -2, 3], dtype=np.int16)
    entries = [
        SafetensorsEntry("a/weight", "F32", (2, 3), 0, a.nbytes),
        SafetensorsEntry("b é", "I16", (3,), a.nbytes, a.nbytes + b.nbytes),
    ]
    header = encode_header(entries, alignment, metadata={"format": "pt"})
    assert len(header) % max(alignment, 8) == 0
    path = tmp_path / "x.safetensors"
    path.write_bytes(header + a.tobytes() + b.tobytes())
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        assert np.array_equal(f.get_tensor("a/weight"), a)
        assert np.array_equal(f.get_tensor("b é"), b)
    parsed = _read(path)
    assert parsed.data_start == len(header)
    assert list(parsed.entries) == ["a/weight", "b é"]
    assert parsed.covered and parsed.metadata == {"format": "pt"}


def test_encode_refuses_repeated_and_empty_keys() -> None:
    with pytest.raises(SafetensorsError, match="repeated"):
        encode_header([SafetensorsEntry("a", "U8", (1,), 0, 1), SafetensorsEntry("a", "U8", (1,), 1, 2)])
    with pytest.raises(SafetensorsError, match="empty"):
        encode_header([SafetensorsEntry("", "U8", (1,), 0, 1)])


def _entry(dtype: str = "U8", shape: list[int] | None = None, offsets: list[int] | None = None) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape if shape is not None else [4], "data_offsets": offsets or [0, 4]}


HOSTILE = {
    "not json": (b"{not json", b"", "not UTF-8 JSON"),
    "not utf8": (b'{"\xff": 1}', b"", "not UTF-8 JSON"),
    "array": (b"[1, 2]", b"", "not an object"),
    "duplicate key": (b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": 1}', b"x", "repeats"),
    "unknown dtype": ({"a": _entry("Q8")}, b"\0" * 4, "unknown dtype"),
    "negative dim": ({"a": _entry(shape=[-4])}, b"\0" * 4, "shape must be"),
    "float dim": ({"a": _entry(shape=[4.0])}, b"\0" * 4, "shape must be"),  # type: ignore[list-item]
    "bool offset": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [False, True]}}, b"\0", "data_offsets"),
    "three offsets": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"\0", "data_offsets"),
    "end before begin": ({"a": _entry(shape=[0], offsets=[3, 1])}, b"\0" * 4, "end before"),
    "past the end": ({"a": _entry(offsets=[0, 4])}, b"\0" * 3, "past the end"),
    "huge offset": ({"a": _entry(offsets=[2**64, 2**64 + 4])}, b"\0" * 4, "past the end"),
    "size disagrees": ({"a": _entry("F32", [2], [0, 4])}, b"\0" * 4, "need 8 bytes"),
    "overflowing shape": ({"a": _entry("F32", [2**40, 2**40], [0, 4])}, b"\0" * 4, "overflow"),
    # Python's json takes any integer; the library's dims are u64 and its product is checked left to right.
    "dim of 2**64": ({"a": _entry(shape=[2**64, 0], offsets=[0, 0])}, b"", r"integers in \[0, 2\*\*64\)"),
    "product overflowing before a 0": (
        {"a": _entry(shape=[2**32, 2**32, 0], offsets=[0, 0])},
        b"",
        "u64 element or bit count",
    ),
    "bit count overflowing": ({"a": _entry("F64", [2**61], [0, 0])}, b"", "u64 element or bit count"),
    "minus zero": (b'{"a": {"dtype": "U8", "shape": [-0], "data_offsets": [0, 0]}}', b"", "shape must be"),
    "lone surrogate": (b'{"\\ud800": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}', b"", "surrogate"),
    "overlap": ({"a": _entry(offsets=[0, 4]), "b": _entry(offsets=[2, 6])}, b"\0" * 6, "overlap"),
    "extra key": ({"a": {**_entry(), "x": 1}}, b"\0" * 4, "exactly"),
    "bad metadata": ({"__metadata__": {"a": 1}}, b"", "__metadata__"),
    "empty name": ({"": _entry()}, b"\0" * 4, "empty name"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_typed_errors_naming_the_file(tmp_path: Path, case: str) -> None:
    header, data, message = HOSTILE[case]
    path = _write(tmp_path / "h.safetensors", header, data)
    with pytest.raises(SafetensorsError, match=message) as info:
        _read(path)
    assert isinstance(info.value, ExternalDataError)
    assert str(path) in str(info.value)


def test_header_size_above_the_cap_or_past_the_file_is_refused_before_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{}")
    with pytest.raises(SafetensorsError, match="exceeds"):
        _read(path)
    path.write_bytes(struct.pack("<Q", 2**64 - 1) + b"{}")
    with pytest.raises(SafetensorsError, match="exceeds"):
        _read(path)
    path.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(SafetensorsError, match="past the end"):
        _read(path)
    path.write_bytes(b"\1\0")
    with pytest.raises(SafetensorsError, match="fewer than"):
        _read(path)


def test_holes_are_reported_and_refused_by_require_covered(tmp_path: Path) -> None:
    path = _write(tmp_path / "hole.safetensors", {"a": _entry(offsets=[2, 6])}, b"\0" * 8)
    header = _read(path)
    assert header.holes == ((0, 2), (6, 8))
    assert not header.covered
    with pytest.raises(SafetensorsError, match=r"2 uncovered range\(s\), the first at file offsets"):
        require_covered(header)
    # The safetensors library refuses the same file: the oracle agrees that holes are invalid.
    with pytest.raises(Exception, match=r"(?i)offset|invalid"):
        safe_open(str(path), framework="numpy")
