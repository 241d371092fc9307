"""Identical blobs are found by their bytes: equal lengths are compared, digests only pick candidates."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onnx_light_ref.io._plan.dedup as dedup_module
from onnx_light_ref.errors import ExternalDataError
from onnx_light_ref.io._plan.dedup import BlobSource, find_duplicates


@pytest.fixture
def data_file(tmp_path):
    fds = []

    def make(payload: bytes) -> int:
        path = tmp_path / f"f{len(fds)}.bin"
        path.write_bytes(payload)
        fds.append(os.open(path, os.O_RDONLY))
        return fds[-1]

    yield make
    for fd in fds:
        os.close(fd)


def test_identical_ranges_in_different_files_are_merged(data_file):
    a = data_file(b"xx" + b"hello world" + b"yy")
    b = data_file(b"hello world")
    blobs = [BlobSource(11, fd=a, offset=2), BlobSource(11, fd=b, offset=0), BlobSource(11, data=b"hello world")]
    assert list(find_duplicates(blobs, chunk_size=3)) == [0, 0, 0]


def test_a_blob_differing_only_in_its_last_byte_is_kept_apart(data_file):
    fd = data_file(b"A" * 100 + b"A" * 99 + b"B")
    blobs = [BlobSource(100, fd=fd, offset=0), BlobSource(100, fd=fd, offset=100)]
    assert list(find_duplicates(blobs, chunk_size=7)) == [0, 1]


def test_a_digest_collision_never_merges_different_bytes(monkeypatch, data_file):
    class ConstantHash:
        def __init__(self, **_):
            pass

        def update(self, _):
            pass

        def digest(self):
            return b"same"

    monkeypatch.setattr(dedup_module.hashlib, "blake2b", ConstantHash)
    fd = data_file(b"abcdabce")
    blobs = [BlobSource(4, fd=fd, offset=0), BlobSource(4, fd=fd, offset=4), BlobSource(4, data=b"abcd")]
    assert list(find_duplicates(blobs, chunk_size=2)) == [0, 1, 0]


def test_blobs_of_unique_length_are_never_read():
    blobs = [BlobSource(3, fd=-1, offset=0), BlobSource(4, fd=-1, offset=0)]  # an invalid fd would raise if read
    assert list(find_duplicates(blobs, chunk_size=2)) == [0, 1]


def test_same_key_means_same_bytes_without_reading():
    blobs = [BlobSource(5, fd=-1, key=("f", 0, 5)), BlobSource(5, fd=-1, key=("f", 0, 5))]
    assert list(find_duplicates(blobs, chunk_size=2)) == [0, 0]


def test_zero_length_blobs_are_all_identical():
    assert list(find_duplicates([BlobSource(0, fd=-1), BlobSource(0, data=b"")], chunk_size=2)) == [0, 0]


def test_a_file_shorter_than_its_range_is_an_error(data_file):
    fd = data_file(b"abc")
    blobs = [BlobSource(4, fd=fd, offset=0, label="tensor 'w'"), BlobSource(4, data=b"abcd")]
    with pytest.raises(ExternalDataError, match=r"tensor 'w': the file ended at offset 3 while 1 more bytes"):
        find_duplicates(blobs, chunk_size=16)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=12), max_size=12), st.integers(1, 5))
def test_matches_a_naive_comparison(payloads, chunk_size):
    blobs = [BlobSource(len(p), data=p) for p in payloads]
    expected = [payloads.index(p) for p in payloads]
    assert list(find_duplicates(blobs, chunk_size)) == expected


def test_the_read_buffers_are_no_longer_than_the_longest_blob_compared(monkeypatch) -> None:
    """A small model's dedup allocated two zeroed buffers of the whole chunk size on each run."""
    sizes: list[int] = []
    real = dedup_module._ChunkReader.__init__

    def recording(self, chunk_size: int) -> None:
        sizes.append(chunk_size)
        real(self, chunk_size)

    monkeypatch.setattr(dedup_module._ChunkReader, "__init__", recording)
    blobs = [BlobSource(5, data=b"abcde"), BlobSource(5, data=b"abcde"), BlobSource(9, data=b"123456789")]
    assert list(find_duplicates(blobs, chunk_size=2**26)) == [0, 0, 2]
    assert list(find_duplicates(blobs, chunk_size=3)) == [0, 0, 2]  # smaller than the blobs: the chunk size holds
    assert sizes == [5, 3]
