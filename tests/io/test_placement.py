"""Layout arithmetic: alignment only above the threshold, shards capped in size, tensors never split."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_light_ref.io.plan.placement import Placement, ShardedLayout, shard_path


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
    assert placed == [Placement(0, 0), Placement(1, 0), Placement(2, 0), Placement(3, 0)]
    assert layout.sizes == [10, 500, 10, 600]


def test_zero_length_blobs_sit_at_the_final_end_of_their_file():
    # onnx 1.17 reads a zero-length reference as "the rest of the file": only the end gives zero bytes everywhere.
    layout = ShardedLayout(step=64, max_shard_size=100)
    placed = place_all(layout, [0, 30, 0, 40, 0, 50, 0])
    # 0..30, 64..104 does not fit: file 1 at 0..40, 64..114 does not fit: file 2 at 0..50.
    assert [(p.shard, p.offset) for p in placed] == [(0, 30), (0, 0), (0, 30), (1, 0), (1, 40), (2, 0), (2, 50)]
    assert layout.sizes == [30, 40, 50]  # no padding, no extra file for a zero-length blob


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


def test_shard_names_follow_onnx_light():
    assert [shard_path("m.onnx.data", i) for i in range(3)] == ["m.onnx.data", "m.onnx.data.1", "m.onnx.data.2"]


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
        for (a_off, a_len), (b_off, _) in itertools.pairwise(items):
            assert b_off >= a_off + a_len  # in order, never overlapping
        if cap is not None and layout.sizes[shard] > cap:
            assert len(items) == 1 and items[0][1] > cap  # only a single oversized blob may exceed the cap
    assert layout.total_size == sum(layout.sizes)


@pytest.mark.parametrize("cap", [1, 7])
def test_every_blob_over_a_tiny_cap_gets_its_own_file(cap):
    layout = ShardedLayout(step=1, max_shard_size=cap)
    assert [p.shard for p in place_all(layout, [8, 8, 8])] == [0, 1, 2]
