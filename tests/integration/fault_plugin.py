"""Fault injection for the fault tests, from the test side: a plugin that a test installs as a
throwaway distribution (:func:`install`), so that every rank of a ``torchrun`` job loads it
through the ``tzrun`` entry points like any plugin.

``TZRUN_TEST_FAULT`` holds comma-separated faults, each ``KIND@STEP[:RANK[:SIGNAL]]``:

* ``signal@5:1:SIGTERM``: rank 1 sends itself SIGTERM right after training step 5;
* ``signal-group@4:0:SIGINT``: rank 0 sends SIGINT to its whole process group (its data
  workers too), as a terminal's Ctrl-C does (run the job in a session of its own);
* ``kill-during-save@6:0``: rank 0 SIGKILLs itself while writing the checkpoint of step 6,
  after the state is on disk and before the completion marker;
* ``raise@5:1``: rank 1 raises a ``DataError`` right after training step 5, and
  ``raise-eval@6:1`` at the start of the evaluation of step 6 (both need
  ``TZRUN_STRICT_PLUGINS=1``, or the plugin's error is only a warning);
* ``stop@5:1``: rank 1 freezes itself (SIGSTOP) right after training step 5.

Faults fire only in the first attempt of a job (``TORCHELASTIC_RESTART_COUNT`` unset or 0), so
a run under ``torchrun --max-restarts`` recovers instead of failing again.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import tzrun

ENV = "TZRUN_TEST_FAULT"
#: A file the ``raise``, ``raise-eval`` and ``stop`` faults write the time they fire to (if set).
STAMP_ENV = "TZRUN_TEST_FAULT_STAMP"


def _stamp() -> None:
    import time

    if os.environ.get(STAMP_ENV):
        Path(os.environ[STAMP_ENV]).write_text(f"{time.time()}\n")


def faults() -> list[tuple[str, int, int, str]]:
    """``(kind, step, rank, signal name)`` of every fault asked for, in this attempt."""
    value = os.environ.get(ENV, "")
    if not value or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return []
    out = []
    for item in value.split(","):
        kind, _, rest = item.strip().partition("@")
        parts = rest.split(":")
        out.append((kind, int(parts[0]), int(parts[1]) if len(parts) > 1 else 0, parts[2] if len(parts) > 2 else "SIGTERM"))
    return out


def _data_error(message: str) -> Exception:
    from tzrun.errors import DataError

    return DataError(message)


class Faults:
    """The plugin: kills or signals its own rank where ``TZRUN_TEST_FAULT`` says."""

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        from tzrun.runner import checkpoint

        doomed = {step for kind, step, rank, _ in faults() if kind == "kill-during-save" and rank == run.rank}
        if not doomed:
            return
        mark_complete = checkpoint.mark_complete

        def killed_before_the_marker(path: Path, step: int, manifest: bytes) -> None:
            if step in doomed:
                os.kill(os.getpid(), signal.SIGKILL)
            mark_complete(path, step, manifest)

        checkpoint.mark_complete = killed_before_the_marker

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run: tzrun.RunContext, step: tzrun.StepInfo) -> None:
        for kind, at, rank, name in faults():
            if kind == "signal" and at == step.step and rank == run.rank:
                os.kill(os.getpid(), getattr(signal, name))
            if kind == "signal-group" and at == step.step and rank == run.rank:
                os.killpg(os.getpgid(0), getattr(signal, name))
            if kind == "raise" and at == step.step and rank == run.rank:
                _stamp()
                raise _data_error(f"part-1.csv, line 151, column 'I3': 'abc' is not a number (injected at step {at})")
            if kind == "stop" and at == step.step and rank == run.rank:
                _stamp()
                os.kill(os.getpid(), signal.SIGSTOP)

    @tzrun.hookimpl
    def tzrun_before_eval(self, run: tzrun.RunContext, step: int) -> None:
        for kind, at, rank, _ in faults():
            if kind == "raise-eval" and at == step and rank == run.rank:
                _stamp()
                raise _data_error(f"eval.csv, line 7, column 'label': 'x' is not a number (injected at step {at})")


PLUGIN = Faults()


def install(site_dir: Path) -> dict[str, str]:
    """Install this plugin into ``site_dir`` as a distribution; returns the environment
    (``PYTHONPATH``) under which ``tzrec-run`` loads it."""
    from tests.plugin_kit.dists import _python_path, write_distribution

    write_distribution(site_dir, "tzrun-test-faults", entry_points={"test_faults": "tzrun_test_faults:PLUGIN"},
                       modules={"tzrun_test_faults": Path(__file__).read_text(encoding="utf-8")})
    return {"PYTHONPATH": _python_path(site_dir)}
