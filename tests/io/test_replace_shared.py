"""Never silently change what another model computes (issue 18, section 5).

Every writer about to replace an existing weights file looks for the other ``.onnx`` files of the folder that
reference it and refuses (``SharedWeightsError``, naming them; nothing written) unless ``replace_shared=True`` /
``--replace-shared``. Sharers are made by our shared saver and by hand (same location, a hard link, a subfolder).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnx_light_ref.errors import DestinationConflictError, SharedWeightsError, UnsafeLocationError
from onnx_light_ref.io._align import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref.io._read.sharing import file_key, files_referenced_near, folder_sharing
from onnx_light_ref.io._shared_save import save_model_with_shared_external_data
from tests.checks import sha256_of_tree
from tests.models import identity_model, save_external, write_model

ALIGNERS = [align_external_data_streaming, align_external_data_in_memory]


def _run(path: Path) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {})


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """``models/first.onnx`` + ``first.onnx.data``; ``models/second.onnx`` shares it (made by our shared saver and
    adding one new tensor); ``other/other.onnx`` computes something else."""
    folder = tmp_path / "models"
    folder.mkdir()
    save_external(
        identity_model({"w": np.array([10, 11, 12, 13], dtype=np.float32)}), folder / "first.onnx", "first.onnx.data"
    )
    variant = onnx.load(str(folder / "first.onnx"), load_external_data=False)
    variant.graph.initializer.append(numpy_helper.from_array(np.arange(8, dtype=np.float32), "extra"))
    variant.graph.output.append(onnx.helper.make_tensor_value_info("extra_out", onnx.TensorProto.FLOAT, [8]))
    variant.graph.node.append(onnx.helper.make_node("Identity", ["extra"], ["extra_out"]))
    save_model_with_shared_external_data(variant, folder / "second.onnx", location="second.bin", size_threshold=0)
    (tmp_path / "other").mkdir()
    save_external(
        identity_model({"w": np.array([109, 209, 309, 409], dtype=np.float32)}),
        tmp_path / "other" / "other.onnx",
        "other.onnx.data",
    )
    return tmp_path


@pytest.mark.parametrize("aligner", ALIGNERS)
def test_align_over_a_model_whose_weights_another_model_shares_is_refused(models, aligner):
    before = sha256_of_tree(models, every_entry=True)
    with pytest.raises(SharedWeightsError) as raised:
        aligner(models / "other" / "other.onnx", models / "models" / "first.onnx")
    message = str(raised.value)
    assert "first.onnx.data" in message and "second.onnx" in message and "'w'" in message
    assert "replace_shared=True" in message and "nothing was written" in message
    assert isinstance(raised.value, DestinationConflictError)
    assert sha256_of_tree(models, every_entry=True) == before
    np.testing.assert_array_equal(_run(models / "models" / "second.onnx")[0], [10, 11, 12, 13])


@pytest.mark.parametrize("aligner", ALIGNERS)
def test_replace_shared_opts_in(models, aligner):
    aligner(models / "other" / "other.onnx", models / "models" / "first.onnx", replace_shared=True)
    np.testing.assert_array_equal(_run(models / "models" / "first.onnx")[0], [109, 209, 309, 409])
    # What the user accepted: the sharer now reads the new bytes.
    np.testing.assert_array_equal(_run(models / "models" / "second.onnx")[0], [109, 209, 309, 409])


def test_align_command_refuses_then_accepts_with_replace_shared(models):
    before = sha256_of_tree(models, every_entry=True)
    command = [sys.executable, "-m", "onnx_light_ref", "align", str(models / "other" / "other.onnx")]
    command += [str(models / "models" / "first.onnx"), "--no-progress"]
    refused = subprocess.run(command, capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert (
        refused.stderr.startswith("error: ")
        and "second.onnx" in refused.stderr
        and "--replace-shared" in refused.stderr
    )
    assert sha256_of_tree(models, every_entry=True) == before
    accepted = subprocess.run([*command, "--replace-shared"], capture_output=True, text=True, check=False)
    assert accepted.returncode == 0, accepted.stderr


def test_writing_the_weights_under_a_new_name_is_not_refused(models):
    """Re-aligning first.onnx in place into a new weights file replaces nothing second.onnx uses."""
    first = models / "models" / "first.onnx"
    align_external_data_streaming(first, first, models / "models" / "first.v2.bin")
    np.testing.assert_array_equal(_run(first)[0], [10, 11, 12, 13])
    np.testing.assert_array_equal(_run(models / "models" / "second.onnx")[0], [10, 11, 12, 13])


def test_the_destination_models_own_reference_does_not_count(tmp_path):
    """Re-aligning into the same destination replaces the weights file only the old destination .onnx uses."""
    src = save_external(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "m.onnx", "m.data")
    (tmp_path / "out").mkdir()
    align_external_data_streaming(src, tmp_path / "out" / "m.onnx", alignment=64)
    align_external_data_streaming(src, tmp_path / "out" / "m.onnx", alignment=128)
    np.testing.assert_array_equal(_run(tmp_path / "out" / "m.onnx")[0], np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("how", ["same location", "hard link", "symlink", "subfolder"])
def test_sharers_made_by_hand_are_found(tmp_path, how):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    weights = out / ("sub/w.bin" if how == "subfolder" else "w.bin")
    src = save_external(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "src.onnx", "src.data")
    align_external_data_streaming(src, out / "first.onnx", weights)
    sharer = onnx.load(str(out / "first.onnx"), load_external_data=False)
    if how == "subfolder":  # out/sub/hand.onnx uses "w.bin" from its own folder: out/sub/w.bin
        _relocate(sharer, "w.bin")
        hand = out / "sub" / "hand.onnx"
    else:
        hand = out / "hand.onnx"
        if how == "hard link":
            os.link(weights, out / "alias.bin")
            _relocate(sharer, "alias.bin")
        elif how == "symlink":
            (out / "alias.bin").symlink_to("w.bin")
            _relocate(sharer, "alias.bin")
    write_model(hand, sharer)
    before = sha256_of_tree(tmp_path, every_entry=True)
    with pytest.raises(SharedWeightsError, match=re.escape(hand.name)):
        align_external_data_in_memory(src, out / "first.onnx", weights, alignment=64)
    assert sha256_of_tree(tmp_path, every_entry=True) == before


@pytest.mark.parametrize("order", ["first-entry", "last-entry"])
def test_a_sharer_naming_the_file_in_a_repeated_location_entry_is_found(tmp_path, order):
    """A ``location`` given twice: onnx's loader reads the last entry (``ExternalDataInfo``), another tool may read
    the first; the guard counts both, so the file onnx loads is never replaced under it (it used to read only the
    first)."""
    out = tmp_path / "out"
    out.mkdir()
    src = save_external(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "src.onnx", "src.data")
    align_external_data_streaming(src, out / "first.onnx", out / "w.bin")
    (out / "other.bin").write_bytes((out / "w.bin").read_bytes())
    sharer = onnx.load(str(out / "first.onnx"), load_external_data=False)
    for tensor in sharer.graph.initializer:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        del tensor.external_data[:]
        locations = ["other.bin", "w.bin"] if order == "last-entry" else ["w.bin", "other.bin"]
        for location in locations:
            tensor.external_data.add(key="location", value=location)
        for key in ("offset", "length"):
            tensor.external_data.add(key=key, value=entries[key])
    hand = write_model(out / "hand.onnx", sharer)
    loaded = onnx.load(str(hand))  # the oracle: onnx reads the last location
    assert onnx.external_data_helper.uses_external_data(loaded.graph.initializer[0]) is False
    before = sha256_of_tree(tmp_path, every_entry=True)
    with pytest.raises(SharedWeightsError, match=re.escape(f"file {str(out / 'w.bin')!r} is used by {str(hand)!r}")):
        align_external_data_in_memory(src, out / "first.onnx", out / "w.bin", alignment=64)
    assert sha256_of_tree(tmp_path, every_entry=True) == before
    assert onnx.load(str(hand)) == loaded


def test_a_sharer_whose_location_is_not_utf8_is_found_by_the_bytes_onnxruntime_opens(tmp_path):
    """protobuf hands back ``bytes`` for a ``location`` that is not UTF-8; onnxruntime opens the file of those bytes
    (onnx.load cannot). The guard used to skip such an entry; it now counts the file as used (and no writer can name
    such a file as its output any more: a location must be UTF-8)."""
    out = tmp_path / "out"
    out.mkdir()
    src = save_external(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "src.onnx", "src.data")
    align_external_data_streaming(src, out / "first.onnx", out / "wX.bin")
    weights = out / os.fsdecode(b"w\xff.bin")
    os.rename(out / "wX.bin", weights)
    hand = out / "hand.onnx"
    hand.write_bytes((out / "first.onnx").read_bytes().replace(b"wX.bin", b"w\xff.bin"))
    (out / "first.onnx").unlink()
    np.testing.assert_array_equal(_run(hand)[0], np.arange(4, dtype=np.float32))  # onnxruntime loads it
    before = sha256_of_tree(tmp_path, every_entry=True)
    # The guard sees the file onnxruntime opens, under the model that uses it.
    used = {
        Path(f.path).name.encode("utf-8", "surrogateescape"): [Path(u.model).name for u in f.users]
        for f in folder_sharing(str(out))
    }
    assert used == {b"w\xff.bin": ["hand.onnx"]}
    assert file_key(str(weights)) in files_referenced_near(str(out)).keys
    with pytest.raises(UnsafeLocationError, match="has a name that is not valid UTF-8"):
        # No writer can name that file as an output: a location must be UTF-8 (refused before the guard runs).
        align_external_data_in_memory(src, out / "first.onnx", weights, alignment=64, overwrite=True)
    assert sha256_of_tree(tmp_path, every_entry=True) == before
    np.testing.assert_array_equal(_run(hand)[0], np.arange(4, dtype=np.float32))


def test_a_sharer_carrying_a_protobuf_group_in_an_unknown_field_is_found(tmp_path):
    """Groups (wire types 3/4) are legal in unknown fields and onnx.load accepts them; the wire reader used to refuse
    one inside a tensor it walks, so the guard took the sharer for "not a model" and replaced the file it loads."""
    from tests.wire_writer import encode_varint, field_key

    out = tmp_path / "out"
    out.mkdir()
    src = save_external(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "src.onnx", "src.data")
    align_external_data_streaming(src, out / "first.onnx", out / "w.bin")
    sharer = onnx.load(str(out / "first.onnx"), load_external_data=False)
    tensor = sharer.graph.initializer[0]
    unknown = field_key(999, 3) + field_key(3, 2) + encode_varint(5000) + bytes(5000) + field_key(999, 4)
    grouped = onnx.TensorProto()
    grouped.ParseFromString(tensor.SerializeToString() + unknown)  # kept by protobuf as an unknown field
    tensor.CopyFrom(grouped)
    hand = write_model(out / "hand.onnx", sharer)
    np.testing.assert_array_equal(_run(hand)[0], np.arange(4, dtype=np.float32))
    assert onnx.load(str(hand)).graph.initializer[0].name == "w"  # onnx's loader accepts it
    before = sha256_of_tree(tmp_path, every_entry=True)
    with pytest.raises(SharedWeightsError, match=re.escape(f"file {str(out / 'w.bin')!r} is used by {str(hand)!r}")):
        align_external_data_in_memory(src, out / "first.onnx", out / "w.bin", alignment=64)
    assert sha256_of_tree(tmp_path, every_entry=True) == before


def _relocate(model: onnx.ModelProto, location: str) -> None:
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location


def test_shared_saver_refuses_to_replace_a_secondary_file_another_variant_uses(models):
    folder = models / "models"
    third = onnx.load(str(folder / "first.onnx"), load_external_data=False)
    third.graph.initializer.append(numpy_helper.from_array(np.ones(8, dtype=np.float32), "extra"))
    before = sha256_of_tree(models, every_entry=True)
    original = third.SerializeToString()
    with pytest.raises(SharedWeightsError, match=r"second\.onnx"):
        save_model_with_shared_external_data(third, folder / "third.onnx", location="second.bin", size_threshold=0)
    assert sha256_of_tree(models, every_entry=True) == before and third.SerializeToString() == original
    save_model_with_shared_external_data(
        third, folder / "third.onnx", location="second.bin", replace_shared=True, size_threshold=0
    )
    assert (folder / "third.onnx").exists()


def test_folder_sharing_lists_which_models_use_which_files(models):
    shared = {
        Path(f.path).name: sorted(Path(u.model).name for u in f.users) for f in folder_sharing(str(models / "models"))
    }
    assert shared == {"first.onnx.data": ["first.onnx", "second.onnx"], "second.bin": ["second.onnx"]}


def test_undelay_refuses_to_replace_a_shared_weights_file_unless_told(tmp_path):
    from onnx_light_ref.ops import undelay_initializers
    from onnx_light_ref.ops._convert import delay_initializers

    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    source = save_external(identity_model({"w": np.arange(4, dtype=np.float32)}), tmp_path / "src" / "m.onnx", "m.data")
    delayed = tmp_path / "src" / "delayed.onnx"
    onnx.save(delay_initializers(source, "file"), delayed)
    first = undelay_initializers(delayed, tmp_path / "out" / "a.onnx", tmp_path / "out" / "w.bin")
    assert first > 0
    before = sha256_of_tree(tmp_path, every_entry=True)
    with pytest.raises(SharedWeightsError, match=r"a\.onnx"):
        undelay_initializers(delayed, tmp_path / "out" / "b.onnx", tmp_path / "out" / "w.bin")
    assert sha256_of_tree(tmp_path, every_entry=True) == before
    undelay_initializers(delayed, tmp_path / "out" / "b.onnx", tmp_path / "out" / "w.bin", replace_shared=True)
    np.testing.assert_array_equal(_run(tmp_path / "out" / "a.onnx")[0], np.arange(4, dtype=np.float32))
