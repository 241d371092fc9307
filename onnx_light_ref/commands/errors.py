"""How a command reports a failure the user can cause: one ``error: ...`` line on stderr and exit status 1.

Every handler catches the library's documented errors around its call and returns :func:`error_exit`'s status, so
the wording, the escaping of model-controlled text and the stream are the same for every command. This module never
catches anything itself, and never prints a traceback: an error it is not handed is a bug, and the CLI lets it
surface.
"""

from __future__ import annotations

import sys

from onnx_light_ref.commands.text import printable

__all__ = ["error_exit"]


def error_exit(message: object) -> int:
    """Print ``error: <message>`` on stderr and return the exit status of a failed command.

    Args:
        message: what went wrong, usually the caught exception. Its ``str`` is printed through
            :func:`~onnx_light_ref.commands.text.printable`: messages quote model-controlled names (op types, domains,
            tensor names), and an ESC, OSC 52 or bidi character in them must reach the terminal escaped.

    Returns:
        1, the status every command exits with on an ordinary mistake.
    """
    print(f"error: {printable(str(message))}", file=sys.stderr)
    return 1
