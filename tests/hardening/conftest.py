"""Fixtures of the publication hardening tests: the two source folders and a fast destination filesystem."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hardening.publication_scenarios import values, write_source
from tests.memory_folder import in_memory_folder


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kill_sources")
    write_source(root / "old", values(1))
    write_source(root / "new", values(2))
    return root / "old", root / "new"


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs under ``tmp_path`` (unmounted at the end, whatever happens), else ``tmp_path`` itself."""
    with in_memory_folder(tmp_path / "tmpfs", "64m") as folder:
        yield folder
