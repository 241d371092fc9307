"""Fixtures over the shared test helpers, for the test modules that take them as arguments.

The helpers themselves live in :mod:`tests.models` (model builders) and :mod:`tests.checks` (what a run left behind);
new tests import them directly (``from tests.models import make_external_model``). Each fixture here only returns the
function of the same name, for the tests that still receive it as a fixture argument.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from tests.checks import assert_no_temp_files, sha256_of_tree
from tests.models import externalize, identity_model, make_external_model


@pytest.fixture(name="make_external_model")
def _make_external_model_fixture() -> Callable[..., Path]:
    return make_external_model


@pytest.fixture(name="build_identity_model")
def _build_identity_model_fixture() -> Callable[..., onnx.ModelProto]:
    return identity_model


@pytest.fixture(name="externalize")
def _externalize_fixture() -> Callable[..., None]:
    return externalize


@pytest.fixture(name="sha256_of_tree")
def _sha256_of_tree_fixture() -> Callable[..., dict[str, str]]:
    return sha256_of_tree


@pytest.fixture(name="assert_no_temp_files")
def _assert_no_temp_files_fixture() -> Callable[..., None]:
    return assert_no_temp_files
