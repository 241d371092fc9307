"""``onnx-light-ref generate-tests OUTPUT_DIR``: write the DelayedInitializer conformance cases.

Thin wrapper over ``onnx_light_ref.backend.generate``; it must never hold logic the library does not expose.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

__all__ = ["register"]

logger = logging.getLogger(__name__)


def _run(args: argparse.Namespace) -> int:
    from onnx_light_ref.backend.generate import generate

    case_dirs = generate(args.output_dir)
    for case_dir in case_dirs:
        logger.info("wrote %s", case_dir)
    print(f"wrote {len(case_dirs)} cases under {args.output_dir}/node")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``generate-tests`` sub-command to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "generate-tests",
        help="write ai.rt::DelayedInitializer node conformance cases (onnx backend-test layout)",
        description="Write node/<case>/model.onnx, node/<case>/test_data_set_0/output_0.pb and each case's weights "
        "file under OUTPUT_DIR. The two seed cases (test_cc_delayedinitializer_cpu/_file) write their weights to "
        "the system temp directory with an absolute filename, as onnx-light does; every other case stores a "
        "relative filename next to its model.",
    )
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="folder to write the cases into (created)")
    parser.set_defaults(func=_run)
