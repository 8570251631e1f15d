"""What ``tzrec-run train --nproc-per-node N`` does around torchrun: it forwards the signals a
scheduler sends to the process it started, makes sure the job never outlives it, and exits with
the job's own code.

* SIGTERM, SIGINT, SIGHUP (a closed terminal or ssh session; not under ``nohup``) and SIGUSR1
  received by the launcher go to torchrun, which passes them to every worker (``TORCHELASTIC_SIGNALS_TO_HANDLE``
  is extended with SIGUSR1) and waits up to ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds (default
  here: 300, so a checkpoint of a large model can be written) before it kills them. The workers
  stop at the same step through :class:`tzrun.runner.signals.StopSignals` and write a checkpoint.
* torchrun runs in a session of its own (a Ctrl-C in the terminal reaches it once, through the
  launcher), so it would not see the launcher die: on Linux it is started with a parent-death
  signal, SIGTERM, and stops the job as above (with a checkpoint) when the launcher is killed
  (SIGKILL). Each rank in turn gets SIGTERM when its torchrun dies (:func:`stop_with_agent`), and
  the launcher is a child subreaper: when torchrun dies, the ranks it leaves become the
  launcher's children, which it ends (SIGTERM, then SIGKILL after the shutdown timeout) and
  waits for before it exits with :data:`~tzrun.errors.EXIT_RANK_LOST` (69) and one line.
* torchrun's own output (its log lines and the ``ChildFailedError`` traceback it prints for any
  failure) goes to a log file (:mod:`tzrun.cli.agent`) unless ``--log-level debug``: a failure shows
  the root cause rank 0 prints, once. The file is named in the launcher's one line when it is
  the only report (the ranks did not all record an exit code), and removed otherwise.
* torchrun reports any worker's non-zero exit as a failure (exit 1). Every worker records its
  exit code in a directory the launcher names (``TZRUN_EXIT_CODE_DIR``); when all ranks
  recorded the same code (75 for a signal stop, 78 for a config error, 65 for a data error, ...:
  :mod:`tzrun.errors`), the launcher exits with it, otherwise with torchrun's. A rank that froze
  and was ended by another one's watchdog has its code (69) recorded by that watchdog.

This module imports nothing heavy.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tzrun.errors import EXIT_RANK_LOST

__all__ = ["AGENT_LOG_ENV", "AGENT_PID_ENV", "EXIT_CODE_DIR_ENV", "FORWARDED_SIGNALS", "LAUNCHER_PID_ENV",
           "SHUTDOWN_TIMEOUT", "job_exit_code", "record_exit_code", "run_torchrun", "stop_with_agent", "launch_torchrun",
           "without_launcher_options", "with_our_spellings", "launch_environment", "TORCHRUN_SPELLINGS",
           "available_cpus", "default_num_threads"]

#: Where each worker writes ``rank-<R>`` holding its exit code (set by the launcher).
EXIT_CODE_DIR_ENV = "TZRUN_EXIT_CODE_DIR"
#: The file torchrun's own output goes to (set by the launcher, read by :mod:`tzrun.cli.agent`).
AGENT_LOG_ENV = "TZRUN_AGENT_LOG"
#: The launcher's pid, for torchrun (set by the launcher).
LAUNCHER_PID_ENV = "TZRUN_LAUNCHER_PID"
#: torchrun's pid, for its ranks (set by :mod:`tzrun.cli.agent`).
AGENT_PID_ENV = "TZRUN_AGENT_PID"
#: The signals the launcher passes on to the job.
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")
#: torchrun's wait for the workers after a signal, unless ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is set.
SHUTDOWN_TIMEOUT = 300
_TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def record_exit_code(code: int, rank: int | None = None) -> None:
    """In a worker the launcher started: write this rank's exit code for the launcher.

    Args:
        code: the exit code.
        rank: the rank it is for (default: this process's); a watchdog records a frozen
            rank's code after ending it.
    """
    directory = os.environ.get(EXIT_CODE_DIR_ENV)
    if not directory or "RANK" not in os.environ:
        return
    try:
        Path(directory, f"rank-{os.environ['RANK'] if rank is None else rank}").write_text(f"{int(code)}\n")
    except OSError:  # the launcher's exit code falls back to torchrun's
        pass


def job_exit_code(torchrun_code: int, directory: Path, world_size: int) -> int:
    """The job's exit code: torchrun's, unless it failed and every rank recorded one same code.

    Args:
        torchrun_code: torchrun's exit code.
        directory: where the ranks recorded theirs.
        world_size: how many ranks there are.
    """
    if torchrun_code == 0:
        return 0
    codes = set()
    for rank in range(world_size):
        try:
            codes.add(int(Path(directory, f"rank-{rank}").read_text().strip()))
        except (OSError, ValueError):
            return torchrun_code
    return codes.pop() if len(codes) == 1 else torchrun_code


def _prctl() -> Callable[..., int] | None:
    """Linux's ``prctl(2)`` through ctypes, or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _parent_death_signal(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent SIGTERM when ``parent`` dies (and sends it at
    once if ``parent`` died before the call took effect)."""
    prctl = _prctl()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def stop_with_agent() -> None:
    """In a rank torchrun started (Linux): receive SIGTERM when torchrun dies, so that a killed
    agent leaves no rank behind; the rank stops as on any SIGTERM. Does nothing outside torchrun."""
    prctl = _prctl()
    if prctl is None or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    agent = os.environ.get(AGENT_PID_ENV)
    if agent and agent.isdigit() and os.getppid() != int(agent):  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def _children() -> list[int]:
    """This process's children (zombies included), from ``/proc``."""
    me, found = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.append(int(entry.name))
    return found


