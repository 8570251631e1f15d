"""One run per model dir: a second ``train`` (or ``--resume``) into a model dir a live run holds
is refused naming that run; a lock left by a dead process is taken over with a warning; the
lock is gone after the run; ``evaluate`` does not need it."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.integration.test_checkpoints import _evaluate, _train
from tests.integration.test_update_path import _process_group  # noqa: F401
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.run_lock import LOCK_FILE, ModelDirLockedError, _process_start

pytestmark = pytest.mark.slow

STEPS = ("train.num_steps=2", "train.save_checkpoints_steps=2", 'metrics=[{type = "auc"}]')


def _lock(model_dir, pid: int, host: str | None = None) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / LOCK_FILE).write_text(json.dumps({
        "host": host or socket.gethostname(), "pid": pid, "process_start": _process_start(pid),
        "started": time.time(), "command": "tzrec-run train first.toml"}))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_run_into_a_live_runs_model_dir_is_refused_naming_it(criteo_dir, tmp_path, resume):
    model_dir = tmp_path / "run"
    _lock(model_dir, os.getpid())  # this very process: alive
    with pytest.raises(ModelDirLockedError, match=rf"{model_dir} is in use by another run \(host "
                                                  rf"{socket.gethostname()}, pid {os.getpid()}, started \d{{4}}-.*: "
                                                  r"tzrec-run train first\.toml\)"):
        _train(model_dir, criteo_dir, *STEPS, resume=resume)
    assert sorted(p.name for p in model_dir.iterdir()) == [LOCK_FILE]  # nothing written, the lock left alone
    assert json.loads((model_dir / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_a_lock_from_another_host_is_refused_saying_how_to_remove_it(criteo_dir, tmp_path):
    model_dir = tmp_path / "run"
    _lock(model_dir, 12345, host="elsewhere.example")
    with pytest.raises(ModelDirLockedError, match=rf"host elsewhere\.example, pid 12345.*on another host.*"
                                                  rf"if that run is dead, remove its lock \(rm {model_dir / LOCK_FILE}\)"):
        _train(model_dir, criteo_dir, *STEPS)


def test_a_stale_lock_is_taken_over_released_at_the_end_and_evaluate_needs_none(criteo_dir, tmp_path, caplog):
    model_dir = tmp_path / "run"
    dead = _dead_pid()
    _lock(model_dir, dead)
    with caplog.at_level(logging.WARNING, logger="tzrun.runner.run_lock"):
        result = _train(model_dir, criteo_dir, *STEPS)
    assert result.steps == 2 and [s for s, _ in list_checkpoints(model_dir)] == [2]
    assert any(f"taking over a stale run lock (host {socket.gethostname()}, pid {dead}," in r.getMessage()
               for r in caplog.records)
    assert not (model_dir / LOCK_FILE).exists()  # released when the run ended

    _lock(model_dir, os.getpid())  # a live training run: evaluating its checkpoints is still allowed
    done = _evaluate(model_dir, criteo_dir, "latest", f'model_dir="{model_dir}"', *STEPS)
    assert done.result.step == 2


def test_the_lock_is_released_when_the_run_fails(criteo_dir, tmp_path):
    model_dir = tmp_path / "run"
    _train(model_dir, criteo_dir, *STEPS)
    with pytest.raises(Exception, match="already has checkpoints"):  # refused after the lock was taken
        _train(model_dir, criteo_dir, *STEPS)
    assert not (model_dir / LOCK_FILE).exists()
