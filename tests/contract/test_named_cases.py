"""Every case issue 25 names for rules 1 to 3 (and ``link``'s stale file), as the user met it: public API and CLI.

Each refusal checks the exception type (the CLI: exit 1 and one ``error:`` line), the message, that nothing was
written and no source byte changed (the whole tree, byte for byte) and that the other model still computes what it
did, with onnxruntime (or the package's evaluator for ``ai.rt::DelayedInitializer`` models).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import safetensors.numpy as st_numpy
from onnx import TensorProto, helper, numpy_helper

from onnx_light_ref import (
    align_external_data_streaming,
    link_external_data,
    save_model_with_shared_external_data,
)
from onnx_light_ref._cli import main
from onnx_light_ref.errors import (
    DanglingReferenceError,
    DestinationConflictError,
    ExistingFileError,
    SharedWeightsError,
)
from onnx_light_ref.io._write import publish
from onnx_light_ref.ops import delay_initializers, reference_evaluator
from tests.checks import run_onnxruntime, snapshot_tree, temp_files_under
from tests.contract.rule2 import check_output, rule2_model, rule2_tensors
from tests.contract.sharers import bridge_name, computes, external_model
from tests.models import IR_VERSION, OPSET, identity_model, write_external_model, write_model

ONE = np.full(4, 1.0, dtype=np.float32)
SEVEN = np.full(4, 7.0, dtype=np.float32)


def one_error_line(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    return main(argv)


# ---------------------------------------------------------------------------------------------------------- rule 1


@pytest.mark.parametrize("how", ["api", "cli"])
def test_a_model_in_a_parent_folder_keeps_what_it_computes(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``root/top.onnx`` reads ``a/b/w.data`` (legal: relative, no ``..``); aligning into ``root/a/b/`` with
    ``--weights w.data`` replaced it, and top.onnx computed other values."""
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "w.data").write_bytes(ONE.tobytes())
    top = write_model(root / "top.onnx", external_model("a/b/w.data"))
    (tmp_path / "src").mkdir()
    src = write_external_model(tmp_path / "src", {"s": SEVEN})
    before = snapshot_tree(tmp_path)
    dst = root / "a" / "b" / "model.onnx"
    if how == "api":
        with pytest.raises(SharedWeightsError, match=r"top\.onnx.*replace_shared=True"):
            align_external_data_streaming(src, dst, root / "a" / "b" / "w.data")
    else:
        assert run_cli(["align", str(src), str(dst), "--weights", "w.data", "--no-progress"], capsys) == 1
        one_error_line(capsys, "top.onnx", "--replace-shared")
    assert snapshot_tree(tmp_path) == before
    np.testing.assert_array_equal(run_onnxruntime(top, {})[0], ONE)


@pytest.mark.parametrize("how", ["api", "cli"])
def test_a_sibling_named_in_upper_case_keeps_what_it_computes(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``variant.ONNX`` loads like any name in onnx and onnxruntime; the suffix match was case-sensitive."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.onnx.data").write_bytes(ONE.tobytes())
    variant = write_model(tmp_path / "out" / "variant.ONNX", external_model("model.onnx.data"))
    (tmp_path / "src").mkdir()
    src = write_external_model(tmp_path / "src", {"s": SEVEN})
    before = snapshot_tree(tmp_path)
    if how == "api":
        with pytest.raises(SharedWeightsError, match=r"variant\.ONNX"):
            align_external_data_streaming(src, tmp_path / "out" / "model.onnx")
    else:
        assert run_cli(["align", str(src), str(tmp_path / "out" / "model.onnx"), "--no-progress"], capsys) == 1
        one_error_line(capsys, "variant.ONNX")
    assert snapshot_tree(tmp_path) == before
    np.testing.assert_array_equal(run_onnxruntime(variant, {})[0], ONE)


