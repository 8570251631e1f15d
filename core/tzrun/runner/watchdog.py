"""Failure is a collective fact: one rank's error, or one rank that stops responding, ends every
rank of the job within seconds instead of at a collective timeout.

Every rank of a job of several ranks runs one :class:`Watchdog` thread (started by
:meth:`~tzrun.runner.session.Session.start`, stopped by
:func:`~tzrun.runner.distributed.shutdown_distributed`). It talks to the job's own store
(torchrun's TCPStore at ``MASTER_ADDR:MASTER_PORT``, on a connection of its own, under a prefix
per restart attempt) and does three cheap things:

* every ``POLL_S`` seconds it checks whether a rank published a failure (one ``check`` of one
  key). If one did, the rank stops at once: rank 0 prints the root cause once
  (``tzrec-run: rank 1 failed: <message>``), and every rank exits with that failure's exit code
  through ``os._exit`` (the main thread may be waiting inside a collective, where nothing can
  unwind it);
* every few seconds it writes this rank's heartbeat (a counter, the step, the time, its host
  and pid). The thread beats while the main thread is busy (a long step, a long save); a
  process that is frozen (SIGSTOP, a hung host) stops beating;
* rank 0 reads every rank's heartbeat and the other ranks read rank 0's: a rank whose heartbeat
  did not change for ``train.rank_timeout_s`` seconds (measured on the watcher's own clock, so
  clocks need not agree across hosts) is declared lost. The watcher publishes that as the
  job's failure (exit code :data:`~tzrun.errors.EXIT_RANK_LOST`, 69), ends the lost rank's process
  when it runs on the same host (a frozen process never exits by itself, and torchrun would wait
  for it) and records the code for it, and exits.

A rank publishes its own failure with :func:`fail_collectively` (the trainer's and the CLI's
error paths call it): the exception's type and one-line message, the rank and the exit code it
maps to (:func:`tzrun.errors.exit_code_of`, as on one rank).
The first failure published wins. The failing rank then ends as usual (its own message and
exit code); should its teardown wait on a peer, the thread ends it after ``GRACE_S``.

A job of one process has no watchdog.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tzrun.errors import EXIT_RANK_LOST, TzrunError, exit_code_of

__all__ = ["EXIT_RANK_LOST", "Watchdog", "start_watchdog", "current", "fail_collectively", "stop_watchdog",
           "exit_code_of", "announced_by_rank0"]

log = logging.getLogger("tzrun")

#: Seconds between two checks for a published failure.
POLL_S = 0.5
#: Seconds the failing rank's own teardown may take before its watchdog ends the process.
GRACE_S = 10.0

_current: "Watchdog | None" = None


def one_line(error: BaseException, collective_timeout_s: float | None = None) -> str:
    """``error`` as the one line rank 0 prints: a :class:`TzrunError`'s own message (its first
    line), anything else as ``Type: message``; a collective that timed out names
    ``train.collective_timeout_s``."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    if not isinstance(error, TzrunError):
        line = f"{type(error).__name__}: {line}" if line else type(error).__name__
    if collective_timeout_s is not None and "timed out" in text.lower() and _is_distributed_error(error):
        line += (f" (a collective waited longer than train.collective_timeout_s = {collective_timeout_s:g} s; "
                 "raise it if a step, an evaluation or a save may take that long)")
    return line


def _is_distributed_error(error: BaseException) -> bool:
    import torch.distributed as dist

    return isinstance(error, (getattr(dist, "DistError", RuntimeError), RuntimeError))


