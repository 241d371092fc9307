"""What every ``--help`` ends with, and where it points for details: the parts of the help text commands share.

Each command's ``--help`` ends with the exit statuses *that command* returns (:func:`exit_statuses`): a reader of
``inspect --help`` is told what ``inspect``'s 1 means, not ``verify``'s. Links go to the pages the README links
(:func:`docs_url`): a wheel ships no ``docs/`` folder, so a bare ``docs/align.md`` would name a file the user does
not have.

This module only builds text; it imports nothing heavy (every command module imports it while the parser is built).
"""

from __future__ import annotations

REFUSED = "refused: one 'error: ...' line on stderr, nothing written"
"""What status 1 means for a command that writes."""

DOCS_URL = "https://github.com/onnx-light-ref/onnx-light-ref/blob/main/docs/"
"""Where the documentation pages are, as the README links them."""


def docs_url(page: str) -> str:
    """The address of a documentation page: ``docs_url("json.md")``.

    Args:
        page: the page's file name in ``docs/``.

    Returns:
        Its URL.

    Example:
        >>> docs_url("align.md")
        'https://github.com/onnx-light-ref/onnx-light-ref/blob/main/docs/align.md'
    """
    return DOCS_URL + page


def exit_statuses(success: str, failure: str, *, writes: bool, publishes: bool | None = None) -> str:
    """The exit-status paragraph that ends a command's ``--help``.

    Args:
        success: what status 0 means for the command.
        failure: what status 1 means for it.
        writes: the command writes files: an interrupt removes what it created.
        publishes: the command publishes a model as one transaction, so status 3 exists (default: ``writes``).

    Returns:
        The paragraph, one sentence.

    Example:
        >>> exit_statuses("equal", "a difference", writes=False)[:36]
        'exit status: 0 equal; 1 a difference'
    """
    statuses = [f"0 {success}", f"1 {failure}", "2 bad arguments (the usage is printed)"]
    if writes if publishes is None else publishes:
        statuses.append(
            "3 written, but a step after the commit failed (one 'error: DST is published ..., but ...' line: the fsync "
            "that makes it durable, or removing the previous versions)"
        )
    cleanup = " (temp files and folders the command created are removed)" if writes else ""
    statuses.append(
        "70 a bug in onnx-light-ref (one 'error: ...' line asking to report it; --debug prints the traceback)"
    )
    statuses.append(f"130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM{cleanup}")
    return "exit status: " + "; ".join(statuses) + "."
