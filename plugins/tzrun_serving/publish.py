"""Versioned exports a serving system can poll: ``<dir>/step-N/`` (each a complete export,
its ``COMPLETE`` marker written last), and ``<dir>/latest`` (the name of the newest complete
one, one line), written after the version is complete. A reader that follows ``latest`` never
sees half an export: a version killed while it was written has no marker and ``latest`` still
names the one before it; the next publication removes it. Only ``step-N`` directories under
``<dir>`` are ever removed. Works the same on a local disk and an object store (the marker and
the pointer are each one atomic write)."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from tzrun import as_path, is_remote, write_atomic
from tzrun.checkpoints import open_checkpoint
from tzrun.outputs import read_output_marker, remove_tree
from tzrun_serving.manifest import COMPLETE, MANIFEST

__all__ = ["LATEST", "publish_export", "retire_exports", "versions", "latest_version", "export_root"]

log = logging.getLogger("tzrun")

LATEST = "latest"
_VERSION = re.compile(r"^step-(\d+)$")


def export_root(export: Any, model_dir: str | Path) -> Path:
    """Where ``[export]`` writes: ``export.dir``, or ``<model_dir>/exports``."""
    return as_path(export.dir) if export.dir else as_path(model_dir) / "exports"


def versions(root: Path) -> list[tuple[int, Path, bool]]:
    """``(step, path, complete)`` of every version directory under ``root``, oldest first."""
    root = as_path(root)
    if not root.exists():
        return []
    found = []
    for child in root.iterdir():
        match = _VERSION.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child, (child / COMPLETE).exists()))
    return sorted(found, key=lambda v: v[0])


def latest_version(root: Path) -> Path | None:
    """The version ``<root>/latest`` names (None without one, or one naming no ``step-N``)."""
    pointer = as_path(root) / LATEST
    if not pointer.exists():
        return None
    name = pointer.read_bytes()[:256].decode("utf-8", "replace").strip()
    return as_path(root) / name if _VERSION.match(name) else None


def _ours(path: Path) -> bool:
    """Whether the version directory ``path`` is an export tzrec-run wrote (its output marker,
    or an export written before markers)."""
    from tzrun_serving.export import is_legacy_export

    marker = read_output_marker(path)
    return (marker or {}).get("kind") == "export" or (marker is None and is_legacy_export(path))


def _run_of(path: Path) -> str | None:
    """The run id a version's manifest records (None when it records none or cannot be read)."""
    try:
        manifest = json.loads((as_path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return ((manifest.get("checkpoint") or {}) if isinstance(manifest, dict) else {}).get("run_id") or None


def _remove(path: Path) -> None:
    remove_tree(path) if is_remote(path) else shutil.rmtree(path, ignore_errors=True)


def retire_exports(root: Path, run_id: str) -> list[Path]:
    """Remove the versions under ``root`` that are not complete exports of the run ``run_id``
    (a replaced run's, or what a killed publication left), and a ``latest`` pointer that then
    names none; returns what was removed. Only directories tzrec-run marked as exports are
    removed; anything else under ``root`` is left alone (and never pointed at)."""
    root = as_path(root)
    removed = []
    for _, path, complete in versions(root):
        if _ours(path) and (not complete or _run_of(path) != run_id):
            _remove(path)
            removed.append(path)
    current = latest_version(root)
    if current is not None and not (current / COMPLETE).exists():
        (root / LATEST).unlink()
    return removed


def publish_export(facts: Any, checkpoint: Path, root: Path, keep: int, run_id: str = "") -> Path:
    """Export ``checkpoint`` as the version ``<root>/step-N`` (one process, no process group),
    point ``latest`` at it, and keep the newest ``keep`` versions of the run ``run_id``; the
    versions of other runs are retired first (:func:`retire_exports`). A complete version of
    this run and this very checkpoint is only pointed at.

    Returns:
        The version directory.
    """
    from tzrun_serving.export import export_checkpoint

    root, view = as_path(root), open_checkpoint(checkpoint)
    step = view.step
    retired = retire_exports(root, run_id)
    if retired:
        log.info("retired %d export(s) under %s that were not this run's", len(retired), root)
    version = root / f"step-{step}"
    if not (version / COMPLETE).exists() or _source_digest(version) != view.marker_sha256():
        export_checkpoint(facts, view, version)
    write_atomic(root / LATEST, f"{version.name}\n".encode())
    complete = [path for _, path, done in versions(root) if done and _ours(path)]
    for path in complete[:-keep]:
        if path.name != version.name:
            _remove(path)
    return version


def _source_digest(version: Path) -> str | None:
    """The checkpoint marker's SHA-256 that a version's manifest records."""
    try:
        manifest = json.loads((version / MANIFEST).read_text(encoding="utf-8"))
        digest = manifest["checkpoint"]["marker_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return digest if isinstance(digest, str) else None
