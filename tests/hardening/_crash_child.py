"""Child process for the crash-safety and concurrency tests: run one io function, announcing when it starts.

Usage::

    python _crash_child.py align SRC_ONNX DST_ONNX CHUNK_SIZE ALIGNMENT
    python _crash_child.py align-sharded SRC_ONNX DST_ONNX CHUNK_SIZE MAX_SHARD_SIZE
    python _crash_child.py shared SRC_ONNX DST_ONNX NEW_BYTES SEED

``align-sharded`` aligns at 4096 with ``align_threshold=1024``, ``dedup=True``, ``size_threshold=1024`` and
``max_shard_size``: several weights files and one ``.onnx`` published as one transaction. ``shared`` loads the
source's metadata (its external tensors are reused), adds ``NEW_BYTES`` of new float32 weights
generated from ``SEED`` (see :func:`new_weights`), and saves the variant at ``DST_ONNX``. The child prints ``ready``
just before calling the function and ``done <return value>`` after it; the parent kills it in between.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper


def new_weights(new_bytes: int, seed: int) -> dict[str, np.ndarray]:
    """The new tensors of the shared-save variant: four float32 tensors totalling ``new_bytes``."""
    rng = np.random.default_rng(seed)
    per_tensor = new_bytes // 4 // 4
    return {f"new_{i}": rng.standard_normal(per_tensor, dtype=np.float32) for i in range(4)}


def variant_model(src_onnx: str, new_bytes: int, seed: int) -> onnx.ModelProto:
    model = onnx.load_model(src_onnx, load_external_data=False)
    for name, array in new_weights(new_bytes, seed).items():
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    return model


def make_call(command: str, src: object, dst: object, first: object, second: object) -> Callable[[], object]:
    """The call ``command`` makes (see the module docstring), prepared: only the write itself is left to run.

    Also what :class:`tests.hardening.forked.ForkedCall` runs in a forked child (prepared once in the parent).
    """
    from onnx_light_ref import align_external_data_streaming, save_model_with_shared_external_data

    src, dst = str(src), str(dst)
    if command == "align":
        return lambda: align_external_data_streaming(src, dst, chunk_size=int(first), alignment=int(second))
    if command == "align-sharded":
        return lambda: align_external_data_streaming(
            src,
            dst,
            chunk_size=int(first),
            alignment=4096,
            align_threshold=1024,
            max_shard_size=int(second),
            dedup=True,
            size_threshold=1024,
        )
    if command == "shared":
        model = variant_model(src, int(first), int(second))
        return lambda: save_model_with_shared_external_data(model, dst, alignment=4096)
    raise SystemExit(f"unknown command {command!r}")


def main(argv: list[str]) -> int:
    call = make_call(*argv)
    print("ready", flush=True)
    result = call()
    print(f"done {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
