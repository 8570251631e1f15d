"""What a training run reports to its caller (``tzrec-run train`` prints it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from tzrun.interfaces import EvalResult

__all__ = ["TrainResult"]


@attrs.frozen
class TrainResult:
    """What a finished run reports.

    Attributes:
        steps: training steps run.
        checkpoint: the last checkpoint written.
        eval: the last evaluation (None without an eval input).
        seconds: wall time of the loop, set-up excluded.
        samples_per_second: training rows per second over all ranks, evaluation excluded.
        model: the trained DistributedModelParallel model (for programmatic use).
        stopped_by: the signal that stopped the run early (its checkpoint is written), or None.
        stop_reason: why a stage ended the run early (early stopping, say), or None.
    """

    steps: int
    checkpoint: Path
    eval: EvalResult | None
    seconds: float
    samples_per_second: float
    model: Any = attrs.field(default=None, repr=False)
    stopped_by: str | None = None
    stop_reason: str | None = None
