"""Rule 2 for a safetensors output: a checkpoint with holes is not a checkpoint.

With ``weights_format="safetensors"`` the weights file is meant to be loaded by ``safetensors`` and ``transformers``
too, and ``transformers`` loads a file that lacks a key after a warning only, initializing the tensor at random (the
Qwen2 export kept four 256-byte biases inline: its logits moved by 0.64). So :class:`CheckpointPolicy` externalizes
**every named initializer of the main graph** whatever ``size_threshold`` says (a non-empty one; the writer contract's
rule 2 still keeps shape tensors inline, and the writers list every tensor left in the ``.onnx`` by reason); other
tensors (subgraphs, node attributes) follow ``size_threshold`` as before. A tensor without a name has no key: it stays
in the ``.onnx`` (reason :data:`UNNAMED`) instead of refusing the run. Pure planning: never opens a file.
"""

from __future__ import annotations

import onnx

from onnx_light_ref.io._plan.sites import SiteDecision, SitePolicy
from onnx_light_ref.io._read.walker import TensorSite

UNNAMED = "no name (no safetensors key)"
"""The reason (a key of ``kept_inline_reasons``) for a tensor a safetensors output leaves inline for want of a key."""

_KEPT_UNNAMED = SiteDecision(False, UNNAMED)


class CheckpointPolicy(SitePolicy):
    """:class:`SitePolicy` with ``size_threshold`` 1 for named main-graph initializers and no key-less externals."""

    def __init__(self, model: onnx.ModelProto, size_threshold: int | None) -> None:
        super().__init__(model, size_threshold)
        self._initializers = SitePolicy(model, 1)

    def decide(self, site: TensorSite, nbytes: int | None) -> SiteDecision:
        main_initializer = site.kind == "initializer" and site.container is self.model.graph
        if main_initializer and site.tensor.name:
            return self._initializers.decide(site, nbytes)
        decision = super().decide(site, nbytes)
        if decision.external and not site.tensor.name:
            return _KEPT_UNNAMED
        return decision


def site_policy(model: onnx.ModelProto, size_threshold: int | None, *, safetensors: bool) -> SitePolicy | None:
    """The rule-2 policy of an aligner's walk: :class:`CheckpointPolicy` for a safetensors output, else a plain
    :class:`SitePolicy` when ``size_threshold`` is given (None: inline tensors stay inline)."""
    if safetensors:
        return CheckpointPolicy(model, size_threshold)
    return SitePolicy(model, size_threshold) if size_threshold is not None else None
