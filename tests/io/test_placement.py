"""Layout arithmetic: alignment only above the threshold, shards capped in size, tensors never split."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_light_ref.io._plan.placement import Placement, ShardedLayout


def place_all(layout: ShardedLayout, lengths: list[int]) -> list[Placement]:
    return [layout.place(length) for length in lengths]


def test_every_blob_aligned_when_threshold_is_zero():
    layout = ShardedLayout(step=64)
    assert place_all(layout, [28, 12, 68]) == [Placement(0, 0), Placement(0, 64), Placement(0, 128)]
    assert layout.sizes == [196]


def test_blobs_below_the_threshold_are_packed_at_the_next_free_byte():
    layout = ShardedLayout(step=4096, align_threshold=100)
    placed = place_all(layout, [10, 200, 5, 99, 100])
    assert [p.offset for p in placed] == [0, 4096, 4296, 4301, 8192]
    assert layout.sizes == [8292]


def test_shards_start_at_zero_and_never_split_a_blob():
    layout = ShardedLayout(step=16, max_shard_size=100)
    placed = place_all(layout, [40, 40, 40, 10])
    # 0..40, 48..88; the third does not fit (96 + 40 > 100): next file at 0; the fourth follows at 48.
    assert placed == [Placement(0, 0), Placement(0, 48), Placement(1, 0), Placement(1, 48)]
    assert layout.sizes == [88, 58]


def test_a_blob_larger_than_the_cap_gets_a_file_of_its_own():
    layout = ShardedLayout(step=1, max_shard_size=100)
    placed = place_all(layout, [10, 500, 10, 600])
    # The two small blobs share a file (they fit together); each oversized one is alone.
    assert placed == [Placement(0, 0), Placement(1, 0), Placement(0, 10), Placement(2, 0)]
    assert layout.sizes == [20, 500, 600]


MIB, KIB = 1024 * 1024, 1024


def test_no_shard_is_needlessly_tiny():
    """The issue's model: tensors of 1M, 4K, 4M, 4K, 4M and 40K under a 4M cap made 5 files, one of 4 KiB, when
    filled in model order (the next file as soon as a tensor does not fit). Packed largest first: 3 files."""
    layout = ShardedLayout(step=4096, max_shard_size=4 * MIB)
    placed = place_all(layout, [MIB, 4 * KIB, 4 * MIB, 4 * KIB, 4 * MIB, 40 * KIB])

    # File 0 holds the first tensor and the small ones, largest first; files are numbered by their first tensor.
    assert [(p.shard, p.offset) for p in placed] == [
        (0, 0),
        (0, MIB + 40 * KIB),
        (1, 0),
        (0, MIB + 44 * KIB),
        (2, 0),
        (0, MIB),
    ]
    assert layout.sizes == [MIB + 48 * KIB, 4 * MIB, 4 * MIB]


def test_each_file_holds_its_blobs_largest_first_and_files_follow_their_first_blob():
    layout = ShardedLayout(step=1, max_shard_size=10)
    placed = place_all(layout, [2, 9, 3, 1, 8, 2])
    # Largest first: 9 (file A), 8 (B), 3 (C), the first 2 -> B, the second 2 -> C, 1 -> A; numbered by their first
    # blob: B (blobs 0 and 4) = 0, A (1 and 3) = 1, C (2 and 5) = 2. In each file, the order they were packed in.
    assert [(p.shard, p.offset) for p in placed] == [(0, 8), (1, 0), (2, 0), (1, 9), (0, 0), (2, 3)]
    assert layout.sizes == [10, 10, 5]


def test_the_files_are_decided_once_every_blob_is_known():
    layout = ShardedLayout(step=1, max_shard_size=10)
    first = layout.place(6)
    assert layout.sizes == [6]
    with pytest.raises(RuntimeError, match=r"place\(\) after the shards were read"):
        layout.place(4)
    assert first == Placement(0, 0)


def test_zero_length_blobs_sit_at_the_final_end_of_their_file():
    # onnx 1.17 reads a zero-length reference as "the rest of the file": only the end gives zero bytes everywhere.
    layout = ShardedLayout(step=64, max_shard_size=100)
    placed = place_all(layout, [0, 30, 0, 40, 0, 50, 0])
    # Largest first: 50 at 0 of file A; 40 does not fit after it (64 + 40 > 100): file B; 30 does (64 + 30 = 94).
    # A holds the first tensor: file 0. Each zero-length blob is at the end of the file of the blob before it.
    assert [(p.shard, p.offset) for p in placed] == [(0, 94), (0, 64), (0, 94), (1, 0), (1, 40), (0, 0), (0, 94)]
    assert layout.sizes == [94, 40]  # no padding after the last blob, no extra file for a zero-length blob


def test_zero_length_blob_offsets_follow_their_file_until_placement_ends():
    layout = ShardedLayout(step=16)
    empty = layout.place(0)
    assert empty.offset == 0
    layout.place(10)
    layout.place(20)
    assert empty == Placement(0, 36) and layout.sizes == [36]
    with pytest.raises(TypeError):
        hash(empty)  # its offset moves: never a dict key


def test_only_zero_length_blobs_make_one_empty_file():
    layout = ShardedLayout(step=4096)
    assert place_all(layout, [0, 0]) == [Placement(0, 0), Placement(0, 0)]
    assert layout.sizes == [0]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), max_size=40),
    step=st.sampled_from([1, 2, 16, 64, 4096]),
    threshold=st.integers(0, 400),
    cap=st.one_of(st.none(), st.integers(1, 1000)),
)
def test_layout_invariants(lengths, step, threshold, cap):
    layout = ShardedLayout(step=step, align_threshold=threshold, max_shard_size=cap)
    placed = place_all(layout, lengths)
    per_file: dict[int, list[tuple[int, int]]] = {}
    for length, where in zip(lengths, placed, strict=True):
        if length == 0:
            assert where.offset == layout.sizes[where.shard]  # the end of its file, never inside or past it
            continue
        if length >= threshold:
            assert where.offset % step == 0
        per_file.setdefault(where.shard, []).append((where.offset, length))
    files = set(per_file) | {where.shard for where in placed}
    assert sorted(files) == list(range(len(layout.sizes)))
    for shard, items in per_file.items():
        ends = [offset + length for offset, length in items]
        assert layout.sizes[shard] == max(ends)  # no trailing padding
        if cap is None:
            assert items == sorted(items)  # one file: the order given
        for (a_off, a_len), (b_off, _) in itertools.pairwise(sorted(items)):
            assert b_off >= a_off + a_len  # never overlapping
        if cap is not None and layout.sizes[shard] > cap:
            assert len(items) == 1 and items[0][1] > cap  # only a single oversized blob may exceed the cap
    if cap is not None and step == 1:  # first fit: no two files at most half full (the later one's would have fitted)
        assert len([size for size in layout.sizes if 0 < 2 * size <= cap]) <= 1
    assert layout.total_size == sum(layout.sizes)


@pytest.mark.parametrize("cap", [1, 7])
def test_every_blob_over_a_tiny_cap_gets_its_own_file(cap):
    layout = ShardedLayout(step=1, max_shard_size=cap)
    assert [p.shard for p in place_all(layout, [8, 8, 8])] == [0, 1, 2]
