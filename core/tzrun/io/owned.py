"""Directories that tzrec-run writes outside a model dir (an export, a prediction set) and may
later replace: each carries a marker written before anything else, and only a directory with
the marker, holding nothing but what that kind of output writes, is ever emptied.

The marker is ``.tzrec-run-output``, JSON: ``{"format": 1, "kind": "export" | "predictions",
"run_id": ...}``. :func:`claim_output_dir` is the one rule for every such output:

* a missing or empty directory is claimed (its marker written), and so is one that holds only
  the temporary file of its marker (a claim killed while writing it);
* a directory with this kind's marker, whose other entries are all this kind's files, is
  emptied of exactly those files and claimed again;
* anything else is refused with one line naming what it holds, with or without
  ``--overwrite``: a user's directory, a checkpoint, a model dir, a dump, the working
  directory or one of its parents, a file where a directory belongs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from tzrun.errors import WriteError
from tzrun.io.files import temporary_name, write_atomic
from tzrun.io.storage import as_path, exists, filesystem, is_remote

__all__ = ["OUTPUT_MARKER", "read_output_marker", "replaceable_entries", "claim_output_dir", "output_entries",
           "remove_owned", "write_output_marker"]

#: The marker of an output directory tzrec-run wrote.
OUTPUT_MARKER = ".tzrec-run-output"
#: What a process killed while writing the marker leaves (:func:`~tzrun.io.files.write_atomic`'s
#: temporary): the marker is written first, so a directory holding it and nothing else (or only
#: beside the marker and this kind's files) is an interrupted claim of ours
_MARKER_TEMP = temporary_name(OUTPUT_MARKER)
_FORMAT = 1


def output_entries(path: str | os.PathLike[str]) -> list[str]:
    """The names directly in ``path``, local or on an object store (none when it does not exist
    or is not a directory)."""
    if is_remote(path):
        fs, inner = filesystem(path)
        fs.invalidate_cache(inner)
        try:
            keys = fs.ls(inner, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        inner = inner.rstrip("/")
        return sorted({k.rstrip("/").rsplit("/", 1)[-1] for k in keys if k.rstrip("/") != inner})
    try:
        return sorted(os.listdir(as_path(path)))
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_output_marker(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The output marker of ``path`` (None without one, or one that is not ours)."""
    try:
        marker = json.loads((as_path(path) / OUTPUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("kind"), str) else None


def _is_cwd_or_above(path: Path) -> bool:
    if is_remote(path):
        return False
    here = Path.cwd().resolve()
    target = Path(path).resolve()
    return target == here or target in here.parents


def _listing(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def replaceable_entries(path: str | os.PathLike[str], kind: str, owned: Callable[[str], bool], *, flag: str,
                        overwrite: bool = True) -> list[str]:
    """The entries of ``path`` that replacing it as a ``kind`` removes (all of them: the check
    refuses a directory holding anything else); reads only.

    Raises:
        WriteError: for a file where the directory belongs, the working directory or one of its
            parents, a directory that is not an output of ``kind`` or holds other files, or
            (without ``overwrite``) an output of ``kind``.
    """
    target = as_path(path)
    if _is_cwd_or_above(target):
        raise WriteError(f"{flag} {path}: the working directory or one of its parents; name a new directory for the {kind}")
    if not is_remote(target) and target.exists() and not target.is_dir():
        raise WriteError(f"{flag} {path}: a file exists there; name a new or empty directory for the {kind}")
    names = output_entries(target)
    if not names or names == [_MARKER_TEMP]:
        return names  # empty, or a claim killed while it wrote the marker (before anything else)
    marker = read_output_marker(target)
    foreign = [n for n in names if n not in (OUTPUT_MARKER, _MARKER_TEMP) and not owned(n)]
    if marker is None or marker.get("kind") != kind or foreign:
        what = "it has no tzrec-run marker" if marker is None else (
            f"it is a tzrec-run {marker.get('kind')}, not a {kind}" if marker.get("kind") != kind
            else f"it also holds {_listing(foreign)}, which tzrec-run did not write there")
        raise WriteError(f"{flag} {path}: not empty and not a tzrec-run {kind} ({what}; it holds "
                         f"{_listing(names)}); nothing was changed: name a new or empty directory")
    if not overwrite:
        raise WriteError(f"{flag} {path}: exists already; pass --overwrite to replace it (a tzrec-run {kind}), or "
                         "name another directory")
    return names


def claim_output_dir(path: str | os.PathLike[str], kind: str, owned: Callable[[str], bool], *, flag: str,
                     overwrite: bool = True, run_id: str = "") -> None:
    """Make ``path`` an empty directory of ``kind`` with its marker, or refuse (nothing changed).

    Args:
        path: the directory (local or a URL).
        kind: what it holds (``"export"``, ``"predictions"``).
        owned: whether an entry's name is one this kind writes (the marker aside).
        flag: the option that named ``path`` (``--out``), for the message.
        overwrite: whether an existing output of ``kind`` may be replaced; without it one is refused.
        run_id: the run the output comes from (recorded in the marker).

    Raises:
        WriteError: as :func:`replaceable_entries` says.
    """
    target = as_path(path)
    names = replaceable_entries(target, kind, owned, flag=flag, overwrite=overwrite)
    remove_owned(target, [n for n in names if n != OUTPUT_MARKER])
    if not is_remote(target):
        target.mkdir(parents=True, exist_ok=True)
    write_output_marker(target, kind, run_id)


def write_output_marker(path: str | os.PathLike[str], kind: str, run_id: str = "") -> None:
    """Mark ``path`` (a directory that exists, or an object-store prefix) as tzrec-run's ``kind``."""
    marker = {"format": _FORMAT, "kind": kind, "run_id": run_id}
    write_atomic(as_path(path) / OUTPUT_MARKER, (json.dumps(marker) + "\n").encode())


def remove_owned(path: str | os.PathLike[str], names: list[str]) -> None:
    """Remove the entries ``names`` of ``path`` (files, or directories of parts), nothing else."""
    import shutil

    from tzrun.io.storage import remove_tree

    root = as_path(path)
    for name in names:
        entry = root / name
        if is_remote(entry):
            remove_tree(entry)
            if exists(entry):
                entry.unlink()
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