class Watchdog:
    """This rank's watchdog thread (see the module's docstring).

    Args:
        store: the job's store (a ``torch.distributed.Store``), used by this thread only.
        rank: this process's rank.
        world_size: the number of ranks.
        rank_timeout_s: a rank whose heartbeat is older than this is lost.
        collective_timeout_s: the process group's timeout (named in messages).
    """

    def __init__(self, store: Any, rank: int, world_size: int, rank_timeout_s: float,
                 collective_timeout_s: float | None = None) -> None:
        self.store = store
        self.rank, self.world_size = rank, world_size
        self.rank_timeout_s = float(rank_timeout_s)
        self.collective_timeout_s = collective_timeout_s
        #: the training step this rank is at (set by the trainer; shown in a lost rank's message)
        self.step = 0
        self.beat_s = min(2.0, self.rank_timeout_s / 5)
        self._beats = 0
        #: whether rank 0 prints this rank's failure (it was published first, by another rank)
        self.announced = False
        self._stop = threading.Event()
        self._own_failure_at: float | None = None
        self._own_code = 1
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (last heartbeat value, when it changed)
        self._store_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tzrun-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        """Write the first heartbeat and start the thread."""
        self._beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """A normal end on this rank: stop the thread and mark this rank done, so its silence
        is not taken for a lost rank."""
        self._stop.set()
        try:
            self.store.set(f"done/{self.rank}", "1")
        except Exception:  # the store is gone at the very end: nothing to tell
            pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2 * POLL_S + 5)

    @property
    def failed(self) -> bool:
        """Whether this rank published a failure."""
        return self._own_failure_at is not None

    def publish(self, error: BaseException) -> None:
        """Publish ``error`` as this rank's failure (the first published failure of the job
        wins); arms the grace period after which the thread ends this process."""
        if self._own_failure_at is not None:
            return
        code = exit_code_of(error)
        line = one_line(error, self.collective_timeout_s)
        if "train.collective_timeout_s" in line:  # the traceback that follows does not say which key
            log.error("%s", line)
        value = json.dumps({"rank": self.rank, "code": code, "type": type(error).__name__,
                            "message": f"rank {self.rank} failed: {line}"})
        try:
            stored = self.store.compare_set("failure", "", value)
            self.announced = self.rank != 0 and (stored.decode() if isinstance(stored, bytes) else stored) == value
        except Exception as store_error:  # the others will time out as before
            log.warning("could not tell the other ranks about this rank's failure: %s", store_error)
        self._own_code = code
        self._own_failure_at = time.monotonic()
        from tzrun.runner.launch import record_exit_code

        record_exit_code(code)  # now: torchrun may end this rank with a signal once the others exit

    def wait_for_others(self, timeout_s: float = 4 * POLL_S + 2) -> None:
        """After this rank's failure: wait (briefly) until the other ranks have followed it, so
        that each records the job's exit code before torchrun, seeing this rank exit, ends
        them with a signal. A rank of this host whose process has already ended (killed: it
        never follows) is not waited for (:meth:`_gone`)."""
        deadline = time.monotonic() + timeout_s
        waiting = [r for r in range(self.world_size) if r != self.rank]
        while time.monotonic() < deadline:
            try:
                waiting = [r for r in waiting if not self.store.check([f"ended/{r}"]) and not self._gone(r)]
            except Exception:  # noqa: BLE001 - the store is gone: nothing to wait for
                return
            if not waiting:
                return
            time.sleep(0.1)

    def _gone(self, peer: int) -> bool:
        """Whether ``peer``'s last heartbeat names a process of this host that is no longer
        running (ended, or a zombie); False when it runs elsewhere or cannot be told."""
        key = f"beat/{peer}"
        if not self.store.check([key]):
            return False
        beat = json.loads(self.store.get(key))
        if beat.get("host") != socket.gethostname() or not beat.get("pid"):
            return False
        return not _running(int(beat["pid"]))

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        next_beat = time.monotonic() + self.beat_s
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            if self._own_failure_at is not None:
                if now - self._own_failure_at > GRACE_S:
                    _end(self._own_code, None)
                continue
            try:
                if self.store.check(["failure"]):
                    self._follow(json.loads(self.store.get("failure")))
                if now >= next_beat:
                    next_beat = now + self.beat_s
                    self._beat()
                    self._watch(now)
                self._store_ok = now
            except Exception as error:  # noqa: BLE001 - the store itself stopped answering
                if now - self._store_ok > self.rank_timeout_s:
                    _end(EXIT_RANK_LOST, f"the job's store stopped answering for {self.rank_timeout_s:g} s "
                                         f"(train.rank_timeout_s): {error}")

    def _follow(self, failure: dict[str, Any]) -> None:
        """Another rank failed (or was declared lost): end this one with the job's code."""
        if self._stop.is_set():
            return
        _end(int(failure["code"]), str(failure["message"]) if self.rank == 0 else None, self)

    def _beat(self) -> None:
        self._beats += 1
        self.store.set(f"beat/{self.rank}", json.dumps({
            "n": self._beats, "step": self.step, "time": time.time(), "host": socket.gethostname(),
            "pid": os.getpid()}))

    def _watch(self, now: float) -> None:
        """Rank 0 watches every rank, the others watch rank 0."""
        peers = range(1, self.world_size) if self.rank == 0 else (0,)
        for peer in peers:
            key = f"beat/{peer}"
            if peer not in self._seen and not self.store.check([key]):
                self._seen[peer] = ("", now)  # not beating yet: counted from now
                continue
            value = self.store.get(key).decode() if self.store.check([key]) else ""
            last, since = self._seen.get(peer, ("", now))
            if value != last:
                self._seen[peer] = (value, now)
            elif now - since > self.rank_timeout_s and not self.store.check([f"done/{peer}"]):
                self._lost(peer, value, now - since)

    def _lost(self, peer: int, value: str, silent_s: float) -> None:
        beat = json.loads(value) if value else {}
        where = f" at step {beat['step']}" if beat.get("step") else ""
        message = (f"rank {peer} stopped responding{where} (no heartbeat for {silent_s:.0f} s; "
                   f"train.rank_timeout_s = {self.rank_timeout_s:g})")
        self.store.compare_set("failure", "", json.dumps({"rank": peer, "code": EXIT_RANK_LOST, "message": message}))
        if beat.get("host") == socket.gethostname() and beat.get("pid") and int(beat["pid"]) != os.getpid():
            from tzrun.runner.launch import record_exit_code

            record_exit_code(EXIT_RANK_LOST, rank=peer)  # for it, so that the launcher exits with the job's code
            _kill_frozen(int(beat["pid"]))
        _end(EXIT_RANK_LOST, message, self)


