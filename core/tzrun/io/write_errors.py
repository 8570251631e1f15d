"""Failures to write into the model dir, named: a full disk, a read-only or unwritable dir.

Writing a checkpoint, the run records, ``metrics.jsonl`` or ``eval_results.jsonl`` can fail
with an ``OSError`` (raised directly, or inside torch.distributed.checkpoint's
``CheckpointException``, or as the cause of another error). :func:`named_write_error` turns it
into one line naming the path, what the error number means and what to do, as a
:class:`~tzrun.errors.WriteError` (exit code 2). Torch-free.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Iterator

from tzrun.errors import WriteError
from tzrun.io.storage import as_path, is_remote

__all__ = ["named_write_error", "named_save_error", "write_failure_message"]

#: errors that only a write raises
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_READ_ONLY = {errno.EROFS}
#: errors a read can raise too: named only for a path inside the model dir
_DENIED = {errno.EACCES, errno.EPERM}


def _wrapped(error: BaseException | None, seen: set[int] | None = None) -> Iterator[BaseException]:
    """``error`` and the errors it wraps (cause, context, DCP's per-rank failures), depth first."""
    seen = set() if seen is None else seen
    if error is None or id(error) in seen:
        return
    seen.add(id(error))
    yield error
    failures = getattr(error, "failures", None)  # torch.distributed.checkpoint.api.CheckpointException
    if isinstance(failures, dict):
        for failure in failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException):
                yield from _wrapped(inner, seen)
    yield from _wrapped(error.__cause__, seen)
    yield from _wrapped(error.__context__, seen)


def _os_errors(error: BaseException | None) -> Iterator[OSError]:
    """The ``OSError`` s among ``error`` and the errors it wraps."""
    return (e for e in _wrapped(error) if isinstance(e, OSError))


#: the packages whose errors say that a store (not the code) failed: the clients fsspec uses
_STORE_CLIENTS = ("botocore", "boto3", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "azure", "fsspec",
                  "urllib3", "requests", "google")


def _store_error(error: BaseException) -> bool:
    """Whether ``error`` is a failure of a file system or store (an ``OSError``, a connection
    or timeout error, or an error of a storage client: botocore's ``EndpointConnectionError``
    and ``ClientError``, aiohttp's, fsspec's)."""
    if isinstance(error, (OSError, TimeoutError)):
        return True
    return any(klass.__module__.split(".")[0] in _STORE_CLIENTS for klass in type(error).__mro__)


def named_save_error(error: BaseException, model_dir: str | os.PathLike[str], what: str) -> WriteError | None:
    """The named error for a checkpoint save that failed: :func:`named_write_error`, or else, for
    any failure of the file system or store it wraps (a store that went away mid-save: a refused
    connection, botocore's ``EndpointConnectionError``, an I/O error), a
    :class:`~tzrun.errors.WriteError` naming the model dir, the failure and ``--resume``.

    Args:
        error: what the save raised (DCP wraps each rank's failure in a ``CheckpointException``).
        model_dir: the run's model dir.
        what: what was being written (``"checkpoint step-6"``).

    Returns:
        The :class:`~tzrun.errors.WriteError`, or None when ``error`` is no storage failure.
    """
    from tzrun.errors import TzrunError

    named = named_write_error(error, model_dir, what)
    if named is not None or isinstance(error, (TzrunError, KeyboardInterrupt, SystemExit)):
        return named
    found = next((e for e in _wrapped(error) if _store_error(e)), None)
    if found is None:
        return None
    detail = " ".join(str(found).split())[:200] or "(no message)"
    return WriteError(
        f"{model_dir}: cannot write {what}: {type(found).__name__}: {detail}; check that the store is reachable "
        "(endpoint, credentials, network) and has room, then rerun with --resume: the checkpoints completed "
        "before it are intact")


def _inside(path: str | None, model_dir: Path) -> bool:
    if path is None:
        return False
    try:
        return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(model_dir))
    except (TypeError, ValueError):
        return False


def write_failure_message(error: OSError, model_dir: Path, what: str = "", resume: bool = True) -> str:
    """One line for a failed write.

    Args:
        error: the failure (its ``errno`` picks the fix).
        model_dir: the run's model dir (named when ``error`` names no file).
        what: what was being written (``"the run lock run.lock"``), or empty.
        resume: say that the run continues with ``--resume`` (a training run).

    Returns:
        ``PATH: cannot write: MEANING (ERRNO) while writing WHAT; FIX``.
    """
    path = error.filename if isinstance(error.filename, str) else str(model_dir)
    meaning = os.strerror(error.errno) if error.errno else str(error)
    name = errno.errorcode.get(error.errno or 0, "")
    doing = f" while writing {what}" if what else ""
    if error.errno in _FULL:
        fix = "free space on that disk (or set model_dir to a disk with room)"
    else:
        fix = f"make {model_dir} writable for this user (or set model_dir to a writable directory)"
    if resume:
        fix += " and rerun with --resume: the checkpoints completed before it are intact"
    return f"{path}: cannot write: {meaning} ({name}){doing}; {fix}"


def named_write_error(error: BaseException, model_dir: str | os.PathLike[str], what: str = "") -> WriteError | None:
    """The named error for a failure to write into the model dir.

    Args:
        error: any error a run raised (an ``OSError``, or one wrapping it as its cause or, for
            torch.distributed.checkpoint, as a rank's failure).
        model_dir: the run's model dir.
        what: what was being written, when known.

    Returns:
        A :class:`~tzrun.errors.WriteError` when ``error`` is (or wraps) a full disk or quota,
        a read-only file system, or permission denied on a path inside ``model_dir``, or is any
        other failure while the model dir's disk has under 1 MiB left; None otherwise (and for
        a :class:`~tzrun.errors.TzrunError`, which is named already).
    """
    from tzrun.errors import TzrunError

    if isinstance(error, (TzrunError, KeyboardInterrupt, SystemExit)):
        return None  # named already, or not a failure
    local = None if is_remote(model_dir) else Path(model_dir)  # a URL has no local disk to check
    for found in _os_errors(error):
        if found.errno in _FULL or found.errno in _READ_ONLY or (
                found.errno in _DENIED and local is not None and _inside(found.filename, local)):
            return WriteError(write_failure_message(found, as_path(model_dir), what))
    if local is not None and _disk_full(local):
        # torch.save's zip writer reports a short write as "RuntimeError: [enforce fail at
        # inline_container.cc] unexpected pos ...", without the errno: the disk tells instead
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        lines = str(error).strip().splitlines()
        detail = lines[-1][:160] if lines else ""
        if type(error).__name__ != "CheckpointException":  # whose last line names the inner error
            detail = f"{type(error).__name__}: {detail}"
        return WriteError(write_failure_message(
            full, as_path(model_dir), f"{what or 'into it'} (the disk has under 1 MiB left; the write failed with {detail})"))
    return None


def _disk_full(model_dir: Path) -> bool:
    """Whether the disk of ``model_dir`` (or of its nearest existing parent) has less than
    1 MiB left for this user."""
    path = model_dir
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        stat = os.statvfs(path)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < (1 << 20)
