"""Run the benchmark suite at a real size and write the results: a Markdown table of ratios and a PNG chart.

Usage::

    python -m benchmarks.report --size 1G              # run (about 10 min on 2 cores), then write the report
    python -m benchmarks.report --size 4G              # the 4 GiB run: only the chunk-size sweep (RSS target)
    python -m benchmarks.report --json a.json b.json   # no run: report from pytest-benchmark JSON files

A run writes pytest-benchmark's JSON to ``benchmarks/results/raw-<size>.json``; the report is then built from every
``raw-*.json`` in that folder, so a 1 GiB and a 4 GiB run end up in one table. Outputs: ``results.md`` (per
comparison: medians of time and of peak RSS above the child's import-only baseline, ratios; then every target of
issues 6, 11, 12 and 13 with its measured ratio and pass/miss) and ``results.png``.

Numbers come from the child processes (``benchmark.extra_info``), not from pytest-benchmark's own timing, which
includes interpreter start-up; see ``benchmarks/conftest.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.models import ENV_SIZE, GIB, MIB, parse_size

__all__ = ["Target", "check_group", "evaluate_targets", "load_results", "main", "write_chart", "write_markdown"]

_HERE = Path(__file__).resolve().parent
_REPO_ROOT = _HERE.parent
_RESULTS = _HERE / "results"
# Every target of the issue is stated for a 1 GiB run (the RSS one also at 4 GiB).
_REFERENCE_SIZE = GIB
# Peak-RSS deltas are floored at this before dividing: VmHWM moves in pages, and "0.02 MiB vs 1 GiB" is not a
# meaningful 50,000x.
_RSS_FLOOR_MIB = 1.0

# Human labels, in display order, for every comparison.
_LABELS: dict[str, dict[str, str]] = {
    "align": {
        "streaming": "ours, streaming (4 MiB chunks)",
        "streaming_nofsync": "ours, streaming, durable=False (no fsync, like onnx-ir)",
        "in_memory": "ours, in-memory twin",
        "onnx": "onnx.load + save_model (external, dense)",
        "onnx_ir": "onnx-ir load + save(alignment=4096)",
        "onnx_ir_fsync": "onnx-ir ... + fsync (as ours)",
        "cfr": "limit: copy_file_range copy",
        "cfr_fsync": "limit: copy_file_range + fsync",
        "cfr_ranges_fsync": "limit: copy_file_range of the same ranges to aligned offsets + fsync",
    },
    "chunk-sizes": {
        "chunk_64KiB": "streaming, 64 KiB chunks",
        "chunk_1MiB": "streaming, 1 MiB chunks",
        "chunk_4MiB": "streaming, 4 MiB chunks",
        "chunk_16MiB": "streaming, 16 MiB chunks",
    },
    "shared-save": {
        "shared_save": "ours: save_model_with_shared_external_data",
        "write_alone": "write the new bytes alone (+ fsync)",
        "write_publish": "floor: the contract's system calls alone (2 files written and fsynced, 2 renames, 2 folder "
        "fsyncs)",
        "onnx_full_save": "onnx.save_model, full variant (weights loaded; load not timed)",
    },
    "delayed": {
        "file": "DelayedInitializer load_device=file",
        "cpu": "DelayedInitializer load_device=cpu",
        "np_fromfile": "np.fromfile of the same bytes",
    },
    "dedup": {
        "streaming": "ours, streaming (plain)",
        "dedup": "ours, streaming, dedup=True",
    },
    "shards": {
        "one_file": "ours, streaming, one file",
        "sharded": "ours, streaming, max_shard_size",
        "onnx_ir_sharded": "onnx-ir load + save(max_shard_size_bytes, alignment=4096, align_threshold=0)",
        "onnx_ir_sharded_fsync": "onnx-ir ... sharded + fsync (as ours)",
    },
    "verify": {
        "verify": "ours: verify_models (4 MiB chunks)",
        "read_both": "limit: preadv of both weight sets once (4 MiB buffer)",
    },
    "externalize": {
        "streaming": "ours, streaming, size_threshold=1024",
        "in_memory": "ours, in-memory twin, size_threshold=1024",
        "onnx": "onnx.load + save_model(save_as_external_data=True)",
        "onnx_ir": "onnx-ir ir.load + ir.save(alignment=4096)",
        "onnx_ir_fsync": "onnx-ir ... + fsync (as ours)",
        "cfr_ranges_fsync": "limit: copy_file_range of the payload ranges to aligned offsets + fsync",
    },
    "in-place": {
        "in_place": "ours, streaming, src == dst (the previous .onnx is the source)",
        "fresh_folder": "ours, streaming, into a fresh folder",
    },
    "reflink": {
        "aligned": "re-align an already 4096-aligned model (extents cloned)",
        "unaligned": "re-align the same from unaligned offsets (bytes copied)",
    },
    "node-count": {
        "undelay": "ours: undelay_initializers (DelayedInitializer nodes -> external initializers)",
        "delay": "ours: delay_initializers + onnx.save_model (the inverse direction)",
    },
    "safetensors": {
        "streaming": "ours, streaming, weights_format='safetensors'",
        "streaming_no_fsync": "ours, streaming safetensors, durable=False",
        "onnx_ir": "onnx-ir load + save_safetensors (shards in memory, no fsync)",
        "onnx_ir_fsync": "onnx-ir ... save_safetensors + fsync (as ours)",
        "copy_ranges": "limit: copy_file_range of the same ranges to aligned offsets + fsync",
    },
    "link": {
        "link": "ours: link_external_data to a checkpoint in the folder (no byte copied)",
        "link_no_fsync": "ours: link_external_data, durable=False",
        "copy_safetensors": "writing the same safetensors file again (streaming)",
    },
    "family": {
        "align_models": "ours: align_models, one set of weights for the family (durable)",
        "align_each": "align_external_data_streaming of each member alone (durable)",
        "copy_unique": "limit: copy_file_range of the unique ranges to aligned offsets + fsync",
    },
    "inline-readers": {
        "verify": "ours: verify_models of two inline models (4 MiB chunks)",
        "inspect": "ours: the layout report of one (inspect)",
        "externalize": "reference: align size_threshold=1024 of one (streaming reader of issue 12)",
    },
    "guard": {
        "alone": "align a 64-byte model into a/b/, no .onnx above",
        "raw_data": "the same, a 2 GiB .onnx two folders up: one raw_data",
        "doc_string": "... the 2 GiB is its doc_string",
        "float_data": "... the 2 GiB is packed float_data",
        "string_data": "... the 2 GiB is string_data of 64 KiB strings",
    },
    "startup": {
        "bare": "python -c pass (the bare interpreter)",
        "version": "onnx-light-ref --version",
        "help": "onnx-light-ref --help",
        "inspect_help": "onnx-light-ref inspect --help",  # newer runs name their methods (extra_info "labels")
    },
    "metadata": {
        "align": "ours: align_external_data_streaming at 64 bytes (durable)",
        "verify": "ours: verify_models against that copy",
        "onnx_load": "reference: onnx.load of the same model, load_external_data=False",
    },
    "evaluator": {
        "plain": "onnx ReferenceEvaluator(path)",
        "lazy_file": "reference_evaluator(path, 'file')",
        "lazy_cpu": "reference_evaluator(path, 'cpu')",
    },
}
_LABELS["evaluator-bfloat16"] = _LABELS["evaluator-int4"] = _LABELS["evaluator"]
_REFERENCE_METHOD = {"evaluator-bfloat16": "plain", "evaluator-int4": "plain", "align": "streaming",
                     "chunk-sizes": "chunk_4MiB",
                     "shared-save": "shared_save", "delayed": "np_fromfile", "evaluator": "plain",
                     "dedup": "streaming", "shards": "one_file",
                     "verify": "read_both", "externalize": "cfr_ranges_fsync", "in-place": "fresh_folder",
                     "reflink": "unaligned", "node-count": "delay", "safetensors": "onnx_ir_fsync",
                     "link": "copy_safetensors", "inline-readers": "externalize", "startup": "bare",
                     "family": "copy_unique", "guard": "alone", "metadata": "onnx_load"}  # fmt: skip
# Families whose groups move or read ``payload_bytes``: their tables show a throughput column.
_THROUGHPUT_FAMILIES = (
    "align", "chunk-sizes", "delayed", "dedup", "shards", "verify", "externalize", "in-place", "reflink", "safetensors",
    "family",
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """One target of the issue and what was measured for it."""

    name: str
    size: str
    measured: float
    limit: float
    at_most: bool  # True: measured <= limit passes; False: measured >= limit passes
    detail: str

    @property
    def passed(self) -> bool:
        if math.isnan(self.measured):
            return False
        return self.measured <= self.limit if self.at_most else self.measured >= self.limit

    @property
    def verdict(self) -> str:
        if math.isnan(self.measured):
            return "n/a"
        return "pass" if self.passed else "**miss**"


# ---------------------------------------------------------------------------------------------------------------------
# Loading


def annotate(raw: Path, command: str) -> None:
    """Record in a pytest-benchmark JSON file the command that produced it (shown in the report)."""
    data = json.loads(raw.read_text())
    data["onnx_light_ref"] = {"command": command}
    raw.write_text(json.dumps(data, indent=1))


def run_commands(paths: list[Path]) -> list[str]:
    """The commands that produced these JSON files, as recorded by :func:`annotate`."""
    commands = []
    for path in paths:
        command = json.loads(path.read_text()).get("onnx_light_ref", {}).get("command")
        if command and command not in commands:
            commands.append(command)
    return commands


def load_results(paths: list[Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{size: {group: extra_info}}`` from pytest-benchmark JSON files (later files win)."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for bench in data.get("benchmarks", []):
            info = bench.get("extra_info", {})
            if "group" in info and info.get("summary"):
                results.setdefault(info["size"], {})[info["group"]] = info
    return results


def _family(group: str) -> str:
    for prefix in ("align", "chunk-sizes", "dedup", "externalize", "reflink", "safetensors"):
        if group.startswith(prefix + "-"):
            return prefix
    return group


def _size_key(size: str) -> int:
    return parse_size(size)


# ---------------------------------------------------------------------------------------------------------------------
# Targets


def _get(info: dict[str, Any] | None, method: str, key: str = "seconds", phase: str | None = None) -> float:
    if info is None or method not in info["summary"]:
        return float("nan")
    summary = info["summary"][method]
    if phase is not None:
        summary = summary["phases"].get(phase, {})
    return float(summary.get(key, float("nan")))


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


def evaluate_targets(results: dict[str, dict[str, dict[str, Any]]]) -> list[Target]:
    """Every target of the issues, at the reference size (1 GiB) when present, else the largest size measured.

    Each section is evaluated on its own: one that cannot be (a record lacking a field it reads) becomes one ``n/a``
    row naming the error, and every other target is still evaluated and the report still written.
    """
    sizes = sorted(results, key=_size_key)
    if not sizes:
        return []
    main_size = next((s for s in sizes if _size_key(s) == _REFERENCE_SIZE), sizes[-1])
    groups = results[main_size]
    sections: list[tuple[str, Callable[[], list[Target]]]] = [
        ("re-alignment", lambda: _align_targets(groups, main_size)),
        ("chunk sizes", lambda: _chunk_targets(results, sizes)),
        ("shared save", lambda: _shared_targets(groups, main_size)),
        ("DelayedInitializer", lambda: _delayed_targets(groups, main_size)),
        ("#19 node count", lambda: [_time_target("#19 #43 undelay / delay, one graph of 100k nodes", main_size,
                                                 groups.get("node-count"), "undelay", "delay", 1.5)]),
        ("#43 per-tensor cost", lambda: _metadata_targets(groups.get("metadata"), main_size)),
        ("layouts", lambda: _layout_targets(groups, main_size)),
        ("durability", lambda: _durability_targets(groups, main_size)),
        ("formats", lambda: _format_targets(groups, main_size)),
        ("start-up", lambda: _startup_targets(groups.get("startup"), main_size)),
        ("evaluator", lambda: _evaluator_targets(groups, main_size)),
        ("#27 bfloat16", lambda: _bfloat16_targets(groups, main_size)),
        ("#38 guard", lambda: _guard_targets(groups, main_size)),
        ("#40 int4", lambda: _int4_targets(groups, main_size)),
        ("#28 family", lambda: _family_targets(groups, main_size)),
    ]  # fmt: skip
    targets: list[Target] = []
    for name, section in sections:
        try:
            targets += section()
        except Exception as exc:  # a 13-minute run must end with its report (module docstring)
            detail = f"{type(exc).__name__}: {exc}"
            targets.append(Target(f"{name}: not evaluated", main_size, float("nan"), 0.0, True, detail))
    return targets


def _align_targets(groups: dict[str, dict[str, Any]], main_size: str) -> list[Target]:
    """Issue 6: streaming against the disk and onnx-ir, and against its in-memory twin."""
    targets: list[Target] = []
    large, small = groups.get("align-large"), groups.get("align-small")
    for ref, label in (
        ("cfr_fsync", "whole-file copy_file_range + fsync (like for like)"),
        ("cfr", "whole-file copy_file_range, no fsync"),
        ("cfr_ranges_fsync", "copy_file_range of the same ranges + fsync"),
    ):
        measured = _ratio(_get(large, "streaming"), _get(large, ref))
        targets.append(Target(f"streaming / {label}, large tensors", main_size, measured, 1.15, True,
                              f"{_get(large, 'streaming'):.3f} s / {_get(large, ref):.3f} s"))  # fmt: skip
    for info, shape, limit in ((large, "large tensors", 1.0), (small, "small tensors", 0.5)):
        for ref, label in (("onnx_ir", "onnx-ir save"), ("onnx_ir_fsync", "onnx-ir save + fsync")):
            measured = _ratio(_get(info, "streaming"), _get(info, ref))
            targets.append(Target(f"streaming / {label}, {shape}", main_size, measured, limit, True,
                                  f"{_get(info, 'streaming'):.3f} s / {_get(info, ref):.3f} s"))  # fmt: skip
    for info, shape in ((large, "large tensors"), (small, "small tensors")):
        stream_rss = max(_get(info, "streaming", "delta_mib"), _RSS_FLOOR_MIB)
        mem_rss = _get(info, "in_memory", "delta_mib")
        targets.append(Target(f"in-memory / streaming peak RSS, {shape}", main_size, _ratio(mem_rss, stream_rss),
                              10.0, False, f"{mem_rss:.1f} MiB / max({_get(info, 'streaming', 'delta_mib'):.2f}, "
                              f"{_RSS_FLOOR_MIB:.0f}) MiB"))  # fmt: skip
        targets.append(Target(f"in-memory / streaming time, {shape}", main_size,
                              _ratio(_get(info, "in_memory"), _get(info, "streaming")), 1.5, False,
                              f"{_get(info, 'in_memory'):.3f} s / {_get(info, 'streaming'):.3f} s"))  # fmt: skip
    return targets


def _chunk_targets(results: dict[str, dict[str, dict[str, Any]]], sizes: list[str]) -> list[Target]:
    """Issue 6: streaming peak RSS within chunk + 32 MiB, at 1 GiB and above."""
    targets: list[Target] = []
    for size in sizes:
        if _size_key(size) < _REFERENCE_SIZE:
            continue
        for shape in ("large", "small"):
            chunks = results[size].get(f"chunk-sizes-{shape}")
            if chunks is None:
                continue
            label = _shape_label(chunks)
            for method, chunk in chunks["chunk_sizes"].items():
                limit_mib = chunk / MIB + 32
                delta = _get(chunks, method, "delta_mib")
                targets.append(Target(f"streaming peak RSS Δ / (chunk + 32 MiB), {method.split('_')[1]} chunks, "
                                      f"{label}", size, _ratio(delta, limit_mib), 1.0, True,
                                      f"{delta:.2f} MiB vs {limit_mib:.0f} MiB"))  # fmt: skip
    return targets


def _shared_targets(groups: dict[str, dict[str, Any]], main_size: str) -> list[Target]:
    """Issue 43 (was 2.0 in issue 6): the shared save within 1.5x of writing its new bytes alone; onnx's full save
    at least 20x slower."""
    shared = groups.get("shared-save")
    ours_ms, alone_ms = _get(shared, "shared_save") * 1e3, _get(shared, "write_alone") * 1e3
    floor_ms = _get(shared, "write_publish") * 1e3
    floor = f"; the contract's system calls alone (2 files, 4 fsyncs, 2 renames): {floor_ms:.1f} ms" if shared and (
        "write_publish" in shared["summary"]) else ""  # fmt: skip
    return [
        Target("#43 shared save / writing the new bytes alone", main_size, _ratio(ours_ms, alone_ms), 1.5, True,
               f"{ours_ms:.1f} ms / {alone_ms:.1f} ms{floor}"),
        Target("onnx full save / shared save", main_size,
               _ratio(_get(shared, "onnx_full_save"), _get(shared, "shared_save")), 20.0, False,
               f"{_get(shared, 'onnx_full_save'):.3f} s / {_get(shared, 'shared_save'):.3f} s"),
    ]  # fmt: skip


def _delayed_targets(groups: dict[str, dict[str, Any]], main_size: str) -> list[Target]:
    """Issue 43: a file-mode run of one 256 MiB tensor within 1.2x of ``np.fromfile``."""
    delayed = groups.get("delayed")
    file_run = _get(delayed, "file", phase="run")
    return [Target("#43 DelayedInitializer file-mode run / np.fromfile", main_size,
                   _ratio(file_run, _get(delayed, "np_fromfile")), 1.2, True,
                   f"{file_run * 1e3:.1f} ms / {_get(delayed, 'np_fromfile') * 1e3:.1f} ms")]  # fmt: skip


def _evaluator_targets(groups: dict[str, dict[str, Any]], main_size: str) -> list[Target]:
    """P7: the lazy evaluator in file mode holds at most 0.1x the weights built, 1.2x after a run."""
    evaluator = groups.get("evaluator")
    weights_mib = (evaluator or {}).get("weight_bytes", float("nan")) / MIB
    construct = _get(evaluator, "lazy_file", "delta_mib", phase="construct")
    run = _get(evaluator, "lazy_file", "delta_mib")
    return [
        Target("reference_evaluator file mode, construction peak RSS Δ / weights", main_size,
               _ratio(construct, weights_mib), 0.1, True, f"{construct:.1f} MiB / {weights_mib:.0f} MiB"),
        Target("reference_evaluator file mode, run peak RSS Δ / weights", main_size,
               _ratio(run, weights_mib), 1.2, True, f"{run:.1f} MiB / {weights_mib:.0f} MiB"),
    ]  # fmt: skip


def _family_targets(groups: dict[str, dict[str, Any]], main_size: str) -> list[Target]:
    """Issue 28: a family's weights written once, near the speed of copying its unique bytes."""
    family = groups.get("family")
    return [
        _time_target("#28 align_models / copy_file_range of the unique ranges + fsync", main_size, family,
                     "align_models", "copy_unique", 1.5),
        _time_target("#28 align_models / each member aligned alone", main_size, family, "align_models",
                     "align_each", 1.0),
    ]  # fmt: skip


