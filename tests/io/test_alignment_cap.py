"""Alignments are capped at 1 GiB: a huge power of two is refused before anything is written, with the cap named.

Uncapped, ``alignment=2**40`` made a 1 TiB sparse file for three tiny tensors and ``2**62``..``2**63`` raised
OverflowError from deep inside the writer.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from onnx_light_ref import align_external_data_in_memory, align_external_data_streaming
from onnx_light_ref._cli import main
from onnx_light_ref.io._arguments import ArgumentTypeError
from onnx_light_ref.io._read.alignment import MAX_ALIGNMENT, align_up, validate_alignment
from onnx_light_ref.io._shared_save import save_model_with_shared_external_data
from tests.checks import sha256_of_tree
from tests.models import make_external_model

TOO_LARGE = [2**31, 2**40, 2**62, 2**63, 2**64, 2**100]


def test_the_cap_is_one_gib_and_is_accepted():
    assert MAX_ALIGNMENT == 1024**3
    assert validate_alignment(MAX_ALIGNMENT) == MAX_ALIGNMENT
    assert validate_alignment(0) == validate_alignment(1) == 1
    # The worst offset the cap allows stays far inside int64, whatever the tensor count.
    assert align_up(2**62, MAX_ALIGNMENT) < 2**63


@pytest.mark.parametrize("alignment", TOO_LARGE)
def test_powers_of_two_above_the_cap_are_refused_naming_it(alignment):
    with pytest.raises(ValueError, match=rf"alignment must be at most 1073741824 \(1 GiB.*got {alignment}\."):
        validate_alignment(alignment)


@pytest.mark.parametrize(("value", "shown"), [("4096", "str"), (4096.0, "float"), (True, "bool"), (None, "NoneType")])
def test_non_int_alignments_are_argument_type_errors(value, shown):
    with pytest.raises(ArgumentTypeError, match=f"alignment must be an int, got {shown}") as caught:
        validate_alignment(value)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    tensors = {f"w{i}": np.full(3, i, dtype=np.float32) for i in range(3)}
    return make_external_model(folder, tensors)


@pytest.mark.parametrize("align", [align_external_data_streaming, align_external_data_in_memory])
@pytest.mark.parametrize("alignment", [2**40, 2**62, 2**63])
def test_aligners_refuse_before_writing(tmp_path, source, align, alignment):
    before = sha256_of_tree(tmp_path)

    with pytest.raises(ValueError, match="at most 1073741824"):
        align(source, tmp_path / "out.onnx", alignment=alignment)

    assert sha256_of_tree(tmp_path) == before  # no output, no temp file, source untouched


def test_shared_saver_refuses_before_writing(tmp_path, source):
    model = onnx.load_model(str(source))  # weights loaded: the saver would write them all anew
    before = sha256_of_tree(tmp_path)

    with pytest.raises(ValueError, match="at most 1073741824"):
        save_model_with_shared_external_data(model, tmp_path / "variant.onnx", alignment=2**40)

    assert sha256_of_tree(tmp_path) == before


def test_cli_refuses_it_as_a_usage_error(tmp_path, source, capsys):
    before = sha256_of_tree(tmp_path)

    with pytest.raises(SystemExit) as done:  # issue 29: a value the option refuses is a usage error (exit 2)
        main(["align", str(source), str(tmp_path / "out.onnx"), "--alignment", "2G", "--no-progress"])

    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("usage: onnx-light-ref align")
    assert err.endswith("error: argument --alignment: alignment must be at most 1073741824 (1 GiB, the largest page "
                        "size a loader can map), got 2147483648.\n")  # fmt: skip
    assert sha256_of_tree(tmp_path) == before
    assert not os.path.exists(tmp_path / "out.onnx")
