"""Fault injection for the fault-tolerance tests: ``TZRUN_FAULT`` makes a rank fail on purpose
at a chosen point, the way a preemption or a crash would.

``TZRUN_FAULT`` holds comma-separated faults, each ``KIND@STEP[:RANK[:SIGNAL]]``:

* ``signal@5:1:SIGTERM``: rank 1 sends itself SIGTERM right after training step 5 (the default
  rank is 0, the default signal SIGTERM);
* ``kill-during-save@6:0``: rank 0 SIGKILLs itself while writing the checkpoint of step 6, after
  the sharded state is on disk and before the completion marker.

Faults fire only in the first attempt of a job (``TORCHELASTIC_RESTART_COUNT`` unset or 0), so
a run under ``torchrun --max-restarts`` recovers instead of failing again. Unset, this module
does nothing.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

import attrs

__all__ = ["Fault", "faults", "at_step", "during_save"]


@attrs.frozen
class Fault:
    """One injected fault."""

    kind: str
    step: int
    rank: int = 0
    signal_name: str = "SIGTERM"


def faults(value: Optional[str] = None) -> list[Fault]:
    """The faults ``TZRUN_FAULT`` (or ``value``) asks for, in this attempt of the job."""
    value = os.environ.get("TZRUN_FAULT", "") if value is None else value
    if not value or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return []
    out = []
    for item in value.split(","):
        kind, _, rest = item.strip().partition("@")
        parts = rest.split(":")
        if kind not in ("signal", "kill-during-save") or not parts[0].isdigit():
            raise ValueError(f"TZRUN_FAULT: cannot read {item!r} (expected KIND@STEP[:RANK[:SIGNAL]])")
        out.append(Fault(kind, int(parts[0]), int(parts[1]) if len(parts) > 1 else 0,
                         parts[2] if len(parts) > 2 else "SIGTERM"))
    return out


def at_step(step: int, rank: int) -> None:
    """Fire the ``signal`` faults of ``step`` on ``rank``."""
    for fault in faults():
        if fault.kind == "signal" and fault.step == step and fault.rank == rank:
            os.kill(os.getpid(), getattr(signal, fault.signal_name))


def during_save(step: int, rank: int) -> None:
    """Fire the ``kill-during-save`` faults of ``step`` on ``rank``."""
    for fault in faults():
        if fault.kind == "kill-during-save" and fault.step == step and fault.rank == rank:
            os.kill(os.getpid(), signal.SIGKILL)
