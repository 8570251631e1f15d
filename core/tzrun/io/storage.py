"""Where a path points: this machine's disk, or an object store or distributed file system named
by a URL (``s3://bucket/key``, ``gs://``, ``abfs://``, ``hdfs://``; ``file://`` is local).

Every path a config or a command names (``data.train_input``, ``data.eval_input``,
``model_dir``, ``--init-from``, a checkpoint) goes through here. Local paths stay
:class:`pathlib.Path` and behave exactly as before; a URL becomes a
:class:`upath.UPath`, the pathlib API over `fsspec <https://filesystem-spec.readthedocs.io>`_,
so code written against ``Path`` (``/``, ``exists``, ``iterdir``, ``read_bytes``, ``open``)
works on both. Credentials and endpoints come only from each store's standard environment and
config files (for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...),
never from the TOML. Each scheme needs its fsspec implementation, installed by an extra
(``pip install 'tzrec-run[s3]'``); a missing one is a one-line error naming the extra.

Torch-free; part of the public API, so that readers and stages handle URLs the way the core does.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from tzrun.errors import DataError, StorageError

__all__ = [
    "is_remote",
    "as_path",
    "filesystem",
    "open_file",
    "list_files",
    "remove_tree",
    "under",
    "exists",
    "storage_options",
    "redact_url",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

#: The extra of ``tzrec-run`` that installs the fsspec implementation of a scheme.
_EXTRAS = {
    "s3": "s3", "s3a": "s3",
    "gs": "gcs", "gcs": "gcs",
    "abfs": "azure", "abfss": "azure", "az": "azure", "adl": "azure",
    "hdfs": "hdfs", "viewfs": "hdfs",
}


#: The password of a URL's user information (``scheme://user:password@host``), and of the same
#: ``user:password@host`` without its scheme at the start of a word (a store client's message).
_PASSWORD = re.compile(r"""([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'"]*|(?<![^\s'"(=])[^\s/@:'"]+):[^\s/@'"]+@""")


def redact_url(text: str | os.PathLike[str]) -> str:
    """``text`` with the password of every URL in it replaced by ``***``
    (``s3://user:***@bucket/key``; ``user:***@bucket`` where a message quotes it without its
    scheme): what every message, log line and record of a run shows of a
    path, a command line or an error. Credentials belong in each store's standard environment,
    which is never printed nor recorded; one written into a URL is kept out the same way."""
    return _PASSWORD.sub(r"\1:***@", os.fspath(text) if isinstance(text, os.PathLike) else str(text))


def scheme(path: str | os.PathLike[str]) -> str | None:
    """The URL scheme of ``path`` (``"s3"``), or None for a plain local path."""
    match = _SCHEME.match(os.fspath(path))
    return match.group(1).lower() if match else None


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a URL of a store other than the local disk (``file://`` is local)."""
    if isinstance(path, Path) and not _is_upath(path):
        return False
    if _is_upath(path):
        return getattr(path, "protocol", "") not in ("", "file", "local")
    found = scheme(str(path))
    return found is not None and found not in ("file", "local")


def as_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a path object: a :class:`pathlib.Path` for a local path or a ``file://``
    URL, a :class:`upath.UPath` for any other URL.

    Raises:
        StorageError: for a URL whose scheme has no fsspec implementation installed, naming
            the ``tzrec-run`` extra that installs it.
    """
    if isinstance(path, Path):  # a local path
        return path
    if _is_upath(path):
        return path if is_remote(path) else Path(path.path)  # type: ignore[attr-defined]
    text = os.fspath(path)
    found = scheme(text)
    if found is None:
        return Path(text)
    if found in ("file", "local"):
        return Path(text.split("://", 1)[1])
    _check_protocol(found, text)
    from upath import UPath

    return UPath(text, **storage_options(text))


#: Schemes whose fsspec filesystem caches directory listings (s3fs, gcsfs, adlfs).
_LISTING_CACHES = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"}


def storage_options(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The fsspec options every access to ``path`` uses: for stores whose filesystem caches
    directory listings, no listing cache. Several processes (ranks, runs, ``tzrec-run ckpt``)
    write a model dir; a cached listing would hide a checkpoint another rank wrote, and s3fs
    reads a file it rewrote since (``eval_results.jsonl``, ``best.json``) by a stale ETag
    and fails with ``FileExpired``. Endpoints and credentials are never options here: they
    come from each store's standard environment."""
    found = scheme(str(path))
    return {"use_listings_cache": False} if found in _LISTING_CACHES else {}


def _is_upath(path: object) -> bool:
    return type(path).__module__.startswith("upath")


def _check_protocol(found: str, text: str) -> None:
    """Raise the one-line error for a scheme fsspec does not know or cannot import."""
    import fsspec

    try:
        fsspec.get_filesystem_class(found)
    except (ImportError, ValueError) as error:
        extra = _EXTRAS.get(found)
        fix = f"install its extra: pip install 'tzrec-run[{extra}]'" if extra else "use a local path or a supported URL"
        raise StorageError(f"{text}: cannot open {found}:// paths ({error}); {fix}") from None


def filesystem(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """The fsspec filesystem of ``path`` and the path inside it (for a local path, fsspec's
    local filesystem and the absolute path).

    Raises:
        StorageError: as :func:`as_path`.
    """
    import fsspec.core

    text = str(path)
    found = scheme(text)
    if found is not None and found not in ("file", "local"):
        _check_protocol(found, text)
    return fsspec.core.url_to_fs(text, **storage_options(text))


def open_file(path: str | os.PathLike[str], mode: str = "rb") -> IO[Any]:
    """Open ``path`` (local or a URL) like :func:`open`."""
    if not is_remote(path):
        return open(as_path(path), mode)
    return as_path(path).open(mode)


def under(base: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` as a path object (:func:`as_path`), taken relative to ``base`` unless it is a
    URL or absolute: where a stage's output option (``log_dir = "tensorboard"``) points in a
    model dir that may itself be a URL."""
    if is_remote(path) or Path(path).is_absolute():
        return as_path(path)
    return as_path(base) / os.fspath(path)


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (local or a URL) names a file or a directory (on an object store: an
    object or a prefix of objects).

    Raises:
        StorageError: as :func:`as_path`; and what the store's client raises when it cannot
            answer (credentials, network).
    """
    if not is_remote(path):
        return os.path.exists(as_path(path))
    fs, inner = filesystem(path)
    return bool(fs.exists(inner))


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Delete the directory ``path`` and everything under it (an object store: every key
    under the prefix). A missing directory is not an error."""
    if not is_remote(path):
        shutil.rmtree(as_path(path), ignore_errors=True)
        return
    fs, inner = filesystem(path)
    try:
        fs.rm(inner, recursive=True)
    except FileNotFoundError:
        pass


def list_files(
    input_path: str | os.PathLike[str], suffixes: Sequence[str], hint: Callable[[Sequence[str]], str] | None = None
) -> list[str]:
    """The files of ``input_path`` (a file, a directory searched recursively for ``suffixes``,
    or a glob, ``**`` included), local or a URL, sorted so every rank sees the same order.
    Names starting with ``.`` or ``_`` in a directory are skipped (``_SUCCESS``, ``.crc``).
    URLs are returned as URLs (``s3://bucket/key``).

    Args:
        input_path: a file, a directory or a glob.
        suffixes: the endings of the files read from a directory (``data.reader.suffixes``).
        hint: given the names of the files a directory holds when none ends in ``suffixes``,
            what to add to the error (what the reader can or cannot read of them).

    Raises:
        DataError: when nothing matches; for a directory, naming a few of the files it holds,
            the suffixes looked for and ``data.reader.suffixes``.
        StorageError: for a URL whose scheme is not installed (see :func:`as_path`), or whose
            store refuses the listing (credentials, endpoint, network), naming the URL.
    """
    text = os.fspath(input_path)
    local = text.split("://", 1)[1] if scheme(text) in ("file", "local") else text
    fs, inner = filesystem(text) if is_remote(text) else (None, local)
    if fs is None:
        files, seen = _list_local(inner, suffixes)
    else:
        try:
            files, seen = _list_remote(fs, inner, text, suffixes)
        except Exception as error:  # the store's client raises its own types (botocore's, ...)
            raise StorageError(f"{text}: cannot be listed: {type(error).__name__}: {error}; check the path and the "
                               "store's credentials and endpoint in its standard environment (AWS_*, ...)") from None
    if seen is not None and not files:
        raise DataError(_no_files_in_directory(text, sorted(seen), suffixes, hint))
    if not files:
        raise DataError(
            f"{text}: no input files found (expected a file, a directory with "
            f"{'/'.join(suffixes)} files, or a glob)"
        )
    return sorted(files)


def _is_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _list_local(path: str, suffixes: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Matching files and, for a directory, every listed name (relative)."""
    import glob

    if os.path.isdir(path):
        seen = [
            os.path.join(root, name)[len(path) :].lstrip(os.sep)
            for root, _, names in os.walk(path)
            for name in names
            if not name.startswith((".", "_"))
        ]
        return [os.path.join(path, name) for name in seen if name.endswith(tuple(suffixes))], seen
    if _is_glob(path):
        return [f for f in glob.glob(path, recursive=True) if os.path.isfile(f)], None
    return ([path] if os.path.isfile(path) else []), None


def _list_remote(fs: Any, inner: str, url: str, suffixes: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """:func:`_list_local` on an fsspec filesystem; results are full URLs."""
    prefix = url[: len(url) - len(url.split("://", 1)[1])]  # "s3://"

    def as_url(key: str) -> str:
        return key if "://" in key else prefix + key.lstrip("/")

    if _is_glob(inner):
        return [as_url(k) for k in fs.glob(inner) if fs.isfile(k)], None
    if fs.isdir(inner):
        base = inner.rstrip("/")
        keys = [k for k in fs.find(base) if not k.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))]
        seen = [k[len(base) :].lstrip("/") for k in keys]
        return [as_url(base + "/" + name) for name in seen if name.endswith(tuple(suffixes))], seen
    return ([url] if fs.isfile(inner) else []), None


def _no_files_in_directory(
    directory: str, seen: Sequence[str], suffixes: Sequence[str], hint: Callable[[Sequence[str]], str] | None
) -> str:
    looked_for = ", ".join(repr(s) for s in suffixes)
    if not seen:
        return f"{directory}: no input files found: the directory has no files (looked for names ending in {looked_for})"
    shown = ", ".join(seen[:5]) + (f", ... ({len(seen)} files)" if len(seen) > 5 else "")
    return (
        f"{directory}: no input files found: no name ends in {looked_for} (the directory has: {shown}); "
        'set data.reader.suffixes to the endings to read (suffixes = [""] reads every file)' + (hint(seen) if hint else "")
    )
