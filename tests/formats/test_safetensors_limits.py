"""Rule 4 for the safetensors writer: a header the ``safetensors`` library would refuse is never written.

The library refuses a header size ``N`` (the JSON and its padding) above 100,000,000 bytes. Before this rule, an
alignment of 128 MiB (the header is padded to it) or a tensor name of 10**8 characters wrote such files with exit 0.
Now both aligners and the CLI refuse before anything is written, naming the cause and the limit; the largest
alignment a header can give (64 MiB) still works and loads in safetensors; ``inspect`` says a file above the limit
is refused.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from safetensors import safe_open

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming, verify_models
from onnx_light_ref.errors import SafetensorsError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read.safetensors_header import (
    MAX_DATA_ALIGNMENT,
    MAX_HEADER_SIZE,
    SafetensorsEntry,
    encode_header,
)
from tests.checks import assert_no_temp_files, run_onnxruntime, sha256_of_tree
from tests.cli_runner import run_cli
from tests.models import external_tensor, make_external_model, make_model, value_info

ALIGNERS = [align_external_data_streaming, align_external_data_in_memory]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def _small_model(folder: Path) -> Path:
    return make_external_model(folder, {"w": np.arange(16, dtype=np.float32)}, name="src.onnx")


@pytest.mark.parametrize("aligner", ALIGNERS)
@pytest.mark.parametrize("alignment", [2**27, 2**30])
def test_an_alignment_no_header_padding_can_give_is_refused_and_nothing_is_written(
    tmp_path: Path, aligner: object, alignment: int
) -> None:
    src = _small_model(tmp_path)
    before = sha256_of_tree(tmp_path)
    with pytest.raises(SafetensorsError) as info:
        aligner(src, tmp_path / "m.onnx", alignment=alignment, weights_format="safetensors")  # type: ignore[operator]
    message = str(info.value)
    assert f"alignment {alignment} cannot be given to a safetensors file" in message
    assert "100,000,000" in message and f"{MAX_DATA_ALIGNMENT} (64 MiB)" in message and "Nothing written" in message
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_cli_align_refuses_an_alignment_of_128M_as_safetensors(tmp_path: Path) -> None:
    src = _small_model(tmp_path)
    before = sha256_of_tree(tmp_path)
    out = _cli("align", str(src), str(tmp_path / "m.onnx"), "--format", "safetensors", "--alignment", "128M")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("error: alignment 134217728 cannot be given to a safetensors file")
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert sha256_of_tree(tmp_path) == before


def test_64_MiB_the_largest_alignment_a_header_can_give_loads_everywhere(tmp_path: Path) -> None:
    src = _small_model(tmp_path)
    dst = tmp_path / "m.onnx"
    align_external_data_streaming(src, dst, alignment=MAX_DATA_ALIGNMENT, weights_format="safetensors", durable=False)
    weights = tmp_path / "m.safetensors"
    raw = weights.read_bytes()
    assert int.from_bytes(raw[:8], "little") == MAX_DATA_ALIGNMENT - 8 <= MAX_HEADER_SIZE
    with safe_open(str(weights), framework="numpy") as opened:
        np.testing.assert_array_equal(opened.get_tensor("w"), np.arange(16, dtype=np.float32))
    onnx.checker.check_model(str(dst), full_check=True)
    (output,) = run_onnxruntime(dst, {})
    np.testing.assert_array_equal(output, np.arange(16, dtype=np.float32))
    assert verify_models(src, dst).equal
    assert build_layout_report(dst).ok


def test_a_header_of_exactly_the_limit_opens_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    """The library's rule is on ``N``, padding included: ``N == 100,000,000`` opens, the next header size does not."""
    name_len = MAX_HEADER_SIZE - len(b'{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}')
    header = encode_header([SafetensorsEntry("k" * name_len, "U8", (1,), 0, 1)], 8)
    assert len(header) == 8 + MAX_HEADER_SIZE
    path = tmp_path / "limit.safetensors"
    path.write_bytes(header + b"\x07")
    with safe_open(str(path), framework="numpy") as opened:
        assert opened.get_tensor("k" * name_len).tolist() == [7]
    with pytest.raises(SafetensorsError, match=r"100,000,001 bytes of JSON, above the 100,000,000-byte limit"):
        encode_header([SafetensorsEntry("k" * (name_len + 1), "U8", (1,), 0, 1)], 8)


