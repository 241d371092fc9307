"""``python -m onnx_light_ref``: same as the ``onnx-light-ref`` console script."""

from onnx_light_ref.cli import main

raise SystemExit(main())
