"""Site columns recorded the way a writer records them: from a walk of the model they describe."""

from __future__ import annotations

import onnx

from onnx_light_ref.io._plan.sites import SiteColumns, iter_sites


def recorded(model: onnx.ModelProto, *kinds: int | tuple[int, str, int, int]) -> SiteColumns:
    """``model``'s first sites (in walk order) recorded with ``kinds``: a kind, or ``(kind, path, offset, length)``
    for a placed site."""
    columns = SiteColumns()
    for site, entry in zip(iter_sites(model), kinds, strict=False):
        if isinstance(entry, tuple):
            columns.add(site, *entry)
        else:
            columns.record(site, entry)
    return columns
