"""``onnx-light-ref generate-tests OUTPUT_DIR [--relocatable]``: write the DelayedInitializer conformance cases.

Thin wrapper over ``onnx_light_ref.backend.generate``; it must never hold logic the library does not expose. An
ordinary mistake (OUTPUT_DIR is a file, a folder that cannot be written) is one ``error:`` line and exit status 1,
with nothing written: the library checks the destination before writing.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from onnx_light_ref.commands.errors import error_exit

__all__ = ["generate_tests_command", "register"]

logger = logging.getLogger(__name__)


def generate_tests_command(args: argparse.Namespace) -> int:
    from onnx_light_ref.backend.generate import generate

    try:
        case_dirs = generate(args.output_dir, relocatable=args.relocatable)
    except OSError as exc:
        return error_exit(exc.strerror or exc)
    for case_dir in case_dirs:
        logger.info("wrote %s", case_dir)
    node_dir = case_dirs[0].parent if case_dirs else args.output_dir
    print(f"wrote {len(case_dirs)} cases under {node_dir}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``generate-tests`` sub-command to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "generate-tests",
        help="write ai.rt::DelayedInitializer node conformance cases (onnx backend-test layout)",
        description="Write node/<case>/model.onnx, node/<case>/test_data_set_0/output_0.pb and each case's weights "
        "file under OUTPUT_DIR. The two seed cases (test_cc_delayedinitializer_cpu/_file) write their weights to "
        "the system temp directory with an absolute filename, as onnx-light does. Every other case keeps its "
        "weights next to its model and names them by absolute path, so onnx's backend-test Runner runs the folder "
        "unchanged from any directory (onnx_light_ref.backend.make_runner(OUTPUT_DIR) loads it).",
    )
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="folder to write the cases into (created)")
    parser.add_argument(
        "--relocatable",
        action="store_true",
        help="name each case's weights relatively (weights.bin) so a case folder can be moved; such cases need "
        "the op bound to their folder (backend base_dir, see onnx_light_ref.backend.bound_test_kwargs)",
    )
    parser.set_defaults(func=generate_tests_command)