def _reap() -> None:
    """Collect every child that has exited."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _end_orphans(timeout_s: float) -> None:
    """End the processes torchrun left behind (they became ours, the subreaper's): SIGTERM
    (a rank checkpoints), then SIGKILL after ``timeout_s``."""
    _reap()
    orphans = _children()
    for number in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + (timeout_s if number == signal.SIGTERM else 10)
        for pid in orphans:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass
        while orphans and time.monotonic() < deadline:
            time.sleep(0.1)
            _reap()
            orphans = _children()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _say(line: str) -> None:
    """One line on standard error; nothing if it is gone (a closed terminal sent SIGHUP)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def run_torchrun(command: Sequence[str], env: Mapping[str, str], world_size: int) -> int:
    """Run torchrun ``command``, forwarding :data:`FORWARDED_SIGNALS` to it; returns the job's
    exit code (:func:`job_exit_code`; :data:`~tzrun.errors.EXIT_RANK_LOST` when torchrun itself
    was killed)."""
    directory = tempfile.mkdtemp(prefix="tzrun-exit-")
    full_env = {**env, EXIT_CODE_DIR_ENV: directory, LAUNCHER_PID_ENV: str(os.getpid())}
    full_env.setdefault("TORCHELASTIC_SIGNALS_TO_HANDLE", _TORCHRUN_SIGNALS)
    full_env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT))
    log = None
    if not logging.getLogger("tzrun").isEnabledFor(logging.DEBUG):
        handle, log = tempfile.mkstemp(prefix="tzrun-torchrun-", suffix=".log")
        os.close(handle)
        full_env[AGENT_LOG_ENV] = log
    prctl = _prctl()
    subreaper = prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    # its own session: a Ctrl-C in the terminal reaches torchrun once, through the launcher
    proc = subprocess.Popen(list(command), env=full_env, start_new_session=True,
                            preexec_fn=_parent_death_signal(os.getpid()))

    def forward(number: int, frame: Any) -> None:
        try:
            proc.send_signal(number)
        except ProcessLookupError:
            pass

    previous = {}
    for name in FORWARDED_SIGNALS:
        number = getattr(signal, name)
        if number != signal.SIGHUP or signal.getsignal(number) is not signal.SIG_IGN:  # nohup: stays ignored
            previous[number] = signal.signal(number, forward)
    keep_log = False
    try:
        code = proc.wait()
        if subreaper:
            _end_orphans(float(full_env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]))
        if code < 0:
            _say(f"tzrec-run: torchrun, the job's agent (pid {proc.pid}), was killed by {_signal_name(-code)}; "
                 f"its ranks were stopped; rerun with --resume; exit code {EXIT_RANK_LOST}")
            return EXIT_RANK_LOST
        job = job_exit_code(code, Path(directory), world_size)
        if job == code != 0:
            keep_log = log is not None
            report = f"; its report: {log}" if keep_log else ""
            _say(f"tzrec-run: torchrun exited with {code} and the ranks did not all record one exit code (a rank "
                 f"was killed or crashed in native code, or torchrun failed){report}; exit code {code}")
        return job
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if subreaper:
            prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        shutil.rmtree(directory, ignore_errors=True)
        if log is not None and not keep_log:
            Path(log).unlink(missing_ok=True)


