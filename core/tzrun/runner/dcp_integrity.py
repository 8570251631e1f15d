"""Integrity of a checkpoint's ``state/`` computed where the bytes pass anyway.

The writer's file system (:class:`HashingFileSystem`) hashes each file as DCP writes it
(:data:`HashedFiles`, read by the manifest). The reader's (:class:`VerifyingFileSystem`),
given the manifest's entries, reads each file it needs once, whole (a local one mapped, so its
pages are read from the disk once and DCP copies from the page cache), checks its size before
DCP gets a byte of it and the SHA-256 of each of its blocks on other threads while DCP reads it
(:class:`~tzrun.runner.manifest.BlockHasher`, on this rank's share of the host's cores: one
SHA-256 stream is slower than the disk, and done first it halved the load rate). A damaged file
is named, with the bytes that differ, before the load returns, in place of whatever torch made
of its bytes.

A mapped file's pages are let go as soon as they are used (:func:`release_pages`): the hash
threads drop each block they have hashed, and DCP's copy each piece of a value it has copied,
so a load holds a few blocks of the file in the process besides the state it loads (one per
hashing thread and the piece being copied), not the whole file (which doubled a resume's
memory). The pages stay in the page cache; one used again (the copy behind the hash, or the
hash behind the copy) comes back from there.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
from typing import Any, Callable, Iterator, Mapping

from tzrun.runner.manifest import BLOCK_SIZE, BlockHasher, FileEntry, hash_threads, release_pages

__all__ = ["HashedFiles", "HashingFileSystem", "BufferReader", "VerifyingFileSystem", "release_pages"]

#: What a writer hashed: each file's name (in its directory) to its size and the SHA-256 (hex)
#: of each of its blocks of :data:`~tzrun.runner.manifest.BLOCK_SIZE` bytes.
HashedFiles = dict[str, tuple[int, tuple[str, ...]]]


def _name(path: Any) -> str:
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]


class _HashingStream:
    """A write stream that hashes every byte it passes on, block by block (DCP only appends: no
    seeking)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.blocks: list[str] = []
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < view.nbytes:
            room = BLOCK_SIZE - self.size % BLOCK_SIZE
            piece = view[done:done + room]
            self.digest.update(piece)
            done += piece.nbytes
            self.size += piece.nbytes
            if self.size % BLOCK_SIZE == 0:
                self.blocks.append(self.digest.hexdigest())
                self.digest = hashlib.sha256()
        written = self.raw.write(view)
        return view.nbytes if written is None else written

    def hashed(self) -> tuple[int, tuple[str, ...]]:
        """The size and block hashes of what was written (a last, shorter block included)."""
        last = [self.digest.hexdigest()] if self.size % BLOCK_SIZE or not self.size else []
        return self.size, tuple(self.blocks + last)

    def seekable(self) -> bool:
        return False

    def seek(self, *args: Any) -> int:
        raise io.UnsupportedOperation("a hashed checkpoint stream is written front to back")

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close
        return getattr(self.raw, name)


class HashingFileSystem:
    """DCP's file system of a writer, hashing each file it writes into ``hashed``."""

    def __init__(self, fs: Any, hashed: HashedFiles) -> None:
        self._fs = fs
        self._hashed = hashed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self._fs.create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = _HashingStream(stream)
            yield hashing
        self._hashed[_name(path)] = hashing.hashed()


def _mapped(stream: Any) -> mmap.mmap | None:
    """A local file's pages, mapped read-only (read from the page cache, no copy in memory of
    ours), or None for a stream that is not a local file or an empty one."""
    try:
        mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    with contextlib.suppress(AttributeError, OSError):
        mapped.madvise(mmap.MADV_WILLNEED)  # the kernel reads ahead the whole file now, not page by page
    return mapped


class BufferReader(io.RawIOBase):
    """A read-only, seekable stream over bytes in memory (no copy of them); ``release(start,
    end)`` lets go of a range of them that has been used (:func:`release_pages`)."""

    def __init__(self, data: memoryview, release: Callable[[int, int], None] | None = None) -> None:
        super().__init__()
        self._data = data
        self._pos = 0
        self.release = release or (lambda start, end: None)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        n = max(0, min(target.nbytes, len(self._data) - self._pos))
        target[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._data)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    @property
    def view(self) -> memoryview:
        """The bytes read, whole (a value is taken from them without a copy)."""
        return self._data

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a slice still held: released when it is freed
            self._data.release()
        super().close()


class VerifyingFileSystem:
    """DCP's file system of a reader: a file the manifest lists is read once, whole; its size
    is checked before DCP gets a byte of it and its blocks' SHA-256 while DCP reads it (on
    :func:`~tzrun.runner.manifest.hash_threads` threads), and ``damaged(problem)`` is raised
    for either one that is not the manifest's, before the load returns and in place of
    whatever DCP made of the damaged bytes."""

    def __init__(self, fs: Any, expected: Mapping[str, FileEntry], damaged: Callable[[str, str], Exception]) -> None:
        self._fs = fs
        self._expected = expected
        self._damaged = damaged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        name = _name(path)
        if "r" not in mode or name not in self._expected:
            with self._fs.create_stream(path, mode) as stream:
                yield stream
            return
        entry = self._expected[name]
        with self._fs.create_stream(path, mode) as stream:
            data = _mapped(stream) or stream.read()
        reader = hasher = None
        try:
            if len(data) != entry.size:
                how = "truncated" if len(data) < entry.size else "longer than written"
                raise self._damaged(name, f"{how} ({len(data):,} bytes; {entry.size:,} were written)")
            hasher = BlockHasher(data, entry.block_size, hash_threads(), lambda start, end: release_pages(data, start, end))
            reader = BufferReader(memoryview(data), lambda start, end: release_pages(data, start, end))
            try:
                yield reader
            except Exception:
                if problem := entry.problem(hasher.digests()):  # what torch made of damaged bytes is not the news
                    raise self._damaged(name, problem) from None
                raise
            if problem := entry.problem(hasher.digests()):
                raise self._damaged(name, problem)
        finally:
            if hasher is not None:
                hasher.join()  # it reads the mapping: closed only after it
            if reader is not None:
                reader.close()
            if isinstance(data, mmap.mmap):
                with contextlib.suppress(BufferError):  # a view still held (an error's traceback): unmapped when freed
                    data.close()
