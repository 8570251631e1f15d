"""The ``progress`` stage: a live progress bar on a terminal, plain periodic lines elsewhere.

Rank 0 only. Numbers come from the loop's train log (``tzrun_after_train_log``, every
``train.log_every_n_steps`` steps), so the per-step hook only moves the bar: it never reads a
tensor.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any, Literal

import attrs

import tzrun
from tzrun_plugins.stages._closing import ClosedAtTheEnd

__all__ = ["ProgressConfig", "ProgressStage", "build_progress", "format_train_log"]

log = logging.getLogger("tzrun.progress")


@attrs.frozen
class ProgressConfig:
    """Options of the ``progress`` stage.

    Attributes:
        mode: ``"auto"`` (a bar when standard error is a terminal, lines otherwise), ``"bar"``
            or ``"lines"``. Lines come every ``train.log_every_n_steps`` steps.
    """

    mode: Literal["auto", "bar", "lines"] = "auto"


def _eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(max(seconds, 0))))


def format_train_log(record: tzrun.TrainLog, total_steps: int) -> str:
    """One plain progress line: step, epoch, mean loss, train metrics, learning rates,
    samples/s, data wait and the time left at the window's pace."""
    metrics = "".join(f"  {k}={v:.5f}" for k, v in record.metrics.items())
    lrs = " ".join(f"lr/{k}={v:.6g}" for k, v in record.learning_rates.items())
    per_step = record.seconds / max(record.steps, 1)
    eta = _eta(per_step * (total_steps - record.step))
    return (f"step {record.step}/{total_steps} epoch {record.epoch}  loss={record.loss:.5f}{metrics}  {lrs}  "
            f"samples/s={record.samples_per_s:.0f}  data_wait={100 * record.data_wait_fraction:.1f}%  eta {eta}")


class ProgressStage(ClosedAtTheEnd):
    """Shows how far training is: a tqdm bar or log lines (see the module doc)."""

    def __init__(self, cfg: ProgressConfig) -> None:
        self.cfg = cfg
        self.bar: Any = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if not run.is_rank0:
            return
        use_bar = self.cfg.mode == "bar" or (self.cfg.mode == "auto" and sys.stderr.isatty())
        if use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=run.total_steps, initial=run.start_step, unit="step", dynamic_ncols=True,
                            desc="train", file=sys.stderr)

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run: tzrun.RunContext, step: tzrun.StepInfo) -> None:
        if self.bar is not None:
            self.bar.update(1)

    @tzrun.hookimpl
    def tzrun_after_train_log(self, run: tzrun.RunContext, log: tzrun.TrainLog) -> None:
        if not run.is_rank0:
            return
        if self.bar is not None:
            self.bar.set_postfix(epoch=log.epoch, loss=f"{log.loss:.4f}", samples_s=f"{log.samples_per_s:.0f}",
                                 data_wait=f"{100 * log.data_wait_fraction:.0f}%", refresh=False)
        else:
            _log_line(format_train_log(log, run.total_steps))

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        if not run.is_rank0:
            return
        values = "  ".join(f"{k}={v:.6f}" for k, v in result.metrics.items())
        rate = f" in {result.seconds:.1f} s ({result.rows / result.seconds:,.0f} rows/s)" if result.seconds > 0 else ""
        line = f"eval at step {step} over {result.rows} rows{rate}: {values}"
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            _log_line(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _log_line(line: str) -> None:
    log.info("%s", line)


def build_progress(cfg: ProgressConfig) -> ProgressStage:
    """A progress stage for one run."""
    return ProgressStage(cfg)