def launch_torchrun(argv: Sequence[str], nproc_per_node: int, max_restarts: int | None = None) -> int:
    """Run the ``tzrec-run`` command line ``argv`` on ``nproc_per_node`` ranks of this machine
    through torchrun's agent (:func:`run_torchrun`), without the launcher's own options;
    returns the job's exit code."""
    from tzrun.stack import require_stack

    require_stack()  # before torchrun itself needs torch
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    command = [sys.executable, "-m", "tzrun.cli.agent", "--standalone", *restarts,
               "--nproc-per-node", str(nproc_per_node), "-m", "tzrun", *without_launcher_options(argv)]
    return run_torchrun(command, launch_environment(os.environ, nproc_per_node), nproc_per_node)


def without_launcher_options(argv: Sequence[str]) -> list[str]:
    """``argv`` without the options the launcher itself takes (``--nproc-per-node N`` and
    ``--max-restarts N``, with ``=`` or a separate value)."""
    launcher = ("--nproc-per-node", "--max-restarts")
    rest, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in launcher:
            skip = True
        elif not token.startswith(tuple(f"{option}=" for option in launcher)):
            rest.append(token)
    return rest


#: torchrun's spellings of the options it shares with ``tzrec-run``, and ours.
TORCHRUN_SPELLINGS = {"--nproc_per_node": "--nproc-per-node", "--max_restarts": "--max-restarts"}


def with_our_spellings(argv: Sequence[str]) -> list[str]:
    """``argv`` with torchrun's spellings (``--nproc_per_node 2``, ``--max_restarts=1``) written
    as ours, so that a torchrun command line works (aliases in the parser would make the
    abbreviation ``--nproc`` ambiguous)."""
    spelled = []
    for token in argv:
        name, equals, value = token.partition("=")
        spelled.append(TORCHRUN_SPELLINGS[name] + equals + value if name in TORCHRUN_SPELLINGS else token)
    return spelled


def launch_environment(environ: Mapping[str, str], nproc_per_node: int) -> dict[str, str]:
    """The environment of the ranks ``--nproc-per-node`` starts: ``environ``, plus
    ``OMP_NUM_THREADS`` = the available CPUs split across the ranks when it is unset.

    torchrun sets ``OMP_NUM_THREADS=1`` for several ranks when it is unset, which would leave
    most cores of a large host idle and defeat the per-rank default of
    :func:`default_num_threads`; setting it first keeps that default.
    """
    env = dict(environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(default_num_threads(available_cpus(), nproc_per_node))
    return env


def default_num_threads(cpu_count: int, local_world_size: int) -> int:
    """Intra-op threads per rank on CPU: the cores split evenly across the host's ranks, so two
    ranks on two cores do not oversubscribe (``OMP_NUM_THREADS`` overrides it)."""
    return max(1, cpu_count // max(1, local_world_size))


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. under ``taskset`` or a
    container's cpuset), or ``os.cpu_count()`` where the platform has no affinity."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
