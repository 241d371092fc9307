"""Every public name's docstring is written for a user, and its ``Example:`` runs (issue 39).

The public names are the ``__all__`` of the public modules (``onnx_light_ref``, ``.io``, ``.ops``, ``.backend``,
``.errors``, ``.schemas``: functions and classes, constants carry no docstring of their own), plus the classes their
functions return. Each docstring has a one-line summary and an ``Example:``; a function's also ``Args:`` (when it
takes any), ``Returns:`` and ``Raises:``; a result class's ``Attributes:``, naming every field. The design documents'
private words ("site", "bridge", "commit A", "rule 2"...) and internal module paths stay out of them and out of the
``--help`` texts; every ``docs/NAME.md#anchor`` they link names an existing section.

The examples run with :mod:`doctest`, each docstring in a fresh copy of the folder the examples say they run in
(``onnx-light-ref demo --size 1M --keep demo``, made once per test process through the command line), with the
system temp folder inside the test's own. An audit hook watches every path a write names while an example runs: an
example writing outside its temporary folder fails. Outputs are sizes, counts, names and verdicts, never float values
nor random bytes, so they are the same on every supported onnx and numpy.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import inspect
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.backend.expected_warnings import EVERY_BIT_PATTERN

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_MODULES: tuple[ModuleType, ...] = tuple(
    importlib.import_module(name)
    for name in (
        "onnx_light_ref",
        "onnx_light_ref.io",
        "onnx_light_ref.ops",
        "onnx_light_ref.backend",
        "onnx_light_ref.errors",
        "onnx_light_ref.schemas",
    )
)
EXAMPLE_FOLDER = "onnx-light-ref demo --size 1M --keep demo"
"""The command whose folder the examples run in; each ``Example:`` says so in these words (or "in any folder")."""

PRIVATE_WORDS = re.compile(
    r"\b(sites?|held folder|folder held|bridged?|bridge files?|commit [AB]|rule \d(?![^.]*docs/safety\.md)|seed spec|"
    r"walker|SitePolicy|WritePlan|ModelFolder)\b",
    re.IGNORECASE,
)
"""The design documents' words, which a user has not read: a public text says it in plain words, or links the
section of ``docs/safety.md`` that defines it (``docs/safety.md#glossary``; "rule N" only with that link)."""

LEFT_TO_ISSUE_39C = {"onnx_light_ref.align_external_data_streaming", "onnx_light_ref.align_external_data_in_memory"}
"""The aligners' shared option and return descriptions, which issue-39c writes once for both (this branch edits only
their summaries and examples): their private words are its to remove, and each entry goes once it has none left."""

INTERNAL_PATH = re.compile(r"onnx_light_ref(?:\.\w+)+")
DOC_LINK = re.compile(r"docs/(\w+\.md)#([\w-]+)")


def _public_objects() -> dict[str, object]:
    """Every public function and class under its first documented name, then each class a public function returns."""
    found: dict[str, object] = {}
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and all(obj is not o for o in found.values()):
                found[f"{module.__name__}.{name}"] = obj
    for name, obj in list(found.items()):
        returned = typing.get_type_hints(obj).get("return") if inspect.isfunction(obj) else None
        ours = inspect.isclass(returned) and returned.__module__.startswith("onnx_light_ref.")
        if ours and all(returned is not o for o in found.values()):
            found[f"{name}() -> {returned.__name__}"] = returned
    return found


PUBLIC = _public_objects()


def _public_methods(cls: type) -> Iterator[tuple[str, object]]:
    for name, member in vars(cls).items():
        function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if not name.startswith("_") and inspect.isfunction(function):
            yield name, function


def _attributes(cls: type) -> set[str]:
    """A result's public attributes: its fields (a dataclass's, else annotated ones) and its properties."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("onnx_light_ref."):
            names |= {name for name, value in vars(klass).items() if isinstance(value, property)}
            if not dataclasses.is_dataclass(cls):
                names |= set(vars(klass).get("__annotations__", {}))
    if dataclasses.is_dataclass(cls):
        names |= {field.name for field in dataclasses.fields(cls)}
    return {name for name in names if not name.startswith("_")}


def _command_line(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "1000"}  # one line per sentence: a phrase is never cut by a line break
    command = [sys.executable, "-m", "onnx_light_ref", *args]
    result = subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=120)
    return result.stdout


def _texts_a_user_reads() -> Iterator[tuple[str, str]]:
    """Every public docstring (its public methods' too) and every ``--help`` text."""
    for name, obj in PUBLIC.items():
        yield name, inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
            for method, function in _public_methods(obj):
                yield f"{name}.{method}", inspect.getdoc(function) or ""
    usage = _command_line("--help")
    yield "onnx-light-ref --help", usage
    commands = re.findall(r"^ {4}([a-z][a-z-]*)(?: {2,}\S|$)", usage, re.MULTILINE)  # a long name: help below
    assert "align" in commands and "generate-tests" in commands
    for command in commands:
        yield f"onnx-light-ref {command} --help", _command_line(command, "--help")


def _public_path(dotted: str) -> bool:
    modules = {module.__name__: module for module in PUBLIC_MODULES}
    module, _, name = dotted.rpartition(".")
    return dotted in modules or (module in modules and name in modules[module].__all__)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_the_docstring_has_a_summary_its_sections_and_an_example(name: str) -> None:
    obj = PUBLIC[name]
    doc = inspect.getdoc(obj) or ""
    summary = doc.split("\n\n", 1)[0]
    assert "\n" not in summary and summary.endswith("."), f"{name}: one summary line ending with '.': {summary!r}"
    sections = set(re.findall(r"^(\w+):$", doc, re.MULTILINE))
    needed = {"Example"}
    if inspect.isfunction(obj):
        needed |= {"Returns", "Raises"} | ({"Args"} if inspect.signature(obj).parameters else set())
    if inspect.isclass(obj) and obj.__name__.endswith("Result"):
        needed.add("Attributes")
        undescribed = sorted(a for a in _attributes(obj) if not re.search(rf"\b{a}\b", doc))
        assert not undescribed, f"{name}: attributes not described: {undescribed}"
    assert needed <= sections, f"{name}: missing {sorted(needed - sections)}"
    assert doctest.DocTestParser().get_examples(doc.split("\nExample:\n", 1)[1]), f"{name}: no '>>>' in its Example:"
    assert "+SKIP" not in doc, f"{name}: an example that does not run"
    assert EXAMPLE_FOLDER in doc or "in any folder" in doc.lower(), f"{name}: say which folder the example runs in"
    if inspect.isclass(obj) and not issubclass(obj, BaseException):
        undocumented = [method for method, function in _public_methods(obj) if not inspect.getdoc(function)]
        assert not undocumented, f"{name}: public methods without a docstring: {undocumented}"


@pytest.mark.slow
def test_public_texts_use_no_private_word_and_link_only_existing_sections() -> None:
    offending, links, pending = [], [], set()
    for where, text in _texts_a_user_reads():
        found = [f"{where}: {word!r}" for word in PRIVATE_WORDS.findall(text)]
        found += [f"{where}: {path}" for path in INTERNAL_PATH.findall(text) if not _public_path(path)]
        pending |= {where} if where in LEFT_TO_ISSUE_39C and found else set()
        offending += found if where not in LEFT_TO_ISSUE_39C else []
        links += [(where, document, anchor) for document, anchor in DOC_LINK.findall(text)]
    assert not offending, "\n".join(offending)
    assert pending == LEFT_TO_ISSUE_39C, f"no private word left: remove {LEFT_TO_ISSUE_39C - pending} from the list"
    assert ("onnx_light_ref.errors.UnsafeLocationError", "safety.md", "glossary") in links
    broken = [f"{where}: docs/{doc}#{anchor}" for where, doc, anchor in links if anchor not in _anchors(doc)]
    assert not broken, "\n".join(broken)


def _anchors(document: str) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / document).read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {  # audit event -> positions of the paths it changes
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.rename": (0, 1),
    "os.link": (1,),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
}
_writable: list[str] = []  # the folder a running example may write into; empty when no example runs
_escapes: list[str] = []
_hooked: list[bool] = []


def _watch_writes(event: str, args: tuple[object, ...]) -> None:
    """Record each path a write names outside the running example's folder (the compiler's caches aside)."""
    if not _writable:
        return
    if event == "open":
        paths = [args[0]] if isinstance(args[2], int) and args[2] & _WRITE_FLAGS else []
    else:
        paths = [args[i] for i in _PATH_EVENTS.get(event, ())]
    for path in paths:
        if isinstance(path, (str, bytes)):
            absolute = os.path.abspath(os.fsdecode(path))
            if not absolute.startswith(_writable[0]) and "__pycache__" not in absolute:
                _escapes.append(f"{event} {absolute}")


@pytest.fixture(scope="session")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the examples run in, written once per test process by the command line."""
    folder = tmp_path_factory.mktemp("docstrings") / "demo"
    _command_line(*EXAMPLE_FOLDER.split()[1:-1], str(folder), "--no-progress")
    if not _hooked:
        sys.addaudithook(_watch_writes)  # for the rest of this process: a hook cannot be removed
        _hooked.append(True)
    return folder


def _run_examples(test: doctest.DocTest, folder: Path) -> tuple[doctest.TestResults, str, list[str]]:
    """Run one docstring's examples in ``folder``, the system temp folder inside it; return what wrote outside."""
    temp = folder / "tmp"
    temp.mkdir()
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("TMPDIR", str(temp))
        patch.setattr(tempfile, "tempdir", str(temp))
        _escapes.clear()
        _writable.append(str(folder) + os.sep)
        try:
            results = runner.run(test, out=report.write)
        finally:
            _writable.clear()
    return results, report.getvalue(), list(_escapes)


@pytest.mark.slow
@EVERY_BIT_PATTERN[0]  # make_runner's example runs the conformance cases
@EVERY_BIT_PATTERN[1]
@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_the_examples_run_as_written_in_the_demo_folder(name: str, demo_folder: Path, tmp_path: Path) -> None:
    tests = [t for t in doctest.DocTestFinder().find(PUBLIC[name], name, module=False, globs={}) if t.examples]
    assert any(test.name == name for test in tests), f"{name}: its own docstring holds no example"
    for index, test in enumerate(sorted(tests, key=lambda t: t.name)):
        folder = tmp_path / str(index)
        shutil.copytree(demo_folder, folder, symlinks=True)
        results, report, escapes = _run_examples(test, folder)
        assert results.failed == 0, report
        assert not escapes, f"{test.name} wrote outside its folder: {escapes}"


def test_an_example_writing_outside_its_folder_is_caught(demo_folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    source = f">>> _ = open({str(outside)!r}, 'w').write('escaped')\n>>> open('inside.txt', 'w').close()\n"
    test = doctest.DocTestParser().get_doctest(source, {}, "escape", None, 0)
    folder = tmp_path / "example"
    shutil.copytree(demo_folder, folder, symlinks=True)
    results, _, escapes = _run_examples(test, folder)
    assert results.failed == 0 and (folder / "inside.txt").is_file()
    assert escapes == [f"open {outside}"]
