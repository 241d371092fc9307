"""Tests of fs."""
