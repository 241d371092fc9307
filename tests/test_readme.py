"""The README as a newcomer uses it (issues 22, 29): every example and snippet runs as written, in order, in a fresh
folder; links work on a package index page; the documented temp-file names are the code's; the synopsis shows every
option and the test-extra list is the extra's.

The examples get their inputs from the README itself: its command-line examples start with ``onnx-light-ref demo
--size 4M --keep demo && cd demo``, which writes ``model.onnx`` (+ ``model.onnx.data``: the demo's MLP, input ``x``
``[N, 64]``, last layer ``head.weight``/``head.bias``, an inline 16-byte ``Reshape`` shape, the case onnxruntime
refused in issue 22) and ``light.onnx`` (for onnx-light). Every ```python block and every line of every ```bash
block then runs in document order, in a child process (the console script ``onnx-light-ref`` of this environment),
in the folder a reader would be in: a line ending in ``&& cd DIR`` moves the next ones into ``DIR``. The set-up
lines are checked verbatim; of those, the virtual environment is this interpreter's, the installs are what
``.ci/run`` does, and the quick start's ``onnx-light-ref demo`` runs with ``--size 1M`` (its 64 MiB default is not
the point: every step is the same, and the examples' own demo runs as written).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import onnx_light_ref
from onnx_light_ref._cli import build_parser
from onnx_light_ref.io._write.publish import StagedFile
from tests.checks import run_onnxruntime

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
BASE = "https://github.com/onnx-light-ref/onnx-light-ref/blob/main/"
MAKE_VENV = "python3 -m venv .venv && . .venv/bin/activate"
INSTALL_AND_DEMO = "python -m pip install . && onnx-light-ref demo"
INSTALL_AND_TEST = 'python -m pip install ".[test]" && python -m pytest'
QUICK_START_DEMO = "onnx-light-ref demo --size 1M"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
THEN_CD = re.compile(r"^(?P<command>.+?) && cd (?P<folder>[\w./-]+)$")


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README) if lang == language]


def run(command: list[str] | str, cwd: Path, *, shell: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        command, check=False, cwd=cwd, env=env, shell=shell, capture_output=True, text=True, timeout=600
    )


def test_the_set_up_commands_are_unchanged() -> None:
    assert blocks("bash")[0].strip() == f"{MAKE_VENV}\n{INSTALL_AND_DEMO}"
    assert blocks("bash")[1].strip() == INSTALL_AND_TEST


def run_bash_line(line: str, cwd: Path) -> tuple[str | None, Path]:
    """Run one README shell line in ``cwd`` as a reader would; return what ran (None: a set-up line CI does) and the
    folder the reader is in afterwards."""
    if line in (MAKE_VENV, INSTALL_AND_TEST):
        return None, cwd
    command = QUICK_START_DEMO if line == INSTALL_AND_DEMO else line
    moved = THEN_CD.fullmatch(command)
    if moved is not None:
        command = moved["command"]
    result = run(command, cwd, shell=True)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return command, cwd / moved["folder"] if moved is not None else cwd


def test_every_example_and_snippet_runs_as_written_in_order_in_a_fresh_folder(tmp_path: Path) -> None:
    cwd = tmp_path
    ran = []
    for language, body in BLOCK.findall(README):
        if language == "python":
            result = run([sys.executable, "-c", body], cwd)
            assert result.returncode == 0, f"{body}\n{result.stderr}"
            ran.append(body)
        elif language == "bash":
            for line in body.splitlines():
                if line.strip() and not line.startswith("#"):
                    command, cwd = run_bash_line(line.strip(), cwd)
                    ran += [command] if command is not None else []
    assert len(ran) >= 14  # 6 python blocks, the quick start's demo, the examples' demo and its 6 examples
    folder = tmp_path / "demo"
    assert cwd == folder

    # What the snippets wrote is what they say, and loads where they say it does.
    x = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)
    expected = run_onnxruntime(folder / "model.onnx", {"x": x})[0]
    for path in (
        "out/model.onnx",
        "aligned/model.onnx",
        "hub/model.onnx",
        "external/model.onnx",
        "standard/model.onnx",
    ):
        np.testing.assert_allclose(run_onnxruntime(folder / path, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)
    assert (folder / "hub" / "weights.bin").is_file() and not (folder / "weights.bin").exists()
    variant = onnx.load_model(str(folder / "variant.onnx"), load_external_data=False)
    shape = next(t for t in variant.graph.initializer if t.name == "shape")
    assert shape.data_location == TensorProto.DEFAULT  # the 16-byte Reshape shape stayed inline (issue 22)
    got = run_onnxruntime(folder / "variant.onnx", {"x": x})[0]  # the variant runs in onnxruntime
    bias = numpy_helper.to_array(
        next(t for t in onnx.load(folder / "model.onnx").graph.initializer if t.name == "head.bias")
    )
    np.testing.assert_allclose(got, np.broadcast_to(bias, (4, 16)), rtol=1e-6)  # zero head: only the bias is left


def test_the_test_extra_list_is_the_test_extra() -> None:
    listed = re.search(r"installs the test extra: ([^)]+)\)", README)
    assert listed is not None
    named = [name.strip() for name in " ".join(listed[1].split()).split(",")]
    extra = (ROOT / "pyproject.toml").read_text().split("\ntest = [", 1)[1].split("]", 1)[0]
    assert named == re.findall(r'"([\w-]+)', extra)


def test_the_synopsis_shows_every_option_of_every_command() -> None:
    synopsis = next(body for body in blocks("text") if body.startswith("onnx-light-ref align"))
    lines: dict[str, str] = {}
    command = ""
    for line in synopsis.splitlines():
        if line.startswith("onnx-light-ref "):
            command = line.split()[1]
        lines[command] = lines.get(command, "") + " " + line.split("#")[0]
    parser = build_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    assert set(lines) == set(commands)
    for name, subparser in commands.items():
        options = {o for a in subparser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        shown = set(re.findall(r"--[\w-]+", lines[name]))
        assert shown == options, f"{name}: missing {sorted(options - shown)}, unknown {sorted(shown - options)}"


def test_the_readme_imports_every_function_from_the_package_root() -> None:
    imported = re.findall(r"^from (onnx_light_ref[\w.]*) import \(?([\w, ]+)", "\n".join(blocks("python")), re.M)
    assert imported
    for module, names in imported:
        assert module == "onnx_light_ref", f"one import path per function: {module}"
        for name in (n.strip() for n in names.split(",")):
            assert name in onnx_light_ref.__all__ and getattr(onnx_light_ref, name) is not None
    for name in ("delay_initializers", "undelay_initializers", "reference_evaluator", "verify_models"):
        assert name in onnx_light_ref.__all__
    assert onnx_light_ref.undelay_initializers is __import__("onnx_light_ref.ops").ops.undelay_initializers


def test_links_are_absolute_and_name_files_of_the_repository() -> None:
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert links
    for link in links:
        assert link.startswith("https://"), f"a relative link breaks on a package index page: {link}"
        if link.startswith(BASE):
            assert (ROOT / link[len(BASE) :].split("#")[0]).exists(), link


def test_pyproject_names_absolute_project_urls_and_the_changelog_exists() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    table = text.split("[project.urls]\n", 1)[1].split("\n[", 1)[0]
    urls = dict(re.findall(r'^(\w+) = "([^"]+)"$', table, re.M))
    assert set(urls) == {"Homepage", "Documentation", "Changelog"}
    for url in urls.values():
        assert url.startswith("https://github.com/onnx-light-ref/onnx-light-ref")
        if url.startswith(BASE):
            assert (ROOT / url[len(BASE) :]).is_file(), url
    assert urls["Changelog"] == BASE + "CHANGELOG.md"
    assert "## " in (ROOT / "CHANGELOG.md").read_text()


def _documents() -> dict[str, str]:
    texts = {"README.md": README}
    texts.update({f"docs/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))})
    return texts


def _as_regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(<tag>|<hash of the final name>|<pid>|<random>|\.\.\.)", pattern)
    meaning = {
        "<tag>": "[0-9a-f]{12}",
        "<hash of the final name>": "[0-9a-f]{12}",
        "<pid>": "[0-9]+",
        "<random>": "[0-9a-f]{16}",
        "...": ".+",
    }
    return re.compile("".join(meaning.get(part, re.escape(part)) for part in parts))


def test_the_documented_temp_file_names_are_the_code_s(tmp_path: Path) -> None:
    staged = StagedFile(str(tmp_path / "second.onnx.data"), durable=False)
    real = os.path.basename(staged.temp_path)
    staged.discard()
    documented = {
        (name, token)
        for name, text in _documents().items()
        for token in re.findall(r"`([^`\s]*\.tmp)`", text)
        if not token.startswith("*")
    }
    assert any(name == "docs/shared_weights.md" for name, _ in documented)
    for name, token in documented:
        assert token.startswith(".olr~"), f"{name} names temp files {token!r}; the code writes {real!r}"
        assert _as_regex(token).fullmatch(real), f"{name}: {token!r} does not describe {real!r}"
    for name, text in _documents().items():
        assert ".second.onnx.data.<pid>" not in text, name


def test_the_user_documentation_cites_no_internal_issue_number() -> None:
    """A reader has no access to the project's issue tracker: "issue 12" in a page says nothing to them."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = [
        f"{page.name}: {match.group()}"
        for page in pages
        for match in re.finditer(r"\b(?:issues?|Issue) #?\d+", page.read_text(encoding="utf-8"))
    ]
    assert cited == []


