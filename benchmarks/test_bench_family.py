"""A family of models (issue 28): a decoder and a decoder-with-past holding the same weights, exported separately.

Two members of half the bench total each (``ONNX_LIGHT_REF_BENCH_SIZE=512M``: 2 x 256 MiB), 16 tensors each: 15 of
them the same bytes under other names, in another order, and one tensor only that member has; each member in its
own folder with its own data file (64-byte gaps: unaligned, as onnx's writer leaves them), so nothing is shared on
disk. Compared, in fresh processes, interleaved:

* ``align_models``: the family into one folder over one set of weights files (each distinct payload once; dedup
  reads both copies of every shared tensor to compare them byte for byte, from the page cache);
* ``align_each``: ``align_external_data_streaming`` of each member alone (every tensor stored again);
* ``copy_unique``: the limit for the job, a ``copy_file_range`` of the unique ranges to aligned offsets + fsync.

Bytes written are asserted (the family writes the unique bytes, aligning each alone writes everything); no timing
assertion: see ``python -m benchmarks.report``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.conftest import BenchConfig, Method
from benchmarks.models import KIB, _external_tensor, _fill_range, _identity_model, _random_block, _save_proto

_MEMBERS = (("export_a", "decoder_model.onnx"), ("export_b", "decoder_with_past_model.onnx"))
_TENSORS = 16  # per member: 15 shared, 1 its own
_GAP = 64  # unaligned source offsets
_DISTINCT = 65_537  # phase step between distinct contents (windows of one random block)


@dataclass(frozen=True)
class FamilyModel:
    sources: list[str]
    tensor_bytes: int
    ranges: list[list[Any]]  # [path, offset, length] of each distinct payload (its first copy)

    @property
    def member_bytes(self) -> int:
        return _TENSORS * self.tensor_bytes

    @property
    def unique_bytes(self) -> int:
        return len(self.ranges) * self.tensor_bytes


def make_family(root: Path, total: int) -> FamilyModel:
    """Write the two members under ``root``; no weight-sized array is ever built (one 4 MiB block, repeated)."""
    tensor_bytes = max(4 * KIB, total // 2 // _TENSORS // (4 * KIB) * (4 * KIB))
    block = _random_block(float_values=False)
    sources: list[str] = []
    ranges: list[list[Any]] = []
    for member, (folder, name) in enumerate(_MEMBERS):
        os.makedirs(root / folder, exist_ok=True)
        data = root / folder / "model.onnx_data"
        contents = list(range(_TENSORS - 1)) if member == 0 else list(reversed(range(_TENSORS - 1)))
        contents.append(100 + member)  # the member's own tensor
        initializers = []
        offset = 0
        fd = os.open(data, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for index, content in enumerate(contents):
                offset += _GAP
                _fill_range(fd, offset, tensor_bytes, block, content * _DISTINCT)
                tensor_name = f"model.layers.{content}.weight" if member == 0 else f"onnx::MatMul_{1000 + index}"
                initializers.append(
                    _external_tensor(tensor_name, [tensor_bytes // 4], "model.onnx_data", offset, tensor_bytes)
                )
                if member == 0 or content >= 100:
                    ranges.append([str(data), offset, tensor_bytes])
                offset += tensor_bytes
        finally:
            os.close(fd)
        _save_proto(_identity_model(initializers), str(root / folder / name))
        sources.append(str(root / folder / name))
    os.sync()
    return FamilyModel(sources, tensor_bytes, ranges)


def test_family(compare: Any, bench_config: BenchConfig, tmp_path: Path) -> None:
    family = make_family(tmp_path / "family-sources", bench_config.total)
    common = {"alignment": 4096, "chunk_size": 4 * 1024 * 1024}
    pairs = [[source, "{fresh}/" + os.path.basename(source)] for source in family.sources]
    methods = [
        Method("align_models", "align_models", {"srcs": family.sources, "dst": "{fresh}", **common}),
        Method("align_each", "align_each", {"pairs": pairs, **common}),
        Method(
            "copy_unique",
            "copy_file_range_ranges",
            {"ranges": family.ranges, "dst": "{fresh}/unique.data", "alignment": 4096},
        ),
    ]
    summary = compare(
        "family",
        methods,
        members=len(family.sources),
        member_bytes=family.member_bytes,
        shared_fraction=(_TENSORS - 1) / _TENSORS,
        payload_bytes=family.unique_bytes,
        tensor_count=_TENSORS * len(family.sources),
        tensor_bytes=family.tensor_bytes,
    )
    ours = summary["align_models"]["extra"]
    assert ours["unique_bytes"] == family.unique_bytes
    assert ours["separate_bytes"] == 2 * family.member_bytes
    assert ours["bytes_written"] == family.unique_bytes  # tensors of whole pages: no padding
    assert summary["align_each"]["extra"]["bytes_written"] == 2 * family.member_bytes
    assert summary["copy_unique"]["extra"]["bytes_written"] == family.unique_bytes
