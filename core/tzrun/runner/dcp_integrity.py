"""Integrity of a checkpoint's ``state/`` computed where the bytes pass anyway.

The writer's file system (:class:`HashingFileSystem`) hashes each file as DCP writes it
(:data:`HashedFiles`, read by the manifest). The reader's (:class:`VerifyingFileSystem`),
given the manifest's entries, reads each file it needs once, whole (a local one mapped, so its
pages are read from the disk once and DCP copies from the page cache), checks its size before
DCP gets a byte of it and its SHA-256 on another thread while DCP reads it (hashing is as slow
as the disk: done first, it halved the load rate). A damaged file is named before the load
returns, in place of whatever torch made of its bytes.

A mapped file's pages are let go as soon as they are used (:func:`release_pages`): the hash
thread drops each block it has hashed, and DCP's copy each piece of a value it has copied, so
a load holds a few blocks of the file in the process besides the state it loads, not the whole
file (which doubled a resume's memory). The pages stay in the page cache; one used again (the
copy behind the hash, or the hash behind the copy) comes back from there.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
import threading
from typing import Any, Callable, Iterator, Mapping

__all__ = ["HashedFiles", "HashingFileSystem", "BufferReader", "VerifyingFileSystem", "release_pages"]

#: bytes hashed (and then let go) at a time
BLOCK = 64 << 20

#: What a writer hashed: each file's name (in its directory) to its size and SHA-256 (hex).
HashedFiles = dict[str, tuple[int, str]]


def _name(path: Any) -> str:
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]


class _HashingStream:
    """A write stream that hashes every byte it passes on (DCP only appends: no seeking)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += view.nbytes
        written = self.raw.write(view)
        return view.nbytes if written is None else written

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
        self._hashed[_name(path)] = (hashing.size, hashing.digest.hexdigest())


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


def release_pages(data: Any, start: int, end: int) -> None:
    """Let go of the whole pages of ``data[start:end]`` when ``data`` is a file's mapping
    (``MADV_DONTNEED``: the process no longer holds them; read again, they come back from the
    page cache); nothing for bytes in memory, or where the system has no such call."""
    if not isinstance(data, mmap.mmap) or data.closed:
        return
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = min(end, len(data)) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            data.madvise(mmap.MADV_DONTNEED, first, last - first)


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


class _Digest(threading.Thread):
    """SHA-256 of ``data``, computed on a thread of its own (hashlib releases the GIL), so that
    hashing a file overlaps with DCP copying its values out of it."""

    def __init__(self, data: Any) -> None:
        super().__init__(name="tzrun-checkpoint-digest", daemon=True)
        self._data = data
        self.hexdigest = ""
        self.start()

    def run(self) -> None:
        digest = hashlib.sha256()
        view = memoryview(self._data)
        try:
            for start in range(0, len(view), BLOCK):
                digest.update(view[start:start + BLOCK])
                release_pages(self._data, start, start + BLOCK)
        finally:
            view.release()
        self.hexdigest = digest.hexdigest()

    def matches(self, expected: str) -> bool:
        """Whether the digest, once computed, is ``expected``."""
        self.join()
        return self.hexdigest == expected


class VerifyingFileSystem:
    """DCP's file system of a reader: a file the manifest lists is read once, whole; its size
    is checked before DCP gets a byte of it and its SHA-256 while DCP reads it (on another
    thread), and ``damaged(problem)`` is raised for either one that is not the manifest's,
    before the load returns and in place of whatever DCP made of the damaged bytes."""

    def __init__(self, fs: Any, expected: Mapping[str, tuple[int, str]], damaged: Callable[[str, str], Exception]) -> None:
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
        size, sha256 = self._expected[name]
        with self._fs.create_stream(path, mode) as stream:
            data = _mapped(stream) or stream.read()
        reader = digest = None
        try:
            if len(data) != size:
                how = "truncated" if len(data) < size else "longer than written"
                raise self._damaged(name, f"{how} ({len(data):,} bytes; {size:,} were written)")
            digest = _Digest(data)
            reader = BufferReader(memoryview(data), lambda start, end: release_pages(data, start, end))
            try:
                yield reader
            except Exception:
                if not digest.matches(sha256):  # what torch made of damaged bytes is not the news
                    raise self._corrupted(name) from None
                raise
            if not digest.matches(sha256):
                raise self._corrupted(name)
        finally:
            if digest is not None:
                digest.join()  # it reads the mapping: closed only after it
            if reader is not None:
                reader.close()
            if isinstance(data, mmap.mmap):
                with contextlib.suppress(BufferError):  # a view still held (an error's traceback): unmapped when freed
                    data.close()

    def _corrupted(self, name: str) -> Exception:
        return self._damaged(name, "corrupted (its SHA-256 differs from the one written)")
