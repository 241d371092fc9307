"""The whole job on a generated model, end to end: what ``onnx-light-ref demo`` runs.

1. Build a 4-layer MLP (input ``x`` of shape ``[N, 64]``, output ``y`` ``[N, 16]``; initializers ``W0``, ``b0``,
   ``W1``, ``b1``, ``W2``, ``b2``, ``head.weight``, ``head.bias``, and the inline ``shape`` of a final ``Reshape``)
   whose float32 weights (``size`` bytes in total) are spread over two data files, written block by block (the
   weights are never all in memory): ``source/mlp.onnx``.
2. Re-align it to 4096 into one data file with :func:`~onnx_light_ref.io._align.align_external_data_streaming`
   (``model.onnx`` + ``model.onnx.data``), check the alignment from the files themselves
   (:func:`~onnx_light_ref.io._layout_report.build_layout_report`), and prove the rewrite changed no tensor with
   :func:`~onnx_light_ref.io._verify.verify_models` (aligned model vs source: every name, dtype, dims and byte,
   streamed from both layouts).
3. Save a variant with a new head next to it with
   :func:`~onnx_light_ref.io._shared_save.save_model_with_shared_external_data` (``new_head.onnx``): only the head is
   written, every other tensor still points into ``model.onnx.data``.
4. Write ``light.onnx``, the model for onnx-light (:func:`~onnx_light_ref.ops._convert.delay_initializers`: every
   external initializer a ``DelayedInitializer`` node reading ``model.onnx.data``).
5. Evaluate the source, the aligned model and the variant with
   :func:`~onnx_light_ref.ops._evaluate.reference_evaluator` (``file`` and ``cpu``) and with onnxruntime when it is
   installed, ``light.onnx`` with onnx's ``ReferenceEvaluator`` and the bound op, and check that every output
   agrees.

``model.onnx`` and ``light.onnx`` are the inputs of the README's examples (``demo --keep DIR``).

This module only works inside the folder it is given and never prints: it returns a :class:`DemoResult` whose lines
the command prints (progress bars go to stderr through tqdm). Peak memory is read from ``getrusage``.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tqdm import tqdm

from onnx_light_ref._commands.progress import byte_progress
from onnx_light_ref.io import align_external_data_streaming, save_model_with_shared_external_data
from onnx_light_ref.io._layout_report import build_layout_report
from onnx_light_ref.io._read.onnx_compat import evaluator_shape_checks
from onnx_light_ref.io._verify import verify_models
from onnx_light_ref.io._write.execute import write_entries
from onnx_light_ref.io._write.space import filesystem_of
from onnx_light_ref.ops import DelayedInitializer, delay_initializers, reference_evaluator

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# Below this the hidden width would be a handful of units: nothing left to demonstrate.
_MIN_SIZE = 64 * 1024
_ALIGNMENT = 4096
_INPUT_WIDTH = 64
_OUTPUT_WIDTH = 16
_BATCH = 4
# Weights are generated and written this many bytes at a time, so building the model needs no more memory.
_WRITE_BLOCK = 4 * 1024 * 1024
# float32 MatMul chains summed in different orders (numpy vs onnxruntime's MLAS) differ by a few ulps per layer.
_RTOL = 1e-4
_ATOL = 1e-5
_OPSET = 18
_IR_VERSION = 10  # what onnxruntime >= 1.17 reads


# What the README's snippets use: the last layer is the "head" a fine-tuned variant replaces.
_HEAD_WEIGHT, _HEAD_BIAS = "head.weight", "head.bias"


@dataclass(frozen=True)
class MlpShape:
    """Widths of the demo MLP: x[batch, d_in] -> h -> h -> h -> y[batch, d_out], ReLU between layers."""

    d_in: int
    hidden: int
    d_out: int

    @property
    def layers(self) -> list[tuple[int, int]]:
        return [
            (self.d_in, self.hidden),
            (self.hidden, self.hidden),
            (self.hidden, self.hidden),
            (self.hidden, self.d_out),
        ]

    @property
    def nbytes(self) -> int:
        return 4 * sum(fan_in * fan_out + fan_out for fan_in, fan_out in self.layers)

    def names(self, index: int) -> tuple[str, str]:
        """The weight and bias names of layer ``index``: ``W<i>``, ``b<i>``, the last one ``head.weight``/``bias``."""
        return (_HEAD_WEIGHT, _HEAD_BIAS) if index == len(self.layers) - 1 else (f"W{index}", f"b{index}")


def mlp_shape(size: int) -> MlpShape:
    """The MLP whose weights come closest to ``size`` bytes from below (hidden width a multiple of 16)."""
    if size < _MIN_SIZE:
        raise ValueError(f"size must be at least {_MIN_SIZE} bytes (64K), got {size}.")
    # 4 bytes * (2h^2 + (d_in + d_out + 3)h + d_out) = size
    linear = _INPUT_WIDTH + _OUTPUT_WIDTH + 3
    hidden = (-linear + math.sqrt(linear * linear + 8 * (size / 4 - _OUTPUT_WIDTH))) / 4
    return MlpShape(_INPUT_WIDTH, max(16, int(hidden) // 16 * 16), _OUTPUT_WIDTH)


@dataclass
class DemoResult:
    """What the demo did and found; ``ok`` is False when any output disagreed or a check failed."""

    workdir: str
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)  # bytes on macOS, KiB elsewhere


def _byte_progress(description: str, enabled: bool) -> AbstractContextManager[Callable[[int, int], None]]:
    """The commands' byte bar, shown whenever ``enabled`` (the caller decided) and erased once done."""
    return byte_progress(description, hidden=not enabled, terminal_only=False, leave=False)