def _guard_targets(groups: dict[str, Any], main_size: str) -> list[Target]:
    """Issue 38: a write below a 2 GiB ``.onnx`` takes at most 0.5 s and 32 MiB above the baseline, whatever the
    ``.onnx`` holds (rule 1 of the writer contract reads it)."""
    guard = groups.get("guard")
    label = _fmt_bytes((guard or {}).get("ancestor_bytes", float("nan")))
    targets: list[Target] = []
    for kind in ("raw_data", "doc_string", "float_data", "string_data"):
        seconds = _get(guard, kind)
        targets.append(Target(f"#38 align below a {label} .onnx ({kind}): seconds / 0.5 s", main_size,
                              _ratio(seconds, 0.5), 1.0, True,
                              f"{seconds:.3f} s (alone: {_get(guard, 'alone'):.3f} s)"))  # fmt: skip
        targets.append(_rss_target(f"#38 align below a {label} .onnx ({kind}): peak RSS Δ / 32 MiB", main_size,
                                   guard, kind, 32))  # fmt: skip
    return targets


def _int4_targets(groups: dict[str, Any], main_size: str) -> list[Target]:
    """Issue 40: one int4 weight read lazily costs the unpacked output (a byte per element) plus one 3 MiB chunk."""
    packed = groups.get("evaluator-int4")
    output_mib = 2 * (packed or {}).get("weight_bytes", float("nan")) / MIB
    limit = output_mib + 3 + 1  # one chunk of packed bytes, 1 MiB for the rest
    construct = _get(packed, "lazy_cpu", "delta_mib", phase="construct")
    run = _get(packed, "lazy_file", "delta_mib")
    return [
        Target("#40 int4: reference_evaluator cpu mode, construction peak RSS Δ / (output + chunk)", main_size,
               _ratio(construct, limit), 1.0, True, f"{construct:.1f} MiB / {limit:.0f} MiB"),
        Target("#40 int4: reference_evaluator file mode, run peak RSS Δ / (output + chunk)", main_size,
               _ratio(run, limit), 1.0, True, f"{run:.1f} MiB / {limit:.0f} MiB"),
    ]  # fmt: skip


