"""``python -m tzrun.cli.agent ARGS`` is ``torchrun ARGS`` as ``tzrec-run --nproc-per-node`` runs it
(:mod:`tzrun.runner.launch`): torchrun's own output (its log lines, and the ``ChildFailedError``
traceback it prints for any failed rank) goes to the file ``TZRUN_AGENT_LOG`` names, while the
ranks it starts keep the launcher's standard error; its ranks learn its pid
(``TZRUN_AGENT_PID``) so that they stop when it dies. If the launcher died (the parent-death
signal ended the job), torchrun removes the launcher's temporary files itself at the end."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Sequence

from tzrun.runner.launch import AGENT_LOG_ENV, AGENT_PID_ENV, EXIT_CODE_DIR_ENV, LAUNCHER_PID_ENV

__all__ = ["main"]


def main(argv: Sequence[str]) -> None:
    """Run torchrun with ``argv``."""
    log = os.environ.pop(AGENT_LOG_ENV, None)
    launcher = os.environ.pop(LAUNCHER_PID_ENV, None)
    os.environ[AGENT_PID_ENV] = str(os.getpid())
    if log:  # before torch is imported: its log handlers write to sys.stderr as it is then
        sys.stderr = open(log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - for the whole process
    from torch.distributed.run import main as torchrun

    try:
        torchrun(list(argv))
    finally:
        if launcher and str(os.getppid()) != launcher:  # nobody reads them now
            if os.environ.get(EXIT_CODE_DIR_ENV):
                shutil.rmtree(os.environ[EXIT_CODE_DIR_ENV], ignore_errors=True)
            if log:
                Path(log).unlink(missing_ok=True)


if __name__ == "__main__":
    main(sys.argv[1:])
