"""The launcher's exit code, the job's processes ending with the launcher, and the run lock's
liveness check, without starting a training job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tzrun.errors import EXIT_RANK_LOST
from tzrun.runner.launch import EXIT_CODE_DIR_ENV, job_exit_code, record_exit_code
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


# -- the job never outlives the launcher (Linux: parent-death signal, child subreaper) -------------

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

#: Runs ``run_torchrun`` on the command in argv (a stand-in for torchrun) and exits with its result.
LAUNCHER = ("import os, sys; from tzrun.runner.launch import run_torchrun; "
            "sys.exit(run_torchrun(sys.argv[1:], os.environ, 1))")
#: A stand-in for torchrun: starts one "rank" in a session of its own (as torchrun does), then
#: waits; it writes "ready" once the rank runs, and "<agent SIGNAL>" if it is signalled.
AGENT = """
import os, signal, subprocess, sys, time
out = sys.argv[1]
def note(number, frame):
    open(os.path.join(out, "agent-signal"), "w").write(signal.Signals(number).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, note)
signal.signal(signal.SIGHUP, note)
rank = subprocess.Popen([sys.executable, "-c", sys.argv[2], out], start_new_session=True)
while not os.path.exists(os.path.join(out, "rank-pid")):
    time.sleep(0.05)
open(os.path.join(out, "ready"), "w").write(str(os.getpid()))
if sys.argv[3] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""
#: A stand-in for a rank: records its pid, then waits (it ends on SIGTERM, as by default).
RANK = "import os, sys, time; open(os.path.join(sys.argv[1], 'rank-pid'), 'w').write(str(os.getpid())); time.sleep(60)"


def _wait_for(path: Path, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.05)
    return path.read_text()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _launch(tmp_path: Path, agent_mode: str, nohup: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, sys.executable, "-c", AGENT, str(tmp_path), RANK,
                             agent_mode], stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)},  # a killed launcher leaves its files
                            preexec_fn=(lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None)


@linux
def test_a_killed_launcher_stops_torchrun_with_sigterm(tmp_path):
    """SIGKILL to the launcher (or its terminal's hang-up without it) reaches torchrun, in a
    session of its own, as SIGTERM: the job checkpoints and stops instead of running on unseen."""
    launcher = _launch(tmp_path, "wait")
    try:
        _wait_for(tmp_path / "ready")
        launcher.kill()
        assert _wait_for(tmp_path / "agent-signal", timeout_s=10) == "SIGTERM"
    finally:
        launcher.kill()
        launcher.wait()
        rank = int(_wait_for(tmp_path / "rank-pid"))
        if _running(rank):
            os.kill(rank, signal.SIGKILL)


@linux
def test_a_killed_agent_leaves_no_rank_and_the_launcher_exits_69_with_one_line(tmp_path):
    launcher = _launch(tmp_path, "die")
    try:
        _, err = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    rank = int(_wait_for(tmp_path / "rank-pid"))
    assert not _running(rank)  # the rank torchrun left behind was ended (SIGTERM) and reaped
    assert launcher.returncode == EXIT_RANK_LOST, err
    agent = _wait_for(tmp_path / "ready")
    assert err.splitlines() == [f"tzrec-run: torchrun, the job's agent (pid {agent}), was killed by SIGKILL; its ranks "
                                f"were stopped; rerun with --resume; exit code {EXIT_RANK_LOST}"]


@linux
def test_a_rank_gets_sigterm_when_its_torchrun_dies(tmp_path):
    """A rank run by hand with torchrun stops (and checkpoints) if torchrun is killed."""
    rank = ("import os, signal, sys, time\n"
            "from tzrun.runner.launch import stop_with_agent\n"
            "signal.signal(signal.SIGTERM, lambda n, f: (open(sys.argv[1] + '/rank-signal', 'w').write('SIGTERM'), "
            "os._exit(0)))\n"
            "stop_with_agent()\n"
            "open(sys.argv[1] + '/rank-pid', 'w').write(str(os.getpid()))\n"
            "time.sleep(60)\n")
    agent = ("import os, subprocess, sys, time\n"
             "os.environ.update(TORCHELASTIC_RUN_ID='x', TZRUN_AGENT_PID=str(os.getpid()))\n"
             "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], start_new_session=True)\n"
             "while not os.path.exists(sys.argv[2] + '/rank-pid'):\n"
             "    time.sleep(0.05)\n")
    subprocess.run([sys.executable, "-c", agent, rank, str(tmp_path)], timeout=30, check=True)
    try:
        assert _wait_for(tmp_path / "rank-signal", timeout_s=10) == "SIGTERM"
    finally:
        pid = int(_wait_for(tmp_path / "rank-pid"))
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


@linux
def test_a_hang_up_stays_ignored_under_nohup(tmp_path):
    """``nohup tzrec-run train --nproc-per-node N``: a closed terminal does not stop the job."""
    launcher = _launch(tmp_path, "wait", nohup=True)
    try:
        _wait_for(tmp_path / "ready")
        launcher.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert launcher.poll() is None and not (tmp_path / "agent-signal").exists()
    finally:
        launcher.kill()
        launcher.wait()
        assert _wait_for(tmp_path / "agent-signal", timeout_s=10) == "SIGTERM"
        rank = int(_wait_for(tmp_path / "rank-pid"))
        if _running(rank):
            os.kill(rank, signal.SIGKILL)
