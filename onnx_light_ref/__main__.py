"""``python -m onnx_light_ref``: same as the ``onnx-light-ref`` console script."""

from onnx_light_ref._cli import console_main

raise SystemExit(console_main())
