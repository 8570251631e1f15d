"""The integrity manifest of a checkpoint: every file's path, size and the SHA-256 of each of
its blocks.

Rank 0 writes ``manifest.json`` after every rank finished writing and before the completion
marker; the marker records the manifest's own SHA-256, so a damaged manifest is caught too.
Loading checks the manifest first: a file missing, shorter or longer than listed (a truncated
copy, a full disk) or with another hash (bit rot, a partial overwrite) is named before
torch reads a byte of it.

Format 2 (``"version": 2``) hashes each file in blocks of :data:`BLOCK_SIZE` bytes (the last one
shorter), so that a load or ``tzrec-run ckpt inspect`` checks one file on several cores at once
and names the bytes that changed. Format 1 (one SHA-256 per file) still loads: its hash is the
one block of a file whose block is the whole file (:func:`read_entries`); for a file of at most
:data:`BLOCK_SIZE` bytes the two formats record the same digest.

Every path may be local or on an object store (:func:`tzrun.io.storage.as_path`): files are
listed, sized and read through the path's own methods.

This module does not import torch (``tzrec-run ckpt`` uses it).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import mmap
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import attrs

from tzrun.io.storage import as_path

__all__ = [
    "MARKER",
    "MANIFEST",
    "VERIFY_ENV",
    "BLOCK_SIZE",
    "FORMAT",
    "MAX_HASH_THREADS",
    "FileEntry",
    "ManifestStatus",
    "UnsupportedFormat",
    "BlockHasher",
    "block_count",
    "hash_threads",
    "listed_files",
    "read_entries",
    "release_pages",
    "describe_files",
    "manifest_bytes",
    "marker_bytes",
    "share_of",
    "check_checkpoint",
    "marker_state",
    "verify_hashes_by_default",
]

#: The completion marker, written last: ``step N`` and ``manifest sha256 <hex>``.
MARKER = "COMPLETE"
MANIFEST = "manifest.json"
#: ``size`` checks only file sizes at load (no hashing); anything else, or unset, checks hashes too.
VERIFY_ENV = "TZRUN_CHECKPOINT_VERIFY"
#: the manifest format this version writes (it reads 1 and 2)
FORMAT = 2
#: bytes per hashed block of a format-2 manifest (a load holds about one block per hashing thread)
BLOCK_SIZE = 64 << 20
#: the most threads one process hashes a file's blocks on
MAX_HASH_THREADS = 4
_CHUNK = 1 << 20
_DIGEST_LINE = re.compile(r"^manifest sha256 ([0-9a-f]{64})$")


class UnsupportedFormat(ValueError):
    """A manifest of a format this version does not read."""


@attrs.frozen
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint directory (``/``-separated),
    its size in bytes, and the SHA-256 (hex) of each ``block_size`` bytes of it in order (one
    block, hashing nothing, for an empty file). A format-1 entry's one hash covers the whole
    file (``block_size`` is its size)."""

    path: str
    size: int
    blocks: tuple[str, ...]
    block_size: int = BLOCK_SIZE

    def to_json(self) -> dict[str, Any]:
        """The entry as format 2 lists it (the manifest records the block size once)."""
        return {"path": self.path, "size": self.size, "blocks": list(self.blocks)}

    def problem(self, digests: Sequence[str]) -> str | None:
        """What is wrong with a file of this entry's size whose blocks hash to ``digests``
        (``"corrupted (...)"``, naming the first block that differs when there are several),
        or None when they are the ones written."""
        bad = [i for i, (got, want) in enumerate(zip(digests, self.blocks)) if got != want]
        if not bad and len(digests) == len(self.blocks):
            return None
        if len(self.blocks) == 1:
            return "corrupted (its SHA-256 differs from the one written)"
        i = bad[0] if bad else min(len(digests), len(self.blocks) - 1)
        start, end = i * self.block_size, min(self.size, (i + 1) * self.block_size)
        more = f"; {len(bad) - 1} more block(s) differ too" if len(bad) > 1 else ""
        return (f"corrupted (block {i + 1} of {len(self.blocks)}, bytes {start:,}-{end:,}: its SHA-256 differs "
                f"from the one written{more})")


@attrs.frozen
class ManifestStatus:
    """The outcome of checking a checkpoint directory against its manifest.

    Attributes:
        state: ``ok``; ``damaged`` (see ``problems``); ``unsupported`` (a manifest format this
            version does not read); ``incomplete`` (no completion marker, or one that is empty, unreadable or lacks
            the manifest's digest; ``problems`` says which).
        files: files the manifest lists.
        size: their bytes in total.
        hashed: whether hashes were checked (not only sizes).
        problems: one line per problem, each starting with the file's relative path.
    """

    state: str
    files: int = 0
    size: int = 0
    hashed: bool = False
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        return {**attrs.asdict(self), "problems": list(self.problems)}


