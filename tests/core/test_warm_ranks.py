"""The suite's warm interpreters (tests/warm_ranks.py) behave as the processes they stand in
for: the exit code, the output, a death by signal, forwarded signals, the environment, and a
hash seed of its own for rank 1. The multi-rank tests that use them rely on all of it."""

from __future__ import annotations

import signal
import subprocess

from tests.warm_ranks import warm_executable, warm_python


def test_a_fork_exits_with_its_code_and_writes_to_the_clients_streams():
    done = warm_python(["-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    crashed = warm_python(["-c", "raise ValueError('boom')"])
    assert crashed.returncode == 1 and crashed.stderr.rstrip().endswith("ValueError: boom")


def test_a_fork_killed_by_a_signal_is_a_client_killed_by_it():
    done = warm_python(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert done.returncode == -signal.SIGKILL


def test_a_signal_to_the_client_reaches_the_fork():
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([str(warm_executable()), "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7


def test_the_environment_and_pythonpath_are_the_clients(tmp_path):
    (tmp_path / "only_here.py").write_text("WHERE = 'tmp'\n")
    done = warm_python(["-c", "import os, sys, only_here; print(os.environ['TZRUN_X'], only_here.WHERE, sys.argv[1:])", "a"],
                       env={"TZRUN_X": "x", "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "x tmp ['a']\n"


def test_rank_1_has_a_hash_seed_other_than_rank_0s():
    seeds = {rank: warm_python(["-c", "print(hash('tzrun'))"], env={"RANK": rank}).stdout for rank in ("0", "1")}
    assert seeds["0"] != seeds["1"]
