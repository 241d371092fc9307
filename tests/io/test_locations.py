"""Parsing and validating external references: what is accepted, what is refused and what the message says."""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnx_light_ref.errors import ExternalDataError, SafetensorsReferenceError, UnsafeLocationError
from onnx_light_ref.io._read.locations import (
    LocationResolver,
    _parse_canonical,
    _parse_full,
    check_location_syntax,
    check_not_hard_linked,
    expected_nbytes,
    parse_external_data,
)
from tests.checks import onnx_loader_refuses_symlinks


def external_tensor(entries: dict[str, str], dims=(4,), data_type=onnx.TensorProto.FLOAT) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name="w", dims=list(dims), data_type=data_type, data_location=onnx.TensorProto.EXTERNAL)
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


@pytest.mark.parametrize("location", ["w.bin", "sub/w.bin", "./w.bin", "sub/./w.bin", "a.b.bin", ".hidden", "w.bin."])
def test_relative_locations_inside_the_folder_are_accepted(location):
    check_location_syntax(location, tensor_name="w")


@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        ("", "empty"),
        ("/abs/w.bin", "absolute"),
        ("../w.bin", "'..'"),
        ("sub/../../w.bin", "'..'"),
        ("sub/..", "'..'"),
        ("sub\\w.bin", "backslash"),
        ("w\x00.bin", "NUL"),
        ("a..b.bin", "'..'"),  # onnx refuses any '..' substring, not only a component
        ("w..", "'..'"),
        ("..w", "'..'"),
        (".", "does not name a file"),
        ("./", "does not name a file"),
        ("w.bin/", "does not name a file"),
        ("sub/", "does not name a file"),
        ("w.bin/.", "does not name a file"),
        ("m.onnx.data/.", "does not name a file"),
        ("//", "absolute"),
    ],
)
def test_unsafe_locations_are_refused_by_syntax(location, fragment):
    with pytest.raises(UnsafeLocationError, match=fragment) as raised:
        check_location_syntax(location, tensor_name="w")
    assert "'w'" in str(raised.value)


