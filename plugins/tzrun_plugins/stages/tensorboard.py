"""The ``tensorboard`` stage: scalars (and optional histograms) for TensorBoard, rank 0.

Two runs under the log dir, ``train/`` and ``eval/``, with stable tags:

========================== ===== ===============================================
tag                        run   value
========================== ===== ===============================================
``loss/total``             train mean total loss over the log window
``loss/<name>``            both  each loss (eval: its mean over the eval rows)
``lr/<optimizer>[/<i>]``   train the learning rate of every param group
``metric/<name>``          both  train metrics (decayed) and eval metrics
``perf/samples_per_s``     train rows per second over all ranks
``perf/data_wait_fraction`` train part of the window spent waiting for data
``grad/global_norm``       train L2 norm of the dense gradients
``param/<name>``           train histogram of a dense parameter (on request)
``grad/<name>``            train histogram of its gradient (on request)
========================== ===== ===============================================

Scalars come from the loop's train log, so they match the progress lines and
``metrics.jsonl`` exactly. The writer is TensorBoard's own (``torch.utils.tensorboard``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Optional

import attrs

import tzrun
from tzrun_plugins.stages._closing import ClosedAtTheEnd

__all__ = ["TensorBoardConfig", "TensorBoardStage", "build_tensorboard"]



@attrs.frozen
class TensorBoardConfig:
    """Options of the ``tensorboard`` stage.

    Attributes:
        log_dir: where the event files go (default ``<model_dir>/tensorboard``); a relative
            path is taken from the model dir.
        histograms_every_n_steps: every N steps, a histogram of each dense parameter and of its
            gradient (0: never). Each costs a pass over the parameters; keep N large.
        flush_secs: how often the writer flushes to disk.
    """

    log_dir: Optional[str] = None
    histograms_every_n_steps: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    flush_secs: int = attrs.field(default=30, validator=attrs.validators.gt(0))

    def __attrs_post_init__(self) -> None:
        # checked with the config (tzrec-run check too), before any training starts
        if importlib.util.find_spec("tensorboard") is None:
            raise ValueError("the tensorboard stage needs TensorBoard, which is not installed: "
                             "run `pip install 'tzrec-run[tensorboard]'`")


class TensorBoardStage(ClosedAtTheEnd):
    """Writes the run's scalars and histograms with TensorBoard's ``SummaryWriter``."""

    def __init__(self, cfg: TensorBoardConfig) -> None:
        self.cfg = cfg
        self.train: Any = None
        self.eval: Any = None
        self.log_dir: Path | None = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if not run.is_rank0:
            return
        from torch.utils.tensorboard import SummaryWriter

        path = Path(self.cfg.log_dir) if self.cfg.log_dir else Path("tensorboard")
        self.log_dir = path if path.is_absolute() else Path(run.model_dir) / path
        # purge_step drops the events a resumed run will write again
        purge = run.start_step + 1 if run.start_step else None
        self.train = SummaryWriter(str(self.log_dir / "train"), flush_secs=self.cfg.flush_secs, purge_step=purge)
        self.eval = SummaryWriter(str(self.log_dir / "eval"), flush_secs=self.cfg.flush_secs, purge_step=purge)

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run: tzrun.RunContext, step: tzrun.StepInfo) -> None:
        every = self.cfg.histograms_every_n_steps
        if self.train is None or not every or step.step % every:
            return
        for name, param in run.dense_parameters.items():
            self.train.add_histogram(f"param/{name}", param.detach(), step.step)
            if param.grad is not None:
                self.train.add_histogram(f"grad/{name}", param.grad.detach(), step.step)

    @tzrun.hookimpl
    def tzrun_after_train_log(self, run: tzrun.RunContext, log: tzrun.TrainLog) -> None:
        if self.train is None:
            return
        w, s = self.train, log.step
        w.add_scalar("loss/total", log.loss, s)
        for name, value in log.losses.items():
            w.add_scalar(f"loss/{name}", value, s)
        for name, value in log.loss_weights.items():
            w.add_scalar(f"loss_weight/{name}", value, s)
        for name, value in log.learning_rates.items():
            w.add_scalar(f"lr/{name}", value, s)
        for name, value in log.metrics.items():
            w.add_scalar(f"metric/{name}", value, s)
        w.add_scalar("perf/samples_per_s", log.samples_per_s, s)
        w.add_scalar("perf/data_wait_fraction", log.data_wait_fraction, s)
        if log.grad_norm is not None:
            w.add_scalar("grad/global_norm", log.grad_norm, s)

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        if self.eval is None:
            return
        if step and step == run.start_step:  # the resumed boundary evaluated again: drop its earlier events
            from torch.utils.tensorboard import SummaryWriter

            self.eval.close()
            self.eval = SummaryWriter(str(self.eval.log_dir), flush_secs=self.cfg.flush_secs, purge_step=step)
        for name, value in result.metrics.items():
            self.eval.add_scalar(name if name.startswith("loss/") else f"metric/{name}", value, step)
        self.eval.flush()
        self.train.flush()

    def close(self) -> None:
        for writer in (self.train, self.eval):
            if writer is not None:
                writer.close()
        self.train = self.eval = None


def tensorboard_outputs(cfg: TensorBoardConfig) -> list[str]:
    """What the stage writes in the model dir (``--overwrite`` removes it)."""
    return [cfg.log_dir or "tensorboard"]


def build_tensorboard(cfg: TensorBoardConfig) -> TensorBoardStage:
    """A tensorboard stage for one run."""
    return TensorBoardStage(cfg)
