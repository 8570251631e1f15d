"""The ``progress`` stage: periodic plain lines with step, loss, learning rates and samples/s.

Rank 0 only. It reads the loss as a number only at its interval (one sync per interval), from a
running sum kept on the device.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import attrs

import tzrun

__all__ = ["ProgressConfig", "ProgressStage", "build_progress"]

log = logging.getLogger("tzrun.progress")


@attrs.frozen
class ProgressConfig:
    """Options of the ``progress`` stage.

    Attributes:
        every_n_steps: the interval of lines (default: ``train.log_every_n_steps``).
    """

    every_n_steps: Optional[int] = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.gt(0)))


class ProgressStage:
    """Logs a line every N steps and one per evaluation."""

    def __init__(self, cfg: ProgressConfig) -> None:
        self.cfg = cfg
        self._every = 0
        self._loss_sum: Any = None
        self._rows = 0
        self._steps = 0
        self._since = 0.0
        self._total_steps: Optional[int] = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        self._every = self.cfg.every_n_steps or run.config.train.log_every_n_steps
        self._since = time.perf_counter()

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run: tzrun.RunContext, step: tzrun.StepInfo) -> None:
        if not run.is_rank0:
            return
        loss = step.loss.detach()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._rows += step.rows
        self._steps += 1
        if step.step % self._every:
            return
        now = time.perf_counter()
        mean_loss = float(self._loss_sum) / self._steps
        rate = self._rows * run.world_size / max(now - self._since, 1e-9)
        lrs = " ".join(f"lr/{k}={v:.6g}" for k, v in step.learning_rates.items())
        metrics = "".join(f"  {k}={v:.5f}" for k, v in step.metrics.items())
        log.info("step %d epoch %d  loss=%.5f%s  %s  samples/s=%.0f", step.step, step.epoch, mean_loss, metrics, lrs, rate)
        self._loss_sum, self._rows, self._steps, self._since = None, 0, 0, now

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        if run.is_rank0:
            values = "  ".join(f"{k}={v:.6f}" for k, v in result.metrics.items())
            log.info("eval at step %d over %d rows: %s", step, result.rows, values)
        self._since = time.perf_counter()


def build_progress(cfg: ProgressConfig) -> ProgressStage:
    """A progress stage for one run."""
    return ProgressStage(cfg)
