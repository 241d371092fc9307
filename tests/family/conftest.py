"""Fixtures of the family tests: the fast destination filesystem of the publication hardening tests."""

from __future__ import annotations

from tests.hardening.conftest import work

__all__ = ["work"]