def _light_folder(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``model.onnx`` + ``model.onnx.data``, ``light.onnx`` made from it by ``delay_initializers`` (it reads
    ``model.onnx.data`` through DelayedInitializer ``filename`` attributes), and ``other.onnx``."""
    folder = tmp_path / "models"
    folder.mkdir()
    model = write_external_model(folder, {"w": ONE})
    light = folder / "light.onnx"
    onnx.save(delay_initializers(model), light)
    model.unlink()  # what is left uses the file only through DelayedInitializer nodes
    other = write_external_model(folder, {"w": SEVEN}, name="other.onnx")
    return folder, light, other


@pytest.mark.parametrize("how", ["api", "cli"])
def test_a_model_reading_the_file_through_delayed_initializer_nodes_keeps_what_it_computes(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``align other.onnx other.onnx --weights model.onnx.data`` replaced the file light.onnx reads, and ``run
    light.onnx`` returned values off by up to 163."""
    folder, light, other = _light_folder(tmp_path)
    computed = np.asarray(reference_evaluator(str(light)).run(None, {})[0])
    before = snapshot_tree(tmp_path)
    if how == "api":
        with pytest.raises(SharedWeightsError, match=r"light\.onnx' \(1 DelayedInitializer node, e\.g\. 'w'\)"):
            align_external_data_streaming(other, other, folder / "model.onnx.data")
    else:
        argv = ["align", str(other), str(other), "--weights", "model.onnx.data", "--no-progress"]
        assert run_cli(argv, capsys) == 1
        one_error_line(capsys, "light.onnx", "DelayedInitializer")
    assert snapshot_tree(tmp_path) == before
    np.testing.assert_array_equal(np.asarray(reference_evaluator(str(light)).run(None, {})[0]), computed)


def test_inspect_on_a_folder_lists_the_models_using_a_file_through_delayed_initializer_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _light, _other = _light_folder(tmp_path)
    assert run_cli(["inspect", str(folder)], capsys) == 0
    out = capsys.readouterr().out
    assert "  model.onnx.data: used by light.onnx (DelayedInitializer)" in out
    assert "  other.onnx.data: used by other.onnx" in out


def _linked_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``first.onnx`` linked to ``ck.safetensors`` (its other tensor in ``first.onnx.data``), and ``second.onnx``
    saved from it by the shared saver (it shares ``first.onnx.data``)."""
    folder = tmp_path / "models"
    folder.mkdir()
    (tmp_path / "src").mkdir()
    src = write_external_model(tmp_path / "src", {"w": ONE, "v": SEVEN})
    st_numpy.save_file({"w": ONE}, str(folder / "ck.safetensors"))
    first = folder / "first.onnx"
    link_external_data(src, folder / "ck.safetensors", first)
    variant = onnx.load(str(first), load_external_data=False)
    save_model_with_shared_external_data(variant, folder / "second.onnx")
    return src, first, folder / "second.onnx"


@pytest.mark.parametrize("how", ["api", "cli"])
def test_relinking_a_model_whose_weights_a_variant_shares_is_refused_until_replace_shared(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``link_external_data`` had no guard: re-linking first.onnx replaced first.onnx.data that second.onnx shares."""
    _src, first, second = _linked_pair(tmp_path)
    (tmp_path / "src2").mkdir()
    src2 = write_external_model(tmp_path / "src2", {"w": ONE, "v": ONE * 3})
    before = snapshot_tree(tmp_path)
    checkpoint = first.parent / "ck.safetensors"
    if how == "api":
        with pytest.raises(SharedWeightsError, match=r"first\.onnx\.data.*second\.onnx"):
            link_external_data(src2, checkpoint, first)
    else:
        assert run_cli(["link", str(src2), str(checkpoint), str(first), "--no-progress"], capsys) == 1
        one_error_line(capsys, "second.onnx", "--replace-shared")
    assert snapshot_tree(tmp_path) == before
    np.testing.assert_array_equal(run_onnxruntime(second, {})[1], SEVEN)
    if how == "api":
        link_external_data(src2, checkpoint, first, replace_shared=True)
    else:
        assert (
            run_cli(["link", str(src2), str(checkpoint), str(first), "--no-progress", "--replace-shared"], capsys) == 0
        )
    np.testing.assert_array_equal(run_onnxruntime(first, {})[1], ONE * 3)


@pytest.mark.parametrize("how", ["api", "cli"])
def test_a_variant_saved_while_align_copies_is_found_under_the_lock(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process saves a variant against the weights file while align copies: the re-check under the folder
    lock, right before the first move, refuses (the plan-time check had nothing to see)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    src = write_external_model(tmp_path / "src", {"s": SEVEN})
    dst = tmp_path / "out" / "model.onnx"
    align_external_data_streaming(src, dst)  # the previous output: its weights file is this destination's own
    kept = {name: (tmp_path / "out" / name).read_bytes() for name in ("model.onnx", "model.onnx.data")}
    real_copy = publish.StagedFile.set_size

    def copy_then_a_variant_appears(self: publish.StagedFile, size: int) -> None:
        real_copy(self, size)
        if not (tmp_path / "out" / "variant.onnx").exists():
            write_model(tmp_path / "out" / "variant.onnx", external_model("model.onnx.data"))

    monkeypatch.setattr(publish.StagedFile, "set_size", copy_then_a_variant_appears)
    if how == "api":
        with pytest.raises(SharedWeightsError, match=r"variant\.onnx"):
            align_external_data_streaming(src, dst, alignment=64)
    else:
        assert run_cli(["align", str(src), str(dst), "--alignment", "64", "--no-progress"], capsys) == 1
        one_error_line(capsys, "variant.onnx")
    assert {name: (tmp_path / "out" / name).read_bytes() for name in kept} == kept
    assert temp_files_under(tmp_path) == []
    np.testing.assert_array_equal(run_onnxruntime(tmp_path / "out" / "variant.onnx", {})[0], SEVEN)


@pytest.mark.parametrize("how", ["api", "cli"])
def test_a_bridge_file_a_variant_was_saved_against_is_never_deleted(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed between its two commits leaves model.onnx on a hidden bridge file (documented, loadable); a
    variant saved from it references the bridge; the next align deleted it, leaving the variant unloadable."""
    out = tmp_path / "out"
    out.mkdir()
    bridge = out / bridge_name("model.onnx.data")
    bridge.write_bytes(ONE.tobytes())
    write_model(out / "model.onnx", external_model(bridge.name))
    variant = onnx.load(str(out / "model.onnx"), load_external_data=False)
    variant.graph.initializer.append(numpy_helper.from_array(SEVEN, "extra"))
    variant.graph.output.append(helper.make_tensor_value_info("out_extra", TensorProto.FLOAT, [4]))
    variant.graph.node.append(helper.make_node("Identity", ["extra"], ["out_extra"]))
    save_model_with_shared_external_data(variant, out / "variant.onnx", size_threshold=0)
    (tmp_path / "src").mkdir()
    src = write_external_model(tmp_path / "src", {"s": SEVEN})
    if how == "api":
        align_external_data_streaming(src, out / "model.onnx")
    else:
        assert run_cli(["align", str(src), str(out / "model.onnx"), "--no-progress"], capsys) == 0
    assert bridge.read_bytes() == ONE.tobytes()
    np.testing.assert_array_equal(run_onnxruntime(out / "variant.onnx", {})[0], ONE)
    np.testing.assert_array_equal(run_onnxruntime(out / "model.onnx", {})[0], SEVEN)


def test_an_unchecked_reused_reference_that_exists_as_a_symlink_is_refused(tmp_path: Path) -> None:
    """``check_references=False`` with a reused location that exists as a symlink to the variant's own future
    secondary file: onnxruntime then read the new weights for the reused tensor. (The shared saver has no CLI.)"""
    (tmp_path / "variant.onnx.data").write_bytes(b"")  # where the secondary file will be published
    (tmp_path / "reused.bin").symlink_to("variant.onnx.data")
    reused = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "w")
    reused.ClearField("raw_data")
    reused.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "reused.bin"), ("offset", "0"), ("length", "16")):
        reused.external_data.add(key=key, value=value)
    model = identity_model([reused, numpy_helper.from_array(SEVEN, "new")])
    original = model.SerializeToString()
    before = snapshot_tree(tmp_path)
    with pytest.raises(DanglingReferenceError, match=r"'reused\.bin' names a file that exists.*symbolic link"):
        save_model_with_shared_external_data(model, tmp_path / "variant.onnx", size_threshold=0, check_references=False)
    assert snapshot_tree(tmp_path) == before and model.SerializeToString() == original
    # A reused file that is not there yet is still written as it is.
    (tmp_path / "reused.bin").unlink()
    save_model_with_shared_external_data(model, tmp_path / "variant.onnx", size_threshold=0, check_references=False)


# --------------------------------------------------------------------------------------------------- rule 2 (link)


def _link_scene(tmp_path: Path, checkpoint: dict[str, np.ndarray], external: tuple[str, ...]) -> tuple[Path, Path]:
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    src = write_model(tmp_path / "src" / "model.onnx", rule2_model(external, tmp_path / "src"))
    st_numpy.save_file(checkpoint, str(tmp_path / "out" / "ck.safetensors"))
    return src, tmp_path / "out" / "ck.safetensors"


@pytest.mark.parametrize("how", ["api", "cli"])
def test_link_keeps_function_defaults_training_tensors_and_shape_tensors_inline(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """link linked a function-default attribute tensor and a training_info initializer (gone after onnx.load +
    onnx.save elsewhere) and a 16-byte int64 Reshape shape (onnxruntime and check_model(full_check=True) refuse);
    ``size_threshold`` was ignored for linked tensors."""
    src, checkpoint = _link_scene(tmp_path, rule2_tensors(), ())
    dst = tmp_path / "out" / "linked.onnx"
    if how == "api":
        result = link_external_data(src, checkpoint, dst, size_threshold=1)
        assert result.linked_tensors == 1
        assert result.kept_inline_reasons == {
            "shape tensor": 1,
            "function default attribute": 1,
            "training_info": 1,
        }
    else:
        assert (
            run_cli(["link", str(src), str(checkpoint), str(dst), "--size-threshold", "1", "--no-progress"], capsys)
            == 0
        )
        assert "kept inline where onnx needs them inline" in capsys.readouterr().out
    check_output(dst)
    # Saved elsewhere by onnx itself, the model still holds every tensor.
    (tmp_path / "elsewhere").mkdir()
    onnx.save(onnx.load(str(dst)), tmp_path / "elsewhere" / "copy.onnx")
    onnx.checker.check_model(str(tmp_path / "elsewhere" / "copy.onnx"), full_check=True)
    x = {"x": np.ones((2, 8), np.float32)}
    for got, want in zip(
        run_onnxruntime(tmp_path / "elsewhere" / "copy.onnx", x), run_onnxruntime(src, x), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_link_follows_its_size_threshold_for_linked_tensors(tmp_path: Path) -> None:
    src, checkpoint = _link_scene(tmp_path, rule2_tensors(), ())
    result = link_external_data(src, checkpoint, tmp_path / "out" / "linked.onnx", size_threshold=1024)
    assert result.linked_tensors == 0  # W is 256 bytes: below the threshold it stays inline, as in onnx.save
    check_output(tmp_path / "out" / "linked.onnx")


@pytest.mark.parametrize("how", ["api", "cli"])
def test_link_never_points_a_zero_length_tensor_at_the_start_of_a_data_section(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """onnx 1.17 reads a zero-length reference as the rest of the file: only the end of the file gives it no bytes.
    The checkpoint puts ``0empty`` first (begin 0: the start of its data section)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    tensors = [numpy_helper.from_array(np.zeros(0, np.float32), "0empty"), numpy_helper.from_array(SEVEN, "w")]
    from tests.models import externalize

    externalize(tensors[::-1], tmp_path / "src", "model.onnx.data")  # the empty one last: the end of its file
    src = write_model(tmp_path / "src" / "model.onnx", identity_model(tensors))
    st_numpy.save_file({"0empty": np.zeros(0, np.float32), "w": SEVEN}, str(tmp_path / "out" / "ck.safetensors"))
    header_size = int.from_bytes((tmp_path / "out" / "ck.safetensors").read_bytes()[:8], "little")
    assert json.loads((tmp_path / "out" / "ck.safetensors").read_bytes()[8 : 8 + header_size])["0empty"][
        "data_offsets"
    ] == [0, 0]
    dst = tmp_path / "out" / "linked.onnx"
    if how == "api":
        result = link_external_data(src, tmp_path / "out" / "ck.safetensors", dst)
        assert (result.linked_tensors, result.written_tensors) == (1, 1)
    else:
        argv = ["link", str(src), str(tmp_path / "out" / "ck.safetensors"), str(dst), "--no-progress"]
        assert run_cli(argv, capsys) == 0
    saved = {
        t.name: {e.key: e.value for e in t.external_data}
        for t in onnx.load(str(dst), load_external_data=False).graph.initializer
    }
    assert saved["0empty"]["location"] == "linked.onnx.data"
    assert int(saved["0empty"]["offset"]) == os.path.getsize(tmp_path / "out" / "linked.onnx.data")
    outputs = run_onnxruntime(dst, {})
    assert outputs[0].shape == (0,)
    np.testing.assert_array_equal(outputs[1], SEVEN)


# ---------------------------------------------------------------------------------------------------------- rule 3


@pytest.mark.parametrize("how", ["api", "cli"])
def test_align_to_safetensors_never_replaces_a_pytorch_checkpoint_unless_told(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``align --format safetensors`` into a folder holding PyTorch's ``model.safetensors`` replaced it (the
    default weights name) with exit 0 and no word."""
    folder = tmp_path / "hub"
    folder.mkdir()
    st_numpy.save_file({"layer.weight": SEVEN}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "src").mkdir()
    src = write_external_model(tmp_path / "src", {"s": ONE})
    before = snapshot_tree(tmp_path)
    dst = folder / "model.onnx"
    if how == "api":
        with pytest.raises(ExistingFileError, match=r"model\.safetensors' exists and is not an output of"):
            align_external_data_streaming(src, dst, weights_format="safetensors")
    else:
        assert run_cli(["align", str(src), str(dst), "--format", "safetensors", "--no-progress"], capsys) == 1
        one_error_line(capsys, "model.safetensors", "--overwrite")
    assert snapshot_tree(tmp_path) == before
    assert st_numpy.load_file(str(folder / "model.safetensors"))["layer.weight"].tolist() == SEVEN.tolist()
    if how == "api":
        align_external_data_streaming(src, dst, weights_format="safetensors", overwrite=True)
    else:
        assert (
            run_cli(["align", str(src), str(dst), "--format", "safetensors", "--no-progress", "--overwrite"], capsys)
            == 0
        )
    np.testing.assert_array_equal(run_onnxruntime(dst, {})[0], ONE)


@pytest.mark.parametrize("how", ["api", "cli"])
def test_link_never_writes_over_the_checkpoint_index(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``link M.onnx ck.index.json ck.index.json`` overwrote the checkpoint's index with protobuf."""
    (tmp_path / "src").mkdir()
    src = write_external_model(tmp_path / "src", {"w": ONE})
    st_numpy.save_file({"w": ONE}, str(tmp_path / "model-00001-of-00001.safetensors"))
    index = tmp_path / "ck.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    before = snapshot_tree(tmp_path)
    for overwrite in (False, True):
        if how == "api":
            with pytest.raises(DestinationConflictError, match=r"ck\.index\.json.*is the source file"):
                link_external_data(src, index, index, overwrite=overwrite)
        else:
            argv = ["link", str(src), str(index), str(index), "--no-progress"] + (["--overwrite"] if overwrite else [])
            assert run_cli(argv, capsys) == 1
            one_error_line(capsys, "ck.index.json", "is the source file")
        assert snapshot_tree(tmp_path) == before


def _dataset_model(folder: Path, output: str) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [output])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [2])],
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION), path)
    return path


