"""Child process of the publication race tests: save writer ``K``'s model into one destination, ``N`` times.

Usage, from the repository root (the child imports ``tests.models``)::

    python -m tests.hardening._race_child DST_ONNX WRITER TIMES [pause MID_MARKER RESUME_MARKER]

Writer ``K``'s model has graph name ``writer<K>`` and one tensor whose size and values depend on ``K`` (see
:func:`writer_array`), so an ``.onnx`` beside another writer's weights file is detected by reading it back. With
``pause``, the first publication stops between the weights rename and the ``.onnx`` rename: it creates
``MID_MARKER`` and waits (at most a few seconds) for ``RESUME_MARKER``, which is exactly the window where a second
writer, if it were not locked out, would publish and leave a mixed pair behind.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import onnx

from onnx_light_ref.io._shared_save import save_model_with_shared_external_data
from onnx_light_ref.io._write import publish
from tests.models import identity_model

PAUSE_SECONDS = 60.0  # a bound only: the test resumes the writer as soon as the other one waits for the lock


def writer_array(writer: int) -> np.ndarray:
    """Different lengths (so offsets and file sizes differ) and values per writer."""
    return np.arange(1000 + 37 * writer, dtype=np.float32) + 1000.0 * writer


def writer_model(writer: int) -> onnx.ModelProto:
    """Writer ``writer``'s model: graph ``writer<K>`` returning its one tensor ``w``."""
    return identity_model({"w": writer_array(writer)}, name=f"writer{writer}")


def pause_after_first_rename(mid_marker: str, resume_marker: str) -> None:
    real_move = publish._move
    state = {"moves": 0}

    def move(temp: str, final: str) -> publish._Move:
        result = real_move(temp, final)
        state["moves"] += 1
        if state["moves"] == 1:  # the weights file (or the bridge .onnx) is published, the final .onnx not yet
            open(mid_marker, "w").close()
            deadline = time.monotonic() + PAUSE_SECONDS
            while not os.path.exists(resume_marker) and time.monotonic() < deadline:
                time.sleep(0.01)
        return result

    publish._move = move


def main(argv: list[str]) -> None:
    dst, writer, times = argv[0], int(argv[1]), int(argv[2])
    if len(argv) > 3 and argv[3] == "pause":
        pause_after_first_rename(argv[4], argv[5])
    for _ in range(times):
        save_model_with_shared_external_data(writer_model(writer), dst, alignment=64, durable=False)


if __name__ == "__main__":
    main(sys.argv[1:])