def _bfloat16_targets(groups: dict[str, Any], main_size: str) -> list[Target]:
    """Issue 27: the lazy evaluator on bfloat16 weights, as P7 for float32 (construction <= 0.1x, run <= 1.2x)."""
    typed = groups.get("evaluator-bfloat16")
    weights_mib = (typed or {}).get("weight_bytes", float("nan")) / MIB
    construct = _get(typed, "lazy_file", "delta_mib", phase="construct")
    run = _get(typed, "lazy_file", "delta_mib")
    plain = _get(typed, "plain", "delta_mib", phase="construct")
    return [
        Target("#27 bfloat16: reference_evaluator file mode, construction peak RSS Δ / weights", main_size,
               _ratio(construct, weights_mib), 0.1, True,
               f"{construct:.1f} MiB / {weights_mib:.0f} MiB (plain ReferenceEvaluator: {plain:.1f} MiB)"),
        Target("#27 bfloat16: reference_evaluator file mode, run peak RSS Δ / weights", main_size,
               _ratio(run, weights_mib), 1.2, True, f"{run:.1f} MiB / {weights_mib:.0f} MiB"),
    ]  # fmt: skip


def _time_target(name: str, size: str, info: dict[str, Any] | None, method: str, reference: str,
                 limit: float) -> Target:  # fmt: skip
    a, b = _get(info, method), _get(info, reference)
    return Target(name, size, _ratio(a, b), limit, True, f"{a:.3f} s / {b:.3f} s")


