"""The shipped schemas: what the validator enforces, that the corpus writes every member they describe, that
``docs/json.md`` describes every member, and that the wheel ships them."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import get_args

import pytest

from onnx_light_ref.io._differences import DifferenceKind
from onnx_light_ref.io._layout_report import LayoutStatus
from onnx_light_ref.io._read.loader_rule import LOADERS
from onnx_light_ref.io._read.reference_scan import Via
from onnx_light_ref.io._read.walker import TensorKind
from onnx_light_ref.io._results import PairingHow
from onnx_light_ref.schemas import SCHEMA_NAMES, SCHEMA_VERSIONS, load_schema
from tests.json.corpus import INSPECT_CASES, VERIFY_CASES
from tests.json.runner import SCHEMAS, run_json
from tests.json.schema_check import SchemaError, UnsupportedKeywordError, property_locations, validate

ROOT = Path(__file__).resolve().parents[2]


def minimal_error(command: str) -> dict:
    return {
        "schema_version": SCHEMA_VERSIONS[command],
        "command": command,
        "kind": "error",
        "ok": False,
        "error": {"type": "X", "message": "m"},
    }


@pytest.mark.parametrize("command", SCHEMA_NAMES)
def test_the_validator_refuses_what_the_schema_forbids(command):
    schema = SCHEMAS[command]
    good = minimal_error(command)
    validate(good, schema)
    bad = []
    for change in (
        lambda d: d.pop("error"),  # a required member missing
        lambda d: d.update(extra=1),  # a member the schema does not describe
        lambda d: d.update(schema_version=d["schema_version"] + 1),  # another version
        lambda d: d.update(ok=0),  # 0 is not false
        lambda d: d["error"].update(message=b"raw"),  # not a JSON value at all
        lambda d: d["error"].update(message={"hex": "zz", "display": ""}),  # not hex
        lambda d: d["error"].update(message={"hex": "ff"}),  # display missing
    ):
        document = copy.deepcopy(good)
        change(document)
        bad.append(document)
    for document in bad:
        with pytest.raises(SchemaError):
            validate(document, schema)


def test_the_validator_refuses_a_keyword_it_does_not_implement():
    with pytest.raises(UnsupportedKeywordError, match="uniqueItems"):
        validate([1], {"type": "array", "uniqueItems": True})


def test_every_member_the_schemas_describe_is_written_by_some_case(tmp_path, capsys):
    """Both ways: every document matches the schema (checked while running), and every member is seen."""
    seen = {command: set() for command in SCHEMA_NAMES}
    for cases, command in ((INSPECT_CASES, "inspect"), (VERIFY_CASES, "verify")):
        for name, build in cases.items():
            folder = tmp_path / command / name
            folder.mkdir(parents=True)
            for argv in build(folder):
                run_json(argv, capsys, seen[command])
    for command in SCHEMA_NAMES:
        missing = property_locations(SCHEMAS[command]) - seen[command]
        assert not missing, f"{command}: members no case writes: {sorted(missing)}"


def schema_members(schema: dict) -> set[str]:
    return {location.rsplit("/", 1)[1] for location in property_locations(schema)}


@pytest.mark.parametrize("command", SCHEMA_NAMES)
def test_docs_json_md_describes_every_member_and_kind(command):
    text = (ROOT / "docs" / "json.md").read_text()
    described = set(re.findall(r"`([a-z_]+)`", text))
    missing = schema_members(SCHEMAS[command]) - described
    assert not missing, f"docs/json.md does not describe {sorted(missing)}"
    enums = json.dumps(SCHEMAS[command])
    for values in re.findall(r'"enum": \[([^\]]*)\]', enums):
        for value in json.loads(f"[{values}]"):
            if isinstance(value, str):
                assert f"`{value}`" in text, f"docs/json.md does not name the value {value!r}"


def _enum(command: str, *path: str) -> list[str]:
    node = load_schema(command)["$defs"]
    for key in path:
        node = node[key]
    return node["enum"]


def test_the_schemas_values_are_the_codes_literals():
    """One source (issue 39): every value a document may hold is a member of the ``Literal`` the code writes it
    from, in the same order; the schemas are published data, checked against the code rather than derived."""
    assert _enum("verify", "difference", "properties", "kind") == list(get_args(DifferenceKind))
    assert _enum("verify", "tensor_kind") == list(get_args(TensorKind))
    assert _enum("inspect", "tensor_kind") == [kind for kind in get_args(TensorKind) if kind != "delayed_initializer"]
    tensor_statuses = _enum("inspect", "tensor", "properties", "status")
    assert set(tensor_statuses) | set(_enum("inspect", "delayed_status")) == set(get_args(LayoutStatus))
    loaders = _enum("inspect", "tensor", "properties", "refusals", "items", "properties", "loaders", "items")
    assert loaders == list(LOADERS)
    via = ("folder_document", "properties", "files", "items", "properties", "users", "items", "properties", "via")
    assert _enum("inspect", *via) == list(get_args(Via))
    assert _enum("verify", "pairing", "properties", "how") == list(get_args(PairingHow))


def test_the_schemas_are_loaded_from_the_package_and_refuse_unknown_names():
    assert load_schema("inspect")["title"].startswith("onnx-light-ref inspect --json")
    with pytest.raises(ValueError, match="command must be one of"):
        load_schema("align")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no schema version 3 for 'inspect' \\(this release writes version 2\\)"):
        load_schema("inspect", 3)
    assert load_schema("inspect", 1)["title"].endswith("schema version 1")  # earlier releases' documents
    assert load_schema("inspect") == load_schema("inspect", 2)


def test_the_package_data_globs_ship_every_schema_file():
    """What setuptools puts in the wheel: ``[tool.setuptools.package-data]`` must match each schema file."""
    import fnmatch

    # tomllib is Python 3.11+ (the floor is 3.10): the table is read with a pattern.
    section = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    globs = json.loads(re.search(r"^onnx_light_ref = (\[.*\])$", section, re.MULTILINE).group(1))
    shipped = sorted(
        p.relative_to(ROOT / "onnx_light_ref").as_posix() for p in (ROOT / "onnx_light_ref" / "schemas").glob("*.json")
    )
    assert shipped == ["schemas/inspect-1.json", "schemas/inspect-2.json", "schemas/verify-1.json"]
    assert all(any(fnmatch.fnmatch(name, pattern) for pattern in globs) for name in shipped)


def _build_outputs_in_checkout() -> set[str]:
    """What a build run in the checkout would leave there: ``build/``, ``dist/``, ``*.egg-info`` (other top-level
    names come and go with other tests: ``.hypothesis``, ``.pytest_cache``)."""
    return {e.name for e in ROOT.iterdir() if e.name in ("build", "dist") or e.name.endswith(".egg-info")}


@pytest.mark.slow  # builds a wheel in an isolated build environment: a few seconds
def test_the_wheel_ships_the_schemas(tmp_path):
    """pip builds the wheel as a user's ``pip install`` does: in an isolated environment holding pyproject.toml's
    build requirement (setuptools >= 77, whatever is installed here: the test extra does not name it), from a copy of
    the tree, every temp and cache folder inside ``tmp_path``."""
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (source / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(ROOT / "onnx_light_ref", source / "onnx_light_ref", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path / "tmp"),  # pip's build environment and unpacked requirements
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),  # the downloaded setuptools wheel
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    before = _build_outputs_in_checkout()
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), "."],
        check=False,
        capture_output=True,
        text=True,
        cwd=source,
        env=env,
    )
    assert built.returncode == 0, built.stderr
    assert _build_outputs_in_checkout() == before
    assert sorted(os.listdir(tmp_path / "tmp")) == []  # pip removed its build environment
    (wheel,) = (tmp_path / "dist").glob("onnx_light_ref-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for command, version in [("inspect", 1), ("inspect", 2), ("verify", 1)]:
            member = f"onnx_light_ref/schemas/{command}-{version}.json"
            assert member in names
            assert json.loads(archive.read(member)) == load_schema(command, version)
