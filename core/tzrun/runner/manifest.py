"""The integrity manifest of a checkpoint: every file's path, size and SHA-256.

Rank 0 writes ``manifest.json`` after every rank finished writing and before the completion
marker; the marker records the manifest's own SHA-256, so a damaged manifest is caught too.
Loading checks the manifest first: a file missing, shorter or longer than listed (a truncated
copy, a full disk) or with another hash (bit rot, a partial overwrite) is named before
torch reads a byte of it.

Every path may be local or on an object store (:func:`tzrun.io.storage.as_path`): files are
listed, sized and read through the path's own methods.

This module does not import torch (``tzrec-run ckpt`` uses it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import attrs

from tzrun.io.storage import as_path

__all__ = [
    "MARKER",
    "MANIFEST",
    "VERIFY_ENV",
    "FileEntry",
    "ManifestStatus",
    "listed_files",
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
_CHUNK = 1 << 20
_DIGEST_LINE = re.compile(r"^manifest sha256 ([0-9a-f]{64})$")


@attrs.frozen
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint directory (``/``-separated),
    its size in bytes and its SHA-256 (hex)."""

    path: str
    size: int
    sha256: str


@attrs.frozen
class ManifestStatus:
    """The outcome of checking a checkpoint directory against its manifest.

    Attributes:
        state: ``ok``; ``damaged`` (see ``problems``); ``incomplete`` (no completion marker, or one that is empty, unreadable or lacks
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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
    """Size and SHA-256 of each of ``names`` under ``root``."""
    root = as_path(root)
    return [FileEntry(name, (root / name).stat().st_size, _sha256(root / name)) for name in names]


def manifest_bytes(step: int, entries: Iterable[FileEntry]) -> bytes:
    """The content of ``manifest.json``."""
    files = [attrs.asdict(e) for e in sorted(entries, key=lambda e: e.path)]
    return json.dumps({"version": 1, "step": step, "files": files}, indent=1).encode()


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
    entries = [FileEntry(**e) for e in json.loads(content)["files"]]
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
        elif hashes and not entry.path.startswith(later) and _sha256(path) != entry.sha256:
            problems.append(f"{entry.path}: corrupted (its SHA-256 differs from the one written)")
    return ManifestStatus(
        "damaged" if problems else "ok", len(entries), sum(e.size for e in entries), hashes, tuple(problems)
    )