def test_run_never_replaces_a_users_file_named_like_an_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run`` (default ``--output-dir .``) replaced the user's ``dataset.npy`` because an output is named
    ``dataset``. (``run`` has no Python API: the command is the interface.)"""
    model = _dataset_model(tmp_path, "dataset")
    np.save(tmp_path / "dataset.npy", np.array([3, 4], dtype=np.float32))
    np.save(tmp_path / "x.npy", np.array([1, 2], dtype=np.float32))
    monkeypatch.chdir(tmp_path)
    before = snapshot_tree(tmp_path)
    assert run_cli(["run", str(model), "--input", "x=x.npy"], capsys) == 1
    one_error_line(
        capsys, f"output file {str(tmp_path / 'dataset.npy')!r} exists", "--overwrite", "nothing was written"
    )
    assert snapshot_tree(tmp_path) == before
    assert run_cli(["run", str(model), "--input", "x=x.npy", "--overwrite"], capsys) == 0
    assert np.load(tmp_path / "dataset.npy").tolist() == [1, 2]


def test_run_over_an_output_that_is_a_directory_refuses_before_evaluating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The directory was swapped to a hidden temp name, the run reported failure and left the new file published."""
    model = _dataset_model(tmp_path, "y")
    np.save(tmp_path / "x.npy", np.array([1, 2], dtype=np.float32))
    (tmp_path / "out" / "y.npy").mkdir(parents=True)
    (tmp_path / "out" / "y.npy" / "keep.txt").write_text("mine")
    evaluated: list[object] = []
    from onnx.reference import ReferenceEvaluator

    real_run = ReferenceEvaluator.run
    monkeypatch.setattr(ReferenceEvaluator, "run", lambda *a, **k: evaluated.append(a) or real_run(*a, **k))
    before = snapshot_tree(tmp_path)
    for extra in ([], ["--overwrite"]):
        argv = ["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]
        assert run_cli([*argv, *extra], capsys) == 1
        one_error_line(capsys, "y.npy' exists and is a directory")
        assert snapshot_tree(tmp_path) == before and evaluated == []


def test_run_with_an_output_name_too_long_for_a_file_refuses_before_evaluating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 300-character output name failed after the model ran, quoting an internal temp path."""
    model = _dataset_model(tmp_path, "o" * 300)
    np.save(tmp_path / "x.npy", np.array([1, 2], dtype=np.float32))
    (tmp_path / "out").mkdir()
    evaluated: list[object] = []
    from onnx.reference import ReferenceEvaluator

    real_run = ReferenceEvaluator.run
    monkeypatch.setattr(ReferenceEvaluator, "run", lambda *a, **k: evaluated.append(a) or real_run(*a, **k))
    before = snapshot_tree(tmp_path)
    argv = ["run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]
    assert run_cli(argv, capsys) == 1
    err = one_error_line(capsys, "o" * 300 + ".npy", "304 bytes, longer than the 255 bytes its folder allows")
    assert ".olr~" not in err and evaluated == []
    assert snapshot_tree(tmp_path) == before


# ------------------------------------------------------------------------------------- rule 5 (link's part): stale


@pytest.mark.parametrize("how", ["api", "cli"])
def test_link_reports_its_leftover_weights_file(tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A first link writes DST.onnx.data (a tensor the checkpoint lacks); once the checkpoint has it, the next link
    writes no weights file: the old one is named as stale (never deleted: another model may use it)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    src = write_external_model(tmp_path / "src", {"w": ONE, "v": SEVEN})
    checkpoint = tmp_path / "out" / "ck.safetensors"
    st_numpy.save_file({"w": ONE}, str(checkpoint))
    dst = tmp_path / "out" / "linked.onnx"
    assert link_external_data(src, checkpoint, dst).weights_files == (str(tmp_path / "out" / "linked.onnx.data"),)
    st_numpy.save_file({"w": ONE, "v": SEVEN}, str(checkpoint))
    if how == "api":
        result = link_external_data(src, checkpoint, dst)
        assert result.weights_files == () and result.stale_weights_files == (
            str(tmp_path / "out" / "linked.onnx.data"),
        )
    else:
        assert run_cli(["link", str(src), str(checkpoint), str(dst), "--no-progress"], capsys) == 0
        out = capsys.readouterr().out
        assert "note: 1 file(s) left by an earlier run" in out and "linked.onnx.data" in out
    assert (tmp_path / "out" / "linked.onnx.data").exists()
    np.testing.assert_array_equal(run_onnxruntime(dst, {})[1], SEVEN)
    assert computes(dst).tolist() == ONE.tolist()
