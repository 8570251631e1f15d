"""The watchdog's decisions over a real torch.distributed store (in one process: two watchdogs
on one HashStore, their clocks driven by the test; ending the process is recorded instead).
The 2-rank jobs are in tests/integration/test_collective_failure.py."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from tzrun import errors
from tzrun.errors import DataError
from tzrun.runner import watchdog as wd


@pytest.fixture
def ended(monkeypatch):
    calls: list[tuple[int, str | None]] = []
    monkeypatch.setattr(wd, "_end", lambda code, message, watchdog=None: calls.append((code, message)))
    return calls


def _pair(timeout_s=10.0):
    store = dist.HashStore()
    return [wd.Watchdog(dist.PrefixStore("job", store), rank, 2, timeout_s) for rank in (0, 1)]


def test_a_rank_publishes_the_exit_code_one_rank_would_exit_with():
    assert wd.exit_code_of is errors.exit_code_of  # one mapping (tests/core/test_exit_codes.py)
    assert wd.exit_code_of(DataError("x")) == 65


def test_the_first_published_failure_wins_and_rank_0_prints_it(ended):
    rank0, rank1 = _pair()
    rank1.publish(DataError("a.csv, line 3, column 'x': 'abc' is not a number\nmore"))
    rank0.publish(RuntimeError("gloo: connection closed"))  # a consequence, published later
    failure = json.loads(rank0.store.get("failure"))
    assert failure == {"rank": 1, "code": errors.EXIT_DATA, "type": "DataError",
                       "message": "rank 1 failed: a.csv, line 3, column 'x': 'abc' is not a number"}
    assert rank1.announced and not rank0.announced
    follower = wd.Watchdog(rank0.store, 0, 2, 10.0)
    follower._follow(failure)
    assert ended == [(errors.EXIT_DATA, "rank 1 failed: a.csv, line 3, column 'x': 'abc' is not a number")]


def test_a_rank_whose_heartbeat_stops_is_lost_after_the_timeout(ended):
    rank0, rank1 = _pair(timeout_s=10.0)
    rank1.step = 7
    rank1._beat()
    rank0._watch(now=100.0)  # first sight of rank 1's heartbeat
    rank0._watch(now=109.0)
    assert ended == []
    rank1._beat()  # it beats: the clock restarts
    rank0._watch(now=115.0)
    rank0._watch(now=124.0)
    assert ended == []
    rank0._watch(now=125.5)
    assert ended == [(wd.EXIT_RANK_LOST, "rank 1 stopped responding at step 7 (no heartbeat for 10 s; "
                                         "train.rank_timeout_s = 10)")]
    assert json.loads(rank0.store.get("failure"))["rank"] == 1


def test_a_rank_that_finished_is_not_lost(ended):
    rank0, rank1 = _pair(timeout_s=1.0)
    rank1._beat()
    rank0._watch(now=0.0)
    rank1.stop()  # a normal end: marked done
    rank0._watch(now=50.0)
    assert ended == []


def test_a_collective_timeout_names_its_config_key():
    error = RuntimeError("[gloo] Timed out waiting 300000ms for recv operation to complete")
    assert "train.collective_timeout_s = 300 s" in wd.one_line(error, 300.0)
    assert "collective_timeout_s" not in wd.one_line(DataError("timed out reading a.csv"), 300.0)


def _beat_as(watchdog, pid: int, host: str | None = None) -> None:
    """``watchdog``'s heartbeat as a process ``pid`` of ``host`` (default: this one) writes it."""
    import socket

    watchdog.store.set(f"beat/{watchdog.rank}", json.dumps({"n": 1, "step": 6, "time": 0.0,
                                                              "host": host or socket.gethostname(), "pid": pid}))


@pytest.mark.parametrize("peer", ["ended", "running", "on-another-host", "followed"])
def test_a_failed_rank_does_not_wait_for_a_peer_whose_process_has_ended(monkeypatch, peer):
    """A rank that failed because its peer was killed waited out the whole grace for the dead
    peer to record its exit code (4 s before torchrun could restart the job); it waits for a
    peer that still runs, or runs on another host, and not for one that followed it."""
    import subprocess
    import sys

    rank0, rank1 = _pair()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pids = {"ended": _ended_pid(), "running": live.pid, "on-another-host": _ended_pid(),
                "followed": live.pid}
        _beat_as(rank1, pids[peer], host="elsewhere" if peer == "on-another-host" else None)
        if peer == "followed":
            rank1.store.set("ended/1", "65")
        polls: list[float] = []
        monkeypatch.setattr(wd.time, "sleep", polls.append)
        rank0.wait_for_others(timeout_s=0.2)
        waited = bool(polls)
        assert waited == (peer in ("running", "on-another-host")), (peer, len(polls))
    finally:
        live.kill()
        live.wait()


def _ended_pid() -> int:
    """The pid of a process of this host that has ended (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