def _external_tensor(name: str, dims: list[int], location: str, offset: int) -> TensorProto:
    tensor = TensorProto(name=name, dims=dims, data_type=TensorProto.FLOAT)
    write_entries(tensor, location, offset, 4 * math.prod(dims))
    return tensor


def _mlp_graph(shape: MlpShape, initializers: list[TensorProto]) -> onnx.ModelProto:
    """The MLP's graph, ending in a ``Reshape`` whose 16-byte ``shape`` stays inline: exporters write such shape
    tensors, and onnxruntime reads them only inline (what the README's ``--size-threshold 1K`` advice is about)."""
    nodes: list[onnx.NodeProto] = []
    current = "x"
    for index in range(len(shape.layers)):
        weight, bias = shape.names(index)
        nodes.append(helper.make_node("MatMul", [current, weight], [f"m{index}"], name=f"matmul{index}"))
        nodes.append(helper.make_node("Add", [f"m{index}", bias], [f"a{index}"], name=f"add{index}"))
        current = f"a{index}"
        if index < len(shape.layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"h{index}"], name=f"relu{index}"))
            current = f"h{index}"
    nodes.append(helper.make_node("Reshape", [current, "shape"], ["y"], name="reshape"))
    reshape = numpy_helper.from_array(np.array([-1, shape.d_out], np.int64), "shape")
    graph = helper.make_graph(
        nodes,
        "demo_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", shape.d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", shape.d_out])],
        [*initializers, reshape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR_VERSION)


def disk_bytes(size: int) -> int:
    """The most bytes :func:`run_demo` writes for ``size``: the source's weights, their aligned copy (each tensor
    padded to 4096), the variant's head, and 256 KiB for the four ``.onnx`` files (a few KiB each) and the
    filesystem's block rounding."""
    shape = mlp_shape(size)
    tensors = 2 * len(shape.layers)
    head_weight = 4 * shape.hidden * shape.d_out
    return 2 * shape.nbytes + tensors * _ALIGNMENT + head_weight + _ALIGNMENT + 256 * 1024


def check_free_space(size: int, folder: str) -> None:
    """Refuse to start a demo of ``size`` whose files cannot fit in ``folder`` (or its nearest existing parent).

    Args:
        size: the demo's ``--size`` in bytes.
        folder: where it will write.

    Raises:
        OSError: ``errno.ENOSPC``, naming the bytes needed and free and the filesystem, as the aligners' check does.

    Example:
        >>> check_free_space(64 * 1024, ".")  # 2.2 MiB fit here
    """
    existing = os.path.abspath(folder)
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    stats = os.statvfs(existing)
    free = stats.f_bavail * stats.f_frsize
    needed = disk_bytes(size)
    if needed > free:
        where = filesystem_of(os.stat(existing).st_dev, existing).describe(existing)
        raise OSError(
            errno.ENOSPC,
            f"not enough free space on {where} for the demo in {os.path.abspath(folder)!r}: {needed} bytes needed "
            f"({needed / 2**20:.1f} MiB), {free} bytes free ({free / 2**20:.1f} MiB); nothing was written (a smaller "
            "--size needs less)",
        )


@contextmanager
def _writing(path: str) -> Iterator[None]:
    """Name ``path`` in an ``OSError`` raised while writing it: a full disk's ENOSPC from ``write`` names no file."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), path) from exc


def build_two_file_mlp(folder: str, shape: MlpShape, *, seed: int = 0, progress: bool = False) -> str:
    """Write ``folder/mlp.onnx`` with layers 0-1 in ``mlp_a.data`` and layers 2-3 in ``mlp_b.data`` (packed).

    Weights are N(0, 1/fan_in), generated and written ``_WRITE_BLOCK`` bytes at a time. Returns the model path.
    """
    rng = np.random.default_rng(seed)
    initializers: list[TensorProto] = []
    files = {"mlp_a.data": [0, 1], "mlp_b.data": [2, 3]}
    with tqdm(
        total=shape.nbytes, desc="write weights", unit="B", unit_scale=True, unit_divisor=1024, disable=not progress
    ) as bar:
        for location, layer_indices in files.items():
            data_path = os.path.join(folder, location)
            # Python's write, not ndarray.tofile: on a full disk tofile says "N requested and M written", no errno.
            with _writing(data_path), open(data_path, "wb") as data:
                for index in layer_indices:
                    fan_in, fan_out = shape.layers[index]
                    scale = np.float32(1 / math.sqrt(fan_in))
                    weight, bias = shape.names(index)
                    for name, dims in ((weight, [fan_in, fan_out]), (bias, [fan_out])):
                        initializers.append(_external_tensor(name, dims, location, data.tell()))
                        remaining = math.prod(dims)
                        while remaining:
                            count = min(remaining, _WRITE_BLOCK // 4)
                            data.write(rng.standard_normal(count, dtype=np.float32) * scale)
                            remaining -= count
                            bar.update(4 * count)
    path = os.path.join(folder, "mlp.onnx")
    with _writing(path):
        onnx.save_model(_mlp_graph(shape, initializers), path)
    return path


def _new_head(model: onnx.ModelProto, shape: MlpShape, seed: int) -> None:
    """Replace the last layer's external weights with new inline tensors (what fine-tuning a head produces)."""
    rng = np.random.default_rng(seed)
    fan_in, fan_out = shape.layers[-1]
    new = {
        _HEAD_WEIGHT: (rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.float32(math.sqrt(fan_in))),
        _HEAD_BIAS: rng.standard_normal(fan_out, dtype=np.float32),
    }
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in new:
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(new[tensor.name], tensor.name))


