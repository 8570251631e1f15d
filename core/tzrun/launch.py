"""What ``tzrec-run train --nproc-per-node N`` does around torchrun: it forwards the signals a
scheduler sends to the process it started, and exits with the job's own code.

* SIGTERM, SIGINT and SIGUSR1 received by the launcher go to torchrun, which passes them to
  every worker (``TORCHELASTIC_SIGNALS_TO_HANDLE`` is extended with SIGUSR1) and waits up to
  ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds (default here: 300, so a checkpoint of a large
  model can be written) before it kills them. The workers stop at the same step through
  :class:`tzrun.runner.signals.StopSignals` and write a checkpoint.
* torchrun reports any worker's non-zero exit as a failure (exit 1). Every worker records its
  exit code in a directory the launcher names (``TZRUN_EXIT_CODE_DIR``); when all ranks
  recorded the same code (75 for a signal stop, 78 for a config error, 65 for a data error, ...:
  :mod:`tzrun.errors`), the launcher exits with it, otherwise with torchrun's. A rank that froze
  and was ended by another one's watchdog has its code (69) recorded by that watchdog.

This module imports nothing heavy.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["EXIT_CODE_DIR_ENV", "FORWARDED_SIGNALS", "SHUTDOWN_TIMEOUT", "record_exit_code", "run_torchrun",
           "job_exit_code"]

#: Where each worker writes ``rank-<R>`` holding its exit code (set by the launcher).
EXIT_CODE_DIR_ENV = "TZRUN_EXIT_CODE_DIR"
#: The signals the launcher passes on to the job.
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
#: torchrun's wait for the workers after a signal, unless ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is set.
SHUTDOWN_TIMEOUT = 300
_TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


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


def run_torchrun(command: Sequence[str], env: Mapping[str, str], world_size: int) -> int:
    """Run torchrun ``command``, forwarding :data:`FORWARDED_SIGNALS` to it; returns the job's
    exit code (:func:`job_exit_code`)."""
    directory = tempfile.mkdtemp(prefix="tzrun-exit-")
    full_env = {**env, EXIT_CODE_DIR_ENV: directory}
    full_env.setdefault("TORCHELASTIC_SIGNALS_TO_HANDLE", _TORCHRUN_SIGNALS)
    full_env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT))
    # its own session: a Ctrl-C in the terminal reaches torchrun once, through the launcher
    proc = subprocess.Popen(list(command), env=full_env, start_new_session=True)

    def forward(number: int, frame: Any) -> None:
        try:
            proc.send_signal(number)
        except ProcessLookupError:
            pass

    previous = {}
    for name in FORWARDED_SIGNALS:
        number = getattr(signal, name)
        previous[number] = signal.signal(number, forward)
    try:
        code = proc.wait()
        job = job_exit_code(code, Path(directory), world_size)
        if job != code:
            print(f"tzrec-run: every rank exited with code {job} (torchrun reported {code}, and a traceback if it "
                  f"was signalled); exit code {job}", file=sys.stderr)
        return job
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        shutil.rmtree(directory, ignore_errors=True)
