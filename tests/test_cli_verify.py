"""``onnx-light-ref verify A.onnx B.onnx``: a user checks a rewritten model against its source from the shell."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light_ref import align_external_data_streaming
from onnx_light_ref._cli import main
from onnx_light_ref.io._read.model_file import PROTOBUF_LIMIT
from tests import large_inline
from tests.models import make_external_model

TENSORS: dict[str, np.ndarray] = {
    "w0": np.arange(1000, dtype=np.float32),
    "w1": np.arange(77, dtype=np.int64),
}


@pytest.fixture
def source(tmp_path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    return make_external_model(folder, TENSORS, size_threshold=0)


def verify(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["verify", "--no-progress", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_an_aligned_copy_verifies_equal(tmp_path, source, capsys):
    aligned = tmp_path / "aligned.onnx"
    align_external_data_streaming(source, aligned, alignment=4096)

    status, out, err = verify(capsys, str(source), str(aligned), "--chunk-size", "1K")

    assert (status, out, err) == (0, "equal: 2 tensors, 4616 bytes compared\n", "")


def test_a_difference_names_the_tensor_and_what_differs(tmp_path, source, capsys):
    with open(source.parent / "model.onnx.data", "r+b") as data_file:
        data_file.seek(4000 + 77 * 8 - 1)
        data_file.write(b"\x7f")

    inline = tmp_path / "inline.onnx"
    model = onnx.load_model(str(source))  # loads the edited bytes inline
    model.graph.initializer[1].raw_data = TENSORS["w1"].tobytes()
    for tensor in model.graph.initializer:
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    onnx.save_model(model, str(inline))

    status, out, err = verify(capsys, str(inline), str(source))

    assert status == 1
    assert out == (
        "different: tensor #1 'w1' (initializer in graph 'identity'): bytes differ at offset 615 of 616 "
        "(A: 0x00, B: 0x7f)\n"
    )
    assert err == ""


def test_an_unsafe_reference_is_one_error_line_without_traceback(tmp_path, source, capsys):
    model = onnx.load_model(str(source), load_external_data=False)
    model.graph.initializer[0].external_data[0].value = "../../etc/passwd"
    bad = tmp_path / "src" / "bad.onnx"
    onnx.save_model(model, str(bad))

    status, out, err = verify(capsys, str(source), str(bad))

    assert status == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: tensor 'w0': external data location '../../etc/passwd'")
    assert "Traceback" not in err


@pytest.mark.parametrize("which", ["missing", "garbage"])
def test_an_unreadable_model_is_one_error_line(tmp_path, source, capsys, which):
    other = tmp_path / f"{which}.onnx"
    if which == "garbage":
        other.write_bytes(b"\x00\x01garbage")

    status, out, err = verify(capsys, str(source), str(other))

    assert status == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and f"{which}.onnx" in err


def test_checksum_mismatches_are_listed_and_fail_only_when_asked(tmp_path, source, capsys):
    model = onnx.load_model(str(source), load_external_data=False)
    model.graph.initializer[0].external_data.add(key="checksum", value="deadbeef")
    with_checksum = tmp_path / "src" / "checksum.onnx"
    onnx.save_model(model, str(with_checksum))

    assert verify(capsys, str(source), str(with_checksum))[0] == 0
    status, out, _ = verify(capsys, str(source), str(with_checksum), "--check-checksums")

    assert status == 1
    assert out.splitlines() == [
        "checksum mismatch: model B: tensor 'w0' (graph 'identity'): checksum 'deadbeef' matches neither the SHA1 of "
        "its 4000 bytes in 'model.onnx.data' nor that of the whole file",
        "equal: 2 tensors, 4616 bytes compared",
    ]


def test_a_bad_chunk_size_is_a_usage_error(source, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["verify", str(source), str(source), "--chunk-size", "lots"])
    assert caught.value.code == 2
    assert "invalid size 'lots'" in capsys.readouterr().err


def test_a_zero_chunk_size_is_a_usage_error(source, capsys):
    with pytest.raises(SystemExit) as done:
        verify(capsys, str(source), str(source), "--chunk-size", "0")
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("usage: ") and "chunk_size must be >= 1, got 0." in err


def test_a_chunk_size_over_1_gib_is_a_usage_error_and_1_gib_works(tmp_path, source, capsys):
    aligned = tmp_path / "aligned.onnx"
    align_external_data_streaming(source, aligned, alignment=4096)

    with pytest.raises(SystemExit) as done:
        verify(capsys, str(source), str(aligned), "--chunk-size", "64G")

    # It used to allocate two 64 GiB buffers and die with a MemoryError traceback.
    captured = capsys.readouterr()
    assert (done.value.code, captured.out) == (2, "")
    assert captured.err.startswith("usage: onnx-light-ref verify")
    assert captured.err.endswith("error: argument --chunk-size: chunk_size must be <= 1073741824, got 68719476736.\n")
    assert verify(capsys, str(source), str(aligned), "--chunk-size", "1G") == (
        0,
        "equal: 2 tensors, 4616 bytes compared\n",
        "",
    )


def test_by_name_verifies_a_delay_undelay_round_trip_that_differs_by_position(tmp_path, source, capsys):
    from onnx_light_ref.ops import delay_initializers, undelay_initializers

    delayed = source.parent / "delayed.onnx"
    onnx.save_model(delay_initializers(source, min_size=1000), str(delayed))  # w0 (4000 bytes) only
    restored = source.parent / "restored.onnx"
    undelay_initializers(delayed, restored)

    assert verify(capsys, str(source), str(restored), "--by-name") == (0, "equal: 2 tensors, 4616 bytes compared\n", "")
    status, out, err = verify(capsys, str(source), str(restored))
    assert (status, err) == (1, "")
    assert out == (
        "different: tensor #0 'w0' (initializer in graph 'identity'): name differs (A: 'w0', B: 'w1')\n"
        "note: tensors are paired by position; if a tool reordered them (undelay does), pair them by graph and name "
        "with --by-name\n"  # issue 29: the fix was nowhere in sight
    )


def test_by_name_reports_a_name_on_one_side_only_and_refuses_a_duplicate(tmp_path, source, capsys):
    model = onnx.load_model(str(source), load_external_data=False)
    model.graph.initializer[1].name = "w9"
    renamed = source.parent / "renamed.onnx"
    onnx.save_model(model, str(renamed))
    assert verify(capsys, str(source), str(renamed), "--by-name") == (
        1,
        "different: tensor #1 'w1' (initializer in graph 'identity') is only in A\n",
        "",
    )
    status, out, _ = verify(capsys, str(source), str(renamed))  # by position: a renamed tensor, no reordering
    assert status == 1 and "name differs (A: 'w1', B: 'w9')" in out and "--by-name" in out

    model.graph.initializer[1].name = "w0"
    twice = source.parent / "twice.onnx"
    onnx.save_model(model, str(twice))

    status, out, err = verify(capsys, str(source), str(twice), "--by-name")
    assert (status, out) == (1, "")
    assert err.startswith("error: model B: initializer 'w0' (graph 'identity') and initializer 'w0'")
    assert err.count("\n") == 1


def test_models_over_2_gib_with_inline_weights_are_verified(tmp_path, capsys):
    a, b = tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx"
    a.parent.mkdir()
    b.parent.mkdir()
    large_inline.write_large_inline_model(a)
    large_inline.write_large_inline_model(b, flip=(0, 1_000_003))  # early: found after reading a few MiB
    if large_inline.real_bytes(a.parent) > 16 * 2**20:
        pytest.skip(f"{tmp_path} does not keep holes in sparse files")
    total = 16 + 12 + large_inline.COUNT * large_inline.LENGTH

    assert verify(capsys, str(a), str(a)) == (
        0,
        f"equal: {2 + large_inline.COUNT} tensors, {total} bytes compared\n",
        "",
    )
    status, out, err = verify(capsys, str(a), str(b), "--chunk-size", "64K")
    assert (status, err) == (1, "")
    assert out == (
        f"different: tensor #2 'w0000' (initializer in graph 'large'): bytes differ at offset 1000003 of "
        f"{large_inline.LENGTH} (A: 0x00, B: 0x01)\n"
    )
    with open(b, "r+b") as f:
        f.truncate(PROTOBUF_LIMIT + 1)  # cuts the payloads short: the wire scan names the byte offset
    status, out, err = verify(capsys, str(a), str(b))
    assert (status, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith(f"error: {str(b)!r} ") and "byte offset" in err


def test_a_difference_in_a_function_with_a_hostile_domain_prints_no_control_character(tmp_path, capsys):
    """Op types and function domains appear in a tensor's place as the model spells them: ESC/OSC-52 and bidi
    overrides must not reach the terminal."""
    hostile = "ai.\x1b]52;c;ZXZpbA==\x07\u202e"
    paths = []
    for value in (1.0, 2.0):
        constant = onnx.helper.make_node(
            "Constant", [], ["Y"], value=onnx.numpy_helper.from_array(np.array([value], np.float32), "c")
        )
        function = onnx.helper.make_function(hostile, "F", [], ["Y"], [constant], [onnx.helper.make_opsetid("", 18)])
        graph = onnx.helper.make_graph([], "g", [], [])
        path = tmp_path / f"{value}.onnx"
        onnx.save_model(onnx.helper.make_model(graph, functions=[function]), str(path))
        paths.append(str(path))

    status, out, err = verify(capsys, *paths)

    assert status == 1 and err == ""
    assert out.startswith("different: tensor #0 'c' (attribute in function ai.\\x1b]52;c;ZXZpbA==\\x07\\u202e::F / ")
    assert out.endswith("\n") and out[:-1].isprintable()