def _timed(function: Callable[[], _T]) -> tuple[_T, float]:
    start = time.perf_counter()
    value = function()
    return value, time.perf_counter() - start


def _evaluate(result: DemoResult, label: str, path: str, x: np.ndarray, ort_module: object | None) -> np.ndarray:
    """Run ``path`` in file and cpu modes (and onnxruntime); record timings; return the file-mode output."""
    outputs: dict[str, np.ndarray] = {}
    for load_device in ("file", "cpu"):
        sess, built = _timed(functools.partial(reference_evaluator, path, load_device, **evaluator_shape_checks()))
        ran_outputs, ran = _timed(functools.partial(sess.run, None, {"x": x}))
        assert isinstance(ran_outputs, list)  # a dict only with intermediate=True
        outputs[load_device] = np.asarray(ran_outputs[0])
        result.lines.append(
            f"  {label:<8} reference_evaluator load_device={load_device:<4}  build {built:6.3f} s  run {ran:6.3f} s  "
            f"peak RSS so far {_peak_rss_mib():7.1f} MiB"
        )
    if not np.array_equal(outputs["file"], outputs["cpu"]):
        result.problems.append(
            f"{label}: file and cpu modes disagree (max |diff| {np.max(np.abs(outputs['file'] - outputs['cpu']))})."
        )
    if ort_module is not None:
        session_cls = ort_module.InferenceSession  # type: ignore[attr-defined]
        ort_sess, built = _timed(functools.partial(session_cls, path, providers=["CPUExecutionProvider"]))
        ort_outputs, ran = _timed(functools.partial(ort_sess.run, None, {"x": x}))
        y = np.asarray(ort_outputs[0])
        result.lines.append(
            f"  {label:<8} onnxruntime                          build {built:6.3f} s  run {ran:6.3f} s  "
            f"peak RSS so far {_peak_rss_mib():7.1f} MiB"
        )
        try:
            np.testing.assert_allclose(y, outputs["file"], rtol=_RTOL, atol=_ATOL)
        except AssertionError as exc:
            result.problems.append(f"{label}: onnxruntime disagrees with the reference evaluator: {exc}")
    return outputs["file"]


