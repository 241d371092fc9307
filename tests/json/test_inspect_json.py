"""``inspect --json``: on every model of the corpus, one document that matches the schema and says what the text
says; and the facts a pipeline reads from it, checked against the model itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest

from tests.checks import sha256_of_tree
from tests.json.corpus import INSPECT_CASES
from tests.json.runner import run_both, run_json


@pytest.mark.parametrize("case", sorted(INSPECT_CASES))
def test_every_case_gives_a_document_that_says_what_the_text_says(tmp_path, capsys, case):
    runs = INSPECT_CASES[case](tmp_path)
    before = sha256_of_tree(tmp_path)
    for argv in runs:
        run_both(argv, capsys)
    assert sha256_of_tree(tmp_path) == before  # inspect writes nothing, in either mode


def test_each_tensor_carries_its_place_dtype_dims_and_range(tmp_path, capsys):
    (argv,) = INSPECT_CASES["zoo-subgraphs"](tmp_path)
    status, document, _ = run_json(argv, capsys)
    model = onnx.load(argv[1], load_external_data=False)

    assert status == 0 and document["ok"] and document["kind"] == "model"
    by_name = {tensor["name"]: tensor for tensor in document["tensors"]}
    assert sorted(by_name) == ["w_else", "w_loop", "w_main", "w_then"]
    main = by_name["w_main"]
    assert (main["kind"], main["dtype"], main["data_type"], main["dims"]) == ("initializer", "FLOAT", 1, [3])
    assert main["place"] == [["graph"], ["initializer", 0]]
    then = by_name["w_then"]
    assert then["place"] == [["graph"], ["node", 1], ["attribute", 1, "then_branch"], ["g"], ["initializer", 0]]
    assert then["place_text"] == "graph / node #1 / attribute #1 'then_branch' / g / initializer #0"
    assert then["where"] == "graph 'subgraphs' / node '#1' (If) / then_branch"
    entries = {e.key: e.value for e in model.graph.initializer[0].external_data}
    assert (main["location"], main["offset"], main["length"]) == (
        entries["location"],
        int(entries["offset"]),
        int(entries["length"]),
    )
    (file,) = document["files"]
    assert file["size"] == os.path.getsize(Path(argv[1]).parent / entries["location"])
    assert file["coverage"] == round(file["bytes_used"] / file["size"], 6)
    assert sum(gap["length"] for gap in file["gaps"]) == file["gap_bytes"]


def test_overlaps_gaps_and_errors_are_listed_per_file_and_per_tensor(tmp_path, capsys):
    (argv,) = INSPECT_CASES["hostile-ranges"](tmp_path)
    status, document, _ = run_json(argv, capsys)

    assert status == 1 and document["status"] == "error"
    statuses = {tensor["label"]: tensor["status"] for tensor in document["tensors"]}
    assert statuses == {
        "a": "overlap",
        "b": "overlap",
        "c": "overlap",
        "tied": "shared",
        "tied_too": "shared",
        "past_end": "out of bounds",
        "bad_number": "invalid",
        "no_location": "invalid",
        "negative": "invalid",
    }
    assert document["error_count"] == 7
    (file,) = document["files"]
    assert [(o["tensor"], o["offset"], o["length"], o["ranges"]) for o in file["overlaps"]] == [
        ("a", 0, 64, 2),
        ("b", 32, 64, 2),
        ("c", 40, 16, 2),
    ]
    assert file["overlaps"][0]["partner"] == {"offset": 32, "length": 64}
    assert file["gaps"] == [{"offset": 96, "length": 32}, {"offset": 192, "length": 108}]
    tied = next(t for t in document["tensors"] if t["label"] == "tied")
    assert tied["shared_with"] == ["tied_too"] and not tied["error"]


def test_names_and_locations_that_are_not_utf8_round_trip_as_bytes(tmp_path, capsys):
    (argv,) = INSPECT_CASES["hostile-not-utf8"](tmp_path)
    status, document, _ = run_json(argv, capsys)

    assert status == 1
    first, second = document["tensors"]
    assert first["name"] == {"hex": b"n\xff\x1bme!".hex(), "display": "n\\xff\x1bme!"}
    assert bytes.fromhex(first["name"]["hex"]) == b"n\xff\x1bme!"
    assert first["label"] == "n\\xff\x1bme!"
    assert first["status"] == "loader refuses"
    assert first["refusals"][0]["loaders"] == ["onnx.load"]
    assert first["refusals"][0]["accepting"] == ["check_model", "onnxruntime"]
    assert bytes.fromhex(second["location"]["hex"]) == b"loc\xfe\xffb.bin"
    assert second["status"] == "invalid"
    assert document["notes"] and "not valid UTF-8" in document["notes"][0]


def test_control_characters_are_escaped_on_stdout_and_exact_once_parsed(tmp_path, capsys):
    (argv,) = INSPECT_CASES["hostile-escapes"](tmp_path)
    from onnx_light_ref._cli import main

    status = main([*argv, "--json"])
    raw = capsys.readouterr().out
    document = json.loads(raw)
    names = [tensor["name"] for tensor in document["tensors"]]

    assert status == 1
    assert "\x1b" not in raw and "\x07" not in raw and "\u202e" not in raw and "\r" not in raw
    assert '"name": "w\\u001b[2J\\u001b]0;pwned\\u0007\\u202e"' in raw
    assert names == ["w\x1b[2J\x1b]0;pwned\x07\u202e", "x\r\x1b[1A"]
    assert document["tensors"][1]["location"] == "gone\x1b[31m.data"


def test_a_symbolic_link_is_refused_then_listed_but_trusted_with_the_opt_in(tmp_path, capsys):
    default, trusted, _ = INSPECT_CASES["hostile-files"](tmp_path)
    _, refused, _ = run_json(default, capsys)
    _, allowed, _ = run_json(trusted, capsys)

    soft = {
        doc_id: next(t for t in doc["tensors"] if t["label"] == "soft")
        for doc_id, doc in (("d", refused), ("t", allowed))
    }
    assert soft["d"]["status"] == "unsafe location"
    assert soft["t"]["status"] == "ok"
    (refusal,) = soft["t"]["refusals"]
    assert refusal["symlink"] and refusal["loaders"] == ["onnx.load", "check_model"]
    keyed = next(t for t in allowed["tensors"] if t["label"] == "keyed")
    assert keyed["status"] == "invalid" and "basepath" in keyed["message"]
    assert keyed["refusals"][0]["loaders"] == ["onnxruntime"]
    hard = next(t for t in allowed["tensors"] if t["label"] == "hard")
    assert hard["status"] == "hard-linked"


def test_safetensors_header_facts(tmp_path, capsys):
    covered, holes, broken = INSPECT_CASES["safetensors"](tmp_path)
    _, linked, _ = run_json(covered, capsys)
    _, holed, _ = run_json(holes, capsys)
    _, bad, _ = run_json(broken, capsys)

    (file,) = linked["files"]
    facts = file["safetensors"]
    header_size = int.from_bytes((tmp_path / "model.safetensors").read_bytes()[:8], "little")
    assert facts["valid"] and facts["ok"] and facts["holes"] == []
    assert (facts["data_start"], facts["tensors"], facts["metadata"]) == (8 + header_size, 4, {"format": "pt"})
    assert facts["data_size"] == file["size"] - facts["data_start"]
    (hole_file,) = holed["files"]
    assert not hole_file["safetensors"]["ok"] and hole_file["safetensors"]["valid"]
    (hole,) = hole_file["safetensors"]["holes"]
    assert (hole["offset"], hole["length"]) == (hole_file["size"] - 64, 64)
    assert {"offset": hole["offset"], "length": 64} in hole_file["gaps"]
    assert bad["files"][0]["safetensors"]["valid"] is False
    assert bad["files"][0]["safetensors"]["summary"].startswith("safetensors header INVALID")


def test_a_folder_document_lists_each_model_and_who_shares_which_file(tmp_path, capsys):
    argv, _ = INSPECT_CASES["shared-folder"](tmp_path)
    status, document, _ = run_json(argv, capsys)

    assert status == 1 and document["kind"] == "folder"
    models = {model["file"]: model for model in document["models"]}
    assert sorted(models) == ["broken.onnx", "model.onnx", "notes.onnx", "variant.onnx"]
    assert [models[name]["status"] for name in sorted(models)] == ["error", "ok", "unreadable", "ok"]
    assert models["notes.onnx"]["error"]["type"] == "InvalidModelError"
    assert models["notes.onnx"]["report"] is None
    assert models["variant.onnx"]["report"]["external_tensors"] == 3
    files = {file["path"]: file for file in document["files"]}
    shared = files["model.onnx.data"]
    assert shared["shared"] and [user["model"] for user in shared["users"]] == ["model.onnx", "variant.onnx"]
    assert [user["tensors"] for user in shared["users"]] == [2, 2]
    assert not files["variant.onnx.data"]["shared"]


def test_file_names_that_are_not_utf8_round_trip_as_bytes(tmp_path, capsys):
    model_argv, folder_argv = INSPECT_CASES["not-utf8-file-names"](tmp_path)
    _, model, _ = run_json(model_argv, capsys)
    _, folder, _ = run_json(folder_argv, capsys)

    assert os.fsencode(model_argv[1]) == bytes.fromhex(model["model"]["hex"])
    assert model["model"]["display"].endswith("m\\xff\x1b.onnx")
    assert bytes.fromhex(folder["models"][0]["file"]["hex"]) == b"m\xff\x1b.onnx"
    assert folder["files"][0]["users"][0]["model"] == folder["models"][0]["file"]


def test_a_large_inline_model_is_reported_without_its_payloads(tmp_path, capsys):
    (argv,) = INSPECT_CASES["large-inline"](tmp_path)
    status, document, _ = run_json(argv, capsys)

    assert (status, document["external_tensors"], document["inline_tensors"]) == (0, 0, 2)


@pytest.mark.parametrize(
    ("which", "kind"), [(0, "FileNotFoundError"), (1, "FileNotFoundError"), (2, "InvalidModelError")]
)
def test_errors_are_a_document_on_stdout_and_the_usual_line_on_stderr(tmp_path, capsys, which, kind):
    argv = INSPECT_CASES["errors"](tmp_path)[which]
    status, document, errors = run_json(argv, capsys)

    assert (status, document["kind"], document["ok"], document["error"]["type"]) == (1, "error", False, kind)
    assert errors.startswith("error: ") and document["error"]["message"] in errors


def test_a_usage_error_writes_no_document(tmp_path, capsys):
    from onnx_light_ref._cli import main

    with pytest.raises(SystemExit) as raised:
        main(["inspect", "--json"])
    captured = capsys.readouterr()
    assert raised.value.code == 2 and captured.out == "" and "usage:" in captured.err
