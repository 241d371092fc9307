"""The text rule of the documents: exact strings, ASCII on stdout, other bytes as ``{"hex", "display"}``."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnx_light_ref._commands.json_output import encode_text, error_document, to_json_value


def decoded(value: str | dict[str, str]) -> bytes:
    """The bytes a JSON text value stands for."""
    return value.encode("utf-8") if isinstance(value, str) else bytes.fromhex(value["hex"])


@given(st.text())
def test_any_text_is_a_json_string_that_round_trips(text):
    dumped = json.dumps(to_json_value({"t": text}), ensure_ascii=True)
    assert dumped.isascii() and all(" " <= char <= "~" for char in dumped)
    assert json.loads(dumped) == {"t": text}


@given(st.binary())
def test_any_bytes_round_trip_through_the_document(raw):
    value = json.loads(json.dumps(to_json_value(raw), ensure_ascii=True))
    assert decoded(value) == raw
    try:
        assert value == raw.decode("utf-8")  # valid UTF-8 is a plain string
    except UnicodeDecodeError:
        assert value == {"hex": raw.hex(), "display": raw.decode("utf-8", errors="backslashreplace")}


@given(st.binary())
def test_a_file_name_decoded_with_surrogateescape_gives_back_its_bytes(raw):
    name = os.fsdecode(raw)
    value = json.loads(json.dumps(to_json_value(name), ensure_ascii=True))
    assert decoded(value) == os.fsencode(name) == raw


def test_no_lone_surrogate_reaches_a_json_string():
    dumped = json.dumps(to_json_value([os.fsdecode(b"a\xffb"), b"\xfe", "\udc80"]), ensure_ascii=True)
    assert "\\udc" not in dumped.lower()
    assert json.loads(dumped)[0] == {"hex": "61ff62", "display": "a\\xffb"}


def test_documents_hold_plain_values_only():
    assert to_json_value({"a": (1, [None, True, 2.5])}) == {"a": [1, [None, True, 2.5]]}
    with pytest.raises(TypeError, match="cannot write a set"):
        to_json_value({"a": {1}})
    assert encode_text("x\x1b") == "x\x1b"


def test_an_error_document_names_the_exception_class_and_message():
    assert error_document("verify", FileNotFoundError("gone")) == {
        "schema_version": 1,
        "command": "verify",
        "kind": "error",
        "ok": False,
        "error": {"type": "FileNotFoundError", "message": "gone"},
    }


def test_a_real_process_with_an_ascii_locale_writes_a_parsable_document(tmp_path):
    """stdout is ASCII whatever the names: a C locale (ASCII stdout encoding) cannot make the writer fail."""
    import subprocess
    import sys

    from tests.json.corpus import INSPECT_CASES

    (argv,) = INSPECT_CASES["hostile-not-utf8"](tmp_path)
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("LC_", "LANG", "PYTHONIO"))}
    environment.update(LC_ALL="C", PYTHONUTF8="0")
    completed = subprocess.run(
        [sys.executable, "-m", "onnx_light_ref", *argv, "--json"], capture_output=True, env=environment, check=False
    )
    assert completed.returncode == 1
    assert completed.stdout.isascii()
    document = json.loads(completed.stdout)
    assert bytes.fromhex(document["tensors"][0]["name"]["hex"]) == b"n\xff\x1bme!"
