"""The ``onnx-light-ref`` dispatcher: every command module is wired in, and a broken one is never skipped silently."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import onnx_light_ref._commands
from onnx_light_ref import __version__
from onnx_light_ref import _cli as cli


def test_every_command_module_is_registered():
    # A command module is one that has `register`; the others (sizes, progress...) are helpers the commands share.
    folder = Path(onnx_light_ref._commands.__file__).parent
    names = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    modules = {
        name for name in names if hasattr(importlib.import_module(f"onnx_light_ref._commands.{name}"), "register")
    }

    assert set(cli._COMMAND_MODULES) == modules
    parser = cli.build_parser()
    subparsers = next(action for action in parser._actions if action.dest == "command")
    # One sub-command per module, named after it (dashes on the command line).
    assert list(subparsers.choices) == [name.replace("_", "-") for name in cli._COMMAND_MODULES]


def test_a_command_that_fails_to_import_is_loud(monkeypatch):
    real_import = importlib.import_module

    def broken(name: str, package: str | None = None):
        if name == "onnx_light_ref._commands.verify":
            raise ModuleNotFoundError("No module named 'some_missing_dependency'", name="some_missing_dependency")
        return real_import(name, package)

    monkeypatch.setattr(cli.importlib, "import_module", broken)

    with pytest.raises(ModuleNotFoundError, match="some_missing_dependency"):
        cli.main(["inspect", "model.onnx"])


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage: onnx-light-ref" in capsys.readouterr().err


def test_version_comes_from_the_package(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])

    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"onnx-light-ref {__version__}"


# What a command that only prints (``--version``, every ``--help``) may import: onnx, numpy and onnxruntime take most
# of a second and 40+ MiB to import, so the CLI imports them only when a command runs (benchmarks/test_bench_startup.py
# measures the start-up itself).
_HEAVY_MODULES = ("onnx", "numpy", "onnxruntime", "google.protobuf", "onnx_light_ref.io._align", "onnx_light_ref.ops")
_PRINT_ONLY = """
import contextlib, io, json, sys
from onnx_light_ref._cli import build_parser, main
commands = list(next(a for a in build_parser()._actions if a.dest == "command").choices)
for argv in (["--version"], ["--help"], *([name, "--help"] for name in commands)):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        main(argv)
    assert out.getvalue(), argv
print(json.dumps({"commands": commands, "modules": sorted(sys.modules)}))
"""


def test_version_and_every_help_import_neither_onnx_nor_numpy() -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PRINT_ONLY], capture_output=True, text=True, check=False, timeout=60)

    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert len(printed["commands"]) == len(cli._COMMAND_MODULES)
    heavy = [name for name in printed["modules"] if any(name == m or name.startswith(f"{m}.") for m in _HEAVY_MODULES)]
    assert heavy == []


_READ_ONLY = """
import contextlib, io, json, sys
from onnx_light_ref._cli import main
statuses = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        statuses.append([main(argv), out.getvalue().splitlines()[-1]])
print(json.dumps({"statuses": statuses, "modules": sorted(sys.modules)}))
"""


def test_inspect_and_verify_of_a_model_import_neither_onnx_nor_numpy(tmp_path: Path) -> None:
    """``inspect`` and ``verify`` read metadata through the protobuf classes alone (``io/_read/proto.py``): the onnx
    package imports numpy and ml_dtypes (0.7.0 alone took 0.67 s on a user's machine), which neither needs."""
    import json
    import subprocess
    import sys

    import numpy as np

    from tests.models import make_external_model

    tensors = {f"w{i}": np.full((64, 16), i, np.float32) for i in range(4)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    model = make_external_model(tmp_path / "a", tensors)
    copy = make_external_model(tmp_path / "b", tensors)
    from tests.delayed_reads import converted_delayed_model

    light = converted_delayed_model(tmp_path / "light")  # read by DelayedInitializer nodes
    runs = [
        ["inspect", str(model)],
        ["inspect", str(tmp_path / "a")],
        ["inspect", str(light)],
        ["verify", str(model), str(copy)],
    ]

    done = subprocess.run(
        [sys.executable, "-c", _READ_ONLY, json.dumps(runs)], capture_output=True, text=True, check=False, timeout=60
    )

    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert [status for status, _ in printed["statuses"]] == [0, 0, 0, 0], printed["statuses"]
    assert printed["statuses"][3][1].startswith("equal: ")
    # protobuf is needed (the model is parsed); onnx's package, numpy, ml_dtypes, tqdm (no terminal: no bar) are not.
    not_needed = ("onnx", "numpy", "ml_dtypes", "onnxruntime", "tqdm", "onnx_light_ref.ops", "onnx_light_ref.io._align")
    heavy = [name for name in printed["modules"] if any(name == m or name.startswith(f"{m}.") for m in not_needed)]
    assert heavy == []


def test_the_test_extra_holds_back_nothing_a_plain_install_gets() -> None:
    """The suite must run with the dependencies ``pip install .`` gives users: the test extra held ml_dtypes below
    0.7 for speed, so no test ever ran the release users got (issue 42). A floor is fine, a ceiling is not."""
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "pyproject.toml").read_text()
    extra = re.search(r"^test = \[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    assert extra is not None
    requirements = re.findall(r'^\s*"([^"]+)"', extra.group(1), re.MULTILINE)
    plain = {"onnx", "numpy", "tqdm", "ml_dtypes", "ml-dtypes", "protobuf"}  # what a plain install brings
    held = [r for r in requirements if re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] in plain and re.search(r"<|==|~=", r)]
    assert "ml_dtypes" in requirements and held == []


def test_the_lazy_packages_give_the_function_align_models_whatever_was_imported_first() -> None:
    """``onnx_light_ref.io`` imports its writers on first use (option parsing imports ``io._arguments``); importing
    the function's private module first (as the align-models command does) still gives the function."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import onnx_light_ref.io._arguments\n"
        "assert 'onnx' not in sys.modules and 'onnx_light_ref.io._align' not in sys.modules\n"
        "import onnx_light_ref.io._align_models\n"  # the submodule first, as the align-models command does
        "from onnx_light_ref.io import align_models\n"
        "import onnx_light_ref\n"
        "assert callable(align_models) and onnx_light_ref.align_models is align_models\n"
        "assert onnx_light_ref.io.align_models is align_models\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)

    assert done.returncode == 0, done.stderr
