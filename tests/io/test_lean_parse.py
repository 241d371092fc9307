"""Readers parse a large ``.onnx`` without its inline payloads: ``verify`` streams them, ``inspect`` never reads them.

``load_model_lean`` parses a ``.onnx`` of at most 16 MiB whole and a larger one with the wire scan. These tests build
real models just above that limit (and one over protobuf's 2 GiB limit, sparse), and check what a user sees: the
same verdicts and differences as before, the payloads read from the file through the chunk buffers (a model
rewritten meanwhile is refused), Python memory far below the model's size, and ``inspect`` working on any size.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref._cli import main
from onnx_light_ref.errors import ExternalDataError, InvalidModelError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read import wire
from onnx_light_ref.io._read.model_file import PROTOBUF_LIMIT
from onnx_light_ref.io._read.wire import PLACEHOLDER_LENGTH, WHOLE_PARSE_LIMIT, load_model_lean
from onnx_light_ref.io._verify import verify_models
from tests import large_inline
from tests.checks import sha256_of_tree
from tests.models import identity_model

BIG = 6 * 2**20  # float32 elements: 24 MiB, over the whole-parse limit


def inline_model(path: Path, *, flip: int | None = None, name: str = "big") -> Path:
    """A .onnx of ~24 MiB with its weights inline: one big tensor, a small one, one in typed fields."""
    values = np.arange(BIG, dtype=np.float32) % 251
    if flip is not None:
        values[flip] += 1
    model = identity_model({name: values, "small": np.ones(4, np.float32), "typed": np.array([1, 2], np.int64)},
                           typed_inline=["typed"])  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    assert path.stat().st_size > WHOLE_PARSE_LIMIT
    return path


def test_a_small_model_is_parsed_whole_and_a_large_one_by_the_scan(tmp_path, monkeypatch):
    calls: list[int] = []
    real = wire.load_model_stripped

    def spy(path, min_length, **kwargs):
        calls.append(min_length)
        return real(path, min_length, **kwargs)

    monkeypatch.setattr(wire, "load_model_stripped", spy)
    small = tmp_path / "small.onnx"
    onnx.save_model(identity_model({"w": np.ones(1000, np.float32)}), str(small))
    large = inline_model(tmp_path / "large" / "model.onnx")

    model, stripped = load_model_lean(small)
    assert stripped is None and calls == [] and len(model.graph.initializer[0].raw_data) == 4000
    model, stripped = load_model_lean(large)
    assert calls == [0]
    assert stripped is not None and [p.length for p in stripped.payloads] == [BIG * 4]  # "small" is 16 bytes
    big = model.graph.initializer[0]
    assert len(big.raw_data) == PLACEHOLDER_LENGTH and stripped.payload(big) == stripped.payloads[0]
    assert model.graph.initializer[1].raw_data == np.ones(4, np.float32).tobytes()
    assert list(model.graph.initializer[2].int64_data) == [1, 2]


def test_verify_of_large_inline_models_finds_the_same_difference_and_holds_no_payload(tmp_path):
    a = inline_model(tmp_path / "a" / "model.onnx")
    b = inline_model(tmp_path / "b" / "model.onnx", flip=5 * 2**20 + 3)
    external = tmp_path / "ext" / "model.onnx"
    external.parent.mkdir()
    align_external_data_streaming(a, external, size_threshold=0, durable=False)
    before = sha256_of_tree(tmp_path)

    tracemalloc.start()
    try:
        equal = verify_models(a, external, chunk_size=2**20)
        different = verify_models(a, b, chunk_size=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (equal.equal, equal.tensors, equal.bytes_compared) == (True, 3, BIG * 4 + 16 + 16)
    assert different.first_difference == (
        "tensor #0 'big' (initializer in graph 'identity'): bytes differ at offset "
        f"{(5 * 2**20 + 3) * 4 + 2} of {BIG * 4} (A: 0x{_byte(5 * 2**20 + 3, 2, 0):02x}, "
        f"B: 0x{_byte(5 * 2**20 + 3, 2, 1):02x})"
    )
    # Two 1 MiB buffers and the metadata: the 24 MiB payloads were never in Python memory (they were, twice, when
    # every .onnx up to 2 GiB was parsed whole).
    assert peak < 8 * 2**20, peak
    assert sha256_of_tree(tmp_path) == before


def _byte(index: int, byte: int, plus: int) -> int:
    return np.array([index % 251 + plus], np.float32).tobytes()[byte]


@pytest.mark.parametrize("change", ["modified", "replaced"])
def test_a_large_inline_model_changed_after_it_was_parsed_is_refused(tmp_path, change):
    a = inline_model(tmp_path / "a" / "model.onnx")
    b = inline_model(tmp_path / "b" / "model.onnx")
    other = inline_model(tmp_path / "other" / "model.onnx", flip=7)

    def change_a() -> None:
        if change == "modified":
            st = a.stat()
            os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        else:
            os.replace(other, a)

    real = wire.load_model_stripped
    parsed: list[str] = []

    def parse_then_change(path, min_length, **kwargs):
        stripped = real(path, min_length, **kwargs)
        parsed.append(os.fspath(path))
        if len(parsed) == 2:  # both parsed: A changes before any payload is read
            change_a()
        return stripped

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire, "load_model_stripped", parse_then_change)
        with pytest.raises(ExternalDataError, match=rf"model A \(.*\) was {change} after it was parsed"):
            verify_models(a, b)
    assert parsed == [str(a), str(b)]


def test_inspect_reports_a_large_inline_model_without_reading_its_payloads(tmp_path, capsys):
    path = inline_model(tmp_path / "model.onnx")
    tracemalloc.start()
    try:
        report = build_layout_report(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (report.ok, report.tensors, report.inline_tensors) == (True, [], 3)
    assert peak < 2 * 2**20, peak
    assert main(["inspect", str(path)]) == 0
    assert "no external tensors and no DelayedInitializer node (3 inline)." in capsys.readouterr().out


def test_inspect_reads_a_model_over_2_gib_it_used_to_refuse(tmp_path, capsys):
    path = tmp_path / "model.onnx"
    large_inline.write_large_inline_model(path)
    assert path.stat().st_size > PROTOBUF_LIMIT

    status = main(["inspect", "--json", str(path)])
    out = capsys.readouterr().out

    assert status == 0
    assert f'"inline_tensors": {large_inline.COUNT + 2}' in out


def test_a_large_model_with_a_name_that_is_not_utf8_is_refused_by_verify_reported_by_inspect(tmp_path):
    path = inline_model(tmp_path / "model.onnx", name="bigNAME")
    data = path.read_bytes()
    assert data.count(b"bigNAME") == 5  # the initializer, the node's name, input and output, the graph output
    path.write_bytes(data.replace(b"bigNAME", b"big\xffAME"))

    with pytest.raises(InvalidModelError, match=r"graph\.node\[0\]\.input\[0\] is not valid UTF-8"):
        verify_models(path, path)
    model, _ = load_model_lean(path, check_strings=False)
    assert model.graph.initializer[0].name == b"big\xffAME"
    report = build_layout_report(path)
    assert report.notes and "not valid UTF-8" in report.notes[0]


def test_a_large_file_that_is_not_a_model_names_the_byte_offset(tmp_path):
    path = tmp_path / "weights.onnx"
    with open(path, "wb") as f:
        f.truncate(WHOLE_PARSE_LIMIT + 1)  # zeros: field number 0 is no protobuf tag
    for call in (lambda: verify_models(path, path), lambda: build_layout_report(path)):
        with pytest.raises(InvalidModelError, match=r"invalid field tag 0 .* at byte offset 0"):
            call()
    assert [p.name for p in tmp_path.iterdir()] == ["weights.onnx"]


def test_a_missing_model_is_file_not_found_either_way(tmp_path):
    with pytest.raises(FileNotFoundError, match="ONNX model file not found"):
        load_model_lean(tmp_path / "missing.onnx")


def test_typed_and_small_payloads_of_a_large_model_compare_in_memory(tmp_path):
    """Typed fields and payloads of at most 32 bytes stay in the parsed metadata; a difference there is found too."""
    a = inline_model(tmp_path / "a" / "model.onnx")
    b_model = onnx.load(str(a))
    b_model.graph.initializer[2].CopyFrom(helper.make_tensor("typed", TensorProto.INT64, [2], [1, 3]))
    b_model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.full(4, 2, np.float32), "small"))
    b = tmp_path / "b" / "model.onnx"
    b.parent.mkdir()
    onnx.save_model(b_model, str(b))

    result = verify_models(a, b, max_differences=0)

    assert [(d.a.label, d.kind) for d in result.differences if d.a] == [("small", "bytes"), ("typed", "bytes")]
    assert result.tensors == 1