def _running(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie does not; without ``/proc``, a
    process that exists does)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        if Path("/proc/self/stat").exists():
            return False  # no entry: ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: it exists
    return True


def _kill_frozen(pid: int) -> None:
    """End a frozen rank on this host (SIGKILL works on a stopped process; torchrun would
    otherwise wait for it to exit)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _end(code: int, message: str | None, watchdog: Watchdog | None = None) -> None:
    """Print ``message`` (if any), record the exit code for the launcher and end the process
    now: the main thread may be inside a collective that nothing else ends."""
    from tzrun.runner.launch import record_exit_code

    if message:
        from tzrun.io.storage import redact_url

        print(f"tzrec-run: {redact_url(message)}", file=sys.stderr)
        from tzrun.runner.log_file import record_in_log_files

        record_in_log_files(message)  # logging.shutdown below closes (and uploads) them
    record_exit_code(code)
    if watchdog is not None:
        try:
            watchdog.store.set(f"ended/{watchdog.rank}", str(code))
        except Exception:  # noqa: BLE001
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    logging.shutdown()
    os._exit(code)


def _job_store(timeout_s: float) -> Any:
    """A connection of this thread's own to the job's store, under this attempt's prefix."""
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return dist.PrefixStore(f"tzrun/watchdog/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def start_watchdog(rank: int, world_size: int, rank_timeout_s: float, collective_timeout_s: float | None = None) -> Watchdog | None:
    """Start this rank's watchdog in a job of several ranks (none for one process, or without
    ``MASTER_ADDR``/``MASTER_PORT``); it becomes :func:`current`.

    Args:
        rank, world_size: this process in the job.
        rank_timeout_s: ``train.rank_timeout_s``.
        collective_timeout_s: ``train.collective_timeout_s`` (named in messages).

    Returns:
        The running watchdog, or None.
    """
    global _current
    if world_size <= 1 or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        return None
    if _current is not None:
        _current.stop()
    _current = Watchdog(_job_store(max(5.0, min(rank_timeout_s, 30.0))), rank, world_size, rank_timeout_s,
                        collective_timeout_s).start()
    return _current


def current() -> Watchdog | None:
    """This process's running watchdog, if any."""
    return _current


def fail_collectively(error: BaseException) -> bool:
    """Publish ``error`` as this rank's failure, so that every rank stops within seconds.

    Returns:
        Whether it was published (a watchdog runs); False in a job of one process. A
        ``SystemExit`` with code 0 is no failure and is not published.
    """
    if _current is None or (isinstance(error, SystemExit) and not error.code):
        return False
    _current.publish(error)
    return True


def stop_watchdog() -> bool:
    """Stop this process's watchdog at the end of a command.

    Returns:
        Whether this rank failed (then the ranks must not meet any more: the caller skips its
        final barrier).
    """
    global _current
    watchdog = _current
    if watchdog is None:
        return False
    if watchdog.failed:  # keeps running: it ends this process should its teardown hang
        watchdog.wait_for_others()
        return True
    _current = None
    watchdog.stop()
    return False


def announced_by_rank0(error: BaseException) -> bool:
    """Whether rank 0 prints ``error`` (this rank published it first), so this rank need not."""
    return _current is not None and _current.failed and _current.announced
