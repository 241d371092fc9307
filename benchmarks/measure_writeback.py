"""Writeback overlap, measured: ranges copy + fsync with and without it, against a whole-file copy + fsync.

Not a test (timings are noisy): run by hand, numbers recorded in docs/durability.md.

    python benchmarks/measure_writeback.py [FOLDER] [--rounds 3] [--size-mib 512]

A source of SIZE MiB (random, fsynced) holds 64 tensors back to back at unaligned offsets; each variant copies them
into a fresh destination at 4096-aligned offsets and fsyncs it. The rounds interleave the variants.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from onnx_light_ref.io._plan.ranges import CopyRange
from onnx_light_ref.io._write.copy_engine import RangeCopier

MIB = 1024 * 1024
TENSORS = 64


def make_source(path: str, size: int) -> list[CopyRange]:
    block = os.urandom(64 * MIB)
    with open(path, "wb") as out:
        for start in range(0, size, len(block)):
            out.write(block[: size - start])
        out.flush()
        os.fsync(out.fileno())
    length = size // TENSORS - 100  # unaligned source offsets: every tensor starts 100 bytes earlier than the last
    ranges, dst = [], 0
    for i in range(TENSORS):
        ranges.append(CopyRange(path, i * length, dst, length))
        dst += -(-length // 4096) * 4096
    return ranges


def whole_file(src: str, dst: str, size: int) -> float:
    start = time.perf_counter()
    s, d = os.open(src, os.O_RDONLY), os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    done = 0
    while done < size:
        done += os.copy_file_range(s, d, size - done, done, done)
    os.fsync(d)
    os.close(s)
    os.close(d)
    return time.perf_counter() - start


def ranges_copy(dst: str, ranges: list[CopyRange], durable: bool) -> float:
    start = time.perf_counter()
    d = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    with RangeCopier(d, 4 * MIB, durable=durable) as copier:
        copier.copy(ranges)
    os.fsync(d)
    os.close(d)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", nargs="?", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=512)
    args = parser.parse_args()
    size = args.size_mib * MIB
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        src = os.path.join(folder, "src.bin")
        ranges = make_source(src, size)
        times: dict[str, list[float]] = {
            "whole-file copy_file_range + fsync": [],
            "ranges + fsync": [],
            "ranges + writeback + fsync": [],
        }
        for _ in range(args.rounds):
            for name, values in times.items():
                dst = os.path.join(folder, "dst.bin")
                if name.startswith("whole"):
                    values.append(whole_file(src, dst, size))
                else:
                    values.append(ranges_copy(dst, ranges, durable="writeback" in name))
                os.unlink(dst)
                os.sync()
        base = statistics.median(times["whole-file copy_file_range + fsync"])
        for name, values in times.items():
            rounded = ", ".join(f"{v:.3f}" for v in values)
            print(
                f"{name:<36} median {statistics.median(values):.3f} s  ratio {statistics.median(values) / base:.2f}"
                f"  ({rounded})"
            )


if __name__ == "__main__":
    main()
