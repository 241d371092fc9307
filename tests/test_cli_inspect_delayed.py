"""``inspect`` of a model read by ``ai.rt::DelayedInitializer`` nodes (onnx-light's form): what each node reads.

It printed "no external tensors (1 inline)" for such a model. Each node's file, offset, length, dtype and shape are
listed, checked as ``run`` (the kernel bound to the model's folder) and ``undelay`` open them, with the statuses of
external tensors; the text and ``--json`` say the same (``tests/json/corpus.py`` runs these models both ways and
against the schema).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnx_light_ref.errors import ExternalDataError, UnsafeLocationError
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.ops import reference_evaluator, undelay_initializers
from tests.checks import snapshot_tree
from tests.cli_runner import run_cli
from tests.delayed_reads import EXPECTED, broken_delayed_model, converted_delayed_model
from tests.json.runner import run_both


def test_a_converted_model_lists_what_each_node_reads(tmp_path: Path) -> None:
    light = converted_delayed_model(tmp_path)
    before = snapshot_tree(tmp_path)

    done = run_cli("inspect", str(light))

    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines() == [
        f"model: {light}",
        "read by 2 DelayedInitializer node(s):",
        "name  filename          offset  length  dtype  shape   align  status",
        "w     source.onnx.data       0     256  FLOAT  [8, 8]    any  ok",
        "b     source.onnx.data     256      32  FLOAT  [8]       256  ok",
        "",
        "files:",
        "  source.onnx.data: 2 tensors, 288 bytes used of 288, 0 gap bytes in 0 gaps",
        "",
        "0 external tensors, 2 read by DelayedInitializer nodes, 0 inline; every offset is aligned to 256",
        "status: OK",
    ]
    assert snapshot_tree(tmp_path) == before  # nothing written, no byte read changed
    with reference_evaluator(light) as session:  # what inspect calls fine, the kernel reads
        (w,) = session.run(["w"], {})
    assert np.array_equal(w, np.arange(64, dtype=np.float32).reshape(8, 8))


def test_every_problem_a_node_can_have_gets_the_status_of_an_external_tensor(tmp_path: Path) -> None:
    broken = broken_delayed_model(tmp_path / "m")
    before = snapshot_tree(tmp_path)

    report = build_layout_report(broken)
    done = run_cli("inspect", str(broken))

    found = {read.name: read for read in report.delayed}
    assert set(found) == set(EXPECTED)
    for name, (status, fragment) in EXPECTED.items():
        shown = f"shared ({len(found[name].shared_range)})" if found[name].status == "shared" else found[name].status
        assert shown == status, (name, found[name].message)
        assert fragment in found[name].message, (name, found[name].message)
    assert sorted(found["ok"].shared_with) == ["ext", "twin"]  # a node's range and an external tensor's are one range
    assert (found["linked"].is_error, found["empty"].path) == (False, None)  # not checked; nothing opened
    errors = [name for name, (status, _) in EXPECTED.items() if status not in ("ok", "linked", "shared (3)")]
    assert done.returncode == 1 and f"status: {len(errors)} error(s)" in done.stdout
    # Each error names its node once: in the message, or after it when the message speaks of the tensor.
    assert all(line.count("DelayedInitializer node '") == 1 for line in done.stdout.splitlines() if "'node_" in line)
    assert snapshot_tree(tmp_path) == before


def test_trusting_the_layout_follows_links_and_absolute_names(tmp_path: Path) -> None:
    broken = broken_delayed_model(tmp_path / "m")

    found = {read.name: read for read in build_layout_report(broken, allow_outside_folder=True).delayed}

    assert found["soft"].status == "ok"  # a symbolic link inside the folder, trusted
    assert found["absolute_outside"].status == "ok" and found["absolute_outside"].path == str(tmp_path / "outside.bin")
    assert found["escaping"].status == "unsafe location"  # '..' stays refused: the kernel refuses it too
    assert found["hard"].status == "hard-linked"  # a relative name inside the folder: hard links still refused


UNDELAY_REFUSES = {
    "past_end": (ExternalDataError, "too short: needs 1064 bytes"),
    "gone": (FileNotFoundError, "gone.bin"),
    "hard": (UnsafeLocationError, "has 2 hard links"),
    "soft": (UnsafeLocationError, "symbolic link"),
    "absolute_outside": (UnsafeLocationError, "outside the source model's folder"),
    "escaping": (UnsafeLocationError, "'..'"),
    "gpu": (ValueError, "load_device must be 'cpu' or 'file', got 'gpu'"),
}


@pytest.mark.parametrize("name", UNDELAY_REFUSES)
def test_what_inspect_calls_an_error_undelay_refuses_before_writing(tmp_path: Path, name: str) -> None:
    """inspect's verdict is the readers': undelay (the other static reader of such nodes) refuses the same node for
    the same reason, and writes nothing."""
    import onnx

    broken = broken_delayed_model(tmp_path / "m")
    error, words = UNDELAY_REFUSES[name]

    model = onnx.load(str(broken), load_external_data=False)
    keep = [node for node in model.graph.node if node.output[0] == name]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    del model.graph.output[:]
    del model.graph.initializer[:]
    del model.functions[:]
    one = tmp_path / "m" / f"{name}.onnx"
    onnx.save(model, str(one))
    assert [read.status for read in build_layout_report(one).delayed] == [EXPECTED[name][0]]
    before = snapshot_tree(tmp_path)

    with pytest.raises(error) as refused:
        undelay_initializers(one, tmp_path / "out.onnx")

    assert words in str(refused.value)
    assert snapshot_tree(tmp_path) == before


def test_the_json_document_lists_the_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = broken_delayed_model(tmp_path / "m")

    run = run_both(["inspect", str(broken)], capsys)

    reads = {read["label"]: read for read in run.document["delayed"]}
    assert run.document["delayed_nodes"] == len(reads) == len(EXPECTED)
    assert run.document["error_count"] == sum(read["error"] for read in reads.values())
    assert reads["past_end"] | {"path": None} == reads["past_end"] | {
        "node": "node_past_end",
        "output": "past_end",
        "filename": "w.bin",
        "path": None,
        "offset": 1000,
        "length": 64,
        "alignment": 8,
        "data_type": 1,
        "dtype": "FLOAT",
        "shape": [16],
        "load_device": "file",
        "status": "out of bounds",
        "error": True,
    }
    assert reads["past_end"]["path"] == str(tmp_path / "m" / "w.bin")
    assert reads["gpu"]["filename"] is None and reads["gpu"]["shape"] is None and reads["gpu"]["status"] == "invalid"
    assert reads["linked"]["status"] == "linked" and not reads["linked"]["error"]
    (w_bin,) = [file for file in run.document["files"] if file["location"] == "w.bin"]
    assert w_bin["tensors"] == 7  # the external tensor and the six nodes whose range in it is known
