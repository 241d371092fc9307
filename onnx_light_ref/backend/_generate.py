"""Write conformance cases to disk in onnx's backend-test layout.

For each case: ``<output_dir>/node/<name>/model.onnx`` and ``<output_dir>/node/<name>/test_data_set_0/`` with
``input_<j>.pb`` / ``output_<j>.pb`` (``TensorProto`` named after the graph's inputs/outputs, as onnx's
``generate-data`` writes them), ``<output_dir>/node/<name>/data.json`` with the case's ``rtol``/``atol`` (read by
onnx's loader for on-disk cases and by ``load_cases``: 0 and 0 for every DelayedInitializer case), plus the
case's weights files: relative ones inside the case directory, absolute ones (the two seed cases) where they are
named. Each case is one plan of the writer contract, executed as every writer's
(:func:`onnx_light_ref.io._write.execute.execute`): every file written under a temp name in its own folder,
fsynced, then renamed over the destination, the ``model.onnx`` last. A rename replaces the name, never writes
through it: a symbolic link planted at the seed path (a shared ``/tmp``) is replaced, its target untouched, and a
reader of the previous file sees the previous bytes or the new ones, never a truncated file.

By default the extra cases name their weights with the absolute path of their case directory (the resolved
output folder), so onnx's own ``Runner``, which loads ``model.onnx`` and calls ``backend.prepare(model, device)``
without any path, runs them from any working directory; ``relocatable=True`` writes relative names instead (see
``onnx_light_ref.backend._cases``). How to load the folder into onnx's Runner: ``onnx_light_ref.backend._runner``.

Every model is checked with ``check_model(..., check_custom_domain=True)`` and strict shape inference, and the
destination is checked (a folder, or creatable as one), before anything is written, so a refused run writes
nothing. This module must never write outside ``output_dir`` except the absolute side files a case declares, and
never delete anything but a case directory it is about to rewrite and the absolute side files it rewrites.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

import onnx

from onnx_light_ref.backend._cases import build_cases
from onnx_light_ref.backend._expect import CaseRegistry, NodeCase, SideFile
from onnx_light_ref.io._arguments import check_bool
from onnx_light_ref.io._plan.sites import SITE_INLINE, SITE_KEPT, SiteColumns, iter_sites
from onnx_light_ref.io._read.entries import is_external
from onnx_light_ref.io._read.locations import check_location_syntax
from onnx_light_ref.io._read.onnx_compat import HAS_PYTHON_SHAPE_INFERENCE, readable_tensor_from_array
from onnx_light_ref.io._read.walker import TensorSite
from onnx_light_ref.io._write.contract import PlannedFile, PlannedModel, WriteOptions, WritePlan
from onnx_light_ref.io._write.execute import execute
from onnx_light_ref.ops._schema import DOMAIN, OP_TYPE, check_delayed_initializer_node, register_schemas

logger = logging.getLogger(__name__)

MODEL_FILENAME = "model.onnx"
DATA_SET_DIRNAME = "test_data_set_0"
DATA_JSON_FILENAME = "data.json"


def _side_path(case: NodeCase, case_dir: Path, side: SideFile) -> Path:
    if os.path.isabs(side.path):
        return Path(side.path)
    check_location_syntax(side.path, tensor_name=case.name)
    target = case_dir / side.path
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _check_model(case: NodeCase) -> None:
    register_schemas()
    onnx.checker.check_model(case.model, check_custom_domain=True)
    if not HAS_PYTHON_SHAPE_INFERENCE:
        # onnx < 1.19 cannot run the op's inference: apply its checks here, and infer the rest of the graph
        # non-strictly (the DelayedInitializer outputs stay untyped for onnx there).
        for node in case.model.graph.node:
            if (node.domain, node.op_type) == (DOMAIN, OP_TYPE):
                check_delayed_initializer_node(node)
        onnx.shape_inference.infer_shapes(case.model, check_type=True)
        return
    onnx.shape_inference.infer_shapes(case.model, check_type=True, strict_mode=True)


def _write_checked_case(case: NodeCase, node_dir: Path) -> Path:
    case_dir = node_dir / case.name
    if case_dir.is_symlink() or case_dir.is_file():
        case_dir.unlink()
    elif case_dir.exists():
        shutil.rmtree(case_dir)
    data_dir = case_dir / DATA_SET_DIRNAME
    data_dir.mkdir(parents=True)
    files = []
    graph = case.model.graph
    for prefix, values, infos in (("input", case.inputs, graph.input), ("output", case.outputs, graph.output)):
        for j, (array, info) in enumerate(zip(values, infos, strict=True)):
            tensor = readable_tensor_from_array(array, info.name)  # from_array, read back exactly by this onnx
            files.append(_data_file(data_dir / f"{prefix}_{j}.pb", tensor.SerializeToString()))
    # The tolerances onnx's loader reads for an on-disk case (``data.json``; the Runner compares with them).
    tolerances = json.dumps({"rtol": case.rtol, "atol": case.atol}) + "\n"
    files.append(_data_file(case_dir / DATA_JSON_FILENAME, tolerances.encode("utf-8"), "json"))
    files += [_data_file(_side_path(case, case_dir, side), side.data) for side in case.side_files]
    model = PlannedModel(str(case_dir / MODEL_FILENAME), case.model, _case_sites(case.model))
    # The seed cases' side files are named by the spec (absolute, in the system temp folder): this writer owns them.
    plan = WritePlan("generate-tests", [model], files, WriteOptions(overwrite=True), rename_hint="another folder")
    execute(plan, lambda _stats: None)
    for side in files[-len(case.side_files) :] if case.side_files else []:
        logger.debug("case %s: wrote %d bytes to %s", case.name, side.size, side.path)
    return case_dir


def _data_file(path: Path, data: bytes, format: str = "raw") -> PlannedFile:
    return PlannedFile(str(path), "data", len(data), writes=[(0, data)], format=format)


def _case_sites(model: onnx.ModelProto) -> SiteColumns:
    """A case model's sites: its tensors are inline, its nodes read the case's side files (kept as written)."""
    sites = SiteColumns()
    for site in iter_sites(model):
        sites.record(site, SITE_INLINE if isinstance(site, TensorSite) and not is_external(site.tensor) else SITE_KEPT)
    return sites


def _check_destination(output_dir: Path) -> None:
    """Refuse, before writing, an output folder that is a file or lies under one, and a ``node`` folder that is a
    symbolic link: cases (and the old case folders they replace) must stay under ``output_dir``."""
    node = output_dir / "node"
    if node.is_symlink():
        raise NotADirectoryError(
            errno.ENOTDIR,
            f"cannot write the cases: {str(node)!r} is a symbolic link (to {os.readlink(node)!r}); cases are only "
            "written, and old case folders only replaced, inside the output folder",
            str(node),
        )
    for folder in (node, output_dir, *output_dir.parents):
        if folder.exists():
            if not folder.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, f"cannot write the cases: {str(folder)!r} exists and is not a folder", str(folder)
                )
            return


def generate(
    output_dir: str | os.PathLike[str], *, registry: CaseRegistry | None = None, relocatable: bool = False
) -> list[Path]:
    """Write every case of ``registry`` (default: :func:`build_cases`) under ``output_dir/node``.

    The layout is onnx's backend-test one (``node/<case>/model.onnx``, ``node/<case>/test_data_set_0/*.pb``), plus
    each case's weights file: onnx's ``Runner`` runs it (:func:`~onnx_light_ref.backend.make_runner`). The seed
    cases' weights go to the system temp dir, as onnx-light's seed cases say; the caller removes them when done
    (:func:`~onnx_light_ref.backend.seed_weights_paths`). A case directory already there is replaced; other files in
    ``output_dir`` are left alone. The command line's ``generate-tests``.

    Args:
        output_dir: Folder to write into; created (with its parents) when missing.
        registry: The cases to write; default every DelayedInitializer case, built for this folder.
        relocatable: Only with the default registry: name each extra case's weights relatively (``weights.bin``)
            instead of by the absolute path of its case directory. Such cases need the op bound to their folder
            (``DelayedInitializerBackend.prepare(model, base_dir=case_dir)``).

    Returns:
        The case directories, in registration order.

    Raises:
        NotADirectoryError: ``output_dir`` (or ``output_dir/node``, or a parent) exists and is not a folder, or
            ``output_dir/node`` is a symbolic link; nothing is written.
        onnx.checker.ValidationError, onnx.shape_inference.InferenceError: a case's model is invalid; nothing is
            written.
        ValueError: ``registry`` and ``relocatable`` given together.
        OSError: the files cannot be written.

    Example:
        In any folder:

        >>> import os
        >>> from onnx_light_ref.backend import generate, seed_weights_paths
        >>> folders = generate("cases")
        >>> folders[0].name, sorted(os.listdir(folders[0]))
        ('test_cc_delayedinitializer_cpu', ['data.json', 'model.onnx', 'test_data_set_0'])
        >>> for path in seed_weights_paths():  # written to the system temp folder
        ...     os.remove(path)
    """
    check_bool("relocatable", relocatable)
    if registry is not None and relocatable:
        raise ValueError("relocatable applies to the default cases only; build the registry with case_root=None.")
    out = Path(os.path.realpath(os.fspath(output_dir)))
    _check_destination(out)
    node_dir = out / "node"
    cases = registry if registry is not None else build_cases(case_root=None if relocatable else str(node_dir))
    for case in cases:
        _check_model(case)
    node_dir.mkdir(parents=True, exist_ok=True)
    written = [_write_checked_case(case, node_dir) for case in cases]
    logger.info("wrote %d conformance cases to %s", len(written), node_dir)
    return written
