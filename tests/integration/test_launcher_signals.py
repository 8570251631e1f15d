"""A scheduler signals the process it started: ``tzrec-run train --nproc-per-node 2`` passes the
signal on to every rank, the ranks stop at one step after writing a checkpoint, and the launcher
exits 75 (what a retrying scheduler looks for); ``--resume`` then trains to the end."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import EXAMPLE, REPO, example_overrides
from tests.integration.test_train import _results, _sets
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.manifest import check_checkpoint
from tzrun.runner.run_lock import LOCK_FILE
from tzrun.runner.signals import EXIT_STOPPED_BY_SIGNAL
from tzrun.errors import EXIT_CANT_WRITE

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

# 12,000 rows over 2 ranks in batches of 1,024: 6 steps per epoch, 150 steps take several seconds
# (the signal arrives within a step or two of the first train log, at step 4); no periodic
# checkpoint, so the one the stop writes is the only one
NUM_STEPS = 150
STEPS = (f"train.num_steps={NUM_STEPS}", "train.save_checkpoints_steps=1000", "data.num_workers=1")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_stops_every_rank_with_exit_75_and_resume_finishes(criteo_dir, tmp_path, signum):
    model_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text().replace("num_epochs = 1", ""))
    command = [sys.executable, "-m", "tzrun", "train", str(config), *_sets(example_overrides(criteo_dir, model_dir, *STEPS))]
    launcher = subprocess.Popen([*command, "--nproc-per-node", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not (model_dir / "metrics.jsonl").exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # training started: the first train log (every 4 steps) is written
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        launcher.send_signal(signum)  # the launcher only, as a scheduler does (or Ctrl-C to tzrec-run alone)
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == EXIT_STOPPED_BY_SIGNAL, err[-3000:]
    stopped = re.search(rf"stopped by {signal.Signals(signum).name} at step (\d+); checkpoint: (\S+)", out)
    assert stopped, out + err[-3000:]
    step = int(stopped.group(1))
    assert 4 <= step < NUM_STEPS
    assert [s for s, _ in list_checkpoints(model_dir)] == [step]  # the stop's checkpoint, complete
    assert check_checkpoint(model_dir / "checkpoints" / f"step-{step}").state == "ok"
    assert not (model_dir / LOCK_FILE).exists()
    if signum == signal.SIGINT:
        return  # a Ctrl-C stop resumes like any other (tests/integration/test_ctrl_c.py resumes one)

    resumed = subprocess.run([*command, "--nproc-per-node", "2", "--resume"], capture_output=True, text=True,
                             cwd=REPO, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"step-{step}" in resumed.stderr and "resuming from" in resumed.stderr
    assert _results(model_dir)[-1]["step"] == NUM_STEPS


def test_two_ranks_refuse_a_model_dir_a_live_run_holds_together_with_exit_73(criteo_dir, tmp_path):
    import json
    import os
    import socket

    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                   "started": time.time(), "command": "tzrec-run train a.toml"}))
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text())
    proc = subprocess.run([sys.executable, "-m", "tzrun", "train", str(config),
                           *_sets(example_overrides(criteo_dir, model_dir, *STEPS)), "--nproc-per-node", "2"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == EXIT_CANT_WRITE, proc.stderr[-3000:]  # every rank refused (73), not torchrun's failure (1)
    assert f"is in use by another run (host {socket.gethostname()}, pid {os.getpid()}" in proc.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == [LOCK_FILE]