def _evaluate_light(result: DemoResult, light: str, folder: str, x: np.ndarray) -> np.ndarray:
    """Run ``light.onnx`` as onnx-light's users do: onnx's ``ReferenceEvaluator`` with the op bound to ``folder``."""
    from onnx.reference import ReferenceEvaluator

    sess, built = _timed(functools.partial(ReferenceEvaluator, light, new_ops=[DelayedInitializer.bind(folder)]))
    ran_outputs, ran = _timed(functools.partial(sess.run, None, {"x": x}))
    assert isinstance(ran_outputs, list)
    result.lines.append(
        f"  {'light':<8} {'ReferenceEvaluator, op bound':<37}build {built:6.3f} s  run {ran:6.3f} s  "
        f"peak RSS so far {_peak_rss_mib():7.1f} MiB"
    )
    return np.asarray(ran_outputs[0])


def _check_alignment(result: DemoResult, label: str, path: str, *, expect_aligned: bool = True) -> None:
    """Read the layout back from the files; every reference must be valid, and aligned when expected."""
    report = build_layout_report(path)
    common = report.common_alignment
    files = ", ".join(f"{f.location} ({f.size} B, {f.tensors} tensors)" for f in report.files)
    result.lines.append(f"  {label:<8} every offset aligned to {common if common else 'any'} bytes; files: {files}")
    if not report.ok:
        result.problems.extend(f"{label}: {t.status}: {t.message}" for t in report.errors)
    if expect_aligned and (common is None or (common != 0 and common < _ALIGNMENT)):
        result.problems.append(f"{label}: offsets are only {common}-byte aligned, expected {_ALIGNMENT}.")


def _shared_bytes(model_path: str, data_path: str) -> int:
    """Bytes of ``data_path`` the model at ``model_path`` references (its layout report, ranges counted once)."""
    shown = os.path.normpath(os.path.abspath(data_path))  # how the report names a file: its folder + location
    return sum(f.bytes_used for f in build_layout_report(model_path).files if f.path == shown)


def _check_sharing(result: DemoResult, shape: MlpShape, variant: str, base_data: str, saved: int) -> None:
    """The variant must reference every base tensor but the head in the base's data file, and write only the head
    (its weight matrix: the bias is under the saver's 1 KiB ``size_threshold`` and stays inline)."""
    head = 4 * (shape.hidden * shape.d_out + shape.d_out)
    shared = _shared_bytes(variant, base_data)
    if shared != shape.nbytes - head:
        result.problems.append(
            f"variant: references {shared} bytes of model.onnx.data, expected {shape.nbytes - head} (all but the head)."
        )
    head_weight = 4 * shape.hidden * shape.d_out  # what the variant's own file holds, padded to the alignment
    if not head_weight <= saved < head_weight + _ALIGNMENT:
        result.problems.append(f"variant: wrote {saved} bytes for a {head}-byte head; its weights were not shared.")


def _check_same_tensors(result: DemoResult, label: str, source: str, rewritten: str, progress: bool) -> None:
    """Prove with ``verify_models`` that ``rewritten`` holds exactly the source's tensors; record it either way."""
    with _byte_progress("verify", progress) as callback:
        verified, took = _timed(functools.partial(verify_models, source, rewritten, progress=callback))
    if verified.equal:
        result.lines.append(
            f"  {label:<8} verify_models: same {verified.tensors} tensors as the source (names, dtypes, dims, "
            f"{verified.bytes_compared:,} bytes compared) in {took:.3f} s"
        )
    else:
        result.lines.append(f"  {label:<8} verify_models: DIFFERENT from the source")
        result.problems.append(f"{label} model differs from the source (verify_models): {verified.first_difference}")


