"""Size-capped shards packed so that no file is needlessly tiny, and a safetensors file's header under the cap.

The user's model: tensors of 1M, 4K, 4M, 4K, 4M and 40K bytes, ``--max-shard-size 4M``. Filled in model order, the
raw output had five files, one of 4 KiB; with ``--format safetensors`` two files of 4,198,400 bytes, over the
4,194,304-byte cap (each held one 4 MiB tensor and its header), though the README said a file exceeds the cap only
when it holds one larger tensor. Both formats are run through the command line, and the outputs are loaded by every
consumer: ``onnx.load``, ``check_model(full_check=True)``, onnxruntime and ``safetensors.safe_open``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from safetensors import safe_open

from onnx_light_ref import align_external_data_in_memory, verify_models
from tests.checks import run_onnxruntime
from tests.cli_runner import run_cli
from tests.io.test_layouts import entries_of, uint8_tensors
from tests.models import make_external_model

MIB, KIB = 1024 * 1024, 1024
LENGTHS = [MIB, 4 * KIB, 4 * MIB, 4 * KIB, 4 * MIB, 40 * KIB]


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    tensors = uint8_tensors(LENGTHS)
    (tmp_path / "src").mkdir()
    return make_external_model(tmp_path / "src", tensors), tensors


def loads_everywhere(model: Path, tensors: dict[str, np.ndarray]) -> None:
    """onnx with its external data, the full checker, onnxruntime: every tensor, every byte."""
    loaded = onnx.load(str(model))
    assert {tensor.name for tensor in loaded.graph.initializer} == set(tensors)
    for tensor in loaded.graph.initializer:
        assert np.array_equal(onnx.numpy_helper.to_array(tensor), tensors[tensor.name])
    onnx.checker.check_model(str(model), full_check=True)
    for array, output in zip(tensors.values(), run_onnxruntime(model, {}), strict=True):
        assert np.array_equal(array, output)


def test_raw_shards_are_three_files_the_small_tensors_with_the_first(source, tmp_path: Path) -> None:
    src, tensors = source
    dst = tmp_path / "out" / "model.onnx"

    done = run_cli("align", str(src), str(dst), "--max-shard-size", "4M", "--no-progress")

    assert done.returncode == 0, done.stderr
    assert "(+2 shards: 3 files)" in done.stdout
    files = ["model.onnx.data", "model.onnx.data.1", "model.onnx.data.2"]
    assert sorted(p.name for p in dst.parent.iterdir()) == sorted(["model.onnx", *files])
    assert [(dst.parent / name).stat().st_size for name in files] == [MIB + 48 * KIB, 4 * MIB, 4 * MIB]
    entries = entries_of(dst)
    # File W: the model's first tensor, then the others largest first, each at a multiple of 4096.
    assert {name: (e["location"], int(e["offset"])) for name, e in entries.items()} == {
        "t0": ("model.onnx.data", 0),
        "t1": ("model.onnx.data", MIB + 40 * KIB),
        "t2": ("model.onnx.data.1", 0),
        "t3": ("model.onnx.data", MIB + 44 * KIB),
        "t4": ("model.onnx.data.2", 0),
        "t5": ("model.onnx.data", MIB),
    }
    loads_everywhere(dst, tensors)
    assert verify_models(src, dst).equal
    twin = tmp_path / "twin" / "model.onnx"  # the in-memory aligner plans the same: byte-identical outputs
    twin.parent.mkdir()
    align_external_data_in_memory(src, twin, max_shard_size=4 * MIB)
    for name in ["model.onnx", *files]:
        assert (twin.parent / name).read_bytes() == (dst.parent / name).read_bytes(), name


def test_safetensors_files_respect_the_cap_with_their_header(source, tmp_path: Path) -> None:
    src, tensors = source
    dst = tmp_path / "out" / "model.onnx"

    done = run_cli("align", str(src), str(dst), "--format", "safetensors", "--max-shard-size", "4M", "--no-progress")

    assert done.returncode == 0, done.stderr
    names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    sizes = [(dst.parent / name).stat().st_size for name in names]
    # The small tensors share a file under the cap, header (4096 bytes, padded to the alignment) included; a 4 MiB
    # tensor cannot fit with its header: a file of its own, the only kind allowed above the cap.
    assert sizes == [4096 + MIB + 48 * KIB, 4096 + 4 * MIB, 4096 + 4 * MIB]
    assert sizes[0] <= 4 * MIB
    placed: dict[str, str] = {}
    for name in names:
        with safe_open(str(dst.parent / name), framework="numpy") as checkpoint:
            for key in checkpoint.keys():  # noqa: SIM118 - safe_open is not a dict
                assert np.array_equal(checkpoint.get_tensor(key), tensors[key])
                placed[key] = name
    assert placed == {"t0": names[0], "t1": names[0], "t2": names[1], "t3": names[0], "t4": names[2], "t5": names[0]}
    loads_everywhere(dst, tensors)
    assert verify_models(src, dst).equal


def test_a_file_of_small_tensors_stays_under_the_cap_with_its_header(tmp_path: Path) -> None:
    """Tensors that fit the cap by their bytes alone but not with the header go to another file."""
    tensors = uint8_tensors([2 * KIB, 2 * KIB, 2 * KIB])
    (tmp_path / "src").mkdir()
    src = make_external_model(tmp_path / "src", tensors)
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()

    # alignment 0: the header is padded to 8 bytes only; 6 KiB of tensors plus a header do not fit in 6 KiB.
    result = align_external_data_in_memory(src, dst, alignment=0, weights_format="safetensors", max_shard_size=6 * KIB)

    sizes = [Path(path).stat().st_size for path in result.weights_files]
    assert len(sizes) == 2 and all(size <= 6 * KIB for size in sizes)
    loads_everywhere(dst, tensors)
