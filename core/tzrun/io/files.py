"""The files a run writes in its model dir, and the two ways it writes them: atomically, and
as JSON lines. Torch-free; part of the public API (:mod:`tzrun` re-exports it) so that stages
write the way the core does.

Every function takes a local path or a URL (``s3://bucket/run/metrics.jsonl``, see
:mod:`tzrun.io.storage`). On the local disk an atomic write is a temporary file, fsync and
rename, and an append is one ``write`` of a whole line. An object store has no rename and no
append, but a single PUT of an object is atomic (a reader sees the old object or the whole new
one), so there :func:`write_atomic` is one PUT and :func:`append_jsonl` reads the object and
PUTs it back with the line added: atomic too, but not safe for two writers of the same file
at once (in a model dir only rank 0 writes these files, under the run lock) and linear in the
file's size per append.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from tzrun.io.storage import as_path, is_remote

__all__ = ["METRICS_FILE", "EVAL_RESULTS", "write_atomic", "temporary_name", "append_jsonl", "read_jsonl", "keep_jsonl"]

#: The train log and evaluations of a run, one JSON object per line (the ``metrics_log`` stage).
METRICS_FILE = "metrics.jsonl"
#: One JSON line per evaluation, in the model dir.
EVAL_RESULTS = "eval_results.jsonl"


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one
    (a temporary file, fsync, rename; on an object store, one PUT)."""
    if is_remote(path):
        as_path(path).write_bytes(data)
        return
    path = Path(path)
    tmp = path.with_name(temporary_name(path.name))
    with _naming(path):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def temporary_name(name: str) -> str:
    """The temporary file beside ``name`` that :func:`write_atomic` writes and renames (what a
    process killed during the write leaves)."""
    return f".{name}.tmp"


def append_jsonl(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one record to a JSON-lines file (one ``write`` of a whole line; on an object
    store, which cannot append, the file is read and written back whole with one PUT)."""
    line = json.dumps(dict(record)) + "\n"
    if is_remote(path):
        target = as_path(path)
        try:
            before = target.read_bytes()
        except FileNotFoundError:
            before = b""
        target.write_bytes(before + line.encode("utf-8"))
        return
    with _naming(path), open(path, "a", encoding="utf-8") as f:
        f.write(line)


@contextlib.contextmanager
def _naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """An ``OSError`` of a write (a full disk: ``write`` and ``close`` name no file) raised
    naming ``path``."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or not error.errno:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (``metrics.jsonl``, ``eval_results.jsonl``), in order;
    a line a crash tore is skipped."""
    out = []
    for line in as_path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def keep_jsonl(path: str | os.PathLike[str], keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite a JSON-lines file (atomically) with only the records for which ``keep(record)``
    is true, e.g. on resume the lines up to the checkpoint's step. Returns how many were
    dropped (0 when the file does not exist)."""
    path = as_path(path)
    if not path.is_file():
        return 0
    records = read_jsonl(path)
    kept = [r for r in records if keep(r)]
    if len(kept) != len(records):
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept).encode("utf-8"))
    return len(records) - len(kept)
