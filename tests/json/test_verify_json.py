"""``verify --json`` and ``--max-differences``: every difference as a record (kind, both tensors, both values),
the verdict and the counts, in one document that matches the schema and says what the text says."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onnx_light_ref.io._differences import DIFFERENCE_KINDS
from onnx_light_ref.io._verify import verify_models
from tests.checks import sha256_of_tree
from tests.io.test_verify_edits import EDITS, base_model
from tests.io.test_verify_edits import save as save_edit_model
from tests.json.corpus import VERIFY_CASES
from tests.json.runner import run_both, run_json


@pytest.mark.parametrize("case", sorted(VERIFY_CASES))
def test_every_case_gives_a_document_that_says_what_the_text_says(tmp_path, capsys, case):
    runs = VERIFY_CASES[case](tmp_path)
    before = sha256_of_tree(tmp_path)
    for argv in runs:
        run_both(argv, capsys)
    assert sha256_of_tree(tmp_path) == before  # verify writes nothing, in either mode


def test_an_equal_pair_gives_the_counts_and_the_pairing(tmp_path, capsys):
    by_position, by_name = VERIFY_CASES["zoo-subgraphs"](tmp_path)
    _, positional, _ = run_json(by_position, capsys)
    status, named, _ = run_json(by_name, capsys)

    assert status == 0
    assert (positional["status"], positional["equal"], positional["pairing"], named["pairing"]) == (
        "equal",
        True,
        "position",
        "name",
    )
    assert positional["a"]["tensors"] == positional["b"]["tensors"] == positional["tensors"] == 4
    assert positional["bytes_compared"] == 4 * 12
    assert positional["differences"] == [] and positional["difference_count"] == 0
    assert positional["max_differences"] == 1 and positional["chunk_size"] == 4 * 1024 * 1024


def test_a_byte_difference_names_the_offset_the_two_bytes_and_both_places(tmp_path, capsys):
    runs = VERIFY_CASES["edit-flip_a_byte"](tmp_path)
    status, document, _ = run_json(runs[0], capsys)

    assert status == 1 and document["status"] == "different"
    (difference,) = document["differences"]
    assert difference["kind"] == "bytes"
    assert difference["value_a"] ^ difference["value_b"] == 0x80
    assert difference["a"]["place"] == difference["b"]["place"]
    assert difference["a"]["model"] == "A" and difference["b"]["model"] == "B"
    a, b = (runs[0][-2], runs[0][-1])
    result = verify_models(a, b)
    assert difference["message"] == result.first_difference
    assert (difference["offset"], difference["length"]) == (result.differences[0].offset, result.differences[0].length)
    assert f"offset {difference['offset']} of {difference['length']}" in difference["message"]


@pytest.mark.parametrize(
    ("edit", "kind"), [("change_a_dim", "dims"), ("change_the_dtype", "data_type"), ("rename", "name")]
)
def test_metadata_differences_carry_both_values(tmp_path, capsys, edit, kind):
    first = VERIFY_CASES[f"edit-{edit}"](tmp_path)[0]
    _, document, _ = run_json(first, capsys)

    (difference,) = document["differences"]
    assert difference["kind"] == kind
    assert document["tensors"] == 0 and document["bytes_compared"] == 0  # found before any byte was read
    assert (difference["value_a"], difference["value_b"]) != (None, None)
    expected = {"dims": ([6, 4], [4, 6]), "data_type": None, "name": ("w1", "w1_3")}[kind]
    if expected is not None:
        assert (difference["value_a"], difference["value_b"]) == expected
    else:
        assert difference["value_a"] == difference["a"]["dtype"] and difference["value_b"] == difference["b"]["dtype"]


def test_every_difference_is_listed_with_max_differences_0_metadata_first(tmp_path, capsys):
    by_position, by_name, reversed_by_name = VERIFY_CASES["many-edits"](tmp_path)
    _, positional, _ = run_json(by_position, capsys)
    _, named, _ = run_json(by_name, capsys)
    _, reverse, _ = run_json(reversed_by_name, capsys)

    kinds = [difference["kind"] for difference in named["differences"]]
    # Renamed w3 and moved b0 on both sides, and B's extra tensor; w2's data type; w1's bytes.
    assert (kinds.count("only_in_a"), kinds.count("only_in_b")) == (2, 3)
    assert kinds.count("data_type") == 1 and kinds.count("bytes") == 1 and "place" not in kinds
    metadata = {"name", "place", "data_type", "dims", "sparse_dims", "only_in_a", "only_in_b"}
    first_byte = kinds.index("bytes")
    assert all(kind in metadata for kind in kinds[:first_byte]) and set(kinds[first_byte:]) == {"bytes"}
    only_b = [d for d in named["differences"] if d["kind"] == "only_in_b"]
    assert all(d["a"] is None and d["b"]["model"] == "B" for d in only_b)
    assert positional["differences"][0]["message"].endswith("; A has 9 tensors, B has 10")
    assert sum(d["message"].endswith("B has 10") for d in positional["differences"]) == 1
    assert positional["difference_count"] == len(positional["differences"]) > 3
    assert {d["kind"] for d in reverse["differences"]} >= {"only_in_a", "only_in_b", "bytes"}


def test_a_tensor_moved_to_another_graph_names_where_the_other_model_has_it(tmp_path, capsys):
    first, second = VERIFY_CASES["edit-move_to_the_sibling_subgraph"](tmp_path)[3:5]
    _, document, _ = run_json(second, capsys)

    assert first[1] == "--by-name"
    only = [d for d in document["differences"] if d["kind"] == "only_in_a"]
    assert only and only[0]["elsewhere"]["model"] == "B"
    assert only[0]["elsewhere"]["place"] != only[0]["a"]["place"]
    assert "B has a tensor of that name" in only[0]["message"]


def test_max_differences_bounds_the_list_and_the_text_prints_one_line_each(tmp_path, capsys):
    from onnx_light_ref._cli import main

    VERIFY_CASES["many-edits"](tmp_path)
    a, b = tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx"
    for limit in (1, 2, 3):
        status = main(["verify", "--max-differences", str(limit), str(a), str(b)])
        lines = capsys.readouterr().out.splitlines()
        assert status == 1 and len(lines) == limit and all(line.startswith("different: ") for line in lines)
        assert len(verify_models(a, b, max_differences=limit).differences) == limit


def test_checksum_mismatches_are_records_and_exit_1_although_equal(tmp_path, capsys):
    wrong, right = VERIFY_CASES["checksums"](tmp_path)
    status, document, _ = run_json(wrong, capsys)
    right_status, fine, _ = run_json(right, capsys)

    assert (status, document["equal"], document["ok"], document["status"]) == (1, True, False, "checksum_mismatch")
    assert document["check_checksums"] is True
    mismatches = document["checksum_mismatches"]
    assert [m["tensor"]["name"] for m in mismatches] == ["w0", "w1", "w2"]
    assert all(m["model"] == "B" and m["checksum"] == "0" * 40 and m["location"] == "weights.bin" for m in mismatches)
    assert [m["length"] for m in mismatches] == [28, 12, 68]
    assert (right_status, fine["checksum_mismatches"]) == (0, [])


def test_string_differences_carry_the_elements(tmp_path, capsys):
    element, count = VERIFY_CASES["strings"](tmp_path)
    _, document, _ = run_json(element, capsys)
    _, counted, _ = run_json(count, capsys)

    (difference,) = document["differences"]
    assert (difference["kind"], difference["offset"], difference["value_a"]) == ("string_element", 1, "two")
    assert difference["value_b"] == {"hex": b"tw\xffo\x1b".hex(), "display": "tw\\xffo\x1b"}
    (difference,) = counted["differences"]  # element counts follow the dims, compared first
    assert (difference["kind"], difference["value_a"], difference["value_b"]) == ("dims", [2], [1])


def test_sparse_dims_and_a_large_inline_byte_difference(tmp_path, capsys):
    (tmp_path / "sparse").mkdir()
    (tmp_path / "large").mkdir()
    (sparse,) = VERIFY_CASES["sparse-dims"](tmp_path / "sparse")
    (large,) = VERIFY_CASES["large-inline-difference"](tmp_path / "large")
    _, sparse_doc, _ = run_json(sparse, capsys)
    _, large_doc, _ = run_json(large, capsys)

    difference = sparse_doc["differences"][0]
    assert (difference["kind"], difference["value_a"], difference["value_b"]) == ("sparse_dims", [8], [9])
    (difference,) = large_doc["differences"]
    assert (difference["kind"], difference["offset"], difference["length"]) == (
        "bytes",
        12 * 2**20 + 2,
        20 * 2**20,
    )  # 1.0f: 00 00 80 3f
    assert large_doc["tensors"] == 0 and large_doc["bytes_compared"] == 12 * 2**20


@pytest.mark.parametrize(
    ("which", "kind"), [(0, "FileNotFoundError"), (1, "UnsafeLocationError"), (2, "InvalidModelError")]
)
def test_errors_are_a_document_on_stdout_and_the_usual_line_on_stderr(tmp_path, capsys, which, kind):
    argv = VERIFY_CASES["errors"](tmp_path)[which]
    status, document, errors = run_json(argv, capsys)

    assert (status, document["kind"], document["error"]["type"]) == (1, "error", kind)
    assert errors.startswith("error: ")


# Also digits that are not ASCII (Arabic-Indic, fullwidth): int() and str.isdigit take them, the command line does not.
@pytest.mark.parametrize("value", ["-1", "x", "1.5", "", "+2", "\u0663", "\uff13"])
def test_a_bad_max_differences_is_a_usage_error(tmp_path, capsys, value):
    from onnx_light_ref._cli import main

    with pytest.raises(SystemExit) as raised:
        main(["verify", "--max-differences", value, "a.onnx", "b.onnx", "--json"])
    captured = capsys.readouterr()
    assert raised.value.code == 2 and captured.out == "" and "--max-differences" in captured.err


@pytest.mark.parametrize("value", [-1, True, 1.0, "2"])
def test_a_bad_max_differences_is_refused_by_the_api_before_any_io(tmp_path, value):
    with pytest.raises((TypeError, ValueError), match="max_differences"):
        verify_models(tmp_path / "missing-a.onnx", tmp_path / "missing-b.onnx", max_differences=value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edits=st.lists(st.sampled_from(sorted(EDITS)), min_size=1, max_size=3, unique=True),
    by_name=st.booleans(),
    storage=st.tuples(st.booleans(), st.booleans()),
)
def test_the_first_of_all_differences_is_the_first_difference(tmp_path_factory, capsys, edits, by_name, storage):
    assume(not {"move_to_the_sibling_subgraph", "swap_a_pair"} <= set(edits))  # both need b0 in graphs[0]
    folder = tmp_path_factory.mktemp("edits")
    edited = base_model()
    for edit in edits:
        EDITS[edit](edited, 1, 3, 0x80)
    a = save_edit_model(base_model(), folder / "a", external=storage[0])
    b = save_edit_model(edited, folder / "b", external=storage[1])

    first = verify_models(a, b, by_name=by_name)
    every = verify_models(a, b, by_name=by_name, max_differences=0)
    argv = ["verify", *(["--by-name"] if by_name else []), "--max-differences", "0", str(a), str(b)]
    run = run_both(argv, capsys)

    assert not first.equal and len(first.differences) == 1
    assert every.differences[0] == first.differences[0]
    assert [d["message"] for d in run.document["differences"]] == [d.message for d in every.differences]
    assert run.document["tensors"] == every.tensors
    # Each pair of tensors is named at most once: one difference per pair.
    pairs = [(d.a.index if d.a else None, d.b.index if d.b else None) for d in every.differences]
    assert len(pairs) == len(set(pairs))
    assert all(d.kind in DIFFERENCE_KINDS for d in every.differences)