def _rss_target(name: str, size: str, info: dict[str, Any] | None, method: str, limit_mib: float) -> Target:
    delta = _get(info, method, "delta_mib")
    return Target(name, size, _ratio(delta, limit_mib), 1.0, True, f"{delta:.2f} MiB vs {limit_mib:.0f} MiB")


def _chunk_mib(info: dict[str, Any] | None) -> float:
    return float((info or {}).get("chunk_size", 4 * MIB)) / MIB


def _layout_targets(groups: dict[str, dict[str, Any]], size: str) -> list[Target]:
    """Issue 11 (dedup, shards, verify) and issue 12 (inline externalize, also past 2 GiB)."""
    targets: list[Target] = []
    none, dup = groups.get("dedup-none"), groups.get("dedup-30")
    targets.append(_time_target("#11 dedup=True / plain streaming, no duplicates", size, none, "dedup", "streaming",
                                1.15))  # fmt: skip
    written = float(((dup or {}).get("summary", {}).get("dedup", {}).get("extra") or {}).get("bytes_written", "nan"))
    unique = float((dup or {}).get("unique_bytes", "nan"))
    targets.append(Target("#11 dedup output bytes / unique bytes, 30 % duplicates", size, _ratio(written, unique), 1.0,
                          True, f"{written / MIB:,.1f} MiB / {unique / MIB:,.1f} MiB"))  # fmt: skip
    for info, label in ((none, "no duplicates"), (dup, "30 % duplicates")):
        targets.append(_rss_target(f"#11 dedup peak RSS Δ / (chunk + 32 MiB), {label}", size, info, "dedup",
                                   _chunk_mib(info) + 32))  # fmt: skip
    shards = groups.get("shards")
    targets.append(_time_target("#11 sharded / one-file streaming", size, shards, "sharded", "one_file", 1.05))
    verify = groups.get("verify")
    # Issue 43 (was 1.2 in issue 11): A and B are read at once, so the limit is the disk, not one reader.
    targets.append(_time_target("#43 verify / reading both weight sets once", size, verify, "verify", "read_both",
                                1.1))  # fmt: skip
    targets.append(_rss_target("#11 verify peak RSS Δ / (2 chunks + 32 MiB)", size, verify, "verify",
                               2 * _chunk_mib(verify) + 32))  # fmt: skip

    inline = groups.get("externalize-inline")
    targets.append(_rss_target("#12 inline externalize, streaming peak RSS Δ / (64 MiB + chunk)", size, inline,
                               "streaming", 64 + _chunk_mib(inline)))  # fmt: skip
    targets.append(_time_target("#12 inline externalize, streaming / copy_file_range of the same ranges + fsync", size,
                                inline, "streaming", "cfr_ranges_fsync", 1.2))  # fmt: skip
    in_place = groups.get("in-place")
    if in_place is not None:
        targets.append(_rss_target("#25 in-place externalize (src == dst), peak RSS Δ / (64 MiB + chunk)", size,
                                   in_place, "in_place", 64 + _chunk_mib(in_place)))  # fmt: skip
    huge = groups.get("externalize-huge")
    if huge is not None:
        label = _fmt_bytes(huge["file_bytes"]) + (" (> 2 GiB)" if huge.get("over_2gib") else " (small run)")
        targets.append(_rss_target(f"#12 single-file {label} externalize, streaming peak RSS Δ / (64 MiB + chunk)",
                                   size, huge, "streaming", 64 + _chunk_mib(huge)))  # fmt: skip
    readers = groups.get("inline-readers")
    if readers is not None:
        label = _fmt_bytes(readers["file_bytes"])
        targets.append(_rss_target(f"#29 verify of two {label} inline models, peak RSS Δ / (2 chunks + 32 MiB)",
                                   size, readers, "verify", 2 * _chunk_mib(readers) + 32))  # fmt: skip
        targets.append(_rss_target(f"#29 inspect of a {label} inline model, peak RSS Δ / 32 MiB", size, readers,
                                   "inspect", 32))  # fmt: skip
    return targets


