"""One run per model dir: an exclusive lock file, ``model_dir/run.lock``.

Rank 0 of ``tzrec-run train`` creates it atomically before anything is written into the model
dir, records its host, pid, process start time, start time and command (URLs with their
passwords redacted), and removes it when the run ends (normally or by an error). The other
ranks learn the outcome from rank 0, so every rank refuses together.

On a local disk the record is written to a temporary file first and hard-linked to
``run.lock`` (``os.link`` fails when the name exists), so the lock is complete whenever it is
visible; a file system without hard links gets ``O_CREAT | O_EXCL`` and readers wait a moment
for the record.

A lock left by a run that died without removing it (killed by SIGKILL, a crashed host) is
*stale*: on the same host, its pid no longer runs (or runs another program, told by the
process start time in ``/proc``); such a lock is taken over with a warning. The takeover is a
compare-and-delete: the stale lock is removed only while this process holds an ``flock`` on the
very file it examined and the name still points to that file (on an object store: while it
holds a lock on this host, the only host allowed to take that lock over, and the object still
holds the record examined); the new lock is then created exclusively like any other, so of
several runs taking over one stale lock at once exactly one gets it. A lock written on another
host cannot be checked from here: it is refused with the command that removes it.
``tzrec-run evaluate`` reads a model dir without taking the lock.

On an object store (``s3://`` ...) the lock is an object created with a conditional write
(fsspec's exclusive mode ``"xb"``: S3's ``If-None-Match: *``, GCS's ``ifGenerationMatch=0``),
which fails when the object exists, so two runs cannot both create it. Some S3-compatible
servers ignore ``If-None-Match`` and overwrite silently, so before taking the lock the run
probes the store (an exclusive create of a probe object, twice: the second must fail). A store
that ignores conditional creates, or an fsspec implementation without them, is refused
(:data:`~tzrun.errors.EXIT_CANT_WRITE`) unless ``TZRUN_NONEXCLUSIVE_RUN_LOCK=1`` accepts a lock
that is checked, then written and read back, with a warning: two runs started within the same
moment may then both believe they hold it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import attrs

from tzrun.errors import EXIT_CANT_WRITE, StorageError, TzrunError
from tzrun.io.storage import as_path, is_remote, redact_url
from tzrun.runner.distributed import refusal_of_rank0

__all__ = ["LOCK_FILE", "NONEXCLUSIVE_LOCK_ENV", "ModelDirLockedError", "RunLock", "acquire_run_lock", "claim_run_lock"]

log = logging.getLogger(__name__)

#: The lock file's name in the model dir.
LOCK_FILE = "run.lock"
#: Set to ``1`` to run on a store that ignores conditional creates, with a lock that is checked,
#: then written (two runs started at the same moment could both take it) and a warning.
NONEXCLUSIVE_LOCK_ENV = "TZRUN_NONEXCLUSIVE_RUN_LOCK"
#: How long a reader waits for a lock's record being written (file systems without hard links).
_READ_WAIT_S = 1.0
#: Tries to create the lock, each after a stale one was removed (by this run or another).
_ATTEMPTS = 5
#: What ``os.link`` fails with on a file system without hard links.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


class ModelDirLockedError(TzrunError):
    """Another run holds the model dir's lock (exit code :data:`~tzrun.errors.EXIT_CANT_WRITE`)."""

    exit_code = EXIT_CANT_WRITE


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` still runs the process that wrote the lock."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, under another user
        pass
    now = _process_start(pid)
    return started is None or now is None or now == started


@attrs.define
class RunLock:
    """A held lock: :meth:`release` removes the file if it is still this process's."""

    path: Path

    def release(self) -> None:
        """Remove the lock file (a lock another process took over meanwhile is left alone)."""
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)


def _describe(holder: dict[str, Any]) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"host {holder.get('host')}, pid {holder.get('pid')}, started {when}: {holder.get('command', '?')}"


def _record(command: str) -> bytes:
    """This process's lock record (a password in a URL of the command line redacted)."""
    record = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
              "started": time.time(), "command": redact_url(command)}
    return (json.dumps(record) + "\n").encode("utf-8")


def _write_new(path: Path, content: bytes) -> None:
    """Create the local file ``path`` (``FileExistsError`` when it exists) holding ``content``."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
    except BaseException:
        os.unlink(path)
        raise


def _create_file(path: Path, content: bytes) -> bool:
    """Create the local lock, complete when it becomes visible (a hard link to a written temporary
    file); False when it exists. Without hard links: ``O_EXCL``, and readers wait for the record."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    _write_new(temp, content)
    try:
        os.link(temp, path)
        return True
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
    finally:
        temp.unlink(missing_ok=True)
    try:
        _write_new(path, content)
    except FileExistsError:
        return False
    return True


def _create_object(path: Path, content: bytes, exclusive: bool) -> bool:
    """Create the lock object: a conditional write, or (a store without one, accepted by
    :data:`NONEXCLUSIVE_LOCK_ENV`) check, write and read back; False when another run's is there."""
    if exclusive:
        try:
            with path.open("xb") as f:
                f.write(content)
            return True
        except FileExistsError:
            return False
    if path.exists():
        return False
    path.write_bytes(content)
    return path.read_bytes() == content


def _probe_exclusive_create(model_dir: Path) -> str | None:
    """Why the store of ``model_dir`` cannot create an object only if it is absent (a probe object
    created exclusively twice: the second must fail), or None when it can."""
    probe = model_dir / f".run.lock-probe-{uuid.uuid4().hex}"
    try:
        for _ in range(2):
            with probe.open("xb") as f:
                f.write(b"tzrec-run: a probe of exclusive creates; safe to delete\n")
    except FileExistsError:
        return None
    except FileNotFoundError:
        raise StorageError(
            f"{model_dir}: cannot create the run lock: its bucket (or container) does not exist, or these credentials "
            "cannot see it; create it first (tzrec-run does not create buckets) or fix model_dir") from None
    except (NotImplementedError, ValueError, TypeError) as error:
        return f"this store (or its fsspec implementation) cannot create a file only if it is absent ({error})"
    finally:
        try:
            probe.unlink()
        except OSError:  # never created (missing bucket), or gone: nothing to clean
            pass
    return "this store ignores conditional creates (If-None-Match): a second exclusive create of one object succeeded"


def _exclusive_store(model_dir: Path) -> bool:
    """Whether the lock on ``model_dir``'s store is a conditional create (probed); a store without
    one is refused, or accepted with a warning when :data:`NONEXCLUSIVE_LOCK_ENV` is ``1``."""
    reason = _probe_exclusive_create(model_dir)
    if reason is None:
        return True
    if os.environ.get(NONEXCLUSIVE_LOCK_ENV, "").strip().lower() in ("1", "true", "yes"):
        log.warning("%s: THE RUN LOCK IS NOT EXCLUSIVE: %s; %s=1 accepts it: the lock is checked, then written and "
                    "read back, so two runs started at the same moment could both take it (and one, with --overwrite, "
                    "delete the other's checkpoints)", model_dir, reason, NONEXCLUSIVE_LOCK_ENV)
        return False
    raise ModelDirLockedError(
        f"{model_dir}: the run lock cannot be made exclusive: {reason}, so a second run could take a live run's lock "
        "(and, with --overwrite, delete its checkpoints); put model_dir on a store that honours conditional writes "
        "(AWS S3, GCS, a recent MinIO) or on a local disk, or accept a lock that two runs started together could both "
        f"take: {NONEXCLUSIVE_LOCK_ENV}=1")


def _holder(read: Callable[[], bytes], path: Path) -> tuple[bytes, dict[str, Any]]:
    """The lock's content and record, waiting up to :data:`_READ_WAIT_S` for a record being written.

    Raises:
        FileNotFoundError: when the lock is gone (released meanwhile).
        ModelDirLockedError: when it holds no record after that wait.
    """
    deadline = time.monotonic() + _READ_WAIT_S
    while True:
        content = read()
        try:
            holder = json.loads(content)
            int(holder["pid"])
            return content, holder
        except (ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                raise ModelDirLockedError(
                    f"{path}: the model dir's run lock is unreadable; if no run is using {path.parent}, remove the "
                    f"file (rm {path}) and start again") from None
            time.sleep(0.05)


def _refuse_unless_stale(path: Path, holder: dict[str, Any]) -> None:
    """Raise :class:`ModelDirLockedError` unless the lock's process is known dead (same host)."""
    model_dir = path.parent
    if holder.get("host") != socket.gethostname():
        raise ModelDirLockedError(
            f"{model_dir} is in use by another run ({_describe(holder)}), on another host, so this host cannot "
            f"tell whether it still runs; if that run is dead, remove its lock (rm {path}) and start again")
    if _alive(int(holder["pid"]), holder.get("process_start")):
        raise ModelDirLockedError(
            f"{model_dir} is in use by another run ({_describe(holder)}); wait for it to end, stop it (SIGTERM "
            "writes a checkpoint), or train with --model-dir elsewhere")


def _take_over(path: Path, holder: dict[str, Any]) -> None:
    log.warning("%s: taking over a stale run lock (%s; that process no longer runs)", path, _describe(holder))
    path.unlink(missing_ok=True)


def _open_lock(path: Path) -> int | None:
    """A descriptor of the local lock (read-write where allowed: NFS locks only a file open for
    writing), or None when it is gone."""
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    except PermissionError:
        pass
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None


def _examine_file(path: Path) -> None:
    """Refuse a live local lock; remove a stale one if it is still the file examined (an
    ``flock`` on it, then the name checked to point to it), so one of several runs taking it
    over at once removes it and the others find the new lock."""
    fd = _open_lock(path)
    if fd is None:
        return
    try:
        _, holder = _holder(lambda: os.pread(fd, 1 << 16, 0), path)
        _refuse_unless_stale(path, holder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as error:
            raise ModelDirLockedError(
                f"{path}: a stale run lock ({_describe(holder)}; that process no longer runs) cannot be taken over "
                f"safely on this file system ({error}); if no run is using {path.parent}, remove it (rm {path}) and "
                "start again") from None
        try:
            if not os.path.samestat(os.fstat(fd), os.stat(path)):
                return  # another run took it over first
        except FileNotFoundError:
            return
        _take_over(path, holder)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _host_lock(path: Path) -> Iterator[None]:
    """An ``flock`` on a file of this host's temporary directory named after the lock's URL: the
    processes of this host (the only one that may take over the lock) take it over one at a time."""
    key = hashlib.sha256(redact_url(path).encode("utf-8")).hexdigest()[:24]
    guard = Path(tempfile.gettempdir()) / f"tzrun-run-lock-{key}"
    try:
        fd = os.open(guard, os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(guard, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _examine_object(path: Path) -> None:
    """:func:`_examine_file` on an object store: a stale lock object is deleted under
    :func:`_host_lock` if it still holds the record examined."""
    try:
        examined, holder = _holder(path.read_bytes, path)
    except FileNotFoundError:
        return
    _refuse_unless_stale(path, holder)
    with _host_lock(path):
        try:
            if path.read_bytes() != examined:
                return  # another run took it over first
        except FileNotFoundError:
            return
        _take_over(path, holder)


def acquire_run_lock(model_dir: Path, command: str | None = None) -> RunLock:
    """Take the model dir's lock (one process: rank 0), creating the model dir if needed.

    Args:
        model_dir: the run's model dir.
        command: recorded in the lock (default: this process's command line).

    Returns:
        The held lock.

    Raises:
        ModelDirLockedError: when a live run holds it (naming its host, pid and start), when it
            was written on another host, when it cannot be read, or when the model dir's store
            cannot create it exclusively (see the module doc).
        StorageError: when the model dir's bucket does not exist.
    """
    model_dir = as_path(model_dir)
    path = model_dir / LOCK_FILE
    content = _record(command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
    if is_remote(model_dir):  # an object store has no directories (and s3fs would create a missing bucket)
        exclusive = _exclusive_store(model_dir)
        create, examine = (lambda: _create_object(path, content, exclusive)), _examine_object
    else:
        model_dir.mkdir(parents=True, exist_ok=True)
        create, examine = (lambda: _create_file(path, content)), _examine_file
    for _ in range(_ATTEMPTS):
        if create():
            return RunLock(path)
        examine(path)
    raise ModelDirLockedError(f"{model_dir}: another run took the run lock ({path}) at the same time")


def claim_run_lock(model_dir: Path, rank: int, world_size: int) -> RunLock | None:
    """Take the lock on rank 0 and tell every rank the outcome (collective with several ranks).

    Returns:
        The lock on rank 0, None on the other ranks.

    Raises:
        ModelDirLockedError: on every rank when rank 0 could not take the lock.
    """
    lock, refusal = None, None
    if rank == 0:
        try:
            lock = acquire_run_lock(model_dir)
        except (ModelDirLockedError, StorageError) as error:
            refusal = str(error)
        except OSError as error:  # a read-only or full model dir: refused on every rank, not a hang
            from tzrun.io.write_errors import write_failure_message

            refusal = write_failure_message(error, as_path(model_dir), f"the run lock {LOCK_FILE}")
    refusal = refusal_of_rank0(refusal, world_size)
    if refusal is not None:
        raise ModelDirLockedError(refusal)
    return lock
