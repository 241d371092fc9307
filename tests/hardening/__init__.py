"""Tests of hardening."""