def _format_targets(groups: dict[str, dict[str, Any]], size: str) -> list[Target]:
    """Issue 21: streaming safetensors output against onnx-ir and the disk, and link of a checkpoint."""
    targets: list[Target] = []
    for shape in ("large", "small"):
        info = groups.get(f"safetensors-{shape}")
        targets.append(_rss_target(f"#21 safetensors streaming peak RSS Δ / (chunk + 32 MiB), {shape}", size, info,
                                   "streaming", _chunk_mib(info) + 32))  # fmt: skip
        targets.append(_time_target(f"#21 safetensors streaming / onnx-ir save_safetensors + fsync, {shape}", size,
                                    info, "streaming", "onnx_ir_fsync", 1.0))  # fmt: skip
        targets.append(_time_target(f"#21 #43 safetensors streaming / same-ranges copy + fsync, {shape}", size, info,
                                    "streaming", "copy_ranges", 1.15))  # fmt: skip
    link = groups.get("link")
    extra = ((link or {}).get("summary", {}).get("link", {}).get("extra")) or {}
    written = float(extra.get("bytes_written", "nan"))
    targets.append(Target("#21 link: bytes written / 1 MiB", size, _ratio(written, MIB), 1.0, True,
                          f"{written / 1024:,.1f} KiB"))  # fmt: skip
    count = float((link or {}).get("tensor_count", "nan"))
    per_1000 = _ratio(_get(link, "link"), count) * 1000
    targets.append(Target("#21 #43 link: seconds per 1000 tensors / 0.015 s", size, _ratio(per_1000, 0.015), 1.0,
                          True, f"{per_1000:.4f} s per 1000 tensors ({count:.0f} tensors)"))  # fmt: skip
    no_fsync = _ratio(_get(link, "link_no_fsync"), count) * 1000
    targets.append(Target("#21 link durable=False: seconds per 1000 tensors / 0.05 s", size, _ratio(no_fsync, 0.05),
                          1.0, True, f"{no_fsync:.4f} s per 1000 tensors ({count:.0f} tensors)"))  # fmt: skip
    return targets


def _metadata_targets(metadata: dict[str, Any] | None, size: str) -> list[Target]:
    """Issue 43: align and verify of 100,000 tensors of 256 bytes in at most 1 s each (onnx.load of the metadata:
    ~0.04 s)."""
    count = (metadata or {}).get("tensor_count", float("nan"))
    load = _get(metadata, "onnx_load")
    return [
        Target(f"#43 {method} of {count:,} tensors of 256 bytes: seconds / 1 s", size, _get(metadata, method), 1.0,
               True, f"{_get(metadata, method):.2f} s (onnx.load of the metadata: {load:.3f} s)")
        for method in ("align", "verify")
    ]  # fmt: skip


def _durability_targets(groups: dict[str, dict[str, Any]], size: str) -> list[Target]:
    """Issue 13: durable streaming at the speed of the disk, durable=False against onnx-ir, reflinks on XFS."""
    large, small = groups.get("align-large"), groups.get("align-small")
    targets = [
        _time_target("#13 durable streaming / whole-file copy_file_range + fsync, large tensors (unaligned)", size,
                     large, "streaming", "cfr_fsync", 1.05),
        _time_target("#13 durable=False streaming / onnx-ir save, large tensors", size, large, "streaming_nofsync",
                     "onnx_ir", 1.0),
        _time_target("#13 durable=False streaming / onnx-ir save, small tensors", size, small, "streaming_nofsync",
                     "onnx_ir", 0.6),
    ]  # fmt: skip
    reflink = groups.get("reflink-xfs")
    targets.append(_time_target("#13 XFS: re-aligning an aligned model / from unaligned offsets", size, reflink,
                                "aligned", "unaligned", 0.05))  # fmt: skip
    new = float(((reflink or {}).get("summary", {}).get("aligned", {}).get("extra") or {}).get("fs_new_bytes", "nan"))
    payload = float((reflink or {}).get("payload_bytes", "nan"))
    # Freed speculative preallocation can make the delta slightly negative: no new blocks.
    targets.append(Target("#13 XFS: new blocks of the aligned re-alignment / weights", size,
                          _ratio(max(new, 0.0), payload), 0.01, True,
                          f"{new / MIB:,.2f} MiB / {payload / MIB:,.0f} MiB"))  # fmt: skip
    return targets


# ---------------------------------------------------------------------------------------------------------------------
# Markdown


