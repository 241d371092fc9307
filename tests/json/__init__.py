"""Tests of ``inspect --json`` and ``verify --json``: every document parsed against the shipped schema."""
