"""Where torch.distributed.checkpoint writes and reads a checkpoint's ``state/``: the local
file system's storage for a local path, DCP's fsspec storage for a URL (``s3://``, ``gs://``,
``abfs://``, ``hdfs://``). The fsspec storage renames only DCP's own ``.metadata`` file
(a copy on an object store); nothing of tzrec-run's atomicity relies on it (see
:mod:`tzrun.runner.checkpoint`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tzrun.storage import is_remote, redact_url, storage_options

__all__ = ["storage_writer", "storage_reader"]


def storage_writer(path: Path) -> Any:
    """DCP's writer of ``path``: the local file system's, or its fsspec storage for a URL
    (torch 2.13 exports ``FsspecWriter`` only from ``torch.distributed.checkpoint._fsspec_filesystem``)."""
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        class RedactingFsspecWriter(FsspecWriter):
            """DCP's fsspec writer, recording the checkpoint's URL in ``.metadata`` without its password."""

            def storage_meta(self) -> Any:
                meta = super().storage_meta()
                if meta is not None and meta.checkpoint_id is not None:
                    meta.checkpoint_id = redact_url(meta.checkpoint_id)
                return meta

        return RedactingFsspecWriter(str(path), **storage_options(path))
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(str(path))


def storage_reader(path: Path) -> Any:
    """DCP's reader of ``path``, as :func:`storage_writer`."""
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(str(path), **storage_options(path))
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(str(path))