def _machine() -> dict[str, str]:
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "?"

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    df = run("df", "-hT", "/tmp").splitlines()
    versions = {}
    for module in ("onnx", "onnx_ir", "numpy"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "-"
    return {
        "cpu": f"{os.cpu_count()} cores ({cpu})",
        "memory": f"{mem_gib:.1f} GiB RAM",
        "disk": " ".join(df[-1].split()[:3]) if df else "?",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }


def _fmt_bytes(nbytes: float) -> str:
    if nbytes >= GIB:
        return f"{nbytes / GIB:.3g} GiB"
    return f"{nbytes / MIB:.4g} MiB" if nbytes >= MIB else f"{nbytes / 1024:g} KiB"


def _shape_label(info: dict[str, Any]) -> str:
    return f"{info['tensor_count']} x {_fmt_bytes(info['tensor_bytes'])}"


def _fmt_s(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _startup_targets(startup: dict[str, Any] | None, main_size: str) -> list[Target]:
    """Issue 29's target for the printing commands; issue 42's for inspect and verify of a small model, once per
    interpreter the run measured (``@ml_dtypes-X``: benchmarks/test_bench_startup.py)."""
    printing = "#29 CLI start-up above the bare interpreter (s), slowest printing command"
    targets = [_slowest_startup(startup, main_size, "", ("version", "help", "inspect_help"), 0.25, printing)]
    for suffix in [python["suffix"] for python in (startup or {}).get("interpreters", [{"suffix": ""}])]:
        name = f"#42 inspect / verify of a small model, above the bare interpreter (s){suffix and f' [{suffix[1:]}]'}"
        targets.append(_slowest_startup(startup, main_size, suffix, ("inspect", "verify"), 0.3, name))
    return targets


def _slowest_startup(
    startup: dict[str, Any] | None, main_size: str, suffix: str, methods: tuple[str, ...], limit: float, name: str
) -> Target:
    slowest = max((m + suffix for m in methods), key=lambda method: _get(startup, method, "above_bare_s"))
    above = _get(startup, slowest, "above_bare_s")
    return Target(name, main_size, above, limit, True,
                  f"{slowest}: {_get(startup, slowest):.3f} s vs {_get(startup, 'bare' + suffix):.3f} s")  # fmt: skip


def _group_bytes(info: dict[str, Any]) -> int | None:
    return info.get("payload_bytes") or info.get("tensor_bytes")


def _group_table(group: str, info: dict[str, Any]) -> list[str]:
    family = _family(group)
    reference = _REFERENCE_METHOD[family]
    ref_seconds = _get(info, reference)
    ref_rss = max(_get(info, reference, "delta_mib"), _RSS_FLOOR_MIB)
    nbytes = _group_bytes(info) if family in _THROUGHPUT_FAMILIES else None
    lines = [
        f"| method | runs | median time | min – max | {'MiB/s | ' if nbytes else ''}peak RSS Δ (MiB) | time / "
        f"{reference} | RSS Δ / {reference} |",
        "|---|---|---|---|" + ("---|" if nbytes else "") + "---|---|---|",
    ]
    labels = info.get("labels") or _LABELS[family]  # startup: one set of methods per interpreter measured
    for method, label in labels.items():
        summary = info["summary"].get(method)
        if summary is None:
            reason = info.get("skipped", {}).get(method)
            if reason:
                lines.append(f"| {label} | 0 | not available: {reason} |")
            continue
        seconds, delta = summary["seconds"], summary["delta_mib"]
        phases = summary.get("phases", {})
        detail = ""
        if len(phases) > 1:
            detail = (
                " ("
                + ", ".join(f"{p} {_fmt_s(v['seconds'])} / {v['delta_mib']:.1f} MiB" for p, v in phases.items())
                + ")"
            )
        throughput = f"{nbytes / MIB / seconds:,.0f} | " if nbytes else ""
        lines.append(
            f"| {label}{detail} | {summary['n']} | {_fmt_s(seconds)} | {_fmt_s(summary['seconds_min'])} – "
            f"{_fmt_s(summary['seconds_max'])} | {throughput}{delta:,.1f} | {_ratio(seconds, ref_seconds):.2f} | "
            f"{_ratio(max(delta, _RSS_FLOOR_MIB), ref_rss):.2f} |"
        )
    notes = [f"- {label}: {note}" for method, label in labels.items() if (note := _written_note(info, method))]
    if notes:
        lines += ["", "What was written (first run):", "", *notes]
    return lines


def _written_note(info: dict[str, Any], method: str) -> str:
    """What an aligner reported about its output (``AlignResult`` fields, via the child): files, merged, moved, cloned.

    Empty for the peers (they report only bytes and files) and for records from before these fields existed.
    """
    extra = (info["summary"].get(method) or {}).get("extra") or {}
    if "shard_count" not in extra:
        return ""
    parts = [f"{extra['shard_count']} weights file{'s' if extra['shard_count'] != 1 else ''}, "
             f"{_fmt_bytes(extra['bytes_written'])}"]  # fmt: skip
    if extra.get("deduplicated_tensors"):
        parts.append(
            f"{extra['deduplicated_tensors']} tensors deduplicated ({_fmt_bytes(extra['deduplicated_bytes'])})"
        )
    if extra.get("externalized_tensors"):
        parts.append(f"{extra['externalized_tensors']} tensors externalized")
    moved = extra.get("bytes_by_method") or {}
    if moved:
        parts.append("moved by " + ", ".join(f"{name} {_fmt_bytes(n)}" for name, n in moved.items()))
    if extra.get("clone_eligible_bytes"):
        parts.append(f"{_fmt_bytes(extra['clone_eligible_bytes'])} clone-eligible")
    return "; ".join(parts)


def _group_title(group: str, info: dict[str, Any]) -> str:
    family = _family(group)
    if family == "align":
        return (f"Re-alignment at 4096, {info['shape']} tensors: {info['tensor_count']} x "
                f"{_fmt_bytes(info['tensor_bytes'])} in {info['source_files']} source file(s)")  # fmt: skip
    if family == "chunk-sizes":
        return f"Streaming re-alignment by chunk size, {info['shape']} tensors: {_shape_label(info)}"
    if family == "shared-save":
        return f"Shared save: {info['reused_bytes'] / MIB:,.0f} MiB reused + {info['new_bytes'] / MIB:g} MiB new"
    if family == "delayed":
        return f"DelayedInitializer, one {info['tensor_bytes'] / MIB:g} MiB float32 tensor (construct + first run)"
    if family == "dedup":
        duplicates = 1 - info["unique_bytes"] / info["payload_bytes"]
        return f"Dedup, {_shape_label(info)} in one file, {duplicates:.0%} duplicate bytes (issue 11)"
    if family == "shards":
        return f"Shards of at most {_fmt_bytes(info['max_shard_size'])} vs one file, {_shape_label(info)} (issue 11)"
    if family == "verify":
        return (f"verify: two models of {_shape_label(info)} (unaligned source vs aligned copy) vs reading both "
                "(issue 11)")  # fmt: skip
    if family == "externalize":
        return (f"Inline single-file model ({info['file_bytes'] / MIB:,.0f} MiB .onnx, {_shape_label(info)} inline) "
                f"to aligned external data (issue 12)")  # fmt: skip
    if family == "in-place":
        return (f"Inline single-file model ({info['file_bytes'] / MIB:,.0f} MiB .onnx) externalized onto itself "
                "(src == dst) vs into a fresh folder (issue 25)")  # fmt: skip
    if family == "reflink":
        return f"Loop-mounted XFS with reflink: re-aligning {_shape_label(info)} (issue 13)"
    if family == "node-count":
        return f"undelay vs delay, one graph of {info['nodes']:,} tensors of {info['tensor_bytes']} bytes (issue 19)"
    if family == "safetensors":
        return f"Safetensors output at 4096, {info['shape']} tensors: {_shape_label(info)} (issue 21)"
    if family == "link":
        return f"link_external_data to a safetensors checkpoint of {_shape_label(info)} (issue 21)"
    if family == "family":
        return (f"A family of {info['members']} models x {_fmt_bytes(info['member_bytes'])} sharing "
                f"{info['shared_fraction']:.0%} of their weights: one set of weights vs each alone "
                "(issue 28)")  # fmt: skip
    if family == "inline-readers":
        return (f"verify and inspect of inline single-file models ({info['file_bytes'] / MIB:,.0f} MiB .onnx, "
                f"{_shape_label(info)} inline) (issue 29)")  # fmt: skip
    if family == "guard":
        return (f"Rule 1 of the writer contract: a 64-byte re-alignment below a {_fmt_bytes(info['ancestor_bytes'])} "
                ".onnx, by what holds its bulk (issue 38)")  # fmt: skip
    if family == "metadata":
        return (f"Per-tensor cost: align and verify of {info['tensor_count']:,} external tensors of "
                f"{info['tensor_bytes']} bytes in one file vs onnx.load of the metadata (issue 43)")  # fmt: skip
    if family == "startup":
        return ("CLI start-up: the whole fresh process, wall time and peak RSS (Δ: above the bare interpreter) "
                "(issues 29 and 42)")  # fmt: skip
    if family == "evaluator-int4":
        return (f"Lazy evaluation of one int4 weight, {info['weight_bytes'] / MIB:,.0f} MiB packed (construct + first "
                "run) (issue 40)")  # fmt: skip
    if family == "evaluator-bfloat16":
        return (f"Lazy evaluation of bfloat16 weights: {info['tensors']} tensors, {info['weight_bytes'] / MIB:,.0f} "
                "MiB (construct + first run) (issue 27)")  # fmt: skip
    if family == "evaluator":
        return (f"Lazy evaluation: MLP of {info['layers']} x (MatMul {info['width']}x{info['width']} + Add), "
                f"{info['weight_bytes'] / MIB:,.0f} MiB of weights (construct + first run)")  # fmt: skip
    raise KeyError(f"the report has no title for the benchmark group {group!r}: add one to _group_title")


def write_markdown(results: dict[str, dict[str, dict[str, Any]]], targets: list[Target], path: Path,
                   commands: list[str], machine: dict[str, str]) -> None:  # fmt: skip
    lines = [
        "# onnx_light_ref benchmark results",
        "",
        "Commands: " + ", ".join(f"`{command}`" for command in commands) + "  ",
        f"Machine: {machine['cpu']}, {machine['memory']}, disk {machine['disk']}, Linux {machine['kernel']}, "
        f"Python {machine['python']} ({machine['versions']}). Shared and noisy: every comparison runs its methods "
        "interleaved in fresh child processes and reports medians; compare ratios, not absolute times.  ",
        "Time: the operation only, inside the child (start-up and imports excluded); sources warm in the page cache; "
        "a fresh destination and `os.sync()` before every run. Peak RSS Δ: child `VmHWM` after the operation minus "
        "`VmHWM` after its imports and preparation.",
        "",
        "## Targets (issues 6, 11, 12, 13)",
        "",
        "Targets without a prefix are issue 6's; `#N` marks the issue that states the target.",
        "",
        "| target | size | measured | target | result | numbers |",
        "|---|---|---|---|---|---|",
    ]
    for target in targets:
        op = "≤" if target.at_most else "≥"
        measured = "-" if math.isnan(target.measured) else f"{target.measured:.2f}"
        lines.append(f"| {target.name} | {target.size} | {measured} | {op} {target.limit:g} | {target.verdict} | "
                     f"{target.detail} |")  # fmt: skip
    for size in sorted(results, key=_size_key):
        lines += ["", f"## Size {size}"]
        for group, info in sorted(results[size].items()):
            lines += ["", *_group_section(group, info)]
    path.write_text("\n".join(lines) + "\n")


def _group_section(group: str, info: dict[str, Any]) -> list[str]:
    """A group's title and table; one the report cannot render still keeps its measurements (a 13-minute run must
    never end without its results because one group is new to the report)."""
    try:
        return [f"### {_group_title(group, info)}", "", *_group_table(group, info)]
    except Exception as exc:
        summary = json.dumps(info.get("summary", {}), indent=1, sort_keys=True, default=str)
        return [f"### {group} (not rendered: {exc})", "", "```json", summary, "```"]


def check_group(group: str, info: dict[str, Any]) -> None:
    """Raise unless the report can render ``group`` and evaluates a target with it: a title, a reference method
    measured (or reported unavailable), labels for every method, and at least one target measured from it alone,
    with no target section failing on it. Every benchmark calls it (``benchmarks/conftest.py``), also when a
    contender is unavailable, so the tiny-size run in the test suite catches a group the report does not know.

    Raises:
        AssertionError: what is missing.
    """
    family = _family(group)
    assert family in _LABELS and family in _REFERENCE_METHOD, f"benchmark group {group!r}: no labels or reference"
    missing = sorted(set(info["summary"]) - set(info.get("labels") or _LABELS[family]))
    assert not missing, f"benchmark group {group!r}: no label for {missing}"
    reference = _REFERENCE_METHOD[family]
    assert reference in info["summary"] or reference in info.get("skipped", {}), (
        f"benchmark group {group!r}: its reference {reference!r} was not measured"
    )
    try:
        _group_title(group, info)
        _group_table(group, info)
    except Exception as exc:
        raise AssertionError(f"benchmark group {group!r} cannot be rendered: {type(exc).__name__}: {exc}") from exc
    at_reference_size = {f"{_REFERENCE_SIZE // GIB}G": {group: info}}  # some targets are judged there only
    targets = evaluate_targets(at_reference_size)
    failed = [f"{t.name} ({t.detail})" for t in targets if t.name.endswith(": not evaluated")]
    assert not failed, f"benchmark group {group!r}: target sections failed on it: {failed}"
    measured = [t for t in targets if not math.isnan(t.measured)]
    assert measured, f"benchmark group {group!r}: no target is measured from it (add one to evaluate_targets)"


# ---------------------------------------------------------------------------------------------------------------------
# Chart


def _legend(ax: Any) -> None:
    """A legend when the panel has labelled data (a partial run, ``-k``, may leave a panel empty)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def write_chart(results: dict[str, dict[str, dict[str, Any]]], path: Path, targets: list[Target] | None = None) -> bool:
    """Draw the chart into ``path``; False (nothing written) when matplotlib, from the bench extra, is missing."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = next((s for s in results if _size_key(s) == _REFERENCE_SIZE), max(results, key=_size_key))
    groups = results[size]
    fig, grid = plt.subplots(3, 3, figsize=(18, 16), gridspec_kw={"height_ratios": [1, 1, 1.3]})
    for ax in grid[2]:
        ax.remove()
    axes = grid[:2]
    _targets_panel(fig.add_subplot(3, 1, 3), [t for t in targets or [] if t.size == size])
    fig.suptitle(f"onnx_light_ref benchmarks ({size}; medians of interleaved fresh-process runs)")

    align_methods = list(_LABELS["align"])
    panels = ((axes[0][0], "seconds", "Re-alignment time (s)", False),
              (axes[0][1], "delta_mib", "Re-alignment peak RSS above baseline (MiB, log)", True))  # fmt: skip
    for ax, key, title, log in panels:
        width = 0.38
        for offset, shape in ((-width / 2, "large"), (width / 2, "small")):
            info = groups.get(f"align-{shape}")
            if info is None:
                continue
            values = [max(_get(info, m, key), 0.05) if log else _get(info, m, key) for m in align_methods]
            label = f"{shape}: {_shape_label(info)}"
            ax.bar([i + offset for i in range(len(align_methods))], values, width, label=label)
        ax.set_xticks(range(len(align_methods)), align_methods, rotation=30, ha="right")
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        _legend(ax)

    def bars(ax: Any, group: str, key: str, title: str, phase: str | None = None, scale: float = 1.0) -> None:
        info = groups.get(group)
        if info is None:
            ax.set_title(f"{title}: not measured")
            return
        methods = [m for m in _LABELS[group] if m in info["summary"]]
        values = [_get(info, m, key, phase if m in ("file", "cpu") or group == "evaluator" else None) * scale
                  for m in methods]  # fmt: skip
        ax.bar(methods, values, color="tab:green")
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=20)

    bars(axes[0][2], "shared-save", "seconds", "Shared save time (ms)", scale=1e3)
    methods = list(_LABELS["chunk-sizes"])
    width = 0.38
    for offset, shape in ((-width / 2, "large"), (width / 2, "small")):
        chunks = groups.get(f"chunk-sizes-{shape}")
        if chunks is not None:
            label = f"{shape}: {_shape_label(chunks)}"
            values = [_get(chunks, m) for m in methods]
            axes[1][0].bar([i + offset for i in range(len(methods))], values, width, label=label)
    axes[1][0].set_xticks(range(len(methods)), [m.split("_")[1] for m in methods])
    axes[1][0].set_title("Streaming time by chunk size (s)")
    _legend(axes[1][0])
    bars(axes[1][1], "delayed", "seconds", "DelayedInitializer run vs np.fromfile (ms)", phase="run", scale=1e3)

    evaluator = groups.get("evaluator")
    ax = axes[1][2]
    if evaluator is not None:
        methods = [m for m in _LABELS["evaluator"] if m in evaluator["summary"]]
        width = 0.38
        construct = [_get(evaluator, m, "delta_mib", "construct") for m in methods]
        run = [_get(evaluator, m, "delta_mib") for m in methods]
        ax.bar([i - width / 2 for i in range(len(methods))], construct, width, label="after construction")
        ax.bar([i + width / 2 for i in range(len(methods))], run, width, label="after first run")
        ax.axhline(evaluator["weight_bytes"] / MIB, color="black", linestyle="--", label="weights")
        ax.set_xticks(range(len(methods)), methods)
        ax.set_title("Evaluator peak RSS above baseline (MiB)")
        _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def _targets_panel(ax: Any, targets: list[Target]) -> None:
    """Every target as measured / limit (log scale): below the line passes for "at most" targets."""
    shown = [t for t in targets if not math.isnan(t.measured) and t.limit > 0]
    if not shown:
        ax.set_title("Targets: none measured at this size")
        return
    values = [max(t.measured, 1e-3) / t.limit if t.at_most else t.limit / max(t.measured, 1e-3) for t in shown]
    colors = ["tab:green" if t.passed else "tab:red" for t in shown]
    ax.barh(range(len(shown)), values, color=colors)
    ax.axvline(1.0, color="black", linestyle="--")
    ax.set_xscale("log")
    ax.set_yticks(range(len(shown)), [t.name[:95] for t in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_title("Targets: measured / limit (≤ 1 passes; 'at least' targets inverted)")


# ---------------------------------------------------------------------------------------------------------------------
# Running


def _run_suite(size: str, rounds: int | None, keyword: str | None, out: Path) -> tuple[Path, int]:
    """Run the suite at ``size``; return the JSON it wrote and pytest's exit status.

    A failed test (an assertion on the written bytes, a child that crashed) still leaves pytest-benchmark's JSON with
    every other comparison: the report is written from it, and the caller exits with pytest's status afterwards.
    """
    total = parse_size(size)
    free = shutil.disk_usage(tempfile.gettempdir()).free
    # Sources of every scenario (both align shapes, dedup, aligned copy, inline, the evaluator models), the loop XFS
    # image (3 x total) and one destination at a time (the > 2 GiB externalize writes 2.25 GiB at 1G and above).
    need = 10 * total + (3 * GIB if total >= GIB else 0)
    if free < need:
        raise SystemExit(f"not enough free disk for a {size} run: {free / GIB:.1f} GiB free, need {need / GIB:.1f}.")
    raw = out / f"raw-{size}.json"
    raw.unlink(missing_ok=True)  # a failed run must not report an older run's numbers as its own
    # A private basetemp: other pytest runs on the machine (same user) prune old numbered temp folders, and the
    # GiB-sized models must not sit where another run might delete them, nor linger afterwards. A fresh name per run:
    # pytest empties its basetemp first, and two runs at once (the report's own test, a user's run) must not share it.
    basetemp = Path(tempfile.mkdtemp(prefix=f"onnx-light-ref-bench-{size}-"))
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider", "--benchmark-enable",
           f"--benchmark-json={raw}", f"--basetemp={basetemp}"]  # fmt: skip
    if keyword is None and total > _REFERENCE_SIZE:
        keyword = "chunk_sizes"  # above 1 GiB only the RSS target is stated
    if keyword:
        cmd += ["-k", keyword]
    env = dict(os.environ)
    env[ENV_SIZE] = size
    if rounds is not None:
        env["ONNX_LIGHT_REF_BENCH_ROUNDS"] = str(rounds)
    printable = f"{ENV_SIZE}={size} " + " ".join(["python", *cmd[1:]])
    print(f"running: {printable}", flush=True)
    start = time.perf_counter()
    completed = subprocess.run(cmd, cwd=_REPO_ROOT, env=env, check=False)
    shutil.rmtree(basetemp, ignore_errors=True)
    print(f"suite finished in {time.perf_counter() - start:.0f} s (exit {completed.returncode})", flush=True)
    if completed.returncode != 0 and not raw.exists():
        raise SystemExit(completed.returncode)
    if completed.returncode != 0:
        print(f"the suite failed (exit {completed.returncode}): reporting what it measured", flush=True)
    return raw, completed.returncode


def _report_command(args: argparse.Namespace) -> str:
    parts = ["python -m benchmarks.report", f"--size {args.size}"]
    if args.rounds is not None:
        parts.append(f"--rounds {args.rounds}")
    if args.keyword:
        parts.append(f"-k '{args.keyword}'")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1G", help="model size of the run: tiny, 512M, 1G (default), 4G")
    parser.add_argument("--json", nargs="+", type=Path, help="report from these pytest-benchmark JSON files; no run")
    parser.add_argument(
        "--rounds", type=int, help="interleaved rounds per comparison (default 7 from 256 MiB up, 1 below)"
    )
    parser.add_argument("-k", dest="keyword", help="pytest -k expression to run a subset")
    parser.add_argument("--out", type=Path, default=_RESULTS, help="output folder (default benchmarks/results)")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    status = 0
    if args.json:
        paths = args.json
    else:
        raw, status = _run_suite(args.size, args.rounds, args.keyword, args.out)
        annotate(raw, _report_command(args))
        paths = sorted(args.out.glob("raw-*.json"))
    commands = run_commands(paths) or ["python -m benchmarks.report --json " + " ".join(str(p) for p in paths)]
    results = load_results(paths)
    if not results:
        raise SystemExit(f"no benchmark results in {[str(p) for p in paths]}")
    targets = evaluate_targets(results)
    write_markdown(results, targets, args.out / "results.md", commands, _machine())
    try:
        charted: bool | None = write_chart(results, args.out / "results.png", targets)
    except Exception as exc:  # the table is written: a chart that fails must not hide it
        charted = None
        chart_error = f"{type(exc).__name__}: {exc}"
    print((args.out / "results.md").read_text())
    if charted is None:
        print(f"the chart could not be drawn ({chart_error}); results.md holds every measurement", flush=True)
    elif not charted:
        print("matplotlib is missing: install the bench extra for the chart (pip install '.[bench]')", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
