"""The layering is checked, not only written down: ``lint-imports`` (import-linter) keeps pyproject.toml's contracts.

Data flows one way: ``_cli`` → ``_commands`` → ``backend`` → ``ops`` → ``io`` → errors; inside ``io``, the public
functions → ``_write`` → ``_plan`` → ``_read`` → the shared base (``_arguments``, ``_posix``). The planted cases copy
the package to ``tmp_path``, add one backward import, and show that the same command then fails, naming it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "onnx_light_ref"


def _lint_imports(cwd: Path, package_parent: Path) -> subprocess.CompletedProcess[str]:
    """Run import-linter's command on the package found in ``package_parent``, with the repo's contracts."""
    env = {**os.environ, "PYTHONPATH": str(package_parent), "NO_COLOR": "1"}
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", script, "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_package_keeps_every_layer_contract() -> None:
    done = _lint_imports(REPO, REPO)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # a reader importing the publisher: a later stage
        ("io/_read/walker.py", "from onnx_light_ref.io._write import publish", "onnx_light_ref.io._read.walker ->"),
        # planning importing a public writer
        ("io/_plan/placement.py", "import onnx_light_ref.io._align", "onnx_light_ref.io._plan.placement ->"),
        # io importing the operators
        ("io/_verify.py", "import onnx_light_ref.ops._convert", "onnx_light_ref.io._verify ->"),
        # a new module nobody placed in a layer
        ("io/_unplaced.py", "", "_unplaced"),
        # a command writing through the write machinery instead of io's public functions
        ("_commands/undelay.py", "import onnx_light_ref.io._write.execute", "onnx_light_ref._commands.undelay ->"),
    ],
)
def test_a_planted_backward_import_breaks_the_contract(tmp_path: Path, module: str, planted: str, broken: str) -> None:
    copy = tmp_path / "src" / "onnx_light_ref"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = copy / module
    text = target.read_text(encoding="utf-8") if target.exists() else '"""Planted."""\n'
    target.write_text(text + f"\n{planted}\n", encoding="utf-8")

    done = _lint_imports(tmp_path, tmp_path / "src")

    assert done.returncode == 1, done.stdout + done.stderr
    assert "BROKEN" in done.stdout
    assert broken in done.stdout, done.stdout
    assert not (PACKAGE / module).exists() or planted not in (PACKAGE / module).read_text(encoding="utf-8")
