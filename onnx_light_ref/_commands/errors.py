"""How a command reports a failure: one ``error: ...`` line on stderr, and an exit status that says whose it is.

Every handler catches the library's documented errors around its call (its typed errors, all ``ValueError`` s or
``OSError`` s, and ``OSError``) and returns :func:`error_exit`'s status 1, so the wording, the escaping of
model-controlled text and the stream are the same for every command. Anything else reaching the command line is a
bug: :func:`bug_exit` says so in one line and returns :data:`INTERNAL_ERROR` (70), the traceback behind ``--debug``.
This module never catches anything itself.
"""

from __future__ import annotations

import os
import re
import sys
import traceback

from onnx_light_ref._commands.text import printable
from onnx_light_ref.errors import PublishedWithErrorsError


class UsageError(ValueError):
    """A command line argument that is wrong in a way argparse cannot see alone (``--weights`` naming an existing
    folder): the command line reports it as argparse does (usage error, exit status 2)."""


PUBLISHED_WITH_ERRORS = 3
"""Exit status of a command whose model is published but a step after the commit failed (not 1: 1 says nothing
was written, and a script that retries or restores on 1 must not undo a published model)."""


INTERNAL_ERROR = 70
"""Exit status of a bug in onnx-light-ref (``EX_SOFTWARE`` of BSD's ``sysexits.h``): an exception no command
expects (``KeyError``, ``AssertionError``...), never a refusal (1), so a script can tell "my input" from "report it"."""

ISSUES_URL = "https://github.com/onnx-light-ref/onnx-light-ref/issues"
"""Where a bug is reported."""


def describe_error(error: object) -> str:
    """The words of an error for a person: an ``OSError`` without Python's ``[Errno N]`` prefix.

    ``str(OSError)`` is ``[Errno 20] Not a directory: 'out/m.onnx'``: the errno number means nothing to a user, and
    when the message already names the file (the library's do) the file would be repeated. This keeps the message
    (``strerror``) and adds each file name it does not already contain.

    Args:
        error: an exception (or any object: its ``str``).

    Returns:
        One line of text.
    """
    if not isinstance(error, OSError) or not error.strerror:
        return str(error)
    text = str(error.strerror)
    for name in (error.filename, error.filename2):
        if name is not None and os.fsdecode(name) not in text:
            text += f": {os.fsdecode(name)!r}"
    return text


def error_exit(message: object) -> int:
    """Print ``error: <message>`` on stderr and return the exit status of a failed command.

    Args:
        message: what went wrong, usually the caught exception. Its ``str`` is printed through
            :func:`~onnx_light_ref._commands.text.printable`: messages quote model-controlled names (op types, domains,
            tensor names), and an ESC, OSC 52 or bidi character in them must reach the terminal escaped. An
            ``OSError`` is described by :func:`describe_error` (no raw ``[Errno 20]``).

    Returns:
        1, the status every command exits with on an ordinary mistake.
    """
    print(f"error: {printable(cli_spelling(describe_error(message)))}", file=sys.stderr)
    return 1


_PYTHON_OPT_IN = re.compile(r"\b([a-z_]+)=True \((--[a-z-]+)\)")


def cli_spelling(text: str) -> str:
    """The library's "pass overwrite=True (--overwrite)" as a command line user types it: "pass --overwrite"."""
    return _PYTHON_OPT_IN.sub(r"\2", text)


def published_exit(exc: PublishedWithErrorsError) -> int:
    """Print the ``error: '<DST>' is published ..., but ...`` line on stderr; return :data:`PUBLISHED_WITH_ERRORS`.

    Args:
        exc: the writer's error; its message starts with the published model and says what failed after the commit.

    Returns:
        3.
    """
    print(f"error: {printable(str(exc))}", file=sys.stderr)
    return PUBLISHED_WITH_ERRORS


def bug_exit(exc: BaseException, *, debug: bool) -> int:
    """Report an exception no command expects: a bug of the package, not the user's input.

    Args:
        exc: the exception.
        debug: the global ``--debug`` was given: print the traceback first.

    Returns:
        :data:`INTERNAL_ERROR`, after one ``error: <type>: <message> (this is a bug ...)`` line on stderr.
    """
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    hint = "" if debug else "; run it again with --debug (onnx-light-ref --debug COMMAND ...) for the traceback"
    print(
        f"error: {type(exc).__name__}: {printable(describe_error(exc))} (this is a bug in onnx-light-ref, please "
        f"report it at {ISSUES_URL}{hint})",
        file=sys.stderr,
    )
    return INTERNAL_ERROR