def test_the_size_threshold_table_gives_each_writer_s_real_default() -> None:
    """The README's table of ``size_threshold`` defaults is what the functions and the commands use."""
    import inspect

    from onnx_light_ref import (
        align_external_data_in_memory,
        align_external_data_streaming,
        align_models,
        link_external_data,
        save_model_with_shared_external_data,
    )

    table = README[README.index("**`size_threshold` has two defaults") :].split("\n\n", 2)[1]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in table.splitlines()
        if line.strip().startswith("| `")
    }
    documented = {
        align_external_data_streaming: rows["`align_external_data_streaming` / `_in_memory`, `align`"],
        align_external_data_in_memory: rows["`align_external_data_streaming` / `_in_memory`, `align`"],
        align_models: rows["`align_models`, `align-models`"],
        link_external_data: rows["`link_external_data`, `link`"],
        save_model_with_shared_external_data: rows["`save_model_with_shared_external_data`"],
    }
    for function, shown in documented.items():
        default = inspect.signature(function).parameters["size_threshold"].default
        assert shown.startswith(f"`{default}`"), (function.__name__, default, shown)
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command, row in (("align", "`align"), ("align-models", "`align_models`"), ("link", "`link_external")):
        default = commands[command].get_default("size_threshold")
        shown = next(value for name, value in rows.items() if name.startswith(row))
        assert shown.startswith(f"`{default}`"), (command, default, shown)
