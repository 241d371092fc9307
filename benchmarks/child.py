"""Run one measured operation in a fresh process and report its wall time and peak memory as one JSON line.

Usage: ``python -m benchmarks.child <scenario> '<args json>'`` (the parent side is :func:`run_in_child`).

Why a fresh process: peak memory is a high-water mark. Measured in the pytest process it would include everything
the suite did before; a forked child inherits the parent's mark in ``ru_maxrss``. A child that ``exec``s starts from
zero, and ``VmHWM`` in ``/proc/self/status`` is read twice: after importing and preparing everything the scenario
needs (the *baseline*), and after each phase of the operation. The reported delta (peak - baseline) is what the
operation itself added. Wall time is ``time.perf_counter`` around the operation only (interpreter start-up, imports
and preparation are excluded).

A scenario is a function ``prepare(args) -> list[(phase name, callable)]``: preparation runs before the baseline;
each phase callable receives the previous phase's return value (``None`` for the first).

Profiling: with ``ONNX_LIGHT_REF_BENCH_PROFILE=<folder>`` in the environment, each phase runs under ``cProfile`` and
its stats go to ``<folder>/<scenario>-<phase>-<pid>.prof`` (read them with ``python -m pstats``). The profiler slows
Python code down, so the times of such a run are not comparable with others.

This module never prints anything but the result line on stdout; a scenario whose API is missing (an op still being
written) reports ``{"skipped": reason}`` instead of failing, so the suite runs before and after it lands.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

__all__ = ["ENV_PROFILE", "RESULT_PREFIX", "ScenarioUnavailableError", "run_in_child"]

RESULT_PREFIX = "BENCH_RESULT "
ENV_PROFILE = "ONNX_LIGHT_REF_BENCH_PROFILE"
_REPO_ROOT = Path(__file__).resolve().parents[1]
# Nothing in the suite should take this long at 4 GiB on a slow shared disk; a hung child must not hang the run.
_CHILD_TIMEOUT_S = 1800

Phase = tuple[str, Callable[[Any], Any]]


class ScenarioUnavailableError(Exception):
    """The scenario's API is not available (yet); the parent turns this into ``pytest.skip``."""


# ---------------------------------------------------------------------------------------------------------------------
# Parent side


