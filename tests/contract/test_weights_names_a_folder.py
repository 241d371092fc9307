"""``--weights`` (``dst_weights_path``, ``weights_name``) naming a folder: a trailing ``/`` used to be dropped and a
file named after the folder written, exit 0. Every writer now refuses it before writing anything: a usage error on
the command line (exit 2, argparse's form), a ``ValueError`` in Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks import sha256_of_tree
from tests.cli_runner import run_cli
from tests.contract.writers import WRITERS, Writer, make_scene

ROWS = [writer for writer in WRITERS if writer.argv is not None and writer.writes_files and writer.name != "run"]


@pytest.mark.parametrize("weights", ["sub/", "sub/.", "sub"], ids=["trailing-slash", "slash-dot", "existing-folder"])
@pytest.mark.parametrize("writer", ROWS, ids=[writer.name for writer in ROWS])
def test_a_weights_name_that_is_a_folder_is_a_usage_error(tmp_path: Path, writer: Writer, weights: str) -> None:
    scene = make_scene(tmp_path / "scene", writer, weights)
    (scene.out / "sub").mkdir()
    before = sha256_of_tree(tmp_path, every_entry=True)
    assert writer.argv is not None
    done = run_cli(*writer.argv(scene))
    assert done.returncode == 2, done
    err = done.stderr.strip().splitlines()[-1]
    assert f"--weights {weights!r} names a folder" in err or f"'{weights}' names a folder, not a file" in err, err
    assert sha256_of_tree(tmp_path, every_entry=True) == before


@pytest.mark.parametrize("weights", ["sub/", "sub"], ids=["trailing-slash", "existing-folder"])
@pytest.mark.parametrize("writer", ROWS, ids=[writer.name for writer in ROWS])
def test_the_python_api_refuses_it_with_a_value_error(tmp_path: Path, writer: Writer, weights: str) -> None:
    scene = make_scene(tmp_path / "scene", writer, weights)
    (scene.out / "sub").mkdir()
    before = sha256_of_tree(tmp_path, every_entry=True)
    with pytest.raises(ValueError, match=r"names a folder, not a file: give the weights file's name"):
        writer.call(scene)
    assert sha256_of_tree(tmp_path, every_entry=True) == before
