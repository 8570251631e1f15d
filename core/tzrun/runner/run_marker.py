"""The mark of a model dir that tzrec-run owns: ``model_dir/.tzrec-run``.

``tzrec-run train`` writes it before any other file of the run (right after taking the run
lock), as JSON: ``{"format": 1, "run_id": ..., "created": <unix time>, "version": ...}``. A
new run id is written when a run starts in an empty (or new) directory and when a run
replaces an earlier one (``--overwrite``); ``--resume`` keeps it.

tzrec-run removes or rewrites files only in a directory with this marker. A directory that
is not empty and has no marker is not a run: training into it is refused (exit 78), with or
without ``--overwrite``, and nothing in it is written or removed. The run lock (``run.lock``)
is not counted: it is what a run writes before its marker.

A model dir written before markers existed (no marker, but a ``resolved_config.json`` with a
run's ``config`` and ``sources``) is a run of ours: it is adopted, and its marker is written
when a run claims it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from tzrun import __version__
from tzrun.errors import EXIT_CONFIG, TzrunError
from tzrun.io.files import write_atomic
from tzrun.io.owned import output_entries
from tzrun.runner.records import RESOLVED_JSON
from tzrun.runner.run_lock import LOCK_FILE
from tzrun.io.storage import as_path, is_remote

__all__ = ["RUN_MARKER", "MARKER_FORMAT", "NotARunDirError", "read_run_marker", "is_run_dir", "check_run_dir",
           "write_run_marker"]

#: The marker's name in the model dir.
RUN_MARKER = ".tzrec-run"
#: The marker's format; a marker of a higher format was written by a newer tzrec-run.
MARKER_FORMAT = 1

#: What may be in a directory that is not (yet) marked: the run lock, and a marker whose write was cut short.
_NOT_COUNTED = frozenset({LOCK_FILE, f".{RUN_MARKER}.tmp"})


class NotARunDirError(TzrunError):
    """A model dir holds files but is not a tzrec-run model dir (exit code :data:`~tzrun.errors.EXIT_CONFIG`)."""

    exit_code = EXIT_CONFIG


def read_run_marker(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The model dir's marker (``{}`` when it exists but is not a JSON object), or None without one."""
    try:
        text = (as_path(model_dir) / RUN_MARKER).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        marker = json.loads(text)
    except ValueError:
        return {}
    return marker if isinstance(marker, dict) else {}


def is_run_dir(model_dir: str | os.PathLike[str]) -> bool:
    """Whether ``model_dir`` carries tzrec-run's marker."""
    return read_run_marker(model_dir) is not None


def _is_legacy_run(model_dir: str | os.PathLike[str]) -> bool:
    """Whether ``model_dir`` holds the records of a run written before markers existed."""
    try:
        record = json.loads((as_path(model_dir) / RESOLVED_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("config"), dict) and isinstance(record.get("sources"), dict)


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def check_run_dir(model_dir: str | os.PathLike[str], *, overwrite: bool = False) -> str:
    """Whether a run may be written into ``model_dir``; reads only.

    Returns:
        ``"run"`` (it has the marker), ``"legacy"`` (a run written before markers) or
        ``"empty"`` (missing, empty, or holding only the run lock).

    Raises:
        NotARunDirError: when it holds other files and no marker, or a marker of a newer format.
    """
    marker = read_run_marker(model_dir)
    if marker is not None:
        found = marker.get("format", MARKER_FORMAT)
        if isinstance(found, int) and found > MARKER_FORMAT:
            raise NotARunDirError(
                f"{as_path(model_dir) / RUN_MARKER}: written by a newer tzrec-run (marker format {found}; this version "
                f"knows format {MARKER_FORMAT}); train with that version, or choose an empty or new directory")
        return "run"
    others = [n for n in output_entries(model_dir) if n not in _NOT_COUNTED]
    if not others:
        return "empty"
    if _is_legacy_run(model_dir):
        return "legacy"
    why = "; --overwrite removes only a tzrec-run model dir's own outputs, so it is refused too" if overwrite else ""
    raise NotARunDirError(
        f"{model_dir} is not empty and is not a tzrec-run model dir (no {RUN_MARKER} marker; it holds "
        f"{_listing(others)}){why}; nothing was changed: choose an empty or new directory (--model-dir)")


def write_run_marker(model_dir: str | os.PathLike[str]) -> str:
    """Write ``model_dir``'s marker with a new run id, creating a local ``model_dir`` if
    needed (one process: rank 0); returns the id."""
    run_id = uuid.uuid4().hex
    marker = {"format": MARKER_FORMAT, "run_id": run_id, "created": time.time(), "version": __version__}
    path: Path = as_path(model_dir) / RUN_MARKER
    if not is_remote(path):  # an object store has no directories
        path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(marker) + "\n").encode("utf-8"))
    return run_id
