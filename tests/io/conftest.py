"""Fixtures over the model zoo of :mod:`tests.zoo` (the builders live there; import them directly in new tests).

``zoo_model`` is parametrized over the whole zoo: a test that takes it runs once per model, built in
``tmp_path/src``. The other fixtures only return the function of the same name, for the tests that still receive it
as a fixture argument.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.zoo import ZOO, ZooModel, build_zoo_model, reference_tensors


@pytest.fixture(params=sorted(ZOO))
def zoo_model(request: pytest.FixtureRequest, tmp_path: Path) -> ZooModel:
    """Each zoo model in turn, built in ``tmp_path/src``."""
    folder = tmp_path / "src"
    folder.mkdir()
    return build_zoo_model(request.param, folder)


@pytest.fixture(name="build_zoo_model")
def _build_zoo_model_fixture() -> Callable[[str, Path], ZooModel]:
    """``build_zoo_model(name, folder)``: one zoo model by name."""
    return build_zoo_model


@pytest.fixture(name="reference_tensors")
def _reference_tensors_fixture() -> Callable[[], dict[str, np.ndarray]]:
    return reference_tensors
