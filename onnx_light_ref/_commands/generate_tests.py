"""``onnx-light-ref generate-tests OUTPUT_DIR [--relocatable]``: write the DelayedInitializer conformance cases.

Thin wrapper over ``onnx_light_ref.backend.generate``; it must never hold logic the library does not expose. An
ordinary mistake (OUTPUT_DIR is a file, a folder that cannot be written) is one ``error:`` line and exit status 1,
with nothing written: the library checks the destination before writing.

Interrupted (SIGINT/SIGTERM, raised by the CLI as a ``KeyboardInterrupt``), the command removes what this run
added before the CLI reports it: the case folders that did not exist before the run, ``OUTPUT_DIR/node`` and
``OUTPUT_DIR`` (with the parents it created) when this run created them, and the seed weights files in the system
temp folder when they did not exist before. A case folder that existed before is never removed (it may have been
replaced, or be half replaced if it was the one being written when the signal came).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
from typing import Any

from onnx_light_ref._commands.errors import error_exit
from onnx_light_ref._commands.folders import remove_created_folders
from onnx_light_ref._commands.help_text import REFUSED, exit_statuses
from onnx_light_ref._commands.paths import shown_path

logger = logging.getLogger(__name__)


def generate_tests_command(args: argparse.Namespace) -> int:
    from onnx_light_ref.backend._cases import seed_weights_paths
    from onnx_light_ref.backend._generate import generate

    before = _Snapshot(args.output_dir, seed_weights_paths())
    try:
        case_dirs = generate(args.output_dir, relocatable=args.relocatable)
    except OSError as exc:
        return error_exit(exc.strerror or exc)
    except BaseException:  # interrupted, or a bug (exit status 70): what the run added goes
        before.remove_added()
        raise
    for case_dir in case_dirs:
        logger.info("wrote %s", case_dir)
    node_dir = case_dirs[0].parent if case_dirs else args.output_dir
    seeds = ", ".join(shown_path(path) for path in seed_weights_paths())
    # The seed cases' weights are not under OUTPUT_DIR: the spec names them absolutely in the system temp folder.
    print(f"wrote {len(case_dirs)} cases under {shown_path(node_dir)}, and the two seed cases' weights in the system "
          f"temp folder, where the spec's absolute names put them: {seeds}")  # fmt: skip
    return 0


class _Snapshot:
    """What existed before the run: enough to remove, on an interrupt, exactly what the run added."""

    def __init__(self, output_dir: str, seed_files: list[str]) -> None:
        self.output_dir = os.path.abspath(output_dir)
        self.node_dir = os.path.join(self.output_dir, "node")
        missing = []
        folder = self.output_dir
        while not os.path.lexists(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        self.missing_folders = [*missing]  # deepest first, as remove_created_folders wants them
        self.cases = set(os.listdir(self.node_dir)) if os.path.isdir(self.node_dir) else set()
        self.node_existed = os.path.lexists(self.node_dir)
        self.seed_files = [path for path in seed_files if not os.path.lexists(path)]

    def remove_added(self) -> None:
        if os.path.isdir(self.node_dir) and not os.path.islink(self.node_dir):
            for name in os.listdir(self.node_dir):
                if name not in self.cases:
                    shutil.rmtree(os.path.join(self.node_dir, name), ignore_errors=True)
            if not self.node_existed:
                with contextlib.suppress(OSError):
                    os.rmdir(self.node_dir)
        for path in self.seed_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        remove_created_folders(self.missing_folders)


def register(subparsers: Any) -> None:
    """Add the ``generate-tests`` sub-command to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "generate-tests",
        epilog=exit_statuses("the cases are written", REFUSED, writes=True, publishes=False),
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