def verify_hashes_by_default() -> bool:
    """Whether loading checks hashes as well as sizes: yes unless ``TZRUN_CHECKPOINT_VERIFY=size``."""
    return os.environ.get(VERIFY_ENV, "").strip().lower() != "size"


def listed_files(root: Path) -> list[str]:
    """Every file under a checkpoint directory that its manifest lists: all but the marker,
    the manifest and temporary files of an atomic write (``.NAME.tmp``)."""
    root = as_path(root)
    names = []
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel in (MARKER, MANIFEST) or (path.name.startswith(".") and path.name.endswith(".tmp")):
            continue
        names.append(rel)
    return sorted(names)


def block_count(size: int, block_size: int = BLOCK_SIZE) -> int:
    """How many blocks a file of ``size`` bytes is hashed in (one for an empty file)."""
    return max(1, -(-size // block_size))


def hash_threads() -> int:
    """Threads one process hashes a file's blocks on: its share of this host's cores among the
    ranks torchrun started here (``LOCAL_WORLD_SIZE``), at least 1 and at most
    :data:`MAX_HASH_THREADS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, min(MAX_HASH_THREADS, cores // local))


class BlockHasher:
    """The SHA-256 of each ``block_size`` bytes of ``data`` (bytes, a memoryview or a file's
    mapping), computed on ``threads`` threads of its own, in block order (hashlib releases the
    GIL, so the blocks are hashed on several cores while the caller goes on); ``release(start,
    end)`` is called with each block's range once it is hashed (a mapped file's pages are let go,
    :func:`release_pages`). :meth:`digests` waits for them."""

    def __init__(self, data: Any, block_size: int = BLOCK_SIZE, threads: int = 1,
                 release: Callable[[int, int], None] | None = None) -> None:
        self._view = memoryview(data).cast("B") if not isinstance(data, mmap.mmap) else memoryview(data)
        self._size = len(self._view)
        self._block_size = block_size
        self._release = release or (lambda start, end: None)
        self._digests = [""] * block_count(self._size, block_size)
        self._next = itertools.count()  # next() of a count is atomic under the GIL
        self._threads = [threading.Thread(target=self._work, name="tzrun-checkpoint-digest", daemon=True)
                         for _ in range(max(1, min(threads, len(self._digests))))]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while (i := next(self._next)) < len(self._digests):
            start = i * self._block_size
            end = min(self._size, start + self._block_size)
            self._digests[i] = hashlib.sha256(self._view[start:end]).hexdigest()
            self._release(start, end)

    def join(self) -> None:
        """Wait until every block is hashed (the data may be closed after it)."""
        for thread in self._threads:
            thread.join()
        with contextlib.suppress(BufferError):
            self._view.release()

    def digests(self) -> list[str]:
        """Each block's SHA-256 (hex), once all are computed."""
        self.join()
        return list(self._digests)


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


def _file_blocks(path: Path, block_size: int) -> list[str]:
    """The SHA-256 of each block of the file ``path``: a local one mapped and hashed on
    :func:`hash_threads` threads, one on an object store read block by block."""
    with path.open("rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (AttributeError, OSError, ValueError):  # an object store's stream, or an empty file
            data = None
        if data is None:
            digests: list[str] = []
            while True:
                digest = hashlib.sha256()
                left = block_size
                while left and (chunk := f.read(min(_CHUNK, left))):
                    digest.update(chunk)
                    left -= len(chunk)
                if left == block_size and digests:
                    return digests
                digests.append(digest.hexdigest())
                if left:
                    return digests
        try:  # each block let go once hashed: a large file is not held in the process
            return BlockHasher(data, block_size, hash_threads(), lambda start, end: release_pages(data, start, end)).digests()
        finally:
            data.close()


def share_of(sizes: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The indices of the files one rank hashes: largest first to the least-loaded rank, so the
    ranks hash about the same number of bytes. The same for every rank given the same sizes."""
    load = [0] * world_size
    owner = {}
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return sorted(i for i, r in owner.items() if r == rank)


def describe_files(root: Path, names: Iterable[str]) -> list[FileEntry]:
    """Size and block hashes of each of ``names`` under ``root`` (format 2)."""
    root = as_path(root)
    return [FileEntry(name, (root / name).stat().st_size, tuple(_file_blocks(root / name, BLOCK_SIZE)))
            for name in names]


def manifest_bytes(step: int, entries: Iterable[FileEntry]) -> bytes:
    """The content of ``manifest.json`` (format 2; every entry hashed in blocks of :data:`BLOCK_SIZE`)."""
    entries = sorted(entries, key=lambda e: e.path)
    assert all(e.block_size == BLOCK_SIZE for e in entries), "a format-2 manifest has one block size"
    files = [e.to_json() for e in entries]
    return json.dumps({"version": FORMAT, "step": step, "block_size": BLOCK_SIZE, "files": files}, indent=1).encode()


def read_entries(content: bytes) -> list[FileEntry]:
    """The entries of a ``manifest.json`` of format 1 (one SHA-256 per file, read as one block
    of the whole file) or 2.

    Raises:
        UnsupportedFormat: for another format (a newer tzrec-run's), naming it.
    """
    manifest = json.loads(content)
    version = manifest.get("version")
    if version == 1:
        return [FileEntry(f["path"], f["size"], (f["sha256"],), max(1, f["size"])) for f in manifest["files"]]
    if version == 2:
        return [FileEntry(f["path"], f["size"], tuple(f["blocks"]), manifest["block_size"]) for f in manifest["files"]]
    raise UnsupportedFormat(f"format {version!r}, which this tzrec-run does not read (it reads 1 and 2): "
                            "a newer tzrec-run wrote it; load it with that version or a later one")


def marker_bytes(step: int, manifest: bytes) -> bytes:
    """The content of the completion marker: the step and the manifest's SHA-256."""
    return f"step {step}\nmanifest sha256 {hashlib.sha256(manifest).hexdigest()}\n".encode()


def marker_state(root: Path) -> tuple[str, str | None]:
    """What a checkpoint's completion marker says, without trusting a damaged one.

    Args:
        root: the checkpoint directory.

    Returns:
        ``("complete", digest)`` for a marker that records the manifest's SHA-256;
        ``("incomplete", reason)`` otherwise: no marker, an empty or unreadable one, or one
        without the digest (a damaged marker, or one a pre-release tzrec-run wrote before
        checkpoints had manifests: neither loads).
    """
    root = as_path(root)
    try:
        text = (root / MARKER).read_bytes().decode("utf-8")
    except FileNotFoundError:
        return "incomplete", f"no {MARKER} marker: its save never finished, or it is not a checkpoint directory"
    except (OSError, UnicodeDecodeError) as error:
        return "incomplete", f"its {MARKER} marker is unreadable ({error})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "incomplete", f"its {MARKER} marker is empty"
    for line in lines:
        match = _DIGEST_LINE.match(line)
        if match:
            return "complete", match.group(1)
    if (root / MANIFEST).exists():
        return "incomplete", f"its {MARKER} marker does not record the SHA-256 of the {MANIFEST} beside it (damaged)"
    return "incomplete", (f"its {MARKER} marker records no {MANIFEST} digest (damaged, or written by a pre-release "
                          "tzrec-run before checkpoints had manifests, which this version does not load)")


def check_checkpoint(root: Path, *, hashes: bool = True, share: tuple[int, int] | None = None,
                     later: tuple[str, ...] = ()) -> ManifestStatus:
    """Check a checkpoint directory against its manifest.

    Args:
        root: the checkpoint directory.
        hashes: check SHA-256 hashes as well as sizes.
        share: ``(rank, world_size)``: check only this rank's share of the files (see
            :func:`share_of`); the manifest itself is checked by every share.
        later: path prefixes whose hashes are left to the reader (checked as it reads them,
            see :mod:`tzrun.runner.dcp_storage`); their sizes are checked here.

    Returns:
        The status; ``problems`` name each file relative to ``root``.
    """
    root = as_path(root)
    state, expected = marker_state(root)
    if state == "incomplete" or expected is None:
        return ManifestStatus("incomplete", problems=(str(expected),))
    manifest = root / MANIFEST
    if not manifest.is_file():
        return ManifestStatus("damaged", problems=(f"{MANIFEST}: missing (the completion marker lists one)",))
    content = manifest.read_bytes()
    if hashlib.sha256(content).hexdigest() != expected:
        return ManifestStatus("damaged", problems=(f"{MANIFEST}: corrupted (its SHA-256 is not the one {MARKER} records)",))
    try:
        entries = read_entries(content)
    except UnsupportedFormat as error:
        return ManifestStatus("unsupported", problems=(f"{MANIFEST}: {error}",))
    except (ValueError, KeyError, TypeError):
        return ManifestStatus("damaged", problems=(f"{MANIFEST}: malformed (not a manifest this tzrec-run wrote)",))
    mine = share_of([e.size for e in entries], *share) if share else range(len(entries))
    problems = []
    for i in mine:
        entry = entries[i]
        path = root / entry.path
        if not path.is_file():
            problems.append(f"{entry.path}: missing")
            continue
        size = path.stat().st_size
        if size != entry.size:
            how = "truncated" if size < entry.size else "longer than written"
            problems.append(f"{entry.path}: {how} ({size:,} bytes; {entry.size:,} were written)")
        elif hashes and not entry.path.startswith(later) and (why := entry.problem(_file_blocks(path, entry.block_size))):
            problems.append(f"{entry.path}: {why}")
    return ManifestStatus(
        "damaged" if problems else "ok", len(entries), sum(e.size for e in entries), hashes, tuple(problems)
    )
