"""What the writers return: an ``int`` (the documented size) carrying what a caller reports."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref import (
    align_external_data_in_memory,
    align_external_data_streaming,
    save_model_with_shared_external_data,
)
from onnx_light_ref.io._results import AlignResult, FamilyResult, LinkResult, SaveResult, summarize_names
from onnx_light_ref.io._verify import VerifyResult
from onnx_light_ref.io._verify_checkpoint import CheckpointVerifyResult
from onnx_light_ref.ops._delay_write import DelayResult
from tests.models import identity_model, make_external_model
from tests.zoo import reference_tensors


def _align_result() -> AlignResult:
    return AlignResult(
        196,
        tensors=3,
        payload_bytes=108,
        weights_files=("/x/w.bin",),
        copy_methods=frozenset({"sendfile"}),
        deduplicated_tensors=1,
        deduplicated_bytes=28,
        externalized_tensors=2,
        bytes_by_method={"sendfile": 108},
        clone_eligible_bytes=0,
        stale_weights_files=("/x/w.bin.1",),
    )


def test_a_result_behaves_as_the_plain_int():
    result = _align_result()

    assert isinstance(result, int) and result == 196 and hash(result) == hash(196)
    assert result + 4 == 200 and result // 2 == 98
    assert str(result) == f"{result}" == "%s" % result == "196" and f"{result:d}" == "196"  # noqa: UP031
    assert json.dumps({"size": result}) == '{"size": 196}'


def test_the_repr_shows_the_facts_not_a_bare_int():
    """Issue 29: ``repr`` was ``196``; at the prompt it now says what was written."""
    assert repr(_align_result()) == (
        "AlignResult(196 bytes, weights_files=('/x/w.bin',), tensors=3, payload_bytes=108, padding=88, "
        "deduplicated_tensors=1, externalized_tensors=2, kept_inline_tensors=0, unaligned_tensors=(), "
        "stale_weights_files=('/x/w.bin.1',), weights_format='onnx', index_file=None)"
    )
    many = AlignResult(
        0,
        tensors=199,
        payload_bytes=0,
        weights_files=(),
        copy_methods=frozenset(),
        unaligned_tensors=tuple(f"t{i}" for i in range(199)),
    )
    assert "unaligned_tensors=('t0', 't1', 't2', ... 199 in all)" in repr(many)
    saved = SaveResult(4160, new_tensors=1, reused_tensors=7, payload_bytes=4096, weights_files=("/x/v.onnx.data",))
    assert repr(saved) == (
        "SaveResult(4160 bytes, weights_files=('/x/v.onnx.data',), new_tensors=1, reused_tensors=7, "
        "payload_bytes=4096, padding=64, kept_inline_tensors=0)"
    )
    linked = LinkResult(0, linked_tensors=4, linked_bytes=4096, written_tensors=0, written_bytes=0)
    assert repr(linked).startswith("LinkResult(0 bytes, weights_files=(), linked_tensors=4, linked_bytes=4096, ")


@pytest.mark.parametrize(
    ("names", "text"),
    [
        ([], ""),
        (["a"], "a"),
        (["a", "b", "c", "d"], "a, b, c, d"),
        ([f"t{i}" for i in range(199)], "t0, t1, t2 and 196 more"),
    ],
)
def test_summarize_names_counts_a_long_list(names, text):
    assert summarize_names(names) == text


def test_a_result_keeps_its_facts_through_pickle_and_copy():
    result = _align_result()

    for clone in (pickle.loads(pickle.dumps(result)), copy.copy(result), copy.deepcopy(result)):
        assert type(clone) is AlignResult and clone == 196
        assert (clone.tensors, clone.payload_bytes, clone.padding) == (3, 108, 88)
        assert clone.weights_files == ("/x/w.bin",) and clone.copy_methods == frozenset({"sendfile"})
        assert (clone.deduplicated_tensors, clone.deduplicated_bytes, clone.externalized_tensors) == (1, 28, 2)
        assert clone.bytes_by_method == {"sendfile": 108} and clone.clone_eligible_bytes == 0
        assert clone.stale_weights_files == ("/x/w.bin.1",)


_MINIMAL = {
    AlignResult: {"tensors": 1, "payload_bytes": 4, "weights_files": ("/x/w",), "copy_methods": frozenset()},
    SaveResult: {"new_tensors": 1, "reused_tensors": 0, "payload_bytes": 4, "weights_files": ("/x/w",)},
    LinkResult: {"linked_tensors": 1, "linked_bytes": 4, "written_tensors": 0, "written_bytes": 0},
    FamilyResult: {
        "members": (),
        "tensors": 0,
        "weights_files": ("/x/w",),
        "copy_methods": frozenset(),
        "unique_bytes": 4,
        "separate_bytes": 8,
    },
}


@pytest.mark.parametrize("cls", list(_MINIMAL), ids=lambda cls: cls.__name__)
def test_every_size_result_is_one_frozen_dataclass_over_an_int(cls):
    """One mechanism (issue 39): the fields are declared once, as dataclass fields, after the size."""
    result = cls(64, **_MINIMAL[cls], kept_inline_reasons={"shape tensor": 2})

    assert dataclasses.is_dataclass(result) and cls.__dataclass_params__.frozen
    assert result == 64 and isinstance(result, int) and str(result) == "64" and result.kept_inline_tensors == 2
    assert {f.name for f in dataclasses.fields(result)} >= set(_MINIMAL[cls]) | {"kept_inline_reasons"}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(result, protocol))
        assert type(clone) is cls and clone == 64 and repr(clone) == repr(result)
    with pytest.raises(TypeError, match="missing"):
        cls(64)
    with pytest.raises(TypeError, match="positional"):
        cls(64, *_MINIMAL[cls].values())


@pytest.mark.parametrize("cls", [VerifyResult, CheckpointVerifyResult, DelayResult], ids=lambda cls: cls.__name__)
def test_the_other_results_are_frozen_dataclasses_too(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_a_result_is_read_only():
    result = _align_result()
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'tensors'"):
        result.tensors = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del result.weights_files  # type: ignore[misc]
    assert result.tensors == 3 and isinstance(dataclasses.FrozenInstanceError(), AttributeError)


@pytest.mark.parametrize("aligner", [align_external_data_streaming, align_external_data_in_memory])
def test_the_aligners_report_what_they_wrote(tmp_path, aligner):
    src = make_external_model(tmp_path, reference_tensors())
    model = onnx.load_model(str(src), load_external_data=False)
    shared = copy.deepcopy(model.graph.initializer[0])  # same file, offset and length as w0
    shared.name = "w0_again"
    model.graph.initializer.append(shared)
    onnx.save_model(model, str(src))
    dst = tmp_path / "out.onnx"

    result = aligner(src, dst, alignment=64)

    assert type(result) is AlignResult
    weights = tmp_path / "out.onnx.data"
    assert result == weights.stat().st_size == 196
    # Four external tensors; w0_again names w0's bytes, stored once (28 + 12 + 68 payload bytes, the rest padding).
    assert (result.tensors, result.payload_bytes, result.padding) == (4, 108, 88)
    assert (result.deduplicated_tensors, result.deduplicated_bytes, result.externalized_tensors) == (1, 28, 0)
    assert sum(result.bytes_by_method.values()) == 108 and set(result.bytes_by_method) == set(result.copy_methods)
    assert result.weights_files == (str(weights),)
    if aligner is align_external_data_in_memory:
        assert result.copy_methods == {"pread_pwrite"}
    else:
        assert result.copy_methods and result.copy_methods <= {"copy_file_range", "sendfile", "pread_pwrite"}


def test_an_aligner_without_external_tensors_reports_nothing_written(tmp_path):
    src = tmp_path / "inline.onnx"
    onnx.save_model(identity_model({"w": np.ones(2, dtype=np.float32)}), str(src))

    result = align_external_data_streaming(src, tmp_path / "out.onnx")

    assert result == 0 and result.tensors == 0 and result.payload_bytes == 0
    assert result.weights_files == () and result.copy_methods == frozenset()
    assert result.bytes_by_method == {} and result.externalized_tensors == 0 and result.deduplicated_tensors == 0


def test_a_result_built_without_the_new_fields_defaults_them():
    result = AlignResult(0, tensors=0, payload_bytes=0, weights_files=(), copy_methods=frozenset())

    assert (result.deduplicated_tensors, result.deduplicated_bytes, result.externalized_tensors) == (0, 0, 0)
    assert result.bytes_by_method == {} and result.clone_eligible_bytes == 0
    assert result.stale_weights_files == ()


def test_the_shared_saver_reports_new_and_reused_tensors(tmp_path):
    src = make_external_model(tmp_path, reference_tensors())
    variant = onnx.load_model(str(src), load_external_data=False)
    variant.graph.initializer.append(numpy_helper.from_array(np.full(5, 7.0, np.float32), "n0"))  # 20 bytes
    variant.graph.initializer.append(numpy_helper.from_array(np.full(3, -3.5, np.float32), "n1"))  # 12 bytes

    result = save_model_with_shared_external_data(variant, tmp_path / "variant.onnx", 64, size_threshold=0)

    assert type(result) is SaveResult
    assert result == (tmp_path / "variant.onnx.data").stat().st_size == 76
    assert (result.new_tensors, result.reused_tensors, result.payload_bytes, result.padding) == (2, 3, 32, 44)
    assert result.weights_files == (str(tmp_path / "variant.onnx.data"),)
