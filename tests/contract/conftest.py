"""Fixtures of the writer-contract tests."""

from __future__ import annotations

import pytest

from onnx_light_ref.io._read import reference_scan
from tests.contract.sharers import TEST_FIELD_BUDGET


@pytest.fixture(autouse=True)
def _small_field_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of :func:`~tests.contract.sharers.too_large` is too large for the reference scan here, as a model of
    millions of nodes is for the real budget (which takes about a second to reach)."""
    monkeypatch.setattr(reference_scan, "MAX_FIELDS", TEST_FIELD_BUDGET)
