"""Versioned exports a serving system can poll: ``<dir>/step-N/`` (each a complete export,
its ``COMPLETE`` marker written last), and ``<dir>/latest`` (the name of the newest complete
one, one line), written after the version is complete. A reader that follows ``latest`` never
sees half an export: a version killed while it was written has no marker and ``latest`` still
names the one before it; the next publication removes it. Only ``step-N`` directories under
``<dir>`` are ever removed. Works the same on a local disk and an object store (the marker and
the pointer are each one atomic write)."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from tzrun.io.files import write_atomic
from tzrun.io.storage import as_path, is_remote, remove_tree
from tzrun.serving.manifest import COMPLETE

__all__ = ["LATEST", "publish_export", "versions", "latest_version", "export_root"]

log = logging.getLogger("tzrun")

LATEST = "latest"
_VERSION = re.compile(r"^step-(\d+)$")


def export_root(cfg: Any) -> Path:
    """Where ``[export]`` writes: ``export.dir``, or ``<model_dir>/exports``."""
    return as_path(cfg.export.dir) if cfg.export.dir else as_path(cfg.model_dir) / "exports"


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
    """The version ``<root>/latest`` names (None without one)."""
    pointer = as_path(root) / LATEST
    if not pointer.exists():
        return None
    return as_path(root) / pointer.read_text(encoding="utf-8").strip()


def _remove(path: Path) -> None:
    remove_tree(path) if is_remote(path) else shutil.rmtree(path, ignore_errors=True)


def publish_export(facts: Any, checkpoint: Path, root: Path, keep: int) -> Path:
    """Export ``checkpoint`` as the version ``<root>/step-N`` (one process, no process group),
    point ``latest`` at it, and keep the newest ``keep`` versions. A version that is complete
    already is only pointed at.

    Returns:
        The version directory.
    """
    from tzrun.runner.checkpoint import checkpoint_step
    from tzrun.serving.export import export_checkpoint

    root, checkpoint = as_path(root), as_path(checkpoint)
    step = checkpoint_step(checkpoint)
    for _, path, complete in versions(root):  # left by a publication that was killed
        if not complete:
            _remove(path)
    version = root / f"step-{step}"
    if not (version / COMPLETE).exists():
        export_checkpoint(facts, checkpoint, version)
    write_atomic(root / LATEST, f"{version.name}\n".encode())
    complete = [path for _, path, done in versions(root) if done]
    for path in complete[:-keep]:
        if path.name != version.name:
            _remove(path)
    return version