def run_demo(size: int, workdir: str, *, progress: bool = False, seed: int = 0) -> DemoResult:
    """Run the demo in ``workdir`` (which must exist); see the module docstring. Never raises for a mismatch."""
    shape = mlp_shape(size)
    result = DemoResult(workdir)
    try:
        import onnxruntime as ort_module
    except ImportError:
        ort_module = None
    source_dir = os.path.join(workdir, "source")
    os.makedirs(source_dir, exist_ok=True)
    result.lines.append(
        f"MLP {shape.d_in} -> {shape.hidden} -> {shape.hidden} -> {shape.hidden} -> {shape.d_out}: "
        f"{shape.nbytes:,} bytes of float32 weights in {workdir}"
    )

    source, took = _timed(lambda: build_two_file_mlp(source_dir, shape, seed=seed, progress=progress))
    result.lines.append(f"1. wrote source/mlp.onnx, weights over 2 files (packed) in {took:.3f} s")
    _check_alignment(result, "source", source, expect_aligned=False)

    aligned = os.path.join(workdir, "model.onnx")
    with _byte_progress("align", progress) as callback:
        written, took = _timed(
            lambda: align_external_data_streaming(source, aligned, alignment=_ALIGNMENT, progress=callback)
        )
    result.lines.append(
        f"2. re-aligned to {_ALIGNMENT} (streaming) into model.onnx + model.onnx.data: {written:,} bytes "
        f"({written - shape.nbytes:,} padding) in {took:.3f} s ({written / 2**20 / max(took, 1e-9):.0f} MiB/s)"
    )
    _check_alignment(result, "aligned", aligned)
    _check_same_tensors(result, "aligned", source, aligned, progress)

    variant = os.path.join(workdir, "new_head.onnx")
    model = onnx.load_model(aligned, load_external_data=False)
    _new_head(model, shape, seed + 1)
    with _byte_progress("save variant", progress) as callback:
        saved, took = _timed(
            functools.partial(save_model_with_shared_external_data, model, variant, _ALIGNMENT, progress=callback)
        )
    result.lines.append(
        f"3. saved new_head.onnx, a variant with a new head: wrote {saved:,} bytes to new_head.onnx.data, shares "
        f"{_shared_bytes(variant, aligned + '.data'):,} bytes with model.onnx.data (read back from its references), "
        f"in {took:.3f} s"
    )
    _check_sharing(result, shape, variant, aligned + ".data", saved)
    _check_alignment(result, "variant", variant)

    light = os.path.join(workdir, "light.onnx")
    with _writing(light):
        onnx.save_model(delay_initializers(aligned), light)
    result.lines.append("4. wrote light.onnx: model.onnx for onnx-light, DelayedInitializer nodes read model.onnx.data")

    result.lines.append("5. evaluate (outputs compared across evaluators and models)")
    x = np.random.default_rng(seed + 2).standard_normal((_BATCH, shape.d_in), dtype=np.float32)
    y_source = _evaluate(result, "source", source, x, ort_module)
    y_aligned = _evaluate(result, "aligned", aligned, x, ort_module)
    y_variant = _evaluate(result, "variant", variant, x, ort_module)
    y_light = _evaluate_light(result, light, workdir, x)
    if not np.array_equal(y_source, y_aligned):
        result.problems.append("aligned model's output differs from the source model's: re-alignment changed bytes.")
    if not np.array_equal(y_light, y_aligned):
        result.problems.append("light.onnx's output differs from model.onnx's: delay_initializers changed a weight.")
    if np.allclose(y_variant, y_aligned):
        result.problems.append("variant's output equals the base model's: its new head was not used.")
    if ort_module is None:
        result.lines.append("  (onnxruntime not installed: skipped)")
    result.lines.append(
        f"peak RSS of this process: {_peak_rss_mib():.1f} MiB (weights: {shape.nbytes / 2**20:.1f} MiB)"
    )
    result.lines.append("result: OK, all outputs agree" if result.ok else f"result: {len(result.problems)} problem(s)")
    return result