def run_in_child(scenario: str, args: dict[str, Any], *, fork: bool = False) -> dict[str, Any]:
    """Run ``scenario`` in a fresh interpreter and return its result record (raises on failure).

    ``fork=True`` (the untimed tiny-size run, which only proves every scenario works) runs it in a fork of this
    process instead: the same scenario code, without a second of interpreter start-up and imports per child (about
    80 children: a quarter of the test command's CPU). Its figures are meaningless (the fork inherits this process's
    memory high-water mark); so are the tiny run's anyway.
    """
    if fork:
        return _run_forked(scenario, args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.child", scenario, json.dumps(args)],
        cwd=_REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_S,
        check=False,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(
            f"benchmark child {scenario!r} failed (exit {completed.returncode}) with args {args}:\n"
            f"{completed.stderr[-4000:]}"
        )
    record = json.loads(lines[-1][len(RESULT_PREFIX) :])
    if "skipped" in record:
        raise ScenarioUnavailableError(record["skipped"])
    return record


def _run_forked(scenario: str, args: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_in_child` in a forked child: the record (or the traceback) comes back through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller (pytest)
        status = 1
        try:
            os.close(read_end)
            os.chdir(_REPO_ROOT)  # where the exec'd child runs
            text = json.dumps(_record(scenario, args))
            status = 0
        except BaseException:
            text = traceback.format_exc()
        finally:
            with os.fdopen(write_end, "w") as pipe:
                pipe.write(text)
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"benchmark child {scenario!r} failed (forked) with args {args}:\n{text[-4000:]}")
    record = json.loads(text)
    if "skipped" in record:
        raise ScenarioUnavailableError(record["skipped"])
    return cast("dict[str, Any]", record)


# ---------------------------------------------------------------------------------------------------------------------
# Child side: measurement


def _status_kib(*fields: str) -> dict[str, int]:
    """Selected ``/proc/self/status`` fields (``VmHWM``, ``VmRSS``, ``RssAnon``, ``RssFile``) in KiB."""
    values: dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in fields:
                values[key] = int(rest.split()[0])
    return values


def _mib(kib: int) -> float:
    return round(kib / 1024, 2)


def _profiled(scenario: str, name: str, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``call`` under cProfile when :data:`ENV_PROFILE` names a folder (stats dumped there), else ``call`` itself."""
    folder = os.environ.get(ENV_PROFILE)
    if not folder:
        return call

    def run(value: Any) -> Any:
        import cProfile

        profiler = cProfile.Profile()
        try:
            return profiler.runcall(call, value)
        finally:
            os.makedirs(folder, exist_ok=True)
            profiler.dump_stats(os.path.join(folder, f"{scenario}-{name}-{os.getpid()}.prof"))

    return run


def _measure(phases: list[Phase]) -> dict[str, Any]:
    gc.collect()
    base = _status_kib("VmHWM", "VmRSS")
    cpu_start = os.times()
    record: dict[str, Any] = {"baseline_hwm_mib": _mib(base["VmHWM"]), "baseline_rss_mib": _mib(base["VmRSS"])}
    phase_records: dict[str, dict[str, float]] = {}
    value: Any = None
    total = 0.0
    for name, call in phases:
        start = time.perf_counter()
        value = call(value)
        seconds = time.perf_counter() - start
        total += seconds
        hwm = _status_kib("VmHWM")["VmHWM"]
        phase_records[name] = {"seconds": seconds, "peak_mib": _mib(hwm), "delta_mib": _mib(hwm - base["VmHWM"])}
    cpu_end = os.times()
    end = _status_kib("VmHWM", "RssAnon", "RssFile")
    record.update(
        seconds=total,
        peak_mib=_mib(end["VmHWM"]),
        delta_mib=_mib(end["VmHWM"] - base["VmHWM"]),
        rss_anon_end_mib=_mib(end["RssAnon"]),
        rss_file_end_mib=_mib(end["RssFile"]),
        user_s=cpu_end.user - cpu_start.user,
        sys_s=cpu_end.system - cpu_start.system,
        phases=phase_records,
    )
    if isinstance(value, dict):
        record["extra"] = value
    return record


# ---------------------------------------------------------------------------------------------------------------------
# Child side: scenarios. Each imports what it needs *before* returning its phases, so imports stay in the baseline.


def _fsync_file_and_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# Keyword options of the aligners that some scenarios pass (layout options of issues 11-13). An option that the
# installed aligner does not accept makes the scenario *unavailable* with that reason, not a failure, so the suite
# runs before and after each feature lands.
_ALIGN_OPTIONS = (
    "align_threshold",
    "max_shard_size",
    "dedup",
    "size_threshold",
    "durable",
    "weights_format",
    "shard_names",
)


def _aligner(name: str, options: dict[str, Any]) -> Callable[..., Any]:
    import inspect

    import onnx_light_ref.io as io

    function = getattr(io, name, None)
    if function is None:
        raise ScenarioUnavailableError(f"onnx_light_ref.io.{name} is not available")
    accepted = inspect.signature(function).parameters
    missing = [key for key in options if key not in accepted]
    if missing:
        raise ScenarioUnavailableError(f"{name} does not accept {', '.join(missing)} yet")
    return cast("Callable[..., Any]", function)


def _weights_files(dst_onnx: str) -> dict[str, int]:
    """Every file next to ``dst_onnx`` except the ``.onnx`` itself (destination folders are fresh), with its size."""
    folder = os.path.dirname(dst_onnx)
    return {
        name: os.path.getsize(os.path.join(folder, name))
        for name in sorted(os.listdir(folder))
        if os.path.join(folder, name) != dst_onnx and os.path.isfile(os.path.join(folder, name))
    }


def _statvfs_free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


# Counters of ``AlignResult`` worth reporting (issues 11-13); absent attributes (an older aligner) are left out.
_ALIGN_RESULT_INTS = (
    "payload_bytes",
    "tensors",
    "deduplicated_tensors",
    "deduplicated_bytes",
    "externalized_tensors",
    "clone_eligible_bytes",
)


def _align_result(args: dict[str, Any], written: Any, free_before: int | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"bytes_written": int(written)}
    if args.get("list_files", False):
        extra["files"] = _weights_files(args["dst"])
    for attribute in _ALIGN_RESULT_INTS:
        if hasattr(written, attribute):
            extra[attribute] = int(getattr(written, attribute))
    if getattr(written, "unaligned_tensors", None) is not None:
        extra["unaligned_tensors"] = len(written.unaligned_tensors)
    if hasattr(written, "copy_methods"):
        extra["copy_methods"] = sorted(written.copy_methods)
    if hasattr(written, "bytes_by_method"):
        extra["bytes_by_method"] = {method: int(n) for method, n in sorted(written.bytes_by_method.items())}
    if hasattr(written, "weights_files"):
        # The aligner's own list (shard order), checked against what is on disk by the tests; names only, the
        # folders are fresh per run.
        extra["weights_files"] = [os.path.basename(path) for path in written.weights_files]
        extra["shard_count"] = len(written.weights_files)
    if free_before is not None:
        # New blocks the operation took on the destination filesystem (reflinks share extents: close to zero).
        extra["fs_new_bytes"] = free_before - _statvfs_free(os.path.dirname(args["dst"]))
    return extra


def _align_streaming(args: dict[str, Any]) -> list[Phase]:
    options = {key: args[key] for key in _ALIGN_OPTIONS if key in args}
    align = _aligner("align_external_data_streaming", options)

    def run(_: Any) -> dict[str, Any]:
        free_before = _statvfs_free(os.path.dirname(args["dst"])) if args.get("measure_fs") else None
        written = align(args["src"], args["dst"], alignment=args["alignment"], chunk_size=args["chunk_size"], **options)
        return _align_result(args, written, free_before)

    return [("align", run)]


def _align_below(args: dict[str, Any]) -> list[Phase]:
    """``align_streaming`` into ``dst``, a fresh ``{fresh}/a/b/model.onnx``, with ``ancestor`` (when given) linked
    as ``{fresh}/ancestor.onnx``: two folders above the destination's, where rule 1 of the writer contract reads it
    (issue 38). The link is made before the baseline."""
    align = _aligner("align_external_data_streaming", {})
    os.makedirs(os.path.dirname(args["dst"]), exist_ok=True)
    if args.get("ancestor"):
        os.symlink(args["ancestor"], os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(args["dst"]))),
                                                  "ancestor.onnx"))  # fmt: skip

    def run(_: Any) -> dict[str, Any]:
        written = align(args["src"], args["dst"], alignment=args["alignment"], chunk_size=args["chunk_size"])
        return _align_result(args, written, None)

    return [("align", run)]


def _align_in_memory(args: dict[str, Any]) -> list[Phase]:
    options = {key: args[key] for key in _ALIGN_OPTIONS if key in args}
    align = _aligner("align_external_data_in_memory", options)

    def run(_: Any) -> dict[str, Any]:
        return _align_result(args, align(args["src"], args["dst"], alignment=args["alignment"], **options), None)

    return [("align", run)]


def _align_in_place(args: dict[str, Any]) -> list[Phase]:
    """Externalize an inline model onto itself (``src == dst`` with ``size_threshold``): the source is copied to the
    destination during preparation (before the baseline), then aligned in place, so the publication reads the
    previous ``.onnx`` it replaces (its references), which is the source."""
    import shutil

    options = {key: args[key] for key in _ALIGN_OPTIONS if key in args}
    align = _aligner("align_external_data_streaming", options)
    shutil.copyfile(args["src"], args["dst"])

    def run(_: Any) -> dict[str, Any]:
        written = align(args["dst"], args["dst"], alignment=args["alignment"], chunk_size=args["chunk_size"], **options)
        return _align_result(args, written, None)

    return [("align", run)]


def _onnx_load_save(args: dict[str, Any]) -> list[Phase]:
    import onnx

    def load(_: Any) -> onnx.ModelProto:
        return onnx.load(args["src"], load_external_data=True)

    def save(model: onnx.ModelProto) -> dict[str, Any]:
        # onnx's writer has no alignment option: tensors are appended densely. It does not fsync either.
        onnx.save_model(
            model, args["dst"], save_as_external_data=True, all_tensors_to_one_file=True, location=args["location"],
            size_threshold=0,
        )  # fmt: skip
        return {"bytes_written": os.path.getsize(os.path.join(os.path.dirname(args["dst"]), args["location"]))}

    return [("load", load), ("save", save)]


def _onnx_load_metadata(args: dict[str, Any]) -> list[Phase]:
    """``onnx.load`` of the model without its external data: the floor of any per-tensor work on the metadata."""
    import onnx

    def run(_: Any) -> dict[str, Any]:
        model = onnx.load(args["src"], load_external_data=False)
        return {"tensors": len(model.graph.initializer)}

    return [("load", run)]


def _onnx_ir_save(args: dict[str, Any]) -> list[Phase]:
    import onnx_ir as ir

    def load(_: Any) -> Any:
        return ir.load(args["src"])  # lazy: external tensors stay on disk (inline ones are parsed with the model)

    def save(model: Any) -> dict[str, Any]:
        # align_threshold=0 by default: align every tensor like ours (onnx-ir's default aligns only tensors >= 1 MiB).
        ir.save(
            model, args["dst"], external_data=args["location"], size_threshold_bytes=args.get("size_threshold", 0),
            alignment=args["alignment"], align_threshold=args.get("align_threshold", 0),
            max_shard_size_bytes=args.get("max_shard_size"),
        )  # fmt: skip
        # Shards are named by onnx-ir (``out-00001-of-00004.onnx.data``): count every file of the fresh folder.
        files = _weights_files(args["dst"])
        if args["fsync"]:
            # onnx-ir does not fsync; the fsync variant adds what ours does before publishing (files, then folder).
            for name in files:
                _fsync_file_and_dir(os.path.join(os.path.dirname(args["dst"]), name))
        return {"bytes_written": sum(files.values()), "files": files}

    return [("load", load), ("save", save)]


def _onnx_ir_save_safetensors(args: dict[str, Any]) -> list[Phase]:
    """onnx-ir's ``ir.save_safetensors``: every shard materialized in memory (``tensor.tobytes()``), no fsync."""
    import onnx_ir as ir

    def load(_: Any) -> Any:
        return ir.load(args["src"])

    def save(model: Any) -> dict[str, Any]:
        ir.save_safetensors(model, args["dst"], size_threshold_bytes=0, max_shard_size_bytes=args.get("max_shard_size"))
        files = _weights_files(args["dst"])
        if args["fsync"]:
            for name in files:
                _fsync_file_and_dir(os.path.join(os.path.dirname(args["dst"]), name))
        return {"bytes_written": sum(files.values()), "files": files}

    return [("load", load), ("save", save)]


def _link(args: dict[str, Any]) -> list[Phase]:
    """``link_external_data`` of a model to a checkpoint in the destination's folder: bytes written = new files."""
    from onnx_light_ref.io import link_external_data

    def run(_: Any) -> dict[str, Any]:
        result = link_external_data(args["src"], args["checkpoint"], args["dst"], durable=args.get("durable", True))
        written = os.path.getsize(args["dst"]) + sum(os.path.getsize(p) for p in result.weights_files)
        return {
            "linked_tensors": result.linked_tensors,
            "linked_bytes": result.linked_bytes,
            "written_tensors": result.written_tensors,
            "bytes_written": written,
        }

    return [("link", run)]


def _copy_file_range(args: dict[str, Any]) -> list[Phase]:
    def run(_: Any) -> dict[str, Any]:
        dst = os.open(args["dst"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        written = 0
        try:
            for path in args["srcs"]:
                src = os.open(path, os.O_RDONLY)
                try:
                    remaining = os.fstat(src).st_size
                    position = 0
                    while remaining:
                        moved = os.copy_file_range(src, dst, min(remaining, 1 << 30), position, written)
                        if moved == 0:
                            raise OSError(f"{path} ended early")
                        position += moved
                        written += moved
                        remaining -= moved
                finally:
                    os.close(src)
            if args["fsync"]:
                os.fsync(dst)
        finally:
            os.close(dst)
        if args["fsync"]:
            _fsync_file_and_dir(args["dst"])  # the folder too, as ours does when it publishes
        return {"bytes_written": written}

    return [("copy", run)]


def _copy_file_range_ranges(args: dict[str, Any]) -> list[Phase]:
    """The limit for the job itself: the same source ranges to the same 4096-aligned offsets, no planning, no checks.

    Layout computed here from the ``.onnx`` (onnx's parser, not ours): tensors in declaration order, each at the
    next multiple of ``alignment``. Unaligned source offsets are what makes this slower than a whole-file copy: the
    kernel then copies partial pages. ``args["ranges"]`` (``[[path, offset, length], ...]``) gives the ranges
    instead: the inline payloads of a single-file model, whose offsets the generator knows (parsing a 1 GiB
    ``.onnx`` here would load it, and one over 2 GiB cannot be parsed by protobuf at all).
    """
    ranges: list[tuple[str, int, int]]
    if "ranges" in args:
        ranges = [(str(path), int(offset), int(length)) for path, offset, length in args["ranges"]]
    else:
        ranges = _external_ranges(args["src"])
    step = args["alignment"]

    def run(_: Any) -> dict[str, Any]:
        dst = os.open(args["dst"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fds: dict[str, int] = {}
        cursor = 0
        try:
            for path, offset, length in ranges:
                src = fds.get(path)
                if src is None:
                    src = fds[path] = os.open(path, os.O_RDONLY)
                cursor = -(-cursor // step) * step
                done = 0
                while done < length:
                    moved = os.copy_file_range(src, dst, length - done, offset + done, cursor + done)
                    if moved == 0:
                        raise OSError(f"{path} ended early")
                    done += moved
                cursor += length
            os.fsync(dst)
        finally:
            os.close(dst)
            for fd in fds.values():
                os.close(fd)
        _fsync_file_and_dir(args["dst"])
        return {"bytes_written": cursor}

    return [("copy", run)]


def _external_ranges(onnx_path: str) -> list[tuple[str, int, int]]:
    """``(file, offset, length)`` of every external initializer of a generated model, in declaration order."""
    import onnx

    model = onnx.load(onnx_path, load_external_data=False)
    folder = os.path.dirname(onnx_path)
    ranges = []
    for tensor in model.graph.initializer:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        ranges.append((os.path.join(folder, entries["location"]), int(entries["offset"]), int(entries["length"])))
    return ranges


def _verify(args: dict[str, Any]) -> list[Phase]:
    try:
        from onnx_light_ref.io._verify import verify_models
    except ImportError as exc:
        raise ScenarioUnavailableError(f"onnx_light_ref.io._verify.verify_models is not available: {exc}") from None

    def run(_: Any) -> dict[str, Any]:
        result = verify_models(args["a"], args["b"], chunk_size=args["chunk_size"])
        return {"equal": bool(result.equal), "bytes_compared": int(result.bytes_compared)}

    return [("verify", run)]


def _inspect(args: dict[str, Any]) -> list[Phase]:
    """``build_layout_report`` of one model (what ``onnx-light-ref inspect`` prints), metadata only."""
    from onnx_light_ref.io._layout_report import build_layout_report

    def run(_: Any) -> dict[str, Any]:
        report = build_layout_report(args["model"])
        return {"ok": bool(report.ok), "inline_tensors": int(report.inline_tensors)}

    return [("inspect", run)]


def _read_ranges(args: dict[str, Any]) -> list[Phase]:
    """The limit for verify: read every tensor of both models once, ``chunk_size`` bytes per ``preadv``, one buffer.

    No comparison, no hashing: only the reads verify cannot avoid (both sides, every byte).
    """
    ranges = [item for path in args["models"] for item in _external_ranges(path)]
    buffer = bytearray(args["chunk_size"])

    def run(_: Any) -> dict[str, Any]:
        view = memoryview(buffer)
        fds: dict[str, int] = {}
        total = 0
        try:
            for path, offset, length in ranges:
                fd = fds.get(path)
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY)
                done = 0
                while done < length:
                    got = os.preadv(fd, [view[: min(len(view), length - done)]], offset + done)
                    if got == 0:
                        raise OSError(f"{path} ended early")
                    done += got
                total += length
        finally:
            for fd in fds.values():
                os.close(fd)
        return {"bytes_read": total}

    return [("read", run)]


def _new_head(nbytes: int) -> Any:
    from onnx import TensorProto

    return TensorProto(name="head.weight", data_type=TensorProto.FLOAT, dims=[nbytes // 4], raw_data=os.urandom(nbytes))


def _shared_save(args: dict[str, Any]) -> list[Phase]:
    import onnx

    from onnx_light_ref.io import save_model_with_shared_external_data

    model = onnx.load(args["base"], load_external_data=False)
    model.graph.initializer.append(_new_head(args["new_bytes"]))

    def run(_: Any) -> dict[str, Any]:
        return {"bytes_written": save_model_with_shared_external_data(model, args["dst"], alignment=4096)}

    return [("save", run)]


def _write_alone(args: dict[str, Any]) -> list[Phase]:
    payload = os.urandom(args["new_bytes"])

    def run(_: Any) -> dict[str, Any]:
        fd = os.open(args["dst"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"bytes_written": len(payload)}

    return [("write", run)]


def _write_publish(args: dict[str, Any]) -> list[Phase]:
    """The system calls the writer contract requires of a shared save, alone: the new bytes and a ``.onnx`` (the base
    model's bytes) written to temp names, each fsynced, then the weights renamed in, the folder fsynced (the weights'
    name before the ``.onnx`` that points at it), the ``.onnx`` renamed in, the folder fsynced (the commit made
    durable). No planning, no checks, no lock: the floor of a durable publication of two files."""
    payload = os.urandom(args["new_bytes"])
    with open(args["base"], "rb") as base:
        model = base.read()
    folder = os.path.dirname(args["dst"])

    def write(path: str, data: bytes) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return fd

    def run(_: Any) -> dict[str, Any]:
        weights, onnx_file = write(args["dst"] + ".data.tmp", payload), write(args["dst"] + ".tmp", model)
        for fd in (weights, onnx_file):
            os.fsync(fd)
            os.close(fd)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.rename(args["dst"] + ".data.tmp", args["dst"] + ".data")
            os.fsync(dir_fd)
            os.rename(args["dst"] + ".tmp", args["dst"])
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return {"bytes_written": len(payload)}

    return [("publish", run)]


def _onnx_full_save(args: dict[str, Any]) -> list[Phase]:
    import onnx

    start = time.perf_counter()
    model = onnx.load(args["base"], load_external_data=True)  # the variant, every weight in memory
    load_seconds = time.perf_counter() - start
    model.graph.initializer.append(_new_head(args["new_bytes"]))

    def run(_: Any) -> dict[str, Any]:
        onnx.save_model(
            model, args["dst"], save_as_external_data=True, all_tensors_to_one_file=True, location=args["location"],
            size_threshold=0,
        )  # fmt: skip
        data_path = os.path.join(os.path.dirname(args["dst"]), args["location"])
        return {"bytes_written": os.path.getsize(data_path), "load_seconds_excluded": load_seconds}

    return [("save", run)]


def _delayed_run(args: dict[str, Any]) -> list[Phase]:
    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    try:
        from onnx_light_ref.ops import DelayedInitializer
    except ImportError as exc:
        raise ScenarioUnavailableError(f"onnx_light_ref.ops.DelayedInitializer is not available: {exc}") from None
    if not hasattr(DelayedInitializer, "bind"):
        raise ScenarioUnavailableError("DelayedInitializer.bind is not available yet")
    model = onnx.load(args["model"], load_external_data=False)
    op = DelayedInitializer.bind(os.path.dirname(args["model"]))

    def construct(_: Any) -> Any:
        return ReferenceEvaluator(model, new_ops=[op])

    def run(evaluator: Any) -> dict[str, Any]:
        (y,) = evaluator.run(None, {})
        return {"checksum": float(np.asarray(y[:: max(1, y.size // 4096)], dtype=np.float64).sum()), "nbytes": y.nbytes}

    return [("construct", construct), ("run", run)]


def _np_fromfile(args: dict[str, Any]) -> list[Phase]:
    import numpy as np

    def run(_: Any) -> dict[str, Any]:
        y = np.fromfile(args["path"], dtype=np.float32, count=args["count"], offset=args["offset"])
        return {"checksum": float(np.asarray(y[:: max(1, y.size // 4096)], dtype=np.float64).sum()), "nbytes": y.nbytes}

    return [("read", run)]


def _evaluator(args: dict[str, Any]) -> list[Phase]:
    import numpy as np
    import onnx.reference

    mode = args["mode"]
    if mode == "plain":

        def construct(_: Any) -> Any:
            return onnx.reference.ReferenceEvaluator(args["model"])  # loads every weight from the path

    else:
        try:
            from onnx_light_ref.ops import reference_evaluator
        except ImportError as exc:
            raise ScenarioUnavailableError(f"onnx_light_ref.ops.reference_evaluator is not available: {exc}") from None

        def construct(_: Any) -> Any:
            return reference_evaluator(args["model"], load_device=mode)

    x = np.full((1, args["width"]), 0.5, dtype=np.float32)

    def run(evaluator: Any) -> dict[str, Any]:
        (y,) = evaluator.run(None, {"X": x})
        return {"checksum": float(np.asarray(y, dtype=np.float64).sum())}

    return [("construct", construct), ("run", run)]


def _ort_session(args: dict[str, Any]) -> list[Phase]:
    """An onnxruntime CPU session on ``args["model"]``: its creation, then one run (``x`` of ``args["width"]``)."""
    import numpy as np
    import onnxruntime as ort

    x = np.full((1, args["width"]), 0.5, dtype=np.float32)

    def construct(_: Any) -> Any:
        return ort.InferenceSession(args["model"], providers=["CPUExecutionProvider"])

    def run(session: Any) -> dict[str, Any]:
        (y,) = session.run(None, {"x": x})
        return {"checksum": float(np.asarray(y, dtype=np.float64).sum())}

    return [("construct", construct), ("run", run)]


def _typed_evaluator(args: dict[str, Any]) -> list[Phase]:
    """A model without inputs whose weights are of one element type (bfloat16, int4): onnx's evaluator vs the lazy
    one."""
    import numpy as np
    import onnx.reference

    mode = args["mode"]
    if mode == "plain":

        def construct(_: Any) -> Any:
            return onnx.reference.ReferenceEvaluator(args["model"])

    else:
        try:
            from onnx_light_ref.ops import reference_evaluator
            from onnx_light_ref.ops._dtypes import ALLOWED_DTYPES
        except ImportError as exc:
            raise ScenarioUnavailableError(f"onnx_light_ref.ops.reference_evaluator is not available: {exc}") from None
        if args["data_type"] not in ALLOWED_DTYPES:
            raise ScenarioUnavailableError(f"DelayedInitializer cannot produce element type {args['data_type']} yet")

        def construct(_: Any) -> Any:
            return reference_evaluator(args["model"], load_device=mode)

    def run(evaluator: Any) -> dict[str, Any]:
        outputs = evaluator.run(None, {})
        # The sum of the outputs' bytes: equal when every method holds the same bits (onnx 1.17's structured int4 and
        # bfloat16 dtypes have no float conversion).
        checksum = sum(int(np.ascontiguousarray(o).reshape(-1).view(np.uint8).sum(dtype=np.uint64)) for o in outputs)
        return {"checksum": float(checksum)}

    return [("construct", construct), ("run", run)]


def _undelay(args: dict[str, Any]) -> list[Phase]:
    try:
        from onnx_light_ref.ops import undelay_initializers
    except ImportError as exc:
        raise ScenarioUnavailableError(f"onnx_light_ref.ops.undelay_initializers is not available: {exc}") from None

    def run(_: Any) -> dict[str, Any]:
        written = undelay_initializers(args["model"], args["dst"], alignment=args["alignment"])
        return {"bytes_written": written}

    return [("undelay", run)]


def _delay(args: dict[str, Any]) -> list[Phase]:
    import onnx

    try:
        from onnx_light_ref.ops import delay_initializers
    except ImportError as exc:
        raise ScenarioUnavailableError(f"onnx_light_ref.ops.delay_initializers is not available: {exc}") from None

    def run(_: Any) -> dict[str, Any]:
        model = delay_initializers(args["model"], "file")
        onnx.save_model(model, args["dst"])  # written like undelay's output, so both sides pay for serializing
        delayed = sum(node.op_type == "DelayedInitializer" for node in model.graph.node)
        return {"delayed_nodes": delayed}

    return [("delay", run)]


def _align_models(args: dict[str, Any]) -> list[Phase]:
    """A family of models into one fresh folder over one set of weights (issue 28)."""
    import onnx_light_ref.io as io

    align_models = getattr(io, "align_models", None)
    if align_models is None:
        raise ScenarioUnavailableError("onnx_light_ref.io._align_models is not available")

    def run(_: Any) -> dict[str, Any]:
        written = align_models(
            args["srcs"], args["dst"], alignment=args["alignment"], chunk_size=args["chunk_size"], durable=True
        )
        return {
            "bytes_written": int(written),
            "unique_bytes": written.unique_bytes,
            "separate_bytes": written.separate_bytes,
            "saved_bytes": written.saved_bytes,
            "shared_tensors": len(written.shared_tensors),
            "weights_files": [os.path.basename(path) for path in written.weights_files],
            "copy_methods": sorted(written.copy_methods),
            "bytes_by_method": {method: int(n) for method, n in sorted(written.bytes_by_method.items())},
        }

    return [("align_models", run)]


def _align_each(args: dict[str, Any]) -> list[Phase]:
    """Each member of a family aligned on its own (the streaming aligner once per member, durable)."""
    align = _aligner("align_external_data_streaming", {})

    def run(_: Any) -> dict[str, Any]:
        written = [
            align(src, dst, alignment=args["alignment"], chunk_size=args["chunk_size"]) for src, dst in args["pairs"]
        ]
        return {"bytes_written": sum(int(item) for item in written), "files": len(written)}

    return [("align_each", run)]


_SCENARIOS: dict[str, Callable[[dict[str, Any]], list[Phase]]] = {
    "align_streaming": _align_streaming,
    "align_below": _align_below,
    "align_in_memory": _align_in_memory,
    "align_in_place": _align_in_place,
    "onnx_load_save": _onnx_load_save,
    "onnx_load_metadata": _onnx_load_metadata,
    "onnx_ir_save": _onnx_ir_save,
    "onnx_ir_save_safetensors": _onnx_ir_save_safetensors,
    "link": _link,
    "copy_file_range": _copy_file_range,
    "copy_file_range_ranges": _copy_file_range_ranges,
    "verify": _verify,
    "inspect": _inspect,
    "read_ranges": _read_ranges,
    "shared_save": _shared_save,
    "write_alone": _write_alone,
    "write_publish": _write_publish,
    "onnx_full_save": _onnx_full_save,
    "delayed_run": _delayed_run,
    "np_fromfile": _np_fromfile,
    "evaluator": _evaluator,
    "typed_evaluator": _typed_evaluator,
    "ort_session": _ort_session,
    "undelay": _undelay,
    "delay": _delay,
    "align_models": _align_models,
    "align_each": _align_each,
}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in _SCENARIOS:
        sys.stderr.write(f"usage: python -m benchmarks.child {{{','.join(_SCENARIOS)}}} '<args json>'\n")
        return 2
    sys.stdout.write(RESULT_PREFIX + json.dumps(_record(argv[1], json.loads(argv[2]))) + "\n")
    return 0


def _record(scenario: str, args: dict[str, Any]) -> dict[str, Any]:
    """Prepare ``scenario``, measure its phases, return the result record (``skipped`` when it is unavailable)."""
    try:
        phases = _SCENARIOS[scenario](args)
    except ScenarioUnavailableError as exc:
        return {"scenario": scenario, "skipped": str(exc)}
    return {"scenario": scenario, **_measure([(name, _profiled(scenario, name, call)) for name, call in phases])}


if __name__ == "__main__":
    sys.exit(main(sys.argv))
