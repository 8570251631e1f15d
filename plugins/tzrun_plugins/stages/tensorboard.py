"""The ``tensorboard`` stage: scalars (and optional histograms) for TensorBoard, rank 0.

Two runs under the log dir, ``train/`` and ``eval/``, with stable tags. The log dir is the model
dir itself unless ``log_dir`` says otherwise, so ``tensorboard --logdir runs`` names the runs
``deepfm_criteo/train`` and ``deepfm_criteo/eval`` (no ``tensorboard/`` between them):

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

With a model dir (or ``log_dir``) on an object store, the writers write into a local
temporary directory whose event files are uploaded through fsspec every ``flush_secs``, after
each evaluation and at the end (see :mod:`._staging`): TensorBoard's own file layer reaches
``s3://`` through boto3 with its own endpoint variable (``S3_ENDPOINT``), and appends to an
object by re-sending it on every flush, so staging keeps one set of credentials and one
upload path for every store.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any, Optional

import attrs

import tzrun
from tzrun_plugins.stages._closing import ClosedAtTheEnd
from tzrun_plugins.stages._staging import StagedDir

__all__ = ["TensorBoardConfig", "TensorBoardStage", "build_tensorboard"]



@attrs.frozen
class TensorBoardConfig:
    """Options of the ``tensorboard`` stage.

    Attributes:
        log_dir: the directory that holds the ``train/`` and ``eval/`` runs (default: the
            model dir); a relative path is taken from the model dir.
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
        self.staged: StagedDir | None = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if not run.is_rank0:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = tzrun.under(run.model_dir, self.cfg.log_dir) if self.cfg.log_dir else tzrun.as_path(run.model_dir)
        self.staged = StagedDir(self.log_dir, "tensorboard")
        # purge_step drops the events a resumed run will write again
        purge = run.start_step + 1 if run.start_step else None
        local = self.staged.local
        self.train = SummaryWriter(str(local / "train"), flush_secs=self.cfg.flush_secs, purge_step=purge)
        self.eval = SummaryWriter(str(local / "eval"), flush_secs=self.cfg.flush_secs, purge_step=purge)

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
        if self.staged is not None and self.staged.remote and \
                time.monotonic() - self.staged.uploaded_at >= self.cfg.flush_secs:
            w.flush()
            self.staged.upload()

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        if self.eval is None:
            return
        for name, value in result.metrics.items():
            self.eval.add_scalar(name if name.startswith("loss/") else f"metric/{name}", value, step)
        self.eval.flush()
        self.train.flush()
        if self.staged is not None:
            self.staged.upload()

    def close(self) -> None:
        for writer in (self.train, self.eval):
            if writer is not None:
                writer.close()
        self.train = self.eval = None
        if self.staged is not None:
            self.staged.close()
            self.staged = None


#: where earlier tzrec-run versions wrote the events by default (``--overwrite`` removes it too)
_OLD_DEFAULT = "tensorboard"


def tensorboard_outputs(cfg: TensorBoardConfig) -> list[str]:
    """What the stage writes in the model dir (``--overwrite`` removes it): its two runs, never
    the model dir itself."""
    if cfg.log_dir and Path(cfg.log_dir) != Path("."):
        return [cfg.log_dir]
    return ["train", "eval", _OLD_DEFAULT]


def build_tensorboard(cfg: TensorBoardConfig) -> TensorBoardStage:
    """A tensorboard stage for one run."""
    return TensorBoardStage(cfg)
