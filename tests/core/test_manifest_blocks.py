"""The block hashes of a checkpoint's manifest (format 2): computed on several threads, or as a
file is written in pieces of any size, they are each block's SHA-256."""

from __future__ import annotations

import hashlib
import io
import os
import random

import pytest

from tzrun.runner import manifest
from tzrun.runner.manifest import BlockHasher, FileEntry, hash_threads


def _reference(data: bytes, block: int) -> list[str]:
    return [hashlib.sha256(data[i:i + block]).hexdigest() for i in range(0, max(len(data), 1), block)]


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 4500])
def test_blocks_hashed_on_several_threads_are_each_blocks_sha256(size):
    data = os.urandom(size)
    released: list[tuple[int, int]] = []
    got = BlockHasher(data, 1000, threads=3, release=lambda start, end: released.append((start, end))).digests()
    assert got == _reference(data, 1000)
    assert sorted(released) == [(i, min(size, i + 1000)) for i in range(0, max(size, 1), 1000)]  # each block let go once


def test_a_written_file_is_hashed_per_block_whatever_the_pieces_it_is_written_in():
    from tzrun.runner.dcp_integrity import HashingFileSystem
    from tzrun.runner.manifest import BLOCK_SIZE as BLOCK

    class Memory:
        def __init__(self):
            self.files = {}

        def create_stream(self, path, mode):
            import contextlib

            @contextlib.contextmanager
            def stream():
                buffer = io.BytesIO()
                yield buffer
                self.files[path] = buffer.getvalue()
            return stream()

    data = os.urandom(2 * BLOCK + 5)
    fs, hashed = Memory(), {}
    pieces = random.Random(0).choices([1, 7, 4096, BLOCK - 3, BLOCK + 11], k=100)
    with HashingFileSystem(fs, hashed).create_stream("state/__0_0.distcp", "wb") as stream:
        at = 0
        for n in pieces:
            stream.write(data[at:at + n])
            at += n
            if at >= len(data):
                break
        stream.write(data[at:])
    assert fs.files["state/__0_0.distcp"] == data
    assert hashed["__0_0.distcp"] == (len(data), tuple(_reference(data, BLOCK)))
    with HashingFileSystem(fs, hashed).create_stream("empty", "wb"):
        pass
    assert hashed["empty"] == (0, (hashlib.sha256(b"").hexdigest(),))


def test_a_damaged_block_is_named_with_its_bytes_and_one_whole_file_hash_as_before():
    entry = FileEntry("state/x", 2500, ("a", "b", "c"), 1000)
    assert entry.problem(["a", "b", "c"]) is None
    assert entry.problem(["a", "x", "y"]) == ("corrupted (block 2 of 3, bytes 1,000-2,000: its SHA-256 differs from "
                                              "the one written; 1 more block(s) differ too)")
    assert entry.problem(["a", "b", "z"]).startswith("corrupted (block 3 of 3, bytes 2,000-2,500:")
    assert FileEntry("meta.json", 10, ("a",), 10).problem(["b"]) == "corrupted (its SHA-256 differs from the one written)"


def test_format_1_entries_are_one_block_of_the_whole_file_and_format_2_entries_keep_their_blocks():
    v1 = manifest.read_entries(b'{"version": 1, "step": 2, "files": [{"path": "a", "size": 0, "sha256": "e"},'
                               b' {"path": "b", "size": 300000000, "sha256": "f"}]}')
    assert v1 == [FileEntry("a", 0, ("e",), 1), FileEntry("b", 300_000_000, ("f",), 300_000_000)]
    v2 = manifest.read_entries(manifest.manifest_bytes(2, [FileEntry("b", 5, ("g",))]))
    assert v2 == [FileEntry("b", 5, ("g",), manifest.BLOCK_SIZE)]
    with pytest.raises(manifest.UnsupportedFormat, match="format 3"):
        manifest.read_entries(b'{"version": 3, "step": 2, "files": []}')


def test_a_rank_hashes_on_its_share_of_the_hosts_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert hash_threads() == manifest.MAX_HASH_THREADS
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert hash_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert hash_threads() == 1
