"""A forgetful writer cannot skip a rule: each rule of the writer contract, through the one way to disk.

Every writer hands a :class:`WritePlan` to :func:`execute`, the only code that writes. These rows play a writer that
forgets one part of its job (a check, a site, its ``.onnx``, a file its model reads) and show that ``execute``
refuses, naming what is wrong, with nothing written and no source byte changed; or, where forgetting is impossible by
construction (the ``.onnx`` is always an output; a site cannot be left out), that the plan cannot be built that way.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref.errors import ExistingFileError, SafetensorsError, SharedWeightsError
from onnx_light_ref.io._align import plan_alignment, write_plan
from onnx_light_ref.io._plan.sites import SITE_EXTERNALIZED, SITE_INLINE, SITE_KEPT, SITE_MOVED, SiteColumns, iter_sites
from onnx_light_ref.io._write.contract import (
    PlannedFile,
    PlannedModel,
    ReferencedFile,
    WriteOptions,
    WritePlan,
    WriterContractError,
)
from onnx_light_ref.io._write.execute import execute
from onnx_light_ref.ops import delay_initializers
from tests.checks import sha256_of_tree, temp_files_under
from tests.contract.recorded import recorded
from tests.contract.sharers import external_model
from tests.models import identity_model, make_model, write_external_model, write_model

PAYLOAD = np.arange(4, dtype=np.float32)


def _model(name: str = "w") -> onnx.ModelProto:
    return identity_model([numpy_helper.from_array(PAYLOAD, name)])


def _weights(path: Path) -> PlannedFile:
    return PlannedFile(str(path), "weights", PAYLOAD.nbytes, writes=[(0, PAYLOAD.tobytes())])


def _placed(path: Path, kind: int = SITE_EXTERNALIZED) -> SiteColumns:
    return recorded(_model(), (kind, str(path), 0, PAYLOAD.nbytes))


def _execute_refused(tmp_path: Path, plan: WritePlan, error: type[BaseException], match: str) -> None:
    before = sha256_of_tree(tmp_path)
    with pytest.raises(error, match=match):
        execute(plan, lambda _stats: None, durable=False)
    assert sha256_of_tree(tmp_path) == before and temp_files_under(tmp_path) == []


def test_a_good_plan_publishes_exactly_its_model_and_files(tmp_path: Path) -> None:
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), _model(), _placed(tmp_path / "w.bin"), 0)],
                     [_weights(tmp_path / "w.bin")])  # fmt: skip
    execute(plan, lambda _stats: None, durable=False)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "w.bin"]  # the .onnx is an output without being listed
    loaded = onnx.load(str(tmp_path / "m.onnx"))  # with its external data
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), PAYLOAD)
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)


def test_rule_1_a_writer_that_forgets_to_look_for_other_models_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(PAYLOAD.tobytes())
    write_model(tmp_path / "other.onnx", external_model("w.bin"))
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), _model(), _placed(tmp_path / "w.bin"), 0)],
                     [_weights(tmp_path / "w.bin")], WriteOptions(overwrite=True))  # fmt: skip
    _execute_refused(tmp_path, plan, SharedWeightsError, r"file '.*w\.bin' is used by '.*other\.onnx'")


def test_rule_2_a_plan_without_sites_cannot_be_built(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="sites"):
        PlannedModel(str(tmp_path / "m.onnx"), _model())  # type: ignore[call-arg]


def test_rule_2_a_writer_that_forgets_a_site_is_refused(tmp_path: Path) -> None:
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), _model(), SiteColumns(), 0)], [])
    _execute_refused(tmp_path, plan, AssertionError, r"has 1 references .* its plan 0 sites")


def test_rule_2_a_writer_that_forgets_the_delayed_initializer_nodes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    write_external_model(tmp_path / "src", {"w": PAYLOAD})
    model = delay_initializers(tmp_path / "src" / "model.onnx")  # no tensor left: one node reading model.onnx.data
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), model, SiteColumns(), 0)], [])
    _execute_refused(tmp_path, plan, AssertionError, r"has 1 references \(tensors and DelayedInitializer nodes\)")


def test_rule_2_a_writer_that_forgets_the_shape_tensor_rule_is_refused(tmp_path: Path) -> None:
    shape = numpy_helper.from_array(np.array([2, 2], dtype=np.int64), "shape")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])],
        [shape],
    )
    model = make_model(graph)
    sites = recorded(model, (SITE_EXTERNALIZED, str(tmp_path / "w.bin"), 0, 16))
    weights = PlannedFile(str(tmp_path / "w.bin"), "weights", 16, writes=[(0, shape.raw_data)])
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), model, sites, 0)], [weights])
    _execute_refused(tmp_path, plan, AssertionError, "made external although rule 2 keeps it inline .shape tensor.")


def test_rule_2_a_writer_that_forgets_to_write_the_file_a_tensor_is_placed_in_is_refused(tmp_path: Path) -> None:
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), _model(), _placed(tmp_path / "w.bin"), 0)], [])
    _execute_refused(tmp_path, plan, AssertionError, r"placed in '.*w\.bin', which the plan neither writes nor")


def test_rule_2_a_kept_reference_to_a_file_the_writer_did_not_check_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.bin").write_bytes(PAYLOAD.tobytes())
    model = external_model("elsewhere.bin")
    sites = recorded(model, SITE_KEPT)
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), model, sites, 0)], [])
    _execute_refused(tmp_path, plan, AssertionError, r"would read '.*elsewhere\.bin', which the plan neither writes")
    plan.referenced.append(ReferencedFile(str(tmp_path / "elsewhere.bin"), PAYLOAD.nbytes))
    execute(plan, lambda _stats: None, durable=False)  # once the writer checked it, the reference is kept


def test_rule_2_a_site_whose_kind_disagrees_with_the_model_is_refused(tmp_path: Path) -> None:
    sites = recorded(_model(), SITE_KEPT)  # the tensor is inline: a writer that thinks it is external
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), _model(), sites, 0)], [])
    _execute_refused(tmp_path, plan, AssertionError, "is inline but planned as kept")
    model = external_model("w.bin")
    sites = recorded(model, SITE_INLINE)
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), model, sites, 0)], [])
    _execute_refused(tmp_path, plan, AssertionError, "is external but planned inline")


def test_rule_3_a_writer_that_forgets_ownership_is_refused_for_a_file_and_for_its_onnx(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"a user's file")
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), _model(), _placed(tmp_path / "w.bin"), 0)],
                     [_weights(tmp_path / "w.bin")])  # fmt: skip
    _execute_refused(tmp_path, plan, ExistingFileError, r"weights file '.*w\.bin' exists and is not an output")
    (tmp_path / "w.bin").unlink()
    (tmp_path / "m.onnx").write_bytes(b"not a model")  # the .onnx is an output though no writer listed it
    os.rename(tmp_path / "m.onnx", tmp_path / "m.txt")
    plan.models[0].path = str(tmp_path / "m.txt")
    _execute_refused(tmp_path, plan, ExistingFileError, r"destination '.*m\.txt' exists and is not an ONNX model")


def test_rule_4_a_writer_that_forgets_the_safetensors_limit_is_refused(tmp_path: Path) -> None:
    header = 100_000_001
    weights = PlannedFile(str(tmp_path / "w.safetensors"), "weights", 8 + header, data_start=8 + header,
                          format="safetensors")  # fmt: skip
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), onnx.ModelProto(), SiteColumns())], [weights])
    _execute_refused(tmp_path, plan, SafetensorsError, "would have a 100,000,001-byte header")


def test_moved_sites_point_the_model_at_their_place_whatever_the_model_said(tmp_path: Path) -> None:
    """The executor writes every placed reference from the plan: a stale location in the model is overwritten."""
    model = external_model("stale.bin")
    (tmp_path / "src").mkdir()
    sites = recorded(model, (SITE_MOVED, str(tmp_path / "w.bin"), 0, PAYLOAD.nbytes))
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), model, sites)], [_weights(tmp_path / "w.bin")])
    execute(plan, lambda _stats: None, durable=False)
    written = onnx.load(str(tmp_path / "m.onnx"))
    np.testing.assert_array_equal(numpy_helper.to_array(written.graph.initializer[0]), PAYLOAD)


def _two_tensors() -> onnx.ModelProto:
    """Two tensors of one size: a swap of their places would go unnoticed by every size check."""
    return identity_model([numpy_helper.from_array(PAYLOAD, "w0"), numpy_helper.from_array(PAYLOAD + 10, "w1")])


def _two_weights(path: Path) -> PlannedFile:
    data = PAYLOAD.tobytes() + (PAYLOAD + 10).tobytes()
    return PlannedFile(str(path), "weights", len(data), writes=[(0, data)])


def test_rule_2_sites_recorded_out_of_walk_order_are_refused_naming_the_first_drifted_site(tmp_path: Path) -> None:
    model = _two_tensors()
    sites = SiteColumns()
    first, second = iter_sites(model)
    sites.add(second, SITE_EXTERNALIZED, str(tmp_path / "w.bin"), 0, PAYLOAD.nbytes)  # w1 recorded first
    sites.add(first, SITE_EXTERNALIZED, str(tmp_path / "w.bin"), PAYLOAD.nbytes, PAYLOAD.nbytes)
    weights = _two_weights(tmp_path / "w.bin")
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), model, sites, 0)], [weights])
    match = r"the plan's sites drifted from the model's walk at tensor 'w0' \(graph / initializer #0\)"
    _execute_refused(tmp_path, plan, WriterContractError, match)
    assert issubclass(WriterContractError, AssertionError)  # a writer bug, never the user's model


def test_rule_2_a_model_changed_after_planning_is_refused_not_written_with_swapped_places(tmp_path: Path) -> None:
    """A real writer's plan (align's) whose model changed between planning and the write: the walk no longer
    matches the sites the plan recorded, and nothing is written (not w0 pointing at w1's bytes)."""
    (tmp_path / "src").mkdir()
    source = write_external_model(tmp_path / "src", {"w0": PAYLOAD, "w1": PAYLOAD + 10})
    align = plan_alignment(source, tmp_path / "m.onnx")
    plan = write_plan([align], WriteOptions())
    initializers = plan.models[0].proto.graph.initializer
    swapped = [onnx.TensorProto(), onnx.TensorProto()]
    swapped[0].CopyFrom(initializers[1])
    swapped[1].CopyFrom(initializers[0])
    del initializers[:]
    initializers.extend(swapped)
    _execute_refused(tmp_path, plan, WriterContractError, r"drifted from the model's walk at tensor 'w1'")


def test_rule_2_kinds_recorded_without_their_sites_are_refused(tmp_path: Path) -> None:
    sites = SiteColumns()
    sites.kinds = bytearray([SITE_INLINE])  # a kind without the site it describes: nothing to check it against
    plan = WritePlan("test", [PlannedModel(str(tmp_path / "m.onnx"), _model(), sites, 0)], [])
    _execute_refused(tmp_path, plan, WriterContractError, r"1 sites planned, 0 recorded with the site of the model")
