"""The test suite, a package: helpers are imported as ``tests.models``, ``tests.checks``, ``tests.wire_writer``."""
