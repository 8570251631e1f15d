"""The run lock itself, without a training run: several runs taking over one stale lock at the
same moment (exactly one gets it, none calls it unreadable), and a store that ignores
conditional creates (refused, or a loud warning when accepted)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tzrun.runner.run_lock import LOCK_FILE, ModelDirLockedError, acquire_run_lock

CONTENDERS = 3
TRIALS = 100


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _stale_record(pid: int) -> str:
    # a process start no process has: stale even if the pid now runs another program (a contender)
    return json.dumps({"host": socket.gethostname(), "pid": pid, "process_start": "1", "started": time.time(),
                       "command": "tzrec-run train dead.toml"})


def _contend(barrier: Any, dirs: Any, results: Any) -> None:
    """One run: for each model dir, start together with the others, then take the lock."""
    for model_dir in iter(dirs.get, None):
        barrier.wait()
        try:
            acquire_run_lock(model_dir, command="tzrec-run train contender.toml")
            results.put(("held", os.getpid()))
        except ModelDirLockedError as error:
            results.put(("refused", str(error)))
        except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
            results.put(("error", f"{type(error).__name__}: {error}"))


def test_of_three_runs_taking_over_one_stale_lock_together_exactly_one_holds_it(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, dirs, results = ctx.Barrier(CONTENDERS), ctx.Queue(), ctx.Queue()
    workers = [ctx.Process(target=_contend, args=(barrier, dirs, results), daemon=True) for _ in range(CONTENDERS)]
    for worker in workers:
        worker.start()
    stale = _stale_record(_dead_pid())
    doubles, messages = [], []
    try:
        for trial in range(TRIALS):
            model_dir = tmp_path / f"run{trial}"
            model_dir.mkdir()
            (model_dir / LOCK_FILE).write_text(stale)
            for _ in range(CONTENDERS):
                dirs.put(model_dir)
            outcomes = [results.get(timeout=30) for _ in range(CONTENDERS)]
            holders = [who for kind, who in outcomes if kind == "held"]
            messages += [who for kind, who in outcomes if kind != "held"]
            if len(holders) != 1:
                doubles.append((trial, outcomes))
            else:
                assert json.loads((model_dir / LOCK_FILE).read_text())["pid"] == holders[0]
    finally:
        for _ in workers:
            dirs.put(None)
        for worker in workers:
            worker.join(timeout=10)
    assert not doubles, f"{len(doubles)} of {TRIALS} trials did not end with exactly one holder: {doubles[:3]}"
    odd = [m for m in messages if "is in use by another run" not in m]
    assert not odd, f"{len(odd)} refusals other than 'in use': {odd[:3]}"
    assert not [p.name for p in tmp_path.glob("run*/.*")]  # no temporary lock file is left behind


def _ignore_exclusive_creates(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsspec's in-memory store, made to behave like an S3 server that ignores If-None-Match."""
    from fsspec.implementations.memory import MemoryFileSystem

    create = MemoryFileSystem._open

    def overwrite(self: Any, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        return create(self, path, mode.replace("x", "w"), *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "_open", overwrite)


def _memory_dir(name: str) -> str:
    return f"memory://tzrun-lock-tests/{name}-{os.getpid()}-{time.monotonic_ns()}"


def _objects(model_dir: str) -> list[str]:
    from tzrun.io.storage import filesystem

    fs, inner = filesystem(model_dir)
    return fs.find(inner)


def test_a_store_that_honours_conditional_creates_keeps_a_second_run_out() -> None:
    model_dir = _memory_dir("honours")
    lock = acquire_run_lock(model_dir, command="tzrec-run train first.toml")
    with pytest.raises(ModelDirLockedError, match="is in use by another run"):
        acquire_run_lock(model_dir, command="tzrec-run train second.toml")
    lock.release()
    assert _objects(model_dir) == []  # the probe objects are gone too


def test_a_store_that_ignores_conditional_creates_is_refused_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    _ignore_exclusive_creates(monkeypatch)
    monkeypatch.delenv("TZRUN_NONEXCLUSIVE_RUN_LOCK", raising=False)
    model_dir = _memory_dir("ignores")
    with pytest.raises(ModelDirLockedError, match=r"the run lock cannot be made exclusive: this store ignores "
                                                  r"conditional creates \(If-None-Match\).*TZRUN_NONEXCLUSIVE_RUN_LOCK=1"):
        acquire_run_lock(model_dir, command="tzrec-run train first.toml")
    assert _objects(model_dir) == []  # no lock, no probe left behind


def test_a_nonexclusive_lock_accepted_knowingly_is_taken_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    _ignore_exclusive_creates(monkeypatch)
    monkeypatch.setenv("TZRUN_NONEXCLUSIVE_RUN_LOCK", "1")
    model_dir = _memory_dir("accepted")
    with caplog.at_level(logging.WARNING, logger="tzrun.runner.run_lock"):
        lock = acquire_run_lock(model_dir, command="tzrec-run train first.toml")
    assert any("THE RUN LOCK IS NOT EXCLUSIVE" in r.getMessage() for r in caplog.records)
    with pytest.raises(ModelDirLockedError, match="is in use by another run"):  # checked before it is written
        acquire_run_lock(model_dir, command="tzrec-run train second.toml")
    lock.release()


def test_a_stale_lock_object_is_taken_over(caplog: pytest.LogCaptureFixture) -> None:
    import tzrun

    model_dir = _memory_dir("stale")
    path = tzrun.as_path(model_dir) / LOCK_FILE
    path.write_text(_stale_record(_dead_pid()))
    with caplog.at_level(logging.WARNING, logger="tzrun.runner.run_lock"):
        lock = acquire_run_lock(model_dir, command="tzrec-run train second.toml")
    assert any("taking over a stale run lock" in r.getMessage() for r in caplog.records)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()
    assert not path.exists()


def test_a_password_in_the_command_line_is_not_recorded_in_the_lock(tmp_path: Path) -> None:
    lock = acquire_run_lock(tmp_path / "run", command="tzrec-run train x.toml --model-dir s3://me:hunter2@bucket/run")
    record = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
    assert record["command"] == "tzrec-run train x.toml --model-dir s3://me:***@bucket/run"
    lock.release()
