"""Opening the readers' input files, on this machine's disk or on an object store.

A local path is opened with :func:`open` and stamped with :func:`os.stat`, exactly as before.
A URL (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``) is opened through its fsspec filesystem
for random reads: every read fetches the bytes asked for and no more (no read-ahead cache, so
reading one group of a file or one Parquet column chunk does not download the rest of it).

No filesystem object is kept here: each open asks fsspec for the URL's filesystem, whose
instance cache is per process (a DataLoader worker forked from the trainer makes its own
instead of using the trainer's, which ``s3fs`` and ``aiohttp`` do not allow after a fork).
"""

from __future__ import annotations

import os
from typing import IO, Any, cast

from tzrun import filesystem, is_remote

__all__ = ["open_input", "read_range", "stamp", "REMOTE_BLOCK_BYTES"]

#: Bytes a remote file fetches at a time where a reader reads up to a line break (a header).
REMOTE_BLOCK_BYTES = 256 << 10

#: Keys of an fsspec ``info()`` that change when an object is rewritten, by store.
_VERSION_KEYS = ("ETag", "etag", "VersionId", "generation", "LastModified", "last_modified", "mtime", "updated")


def open_input(path: str) -> IO[bytes]:
    """``path`` (local or a URL) opened for seekable binary reads.

    Raises:
        OSError: when it cannot be opened (``FileNotFoundError``, ``PermissionError``).
        StorageError: for a URL whose scheme is not installed.
    """
    if not is_remote(path):
        return open(path, "rb")
    fs, inner = filesystem(path)
    return cast(IO[bytes], fs.open(inner, "rb", cache_type="none", block_size=REMOTE_BLOCK_BYTES))


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``path`` (local or a URL: one ranged GET).

    Raises:
        OSError: when it cannot be read.
    """
    if not is_remote(path):
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start)
    fs, inner = filesystem(path)
    return bytes(fs.cat_file(inner, start=start, end=end))


def stamp(path: str) -> tuple[int, Any]:
    """``(size, version)`` of ``path``: a pair that changes when the file is rewritten (a local
    file's modification time; an object's ETag or generation, asked of the store afresh).

    Raises:
        OSError: when it cannot be read.
    """
    if not is_remote(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns
    fs, inner = filesystem(path)
    fs.invalidate_cache(inner)
    info = fs.info(inner)
    if info.get("type") == "directory":
        raise IsADirectoryError(21, "is a directory", path)
    version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k)), "")
    return int(info["size"]), version
