"""One run per model dir: an exclusive lock file, ``model_dir/run.lock``.

Rank 0 of ``tzrec-run train`` creates it atomically (``os.open`` with ``O_CREAT | O_EXCL``)
before anything is written into the model dir, records its host, pid, process start time,
start time and command, and removes it when the run ends (normally or by an error). The other
ranks learn the outcome from rank 0, so every rank refuses together.

A lock left by a run that died without removing it (killed by SIGKILL, a crashed host) is
*stale*: on the same host, its pid no longer runs (or runs another program, told by the
process start time in ``/proc``); such a lock is taken over with a warning. A lock written on
another host cannot be checked from here: it is refused with the command that removes it.
``tzrec-run evaluate`` reads a model dir without taking the lock.

On an object store (``s3://`` ...) the lock is an object created with a conditional write
(fsspec's exclusive mode ``"xb"``: S3's ``If-None-Match: *``, GCS's ``ifGenerationMatch=0``),
which fails when the object exists, so two runs cannot both create it. A store or fsspec
implementation without conditional writes (``"xb"`` refused) gets a check-then-write instead,
with a warning, and the lock is read back after writing: two runs started within the same
moment may then both believe they hold it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from tzrun.errors import EXIT_CANT_WRITE, StorageError, TzrunError
from tzrun.storage import as_path, is_remote

__all__ = ["LOCK_FILE", "ModelDirLockedError", "RunLock", "acquire_run_lock", "claim_run_lock"]

log = logging.getLogger(__name__)

#: The lock file's name in the model dir.
LOCK_FILE = "run.lock"


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


def _create(path: Path, command: str) -> bool:
    """Create the lock file atomically with this process's record; False when it exists."""
    record = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
              "started": time.time(), "command": command}
    if is_remote(path):
        return _create_object(path, (json.dumps(record) + "\n").encode("utf-8"))
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.write("\n")
    return True


def _create_object(path: Path, content: bytes) -> bool:
    """:func:`_create` on an object store: a conditional write, or check-then-write where the
    store has none (then read back: False when another run's record replaced this one)."""
    try:
        with path.open("xb") as f:
            f.write(content)
        return True
    except FileExistsError:
        return False
    except FileNotFoundError:
        raise StorageError(
            f"{path.parent}: cannot create the run lock: its bucket (or container) does not exist, or these credentials "
            "cannot see it; create it first (tzrec-run does not create buckets) or fix model_dir") from None
    except (NotImplementedError, ValueError, TypeError) as error:  # no exclusive create on this store
        log.warning("%s: this store cannot create a file only if it is absent (%s); the run lock is checked, "
                    "then written, so two runs started at the same moment could both take it", path, error)
    if path.exists():
        return False
    path.write_bytes(content)
    return path.read_bytes() == content


def acquire_run_lock(model_dir: Path, command: str | None = None) -> RunLock:
    """Take the model dir's lock (one process: rank 0), creating the model dir if needed.

    Args:
        model_dir: the run's model dir.
        command: recorded in the lock (default: this process's command line).

    Returns:
        The held lock.

    Raises:
        ModelDirLockedError: when a live run holds it (naming its host, pid and start), when it
            was written on another host, or when it cannot be read.
    """
    model_dir = as_path(model_dir)
    if not is_remote(model_dir):  # an object store has no directories (and s3fs would create a missing bucket)
        model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / LOCK_FILE
    command = command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    for _ in range(2):
        if _create(path, command):
            return RunLock(path)
        try:
            holder = json.loads(path.read_text(encoding="utf-8"))
            pid = int(holder["pid"])
        except FileNotFoundError:
            continue  # released meanwhile
        except (OSError, ValueError, KeyError, TypeError):
            raise ModelDirLockedError(
                f"{path}: the model dir's run lock is unreadable; if no run is using {model_dir}, remove the file "
                f"(rm {path}) and start again") from None
        if holder.get("host") != socket.gethostname():
            raise ModelDirLockedError(
                f"{model_dir} is in use by another run ({_describe(holder)}), on another host, so this host cannot "
                f"tell whether it still runs; if that run is dead, remove its lock (rm {path}) and start again")
        if _alive(pid, holder.get("process_start")):
            raise ModelDirLockedError(
                f"{model_dir} is in use by another run ({_describe(holder)}); wait for it to end, stop it (SIGTERM "
                "writes a checkpoint), or train with --model-dir elsewhere")
        log.warning("%s: taking over a stale run lock (%s; that process no longer runs)", path, _describe(holder))
        path.unlink(missing_ok=True)
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
            from tzrun.write_errors import write_failure_message

            refusal = write_failure_message(error, as_path(model_dir), f"the run lock {LOCK_FILE}")
    if world_size > 1:
        import torch.distributed as dist

        outcome: list[Any] = [refusal]
        dist.broadcast_object_list(outcome, src=0)
        refusal = outcome[0]
    if refusal is not None:
        raise ModelDirLockedError(refusal)
    return lock