def test_a_symlink_inside_the_folder_is_refused_as_onnx_refuses_it(tmp_path):
    """onnx 1.23 opens external data with RESOLVE_NO_SYMLINKS: even a link staying inside the folder is refused."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "real.bin").write_bytes(b"x" * 8)
    os.symlink("data/real.bin", tmp_path / "alias.bin")
    tensor = external_tensor({"location": "alias.bin", "length": "8"}, dims=(2,))

    with pytest.raises(UnsafeLocationError, match="symbolic link"):
        LocationResolver(str(tmp_path)).resolve("alias.bin", tensor_name="w")
    if onnx_loader_refuses_symlinks():  # onnx >= 1.18; 1.17 follows the link (our rule is the newer one)
        with pytest.raises(onnx.checker.ValidationError, match="symbolic link"):
            onnx.external_data_helper.load_external_data_for_tensor(tensor, str(tmp_path))


def test_a_symlink_inside_the_folder_is_followed_with_the_opt_in(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "real.bin").write_bytes(b"x" * 8)
    os.symlink("data/real.bin", tmp_path / "alias.bin")

    ref = parse_external_data(
        external_tensor({"location": "alias.bin", "length": "8"}, dims=(2,)),
        LocationResolver(str(tmp_path), allow_outside_folder=True),
    )
    assert (ref.path, ref.length, ref.file_size) == (str(tmp_path / "alias.bin"), 8, 8)


def test_a_folder_is_not_a_data_file(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(ExternalDataError, match="not a regular file"):
        LocationResolver(str(tmp_path)).resolve("sub", tensor_name="w")


def test_length_is_computed_from_dims_when_missing(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(40))

    ref = parse_external_data(external_tensor({"location": "w.bin", "offset": "24"}), str(tmp_path))

    assert (ref.offset, ref.length, ref.file_size, ref.checksum) == (24, 16, 40, None)
    assert ref.path == str(tmp_path / "w.bin")


def test_a_range_ending_exactly_at_the_end_of_the_file_is_valid(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(16))
    assert parse_external_data(external_tensor({"location": "w.bin", "length": "16"}), str(tmp_path)).length == 16
    empty = external_tensor({"location": "w.bin", "offset": "16", "length": "0"}, dims=(0,))
    assert parse_external_data(empty, str(tmp_path)).offset == 16


@pytest.mark.parametrize(
    ("tensor", "fragment"),
    [
        (external_tensor({}), "no external_data entries"),
        (external_tensor({"location": "w.bin", "length": "16", "length ": "1"}), "unknown external_data keys"),
        (external_tensor({"location": "w.bin", "offset": "99999999999999999999"}), "does not fit in int64"),
        (external_tensor({"location": "w.bin", "length": "1.5"}), "non-negative integer"),
        # int() takes every spelling below; onnxruntime refuses them, so parse_entry_int does too.
        (external_tensor({"location": "w.bin", "offset": "+0"}), r"'offset' must be .* ASCII digits only, got '\+0'"),
        (external_tensor({"location": "w.bin", "offset": " 64"}), "ASCII digits only, got ' 64'"),
        (external_tensor({"location": "w.bin", "length": "1_6"}), "'length' must be .* ASCII digits only, got '1_6'"),
        (external_tensor({"location": "w.bin", "length": "\u0661\u0666"}), "ASCII digits only"),
        (external_tensor({"location": "w.bin", "length": "16 "}), "ASCII digits only, got '16 '"),
        (external_tensor({"location": "w.bin", "offset": "-0"}), "ASCII digits only, got '-0'"),
        (external_tensor({"location": "w.bin"}, data_type=onnx.TensorProto.STRING), "no external_data 'length'"),
    ],
)
def test_malformed_entries_are_refused(tmp_path, tensor, fragment):
    (tmp_path / "w.bin").write_bytes(bytes(16))
    with pytest.raises(ExternalDataError, match=fragment):
        parse_external_data(tensor, str(tmp_path))


def test_duplicated_keys_and_inline_bytes_are_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(16))
    duplicated = external_tensor({"location": "w.bin"})
    duplicated.external_data.add(key="location", value="other.bin")
    with pytest.raises(ExternalDataError, match="duplicated keys"):
        parse_external_data(duplicated, str(tmp_path))
    both = external_tensor({"location": "w.bin", "length": "16"})
    both.raw_data = bytes(16)
    with pytest.raises(ExternalDataError, match="both inline raw_data"):
        parse_external_data(both, str(tmp_path))


@pytest.mark.parametrize(
    ("data_type", "dims", "nbytes"),
    [
        (onnx.TensorProto.FLOAT, (2, 3), 24),
        (onnx.TensorProto.DOUBLE, (5,), 40),
        (onnx.TensorProto.FLOAT16, (3,), 6),
        (onnx.TensorProto.BFLOAT16, (3,), 6),
        (onnx.TensorProto.FLOAT8E4M3FN, (3,), 3),
        (onnx.TensorProto.BOOL, (7,), 7),
        (onnx.TensorProto.COMPLEX64, (2,), 16),
        (onnx.TensorProto.INT4, (5,), 3),
        (onnx.TensorProto.UINT4, (4,), 2),
        (onnx.TensorProto.FLOAT, (), 4),
        (onnx.TensorProto.FLOAT, (0, 8), 0),
        (onnx.TensorProto.STRING, (2,), None),
    ],
)
def test_expected_nbytes_follows_dims_and_type(data_type, dims, nbytes):
    assert expected_nbytes(onnx.TensorProto(dims=list(dims), data_type=data_type)) == nbytes


def test_expected_nbytes_agrees_with_numpy_raw_data():
    for dtype in (np.float32, np.int64, np.uint16, np.int8, np.float16):
        tensor = numpy_helper.from_array(np.zeros((3, 5), dtype=dtype))
        assert expected_nbytes(tensor) == len(tensor.raw_data)


def test_a_hard_linked_data_file_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(16))
    ref = parse_external_data(external_tensor({"location": "w.bin"}), str(tmp_path))
    check_not_hard_linked(ref)  # one link: fine
    os.link(tmp_path / "w.bin", tmp_path / "second-name.bin")

    linked = parse_external_data(external_tensor({"location": "w.bin"}), str(tmp_path))

    assert linked.link_count == 2
    with pytest.raises(UnsafeLocationError, match="2 hard links"):
        check_not_hard_linked(linked)


# A key given twice: onnx's loader (``ExternalDataInfo``: one ``setattr`` per entry) reads the last of each;
# onnxruntime refuses a repeated ``location`` and reads the last ``offset`` / ``length``. Every reader of this package
# refuses the tensor (one rule, ``read_entries``), names the key, and shows the location onnx would open; the sharing
# guard, which reads other people's models and never refuses one, counts every file a ``location`` entry names.

DUPLICATED = {
    "location": [("location", "a.bin"), ("location", "b.bin"), ("offset", "0"), ("length", "16")],
    "offset": [("location", "a.bin"), ("offset", "0"), ("offset", "16"), ("length", "16")],
    "length": [("location", "a.bin"), ("offset", "0"), ("length", "8"), ("length", "16")],
}


def _duplicated_model(folder, entries) -> str:
    from tests.models import identity_model

    first, second = np.arange(4, dtype=np.float32), np.arange(100, 104, dtype=np.float32)
    (folder / "a.bin").write_bytes(first.tobytes() + second.tobytes())
    (folder / "b.bin").write_bytes(second.tobytes() + first.tobytes())
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in entries:
        tensor.external_data.add(key=key, value=value)
    path = folder / "m.onnx"
    path.write_bytes(identity_model([tensor]).SerializeToString())
    return str(path)


def _onnx_reads(path: str) -> np.ndarray:
    """The oracle: onnx's own loader, from the model's folder."""
    model = onnx.load(path, load_external_data=False)
    onnx.external_data_helper.load_external_data_for_model(model, os.path.dirname(path))
    return numpy_helper.to_array(model.graph.initializer[0])


@pytest.mark.parametrize("key", list(DUPLICATED))
def test_a_key_given_twice_is_refused_by_every_reader_naming_what_onnx_reads(tmp_path, key, capsys):
    from onnx_light_ref import align_external_data_streaming, verify_models
    from onnx_light_ref._cli import main
    from onnx_light_ref.io._layout_report import build_layout_report
    from onnx_light_ref.io._read.sharing import file_key, read_references
    from tests.checks import sha256_of_tree

    path = _duplicated_model(tmp_path, DUPLICATED[key])
    # The last entry of each key: b.bin at 0, a.bin at 16, 16 bytes (8 would not fill a float32 [4]).
    expected = np.arange(0, 4) if key == "length" else np.arange(100, 104)
    np.testing.assert_array_equal(_onnx_reads(path), expected.astype(np.float32))
    before = sha256_of_tree(tmp_path)
    message = f"tensor 'w': external_data has duplicated keys ['{key}']"
    with pytest.raises(ExternalDataError, match=re.escape(message)) as refused:
        align_external_data_streaming(path, tmp_path / "out.onnx")
    assert "onnx's loader reads the last" in str(refused.value) and "remove the extra" in str(refused.value)
    with pytest.raises(ExternalDataError, match=re.escape(message)):
        verify_models(path, path)
    assert sha256_of_tree(tmp_path) == before
    (tensor,) = build_layout_report(path).tensors
    shown = "b.bin" if key == "location" else "a.bin"  # the file onnx's loader opens
    assert (tensor.status, tensor.location, tensor.raw_location) == ("invalid", shown, shown)
    assert message in tensor.message
    assert main(["inspect", path]) == 1
    assert message in capsys.readouterr().out
    # The sharing guard (another model's references): the file onnx reads is among them.
    references = read_references(path)
    assert references is not None and file_key(str(tmp_path / shown)) in references


def _not_utf8(tensor: onnx.TensorProto, marker: bytes) -> onnx.TensorProto:
    """``tensor`` with the text ``marker`` replaced by as many bytes that are not UTF-8 (protobuf then hands back
    ``bytes`` for that string)."""
    hostile = onnx.TensorProto()
    hostile.ParseFromString(tensor.SerializeToString().replace(marker, b"\xff" * len(marker)))
    return hostile


def _with(tensor: onnx.TensorProto, **fields) -> onnx.TensorProto:
    """``tensor`` with ``fields`` set (a list extends a repeated field, None clears the field)."""
    for name, value in fields.items():
        if value is None:
            tensor.ClearField(name)
        elif isinstance(value, list):
            getattr(tensor, name).extend(value)
        else:
            setattr(tensor, name, value)
    return tensor


CANONICAL = {"location": "w.bin", "offset": "16", "length": "16"}
_FAST_CASES = {
    "canonical": external_tensor(CANONICAL),
    "checksum": external_tensor({**CANONICAL, "checksum": "abc"}),
    "leading zeros": external_tensor({"location": "w.bin", "offset": "0016", "length": "016"}),
    "range ending at the end": external_tensor({"location": "w.bin", "offset": "48", "length": "16"}),
    "two dims": external_tensor(CANONICAL, dims=(2, 2)),
    "int4 packed": external_tensor({**CANONICAL, "length": "3"}, dims=(5,), data_type=onnx.TensorProto.INT4),
    "empty name set": _with(external_tensor(CANONICAL), name=""),
}
_SLOW_CASES = {
    "key order": external_tensor({"offset": "16", "location": "w.bin", "length": "16"}),
    "missing length": external_tensor({"location": "w.bin", "offset": "16"}),
    "missing offset": external_tensor({"location": "w.bin", "length": "16"}),
    "only location": external_tensor({"location": "w.bin"}),
    "no entries": external_tensor({}),
    "unknown fourth key": external_tensor({**CANONICAL, "basepath": "x"}),
    "checksum then more": external_tensor({**CANONICAL, "checksum": "a", "length ": "1"}),
    "plus sign": external_tensor({**CANONICAL, "offset": "+16"}),
    "minus zero": external_tensor({**CANONICAL, "offset": "-0"}),
    "space": external_tensor({**CANONICAL, "length": "16 "}),
    "underscore": external_tensor({**CANONICAL, "length": "1_6"}),
    "arabic-indic digits": external_tensor({**CANONICAL, "length": "\u0661\u0666"}),
    "fullwidth digits": external_tensor({**CANONICAL, "offset": "\uff11\uff16"}),
    "superscript digit": external_tensor({**CANONICAL, "offset": "\u00b9"}),
    "empty number": external_tensor({**CANONICAL, "offset": ""}),
    "19 digits": external_tensor({**CANONICAL, "offset": "0000000000000000016"}),
    "above int64": external_tensor({**CANONICAL, "offset": "99999999999999999999"}),
    "18 digits past the end": external_tensor({**CANONICAL, "offset": "999999999999999999"}),
    "past the end": external_tensor({**CANONICAL, "offset": "56"}),
    "length disagrees": external_tensor({**CANONICAL, "length": "12"}),
    "negative dims": external_tensor(CANONICAL, dims=(-4,)),
    "two negative dims": external_tensor(CANONICAL, dims=(-2, -2)),
    "scalar": external_tensor({**CANONICAL, "length": "4"}, dims=()),
    "string type": external_tensor(CANONICAL, data_type=onnx.TensorProto.STRING),
    "undefined type": external_tensor(CANONICAL, data_type=onnx.TensorProto.UNDEFINED),
    "unknown type": external_tensor(CANONICAL, data_type=999),
    "raw_data": _with(external_tensor(CANONICAL), raw_data=bytes(16)),
    "empty raw_data": _with(external_tensor(CANONICAL), raw_data=b""),
    "float_data": _with(external_tensor(CANONICAL), float_data=[1.0]),
    "int64_data": _with(external_tensor(CANONICAL), int64_data=[1]),
    "string_data": _with(external_tensor(CANONICAL), string_data=[b"x"]),
    "doc_string": _with(external_tensor(CANONICAL), doc_string="d"),
    "name unset": _with(external_tensor(CANONICAL), name=None),
    "location not UTF-8": _not_utf8(external_tensor({**CANONICAL, "location": "w~~.bin"}), b"w~~"),
    "offset not UTF-8": _not_utf8(external_tensor({**CANONICAL, "offset": "1~"}), b"1~"),
    "key not UTF-8": _not_utf8(external_tensor({"lo~~tion": "w.bin", "offset": "16", "length": "16"}), b"lo~~"),
    "checksum not UTF-8": _not_utf8(external_tensor({**CANONICAL, "checksum": "c~~"}), b"c~~"),
    "name not UTF-8": _not_utf8(_with(external_tensor(CANONICAL), name="n~~"), b"n~~"),
    "location never resolved": external_tensor({**CANONICAL, "location": "other.bin"}),
    "location missing": external_tensor({**CANONICAL, "location": "missing.bin"}),
    "location unsafe": external_tensor({**CANONICAL, "location": "../w.bin"}),
}
_SLOW_CASES["duplicated location"] = external_tensor(CANONICAL)
_SLOW_CASES["duplicated location"].external_data.add(key="location", value="w.bin")
_SLOW_CASES["duplicated offset"] = external_tensor({**CANONICAL, "offset": "16"})
_SLOW_CASES["duplicated offset"].external_data.add(key="offset", value="0")


def _outcome(parse, tensor, resolver, label):
    """What ``parse`` gives: the reference, or the exception's type and message."""
    try:
        return parse(tensor, resolver, label)
    except (ExternalDataError, OSError) as error:
        return type(error), str(error)


