"""The README as a newcomer uses it (issue 22): every snippet runs as written, links work on a package index page,
and the documented temp-file names are the code's.

The README's examples run next to a ``model.onnx`` with external weights (``model.onnx.data``) and a ``light.onnx``
written for onnx-light; :func:`newcomer_folder` builds exactly that (an MLP whose last layer is ``head.weight``, with
a ``Reshape`` whose 16-byte ``shape`` is inline, the case onnxruntime refused in issue 22). Every ```python block and
every line of every ```bash block then runs in that folder, in document order, in a child process (the console
script ``onnx-light-ref`` of this environment). The two set-up lines are checked verbatim (``.ci/run`` calls the
test line); of the first, the part after the ``pip install`` (``onnx-light-ref demo``) is run as written, the
install itself is what CI does.
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
from onnx import TensorProto, helper, numpy_helper

import onnx_light_ref
from onnx_light_ref.io.write.publish import StagedFile
from tests.checks import run_onnxruntime
from tests.models import IR_VERSION, OPSET

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
BASE = "https://github.com/onnx-light-ref/onnx-light-ref/blob/main/"
INSTALL_AND_DEMO = "python -m pip install . && onnx-light-ref demo"
INSTALL_AND_TEST = 'python -m pip install ".[test]" && python -m pytest'
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README) if lang == language]


def newcomer_folder(folder: Path) -> None:
    """``model.onnx`` (+ ``model.onnx.data``, tensors of 1 KiB or more) and ``light.onnx`` in ``folder``."""
    from onnx_light_ref import delay_initializers

    rng = np.random.default_rng(22)
    weights = {
        "W0": rng.standard_normal((64, 64), dtype=np.float32),
        "b0": rng.standard_normal(64, dtype=np.float32),
        "head.weight": rng.standard_normal((64, 16), dtype=np.float32),
        "head.bias": rng.standard_normal(16, dtype=np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h0"]),
        helper.make_node("Add", ["h0", "b0"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "head.weight"], ["h3"]),
        helper.make_node("Add", ["h3", "head.bias"], ["h4"]),
        helper.make_node("Reshape", ["h4", "shape"], ["y"]),
    ]
    initializers = [numpy_helper.from_array(array, name) for name, array in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([-1, 16], np.int64), "shape"))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        initializers,
    )
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    onnx.save(delay_initializers(folder / "model.onnx"), folder / "light.onnx")


def run(command: list[str] | str, cwd: Path, *, shell: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        command, check=False, cwd=cwd, env=env, shell=shell, capture_output=True, text=True, timeout=600
    )


def test_the_two_set_up_commands_are_unchanged() -> None:
    assert blocks("bash")[0].strip() == INSTALL_AND_DEMO
    assert blocks("bash")[1].strip() == INSTALL_AND_TEST


def test_every_snippet_runs_as_written_and_the_results_load_in_onnxruntime(tmp_path: Path) -> None:
    newcomer_folder(tmp_path)
    x = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)
    expected = run_onnxruntime(tmp_path / "model.onnx", {"x": x})[0]
    ran = []
    for language, body in BLOCK.findall(README):
        if language == "python":
            result = run([sys.executable, "-c", body], tmp_path)
            assert result.returncode == 0, f"{body}\n{result.stderr}"
            ran.append(body)
        elif language == "bash":
            for line in body.splitlines():
                if not line.strip() or line.startswith("#") or line.strip() == INSTALL_AND_TEST:
                    continue
                command = line.split("&&")[1].strip() if line.strip() == INSTALL_AND_DEMO else line
                result = run(command, tmp_path, shell=True)
                assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
                ran.append(command)
    assert len(ran) >= 12  # 6 python blocks, the demo and the 6 command-line examples

    # What the snippets wrote is what they say, and loads where they say it does.
    for path in (
        "out/model.onnx",
        "aligned/model.onnx",
        "hub/model.onnx",
        "external/model.onnx",
        "standard/model.onnx",
    ):
        np.testing.assert_allclose(run_onnxruntime(tmp_path / path, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)
    assert (tmp_path / "hub" / "weights.bin").is_file() and not (tmp_path / "weights.bin").exists()
    variant = onnx.load_model(str(tmp_path / "variant.onnx"), load_external_data=False)
    shape = next(t for t in variant.graph.initializer if t.name == "shape")
    assert shape.data_location == TensorProto.DEFAULT  # the 16-byte Reshape shape stayed inline (issue 22)
    got = run_onnxruntime(tmp_path / "variant.onnx", {"x": x})[0]  # the variant runs in onnxruntime
    bias = numpy_helper.to_array(
        next(t for t in onnx.load(tmp_path / "model.onnx").graph.initializer if t.name == "head.bias")
    )
    np.testing.assert_allclose(got, np.broadcast_to(bias, (4, 16)), rtol=1e-6)  # zero head: only the bias is left


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
