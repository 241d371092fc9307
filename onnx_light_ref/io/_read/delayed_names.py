"""How an ``ai.rt::DelayedInitializer`` node is spelled, and how it names its file: the one place of these names.

``io`` reads models that hold such nodes (the sharing scan follows their ``filename`` attributes) but never imports
``ops``; ``ops._schema`` takes its ``DOMAIN`` and ``OP_TYPE`` from here, so the package spells them once.
"""

from __future__ import annotations

DELAYED_DOMAIN = "ai.rt"
DELAYED_OP_TYPE = "DelayedInitializer"
DELAYED_FILENAME = "filename"  # the STRING attribute naming the file the node reads
LOAD_DEVICES = ("cpu", "file")  # its load_device values (the command line's --load-device choices)
