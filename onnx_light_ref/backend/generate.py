"""Write conformance cases to disk in onnx's backend-test layout.

For each case: ``<output_dir>/node/<name>/model.onnx`` and ``<output_dir>/node/<name>/test_data_set_0/`` with
``input_<j>.pb`` / ``output_<j>.pb`` (``TensorProto`` named after the graph's inputs/outputs, as onnx's
``generate-data`` writes them), plus the case's weights files: relative ones inside the case directory, absolute
ones (the two seed cases) where they are named, an old file being removed first.

Every model is checked with ``check_model(..., check_custom_domain=True)`` and strict shape inference before it is
written. This module must never write outside ``output_dir`` except the absolute side files a case declares, and
never delete anything but a case directory it is about to rewrite and the absolute side files it rewrites.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import onnx
from onnx import numpy_helper

from onnx_light_ref.backend.cases import build_cases
from onnx_light_ref.backend.expect import CaseRegistry, NodeCase, SideFile
from onnx_light_ref.io.locations import check_location_syntax
from onnx_light_ref.ops.schema import register_schemas

__all__ = ["DATA_SET_DIRNAME", "MODEL_FILENAME", "generate", "write_case"]

logger = logging.getLogger(__name__)

MODEL_FILENAME = "model.onnx"
DATA_SET_DIRNAME = "test_data_set_0"


def _write_side_file(case: NodeCase, case_dir: Path, side: SideFile) -> Path:
    if os.path.isabs(side.path):
        target = Path(side.path)
        # Remove first: a stale file (or a link someone put there) is replaced, never written through.
        if target.is_symlink() or target.exists():
            target.unlink()
    else:
        check_location_syntax(side.path, tensor_name=case.name)
        target = case_dir / side.path
        target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "xb") as f:
        f.write(side.data)
    return target


def _check_model(case: NodeCase) -> None:
    register_schemas()
    onnx.checker.check_model(case.model, check_custom_domain=True)
    onnx.shape_inference.infer_shapes(case.model, check_type=True, strict_mode=True)


def write_case(case: NodeCase, node_dir: str | os.PathLike[str]) -> Path:
    """Write one case under ``node_dir`` (replacing an older copy of that case) and return its directory."""
    _check_model(case)
    case_dir = Path(node_dir) / case.name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    data_dir = case_dir / DATA_SET_DIRNAME
    data_dir.mkdir(parents=True)
    onnx.save_model(case.model, str(case_dir / MODEL_FILENAME))
    graph = case.model.graph
    for prefix, values, infos in (("input", case.inputs, graph.input), ("output", case.outputs, graph.output)):
        for j, (array, info) in enumerate(zip(values, infos, strict=True)):
            tensor = numpy_helper.from_array(array, info.name)
            (data_dir / f"{prefix}_{j}.pb").write_bytes(tensor.SerializeToString())
    for side in case.side_files:
        target = _write_side_file(case, case_dir, side)
        logger.debug("case %s: wrote %d bytes to %s", case.name, len(side.data), target)
    return case_dir


def generate(output_dir: str | os.PathLike[str], *, registry: CaseRegistry | None = None) -> list[Path]:
    """Write every case of ``registry`` (default: :func:`build_cases`) under ``output_dir/node``.

    Returns the case directories in registration order. The seed cases' weights go to the system temp dir (see
    ``onnx_light_ref.backend.cases``); the caller removes them when done (``cases.seed_weights_paths()``).
    """
    cases = registry if registry is not None else build_cases()
    node_dir = Path(os.fspath(output_dir)) / "node"
    node_dir.mkdir(parents=True, exist_ok=True)
    written = [write_case(case, node_dir) for case in cases]
    logger.info("wrote %d conformance cases to %s", len(written), node_dir)
    return written
