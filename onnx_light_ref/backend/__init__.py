"""Conformance cases for ``ai.rt::DelayedInitializer`` in onnx's backend-test layout, and a Backend to run them.

``generate(output_dir)`` writes ``node/<case>/model.onnx`` + ``test_data_set_0/*.pb`` + weights files;
``DelayedInitializerBackend`` runs such models with onnx's ReferenceEvaluator; ``make_runner(output_dir)`` loads the
folder into onnx's own backend-test ``Runner`` (see ``onnx_light_ref.backend._runner`` for why onnx's loader cannot).
Nothing here touches onnx's global backend test registry.
"""

from __future__ import annotations

from onnx_light_ref.backend._backend import DelayedInitializerBackend, DelayedInitializerBackendRep
from onnx_light_ref.backend._cases import seed_weights_paths
from onnx_light_ref.backend._generate import generate
from onnx_light_ref.backend._runner import bound_test_kwargs, load_cases, make_runner

__all__ = [
    "DelayedInitializerBackend",
    "DelayedInitializerBackendRep",
    "bound_test_kwargs",
    "generate",
    "load_cases",
    "make_runner",
    "seed_weights_paths",
]
