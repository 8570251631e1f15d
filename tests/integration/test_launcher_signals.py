"""A scheduler signals the process it started: ``tzrec-run train --nproc-per-node 2`` passes the
signal on to every rank, the ranks stop at one step after writing a checkpoint, and the launcher
exits 75 (what a retrying scheduler looks for); ``--resume`` then trains to the end. A killed
launcher or torchrun leaves no process of the job behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, REPO, example_overrides
from tests.integration.test_train import _results, _sets
from tests.warm_ranks import warm_cli
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.manifest import check_checkpoint
from tzrun.runner.run_lock import LOCK_FILE
from tzrun.runner.signals import EXIT_STOPPED_BY_SIGNAL
from tzrun.errors import EXIT_CANT_WRITE, EXIT_RANK_LOST

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

# 12,000 rows over 2 ranks in batches of 1,024: 6 steps per epoch, 150 steps take several seconds
# (the signal arrives within a step or two of the first train log, at step 4); no periodic
# checkpoint, so the one the stop writes is the only one
NUM_STEPS = 150
STEPS = (f"train.num_steps={NUM_STEPS}", "train.save_checkpoints_steps=1000", "data.num_workers=1")


def _descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, and so on (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in sorted(children.get(todo.pop(0), [])):
            found.append(child)
            todo.append(child)
    return found


def _left_running(pids: list[int], timeout_s: float = 20) -> list[int]:
    """Those of ``pids`` still running (zombies aside) after up to ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = []
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
            except OSError:
                pass
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.2)


def _start_training(criteo_dir, tmp_path, *extra: str) -> tuple[subprocess.Popen, list[str], list[int]]:
    """Start ``train --nproc-per-node 2`` and wait for its first train log; returns the
    launcher, its command (without ``--nproc-per-node``) and the processes of the job."""
    model_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text().replace("num_epochs = 1", ""))
    command = [sys.executable, "-m", "tzrun", "train", str(config),
               *_sets(example_overrides(criteo_dir, model_dir, *STEPS, *extra))]
    # SIGHUP at its default even when the tests run under nohup (a launcher keeps an ignored one)
    launcher = subprocess.Popen([*command, "--nproc-per-node", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=REPO, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (model_dir / "metrics.jsonl").exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # training started: the first train log (every 4 steps) is written
        if launcher.poll() is not None:
            pytest.fail(launcher.communicate()[1][-3000:])
        return launcher, command, _descendants(launcher.pid)
    except BaseException:
        launcher.terminate()
        launcher.communicate(timeout=60)
        raise


def _stopped_step(model_dir: Path, out: str, err: str, name: str) -> int:
    """The step the ranks stopped at after ``name``, checking its checkpoint and the lock."""
    stopped = re.search(rf"stopped by {name} at step (\d+); checkpoint: (\S+)", out)
    assert stopped, out + err[-3000:]
    step = int(stopped.group(1))
    assert 4 <= step < NUM_STEPS
    assert [s for s, _ in list_checkpoints(model_dir)] == [step]  # the stop's checkpoint, complete
    assert check_checkpoint(model_dir / "checkpoints" / f"step-{step}").state == "ok"
    assert not (model_dir / LOCK_FILE).exists()
    return step


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_to_the_launcher_stops_every_rank_with_exit_75_and_resume_finishes(criteo_dir, tmp_path, signum):
    model_dir = tmp_path / "run"
    launcher, command, job = _start_training(criteo_dir, tmp_path)
    try:
        # the launcher only, as a scheduler does (or Ctrl-C to tzrec-run alone, or a closed terminal)
        launcher.send_signal(signum)
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == EXIT_STOPPED_BY_SIGNAL, err[-3000:]
    step = _stopped_step(model_dir, out, err, signal.Signals(signum).name)
    assert _left_running(job) == []
    if signum != signal.SIGHUP:
        return  # a stop resumes the same way whatever the signal (tests/integration/test_ctrl_c.py resumes a Ctrl-C's)

    # a few steps past the stop are what resuming is tested by (not the rest of the 150)
    # (the resume is a plain 2-rank run: its processes start warm)
    resumed = warm_cli([*command[3:], "--set", f"train.num_steps={step + 4}", "--nproc-per-node", "2", "--resume"],
                       timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"step-{step}" in resumed.stderr and "resuming from" in resumed.stderr
    assert _results(model_dir)[-1]["step"] == step + 4


def test_a_killed_launcher_stops_every_rank_with_a_checkpoint_and_leaves_no_process(criteo_dir, tmp_path):
    """SIGKILL to the launcher: torchrun, in a session of its own, gets SIGTERM (its parent-death
    signal), so the job checkpoints, releases the model dir and ends instead of training unseen."""
    launcher, _, job = _start_training(criteo_dir, tmp_path)
    try:
        launcher.kill()
        out, err = launcher.communicate(timeout=60)  # the ranks hold the pipes until they end
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert _left_running(job) == [], err[-3000:]
    _stopped_step(tmp_path / "run", out, err, "SIGTERM")


def test_a_killed_torchrun_ends_the_job_with_exit_69_and_one_line(criteo_dir, tmp_path):
    """The ranks torchrun leaves get SIGTERM (from the kernel, and from the launcher that
    adopted them); the launcher waits for them and names torchrun's death in one line."""
    launcher, _, job = _start_training(criteo_dir, tmp_path, "train.rank_timeout_s=8")
    agent = job[0]  # the launcher's only child
    try:
        os.kill(agent, signal.SIGKILL)
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == EXIT_RANK_LOST, err[-3000:]
    assert err.count(f"tzrec-run: torchrun, the job's agent (pid {agent}), was killed by SIGKILL; its ranks were "
                     f"stopped; rerun with --resume; exit code {EXIT_RANK_LOST}") == 1, err[-3000:]
    assert "Traceback" not in err and "ChildFailedError" not in err, err[-3000:]
    assert _left_running(job) == []


def test_two_ranks_refuse_a_model_dir_a_live_run_holds_together_with_exit_73(criteo_dir, tmp_path):
    import json
    import socket

    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                   "started": time.time(), "command": "tzrec-run train a.toml"}))
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text())
    proc = warm_cli(["train", str(config), *_sets(example_overrides(criteo_dir, model_dir, *STEPS)), "--nproc-per-node", "2"],
                    timeout=120)
    assert proc.returncode == EXIT_CANT_WRITE, proc.stderr[-3000:]  # every rank refused (73), not torchrun's failure (1)
    assert f"is in use by another run (host {socket.gethostname()}, pid {os.getpid()}" in proc.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == [LOCK_FILE]
