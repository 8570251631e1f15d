"""The launcher's exit code and the run lock's liveness check, without starting a job."""

from __future__ import annotations

import os

import pytest

from tzrun.errors import EXIT_RANK_LOST
from tzrun.launch import EXIT_CODE_DIR_ENV, job_exit_code, record_exit_code
from tzrun.runner.run_lock import LOCK_FILE, ModelDirLockedError, _alive, _process_start, acquire_run_lock


def test_the_job_exits_with_the_code_every_rank_recorded_else_with_torchruns(tmp_path, monkeypatch):
    monkeypatch.setenv(EXIT_CODE_DIR_ENV, str(tmp_path))
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        record_exit_code(75)
    assert job_exit_code(1, tmp_path, 2) == 75  # torchrun's "failure" of a coordinated signal stop
    assert job_exit_code(0, tmp_path, 2) == 0
    assert job_exit_code(1, tmp_path, 3) == 1  # rank 2 recorded nothing (it crashed)
    (tmp_path / "rank-1").write_text("2\n")
    assert job_exit_code(1, tmp_path, 2) == 1  # the ranks disagree


def test_a_watchdog_records_the_code_of_the_frozen_rank_it_ended(tmp_path, monkeypatch):
    """A frozen rank killed by another rank's watchdog records nothing itself: the watchdog
    records EXIT_RANK_LOST for it, so the launcher exits with 69 rather than torchrun's 1."""
    monkeypatch.setenv(EXIT_CODE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    record_exit_code(EXIT_RANK_LOST, rank=1)
    record_exit_code(EXIT_RANK_LOST)
    assert job_exit_code(1, tmp_path, 2) == EXIT_RANK_LOST == 69


def test_a_reused_pid_does_not_keep_a_lock_alive_and_a_live_one_refuses(tmp_path):
    assert _alive(os.getpid(), _process_start(os.getpid()))
    if _process_start(os.getpid()) is not None:  # Linux: the start time tells a reused pid apart
        assert not _alive(os.getpid(), "0")
    lock = acquire_run_lock(tmp_path / "run", command="first")
    with pytest.raises(ModelDirLockedError, match=r"is in use by another run \(host .*, pid \d+, started .*: first\)"):
        acquire_run_lock(tmp_path / "run", command="second")
    lock.release()
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    acquire_run_lock(tmp_path / "run").release()
