"""``onnx-light-ref verify A.onnx B.onnx``: prove that two models hold the same tensors, whatever their layout.

A thin front end of :func:`onnx_light_ref.io._verify.verify_models`: the byte progress bar shared by the commands
(:func:`onnx_light_ref._commands.progress.byte_progress`, shown on a terminal only), then the verdict on stdout. Exit
status 0 when every tensor is equal (``equal: N tensors, M bytes compared``); 1 with ``different: <the differing
tensor and what differs>`` otherwise (one line per difference: the first, or up to ``--max-differences``); 1 with a
single ``error: ...`` line on stderr, and no traceback, when
a model cannot be read or a reference is unsafe, malformed or out of bounds (or, with ``--by-name``, a model has
two tensors of one name in one graph). With ``--check-checksums``, ``checksum`` entries that match neither their
tensor's bytes nor their file are listed and also give status 1. ``--json`` prints one JSON document instead
(:mod:`~onnx_light_ref._commands.verify_json`, ``docs/json.md``), same statuses. Never writes a file.
"""

from __future__ import annotations

import argparse

from onnx_light_ref._commands.errors import error_exit
from onnx_light_ref._commands.help_text import exit_statuses
from onnx_light_ref._commands.options import add_option, add_options
from onnx_light_ref._commands.progress import byte_progress
from onnx_light_ref._commands.sizes import bounded_size
from onnx_light_ref._commands.text import printable

# verify_models' words when the tensors paired by position have different names: after a tool reordered them
# (undelay: the DelayedInitializer nodes' outputs become initializers in another order), --by-name is the fix.
_BY_POSITION_NAME_MISMATCH = "name differs (A: "
_BY_NAME_HINT = (
    "note: tensors are paired by position; if a tool reordered them (undelay does), pair them by graph and name "
    "with --by-name"
)

MAX_CHUNK_SIZE = 1024 * 1024 * 1024
"""``verify_models``' own cap (``onnx_light_ref.io._verify.MAX_CHUNK_SIZE``, not imported at start-up; a test
checks)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``verify`` sub-command."""
    parser = subparsers.add_parser(
        "verify",
        epilog=exit_statuses(
            "the models hold the same tensors (with --check-checksums: and every checksum is right)",
            "a difference or a wrong checksum (on stdout), or the models cannot be compared (one 'error: ...' line)",
            writes=False,
        ),
        help="check that two models hold the same tensors (names, dtypes, dims, bytes), inline or external",
        description="Compare every tensor of A.onnx and B.onnx (initializers, subgraphs, attribute and sparse "
        "tensors, functions) in model order (with --by-name: by graph and name): names, data types, dims and bytes "
        "must be equal, however each side stores them (inline, external, one file or many). External bytes, and "
        "the inline weights of a .onnx over 16 MiB, are streamed in chunks, never loaded whole. Exit status 0 when "
        "equal, 1 on a difference or an unreadable model.",
    )
    parser.add_argument("a", metavar="A.onnx", help="first model")
    parser.add_argument(
        "b",
        metavar="B.onnx",
        help="second model; or a checkpoint (a .safetensors file, a .safetensors.index.json or a folder): then prove "
        "that A.onnx holds every checkpoint tensor (by name, --map, content or transpose) and list what it lacks",
    )
    add_option(parser, "--map", when=" (with a checkpoint as B.onnx)")
    add_option(
        parser,
        "--chunk-size",
        {"type": bounded_size("chunk_size", minimum=1, maximum=MAX_CHUNK_SIZE)},
        moved="read from each model",
        buffers="the two read buffers grow up to this size, at most 1G",
    )
    parser.add_argument(
        "--check-checksums",
        action="store_true",
        help="also check 'checksum' entries (SHA1 of the tensor's bytes or of its whole file); a mismatch exits 1",
    )
    parser.add_argument(
        "--allow-hard-links",
        action="store_true",
        help="read data files that have several hard links (refused by default, as onnx does)",
    )
    parser.add_argument(
        "--by-name",
        action="store_true",
        help="pair tensors by graph, kind and name instead of by position, for models a tool reordered "
        "(e.g. undelay); a name on one side only is a difference",
    )
    add_option(parser, "--allow-outside-folder", subject="A.onnx and B.onnx")
    parser.add_argument(
        "--max-differences",
        metavar="N",
        type=_count,
        default=1,
        help="go on after the first difference and report up to N of them, one 'different:' line each "
        "(0: every difference; default: 1, stop at the first)",
    )
    add_option(parser, "--json", command="verify")
    add_options(parser, "--no-progress")
    parser.set_defaults(func=verify_command)


def _count(text: str) -> int:
    """``--max-differences``: a whole number, 0 or more (else a usage error, exit 2)."""
    digits = text.strip()
    value = int(digits) if digits.isascii() and digits.isdigit() else -1  # int() also reads Arabic-Indic digits
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number (0 for every difference), got {text!r}")
    return value


def verify_command(args: argparse.Namespace) -> int:
    """Run the command; return the exit status.

    Text: one ``checksum mismatch:`` line per wrong checksum entry, one ``different:`` line per difference found,
    or the ``equal:`` line. With ``--json``: one JSON document on stdout instead (``docs/json.md``); an error is then
    both a JSON document with an ``error`` member on stdout and the usual ``error:`` line on stderr.
    """
    from onnx_light_ref._commands.verify_checkpoint import is_checkpoint, verify_checkpoint_command
    from onnx_light_ref.io._verify import verify_models

    if is_checkpoint(args.b):
        return verify_checkpoint_command(args)
    as_json = getattr(args, "json", False)
    max_differences = getattr(args, "max_differences", 1)
    try:
        with byte_progress("verify", hidden=args.no_progress) as progress:
            result = verify_models(
                args.a,
                args.b,
                chunk_size=args.chunk_size,
                check_checksums=args.check_checksums,
                allow_hard_links=args.allow_hard_links,
                by_name=args.by_name,
                progress=progress,
                allow_outside_folder=args.allow_outside_folder,
                max_differences=max_differences,
            )
    except (ValueError, OSError) as exc:  # ExternalDataError/InvalidModelError are ValueErrors
        if as_json:
            from onnx_light_ref._commands.json_output import error_document, write_document

            write_document(error_document("verify", exc))
        return error_exit(exc)
    status = 1 if not result.equal or result.checksum_mismatches else 0
    if as_json:
        from onnx_light_ref._commands.json_output import write_document
        from onnx_light_ref._commands.verify_json import verify_document

        write_document(
            verify_document(
                result,
                args.a,
                args.b,
                max_differences=max_differences,
                check_checksums=args.check_checksums,
                chunk_size=args.chunk_size,
            )
        )
        return status
    # Messages quote names with repr, but a place also shows op types and function domains as they are: escaped here.
    for mismatch in result.checksum_mismatches:
        print(f"checksum mismatch: {printable(mismatch)}")
    if not result.equal:
        for difference in result.differences:
            print(f"different: {printable(difference.message)}")
        if not args.by_name and _BY_POSITION_NAME_MISMATCH in (result.first_difference or ""):
            print(_BY_NAME_HINT)
        return status
    print(f"equal: {result.tensors} tensors, {result.bytes_compared} bytes compared")
    return status
