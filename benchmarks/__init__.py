"""Benchmarks of onnx_light_ref: time and peak memory against peers and against the disk's copy limit.

See ``benchmarks/README.md``. Tests run at tiny size in the normal test command; ``python -m benchmarks.report``
runs a real size and writes ``benchmarks/results/``.
"""
