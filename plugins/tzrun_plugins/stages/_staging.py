"""A directory for writers that can only write local files (TensorBoard's event writer,
torch's trace handler) whose files belong in the model dir, which may be on an object store.

For a local target the writers write there directly. For a URL (``s3://``, ``gs://`` ...)
they write into a local temporary directory, and :meth:`StagedDir.upload` copies each file
that changed since its last upload to the target through fsspec, whole (one PUT: an object
store has no append, so an event file is re-sent as it grows; event files and traces are
small). :meth:`StagedDir.close` uploads a last time and removes the temporary directory.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import tzrun

__all__ = ["StagedDir"]


class StagedDir:
    """Where a local-only writer writes, for ``target`` (a local path or a URL).

    Args:
        target: the directory the files belong in.
        what: a word for the temporary directory's name (``tensorboard``).
    """

    def __init__(self, target: Any, what: str) -> None:
        self.target = tzrun.as_path(target)
        self.remote = tzrun.is_remote(self.target)
        self.local = Path(tempfile.mkdtemp(prefix=f"tzrun-{what}-")) if self.remote else Path(self.target)
        self.uploaded_at = time.monotonic()
        self._sent: dict[str, tuple[int, int]] = {}

    def upload(self) -> None:
        """Copy every file that changed since its last upload to the target (nothing to do
        for a local target)."""
        if not self.remote or not self.local.is_dir():
            return
        fs, inner = tzrun.filesystem(self.target)
        for file in sorted(self.local.rglob("*")):
            if not file.is_file():
                continue
            stat = file.stat()
            name = file.relative_to(self.local).as_posix()
            if self._sent.get(name) == (stat.st_size, stat.st_mtime_ns):
                continue
            fs.put_file(str(file), f"{inner.rstrip('/')}/{name}")
            self._sent[name] = (stat.st_size, stat.st_mtime_ns)
        self.uploaded_at = time.monotonic()

    def close(self) -> None:
        """Upload a last time and remove the temporary directory (safe to call again)."""
        if self.remote and self.local.is_dir():
            try:
                self.upload()
            finally:
                shutil.rmtree(self.local, ignore_errors=True)