@pytest.mark.parametrize("label", [None, "site label"])
@pytest.mark.parametrize("case", [*_FAST_CASES, *_SLOW_CASES])
def test_the_fast_path_agrees_with_every_check_on_hostile_references(tmp_path, case, label):
    """The usual reference is read by a fast path (one ListFields, canonical entries, the resolver's answer per
    location); it must answer as the full check does, and leave every other reference, and every refusal and its
    message, to it."""
    (tmp_path / "w.bin").write_bytes(bytes(64))
    (tmp_path / "other.bin").write_bytes(bytes(64))
    resolver = LocationResolver(str(tmp_path))
    parse_external_data(external_tensor(CANONICAL), resolver)  # resolves w.bin: the fast path knows it from now on
    tensor = {**_FAST_CASES, **_SLOW_CASES}[case]

    fast = _parse_canonical(tensor, resolver, label)
    full = _outcome(_parse_full, tensor, resolver, label)
    public = _outcome(lambda t, r, name: parse_external_data(t, r, label=name), tensor, resolver, label)

    assert public == full
    if case in _FAST_CASES:
        assert fast == full and isinstance(fast, tuple) and fast.location == "w.bin"
    else:
        assert fast is None


def test_the_fast_path_refuses_a_disagreeing_safetensors_reference_as_the_full_check(tmp_path):
    """A reference into a ``*.safetensors`` file is checked against its header on the fast path too."""
    header = b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
    header += b" " * (-len(header) % 8)
    (tmp_path / "m.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(32))
    start = 8 + len(header)
    resolver = LocationResolver(str(tmp_path))
    good = external_tensor({"location": "m.safetensors", "offset": str(start), "length": "16"})
    assert parse_external_data(good, resolver).offset == start  # resolves the file
    shifted = external_tensor({"location": "m.safetensors", "offset": str(start + 16), "length": "16"})

    with pytest.raises(SafetensorsReferenceError) as fast:
        _parse_canonical(shifted, resolver, None)
    full = _outcome(_parse_full, shifted, resolver, None)

    assert (SafetensorsReferenceError, str(fast.value)) == full
    assert _parse_canonical(good, resolver, None) == _parse_full(good, resolver, None)