def test_padding_that_would_push_the_header_over_the_limit_is_refused_naming_the_padding() -> None:
    """70 MB of JSON fits the limit, but padded to a 64 MiB multiple it would be 2**27 - 8 bytes."""
    entries = [SafetensorsEntry("n" * 70_000_000, "U8", (1,), 0, 1)]
    assert len(encode_header(entries, 1)) < MAX_HEADER_SIZE
    with pytest.raises(SafetensorsError) as info:
        encode_header(entries, MAX_DATA_ALIGNMENT)
    assert f"starts at a multiple of {MAX_DATA_ALIGNMENT} makes it {2**27 - 8:,} bytes" in str(info.value)
    assert "above the 100,000,000-byte limit" in str(info.value)


def _long_name_model(folder: Path) -> Path:
    """A model whose one extra initializer has a name of 10**8 characters (unused, so that it appears once).

    Written by hand (the proto serialized once, the data file written directly): ``onnx.save`` of a 100 MB name
    takes seconds.
    """
    (folder / "src.data").write_bytes(np.ones(2, np.float32).tobytes() + np.zeros(2, np.float32).tobytes())
    w = external_tensor("w", np.ones(2, np.float32), [("location", "src.data"), ("offset", "0"), ("length", "8")])
    long = external_tensor(
        "n" * 10**8, np.zeros(2, np.float32), [("location", "src.data"), ("offset", "8"), ("length", "8")]
    )
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [], [value_info("y", TensorProto.FLOAT, [2])], [w, long]
    )
    (folder / "src.onnx").write_bytes(make_model(graph).SerializeToString())
    return folder / "src.onnx"


def test_a_name_of_10_to_the_8_characters_is_refused_by_both_aligners_and_the_cli(tmp_path: Path) -> None:
    src = _long_name_model(tmp_path)
    before = sha256_of_tree(tmp_path)
    for aligner in ALIGNERS:
        with pytest.raises(SafetensorsError) as info:
            aligner(src, tmp_path / "m.onnx", weights_format="safetensors")
        message = str(info.value)
        assert "safetensors header of 2 key(s) is 100,000," in message and "above the 100,000,000-byte limit" in message
        assert "(100,000,000 characters)" in message and "max_shard_size" in message and "Nothing written" in message
        assert len(message) < 1000  # the name is shortened, not quoted whole
        assert sha256_of_tree(tmp_path) == before
    out = _cli("align", str(src), str(tmp_path / "m.onnx"), "--format", "safetensors", "--no-progress")
    assert out.returncode == 1 and out.stderr.startswith("error: safetensors file: the safetensors header of 2 key(s)")
    assert sha256_of_tree(tmp_path) == before
    assert_no_temp_files(tmp_path)


def test_inspect_says_a_header_above_the_limit_is_refused(tmp_path: Path) -> None:
    """What the old writer produced with alignment 128M: inspect said WARNING and ``status: OK``."""
    weights = tmp_path / "m.safetensors"
    size = 2**27 - 8  # the header the old writer padded to 128 MiB
    with open(weights, "wb") as file:  # sparse: the size is refused before any header byte is read
        file.write(size.to_bytes(8, "little") + b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}')
        file.truncate(8 + size + 16)
    entries = (("location", "m.safetensors"), ("offset", str(8 + size)), ("length", "16"))
    w = external_tensor("w", np.zeros(4, np.float32), entries)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [], [value_info("y", TensorProto.FLOAT, [4])], [w]
    )
    (tmp_path / "m.onnx").write_bytes(make_model(graph).SerializeToString())
    with pytest.raises(Exception, match=r"(?i)header too large"):
        safe_open(str(weights), framework="numpy")
    report = build_layout_report(tmp_path / "m.onnx")
    assert not report.ok
    (tensor,) = report.tensors
    assert tensor.status == "safetensors refuses"
    assert "exceeds the 100000000-byte limit of the safetensors library" in tensor.message
    out = _cli("inspect", str(tmp_path / "m.onnx"))
    assert out.returncode == 1
    assert "REFUSED by the safetensors library: safetensors header INVALID" in out.stdout
    assert "status: 1 error(s)" in out.stdout and "status: OK" not in out.stdout
