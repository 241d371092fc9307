"""Shared save of a variant: 1 GiB reused + 8 MiB new (scaled), ours vs writing the new bytes alone (+ fsync) vs the
system calls the writer contract requires (two files fsynced, renamed in order, the folder fsynced twice) vs onnx.

No timing assertion: see ``python -m benchmarks.report`` for the targets.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.conftest import Method, ModelCache
from benchmarks.models import MIB, scaled


def test_shared_save(compare: Any, models: ModelCache) -> None:
    base = models.align("large")
    new_bytes = scaled(models.total, 8 * MIB)
    # Reused references must resolve from the variant's folder, so ours saves the variant next to the base model.
    variant = os.path.join(os.path.dirname(base.onnx_path), "variant-{run_id}.onnx")
    methods = [
        Method(
            "shared_save",
            "shared_save",
            {"base": base.onnx_path, "dst": variant, "new_bytes": new_bytes},
            cleanup=(variant, variant + ".data"),
        ),
        Method("write_alone", "write_alone", {"dst": "{fresh}/new.data", "new_bytes": new_bytes}),
        # The floor the writer contract sets (issue 43): the same two files written, fsynced and renamed in order.
        Method(
            "write_publish",
            "write_publish",
            {"base": base.onnx_path, "dst": "{fresh}/variant.onnx", "new_bytes": new_bytes},
        ),
        Method(
            "onnx_full_save",
            "onnx_full_save",
            {
                "base": base.onnx_path,
                "dst": "{fresh}/variant.onnx",
                "location": "variant.onnx.data",
                "new_bytes": new_bytes,
            },
        ),
    ]
    summary = compare("shared-save", methods, reused_bytes=base.payload_bytes, new_bytes=new_bytes)
    assert summary["shared_save"]["extra"]["bytes_written"] == new_bytes
    assert summary["write_publish"]["extra"]["bytes_written"] == new_bytes
    assert summary["onnx_full_save"]["extra"]["bytes_written"] == base.payload_bytes + new_bytes
