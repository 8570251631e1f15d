"""The training loop (see :mod:`tzrun.hookspecs` for it as pseudocode, with every hook).

A :class:`Trainer` takes a run's parts from its :class:`~tzrun.runner.session.Session` and owns
the step, the segments, evaluation and checkpoints. Training runs in segments that end where a
checkpoint and an evaluation are due (every ``train.save_checkpoints_steps``, every
``train.save_checkpoints_epochs`` epochs, and the last step). Each segment is driven by a fresh
TorchRec train pipeline that drains at the boundary, so no batch is in flight while the model is
evaluated or saved. At a boundary the checkpoint is written first, then the model is evaluated,
the best checkpoint recorded and the stages asked whether to stop: an evaluation that fails leaves
the boundary's checkpoint complete. Such a checkpoint says that its boundary's evaluation is
pending (:mod:`~tzrun.runner.boundary_eval`): a run resumed from it evaluates that boundary again
before training on, so that its results and the stages' decisions are an uninterrupted run's. On
resume, evaluations after the checkpoint's step are dropped from ``eval_results.jsonl`` and run
again.

The trainer's state is one dict of ``Stateful`` objects (:meth:`Trainer.state`), saved by one
``torch.distributed.checkpoint`` call and loaded by one.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch

from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.errors import NonFiniteLossError
from tzrun.interfaces import EvalResult, StepInfo
from tzrun.kernel.plugins import call_lifecycle, plugin_infos
from tzrun.runner.checkpoint import checkpoint_dir, latest_checkpoint
from tzrun.runner.async_checkpoint import BackgroundSaves
from tzrun.runner.boundary_eval import resume_evaluation, told_already
from tzrun.runner.evaluate import append_eval_result
from tzrun.runner.init_from import InitFrom, init_from_checkpoint
from tzrun.runner.log_file import log_file
from tzrun.runner.distributed import value_of_rank0
from tzrun.runner.model_dir import claim_model_dir, refuse_foreign_model_dir
from tzrun.runner.run_lock import RunLock, claim_run_lock
from tzrun.runner.run_marker import read_run_marker
from tzrun.runner.position import DataPosition, ResumePoint, checkpoint_boundaries
from tzrun.runner.run_log import log_param_groups, log_skipped, log_time_to_first_step, record_start
from tzrun.runner.retention import prune_checkpoints, read_best, record_best
from tzrun.runner.result import TrainResult
from tzrun.runner.session import Session
from tzrun.runner.launch import record_exit_code
from tzrun.runner.signals import EXIT_STOPPED_BY_SIGNAL, StopSignals
from tzrun.runner.stages import LogWindow, TimedIterator, learning_rates, state_key
from tzrun.runner.watchdog import current as current_watchdog, fail_collectively
from tzrun.runner.trainer_checkpoints import TrainerCheckpoints
from tzrun.runner.zch import zch_counters

__all__ = ["TrainResult", "Trainer", "train", "EXIT_STOPPED_BY_SIGNAL"]

log = logging.getLogger("tzrun")


def train(session: Session, *, overwrite: bool = False, resume: bool = False,
          init_from: InitFrom | None = None) -> TrainResult:
    """Train, evaluate and checkpoint as the session's config says, on every rank of the job
    (collective: it starts the session, see :meth:`Session.start`).

    Args:
        session: the run (e.g. from :meth:`Session.from_config`), not started yet; the
            configured stages are registered on its plugin manager.
        overwrite: remove the checkpoints and results of an earlier run in ``model_dir`` first.
        resume: continue from the latest complete checkpoint in ``model_dir`` (start afresh
            when there is none). Without either, a ``model_dir`` with checkpoints is refused.
        init_from: start from another run's weights (fine-tuning); ignored when resuming.

    Returns:
        The result (the same on every rank, except timing). ``stopped_by`` names the signal
        when SIGTERM/SIGUSR1 stopped the run (after its checkpoint was written).

    Raises:
        TzrunError: when ``model_dir`` already has checkpoints and neither option is given.
    """
    return Trainer(session.start(), overwrite=overwrite, resume=resume, init_from=init_from).fit()


class Trainer(TrainerCheckpoints):
    """Trains one run on this rank: the loop of :mod:`tzrun.hookspecs`, method by method.

    Args:
        session: the run's parts (made by :meth:`Session.start`).
        overwrite, resume, init_from: as :func:`train`.
    """

    def __init__(self, session: Session, *, overwrite: bool = False, resume: bool = False,
                 init_from: InitFrom | None = None) -> None:
        self.session = session
        self.cfg = session.cfg
        self.pm = session.pm
        self.info = session.info
        self.overwrite, self.resume, self.init_from = overwrite, resume, init_from
        self.step = 0
        self.last_eval: EvalResult | None = None
        self.last_checkpoint: Path | None = None
        self.stopped_by: str | None = None
        self.run_lock: RunLock | None = None
        self.run_id = ""  # the model dir's run (its marker's id), once claimed
        train = self.cfg.train  # no BackgroundSaves: every save is synchronous
        self.saves = BackgroundSaves(train.collective_timeout_s, budget_gb=train.async_checkpoint_budget_gb,
                                     local_world_size=self.info.local_world_size) if train.async_checkpoint else None
        self.train_seconds = 0.0
        self._stage_state: dict[str, Any] = {}
        self._loaded_loop: dict[str, Any] = {}
        self._position: DataPosition | None = None
        self._nonfinite_seen = 0
        self._epoch_end_steps: set[int] = set()
        self._evaluation_pending = False  # the checkpoint being written precedes its boundary's evaluation
        self._resumed_boundary_pending = False
        self._told_already: list[object] = []  # plugins not to tell of the next evaluation (they heard it)

    # -- the run, top-down -----------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Set the run up, train it to the end (or a stop), and report; from the moment the
        model dir is claimed, the run's log goes into its log file too (:mod:`~tzrun.runner.log_file`)."""
        resume_from = self.claim_model_dir()
        with log_file(self.session.model_dir, self.info.rank):
            return self.run_claimed(resume_from)

    def run_claimed(self, resume_from: Path | None) -> TrainResult:
        """:meth:`fit` once the model dir is claimed."""
        try:
            self.set_up()
        except BaseException:
            self.release_run_lock()
            raise
        started = time.perf_counter()
        try:
            self.start_from(resume_from)
            call_lifecycle(self.pm, "tzrun_before_train", run=self.run)
            if self.evaluate_resumed_boundary():
                for boundary in self.boundaries:
                    if not self.train_until(boundary):
                        break
            self.wait_for_saves(prune=True)  # the last checkpoint is complete before anything reads it, or the run ends
            if self.last_checkpoint is None:  # resumed at the very end: nothing left to train
                self.last_checkpoint = latest_checkpoint(self.session.model_dir)
            if self.stopped_by is None and self.last_checkpoint is not None:
                self.checkpoint_complete(self.last_checkpoint, self.step, best=False, final=True)
            call_lifecycle(self.pm, "tzrun_after_train", run=self.run, step=self.step)
        except BaseException as error:
            fail_collectively(error)  # the other ranks stop within seconds
            self.on_error(error)
            self.close_saves(quietly=True)
            self.release_run_lock(quietly=True)  # a store gone away must not hide the error that ends the run
            raise
        finally:
            self.signals.restore()
            self.stages.unregister()
            self.close_saves(quietly=True)  # a save still in flight ends before the lock goes
            self.release_run_lock()
        return self.result(time.perf_counter() - started)

    def claim_model_dir(self) -> Path | None:
        """Apply the model-dir policy (:func:`~tzrun.runner.model_dir.claim_model_dir`); the
        ranks meet before anyone writes. Returns the checkpoint to resume from, if any."""
        s = self.session
        # a directory that is not a run's is refused before anything (the lock too) is written there
        refuse_foreign_model_dir(s.model_dir, overwrite=self.overwrite, rank=self.info.rank,
                                 world_size=self.info.world_size)
        self.run_lock = claim_run_lock(s.model_dir, self.info.rank, self.info.world_size)  # before any write
        try:
            resume_from = claim_model_dir(s.model_dir, self.cfg, s.registries, overwrite=self.overwrite,
                                          resume=self.resume, rank=self.info.rank)
            if resume_from is not None:
                read_best(s.model_dir)  # a damaged best.json stops the run now, not at its first evaluation
            marker = read_run_marker(s.model_dir) if self.info.rank == 0 else None
            self.run_id = value_of_rank0(str((marker or {}).get("run_id", "")), self.info.world_size)
        except BaseException:
            self.release_run_lock()
            raise
        torch.distributed.barrier()
        return resume_from

    def release_run_lock(self, *, quietly: bool = False) -> None:
        """Remove the model dir's run lock (rank 0 holds it; the other ranks hold nothing);
        ``quietly``, as a run that failed does, a failure to remove it is a warning."""
        lock, self.run_lock = self.run_lock, None
        if lock is None:
            return
        try:
            lock.release()
        except Exception as error:
            if not quietly:
                raise
            log.warning("could not remove the run lock %s (%s: %s); remove it once no run uses the model dir",
                        lock.path, type(error).__name__, " ".join(str(error).split())[:200])

    def set_up(self) -> None:
        """Build what the loop uses: the model and its update path, the stages, the metrics."""
        s = self.session
        self.built = s.built
        self.run = s.run_context(self.run_id)
        self.plugins = [p.to_json() for p in plugin_infos(self.pm, s.registries)]  # before the stages join
        self.stages = s.stages()
        self.train_metrics = s.train_metrics()
        self.signals = StopSignals(self.info.world_size)
        self.skipped = SkippedRows()

    def start_from(self, resume_from: Path | None) -> None:
        """Load the checkpoint to resume (or the weights to fine-tune from), plan the data from
        there, and record the run."""
        start = ResumePoint.beginning(self.session.whole_layout)
        if resume_from is not None:
            start = self.load(resume_from)
        elif self.init_from is not None:
            report = init_from_checkpoint(self.init_from, model=self.built.model, optimizer=self.built.optimizer,
                                          model_dir=self.session.model_dir, rank=self.info.rank,
                                          world_size=self.info.world_size)
            self._log0("%s", report.summary())
        self.data = self.session.train_data(start)
        self.step = start.step
        self.total = max(self.data.total, start.step)
        self.run.total_steps, self.run.start_step = self.total, start.step
        self.run.steps_per_epoch = self.data.steps_per_epoch
        epoch_ends = self.data.epoch_ends()
        if any(getattr(s, "by_epoch", False) for s in self.built.schedulers.values()):
            self._epoch_end_steps = set(epoch_ends)
        if not self.cfg.train.save_checkpoints_epochs:
            epoch_ends = []
        self.boundaries = checkpoint_boundaries(start.step, self.total, self.cfg.train.save_checkpoints_steps, epoch_ends,
                                      self.cfg.train.save_checkpoints_epochs)
        self.stream = TimedIterator(tally_skipped(self.data.batches(start.step), self.skipped))
        self.window = LogWindow(self.stream, self.info.world_size, skipped=self.skipped)
        if resume_from is not None:
            resumed = resume_evaluation(  # and trims eval_results.jsonl
                self._loaded_loop, self.session.model_dir, start.step, has_eval=self.session.eval_input is not None,
                nothing_left=start.step >= self.total, rank=self.info.rank, world_size=self.info.world_size)
            self._resumed_boundary_pending = resumed.pending
            if resumed.told:
                self._told_already = told_already(self.pm, self._stage_state, state_key)
            call_lifecycle(self.pm, "tzrun_after_checkpoint_load", run=self.run, step=start.step,
                           state=self._stage_state)
        record_start(self.session, self.run, self.plugins)
        log_param_groups(self.built.optimizers, self.info.rank)

    def evaluate_resumed_boundary(self) -> bool:
        """On resume from a boundary's checkpoint, run that boundary's evaluation (and what
        follows it) as the interrupted run would have. Returns whether training goes on."""
        if not self._resumed_boundary_pending:
            return True
        self._log0("evaluating step %d again: its result is not part of the checkpoint (written before it)", self.step)
        return self.conclude_boundary(self.evaluate())

    def train_until(self, boundary: int) -> bool:
        """Train to ``boundary``, then stop (a signal), or checkpoint and evaluate. Returns
        whether training goes on."""
        self.train_segment(boundary)
        if self.stopped_by is not None:
            self.save()
            self.wait_for_saves(prune=True)
            self._log0_warning("stopped by %s at step %d after writing %s; rerun with --resume to continue "
                               "(exit code %d)", self.stopped_by, self.step, self.last_checkpoint, EXIT_STOPPED_BY_SIGNAL)
            record_exit_code(EXIT_STOPPED_BY_SIGNAL)  # now: torchrun ends this rank with a signal once another exits
            return False
        self.save(evaluation_pending=True)  # first: an evaluation that fails leaves it complete
        return self.conclude_boundary(self.evaluate())

    def _records_best(self) -> bool:
        """Whether a boundary's evaluation records the best checkpoint (and so prunes)."""
        return self.cfg.eval.best_metric is not None and self.session.eval_input is not None

    def conclude_boundary(self, result: EvalResult | None) -> bool:
        """After a boundary's evaluation: record the best checkpoint, and ask the stages
        whether to stop. Returns whether training goes on."""
        if result is not None and self._records_best():
            self.record_best(result)
        return not self.any_rank_asks_to_stop()

    def train_segment(self, boundary: int) -> None:
        """Train the steps up to ``boundary`` with a fresh pipeline; notes a signal stop."""
        started = time.perf_counter()
        self.window.resume_clock()
        pipeline = self.session.pipeline()
        batches = itertools.islice(self.stream, boundary - self.step)
        with warnings.catch_warnings():
            # The schedules are closed-form in the number of steps: stepping one before its
            # optimizer has stepped (a dense step inside an accumulation window) skips nothing.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
            try:
                stopped = self.run_steps(pipeline, batches)
            finally:
                if hasattr(pipeline, "detach"):
                    pipeline.detach()
        self.built.update.flush()  # no gradient stays pending across a checkpoint
        self.raise_if_nonfinite()
        self.train_seconds += time.perf_counter() - started
        if self.built.compiled is not None:
            self.built.compiled.report(self.info.rank, f"up to step {self.step}")
        if stopped or self.signals.agree_now():
            self.stopped_by = self.signals.received or "a signal on another rank"
        if self.cfg.data.on_bad_row == "skip":
            log_skipped(self.skipped, self.info.rank, self.info.world_size, self.step, self.cfg.data.max_bad_row_fraction)

    def run_steps(self, pipeline: Any, batches: Iterator[Any]) -> bool:
        """One step after another until the batches end; returns whether every rank agreed to
        stop early (a signal)."""
        while True:
            try:
                out = pipeline.progress(batches)
            except StopIteration:
                return False
            self.step += 1
            self.after_step(out)
            if self.signals.should_stop():
                return True

    def after_step(self, out: Any) -> None:
        """What follows each step: schedules, train metrics, the log window, the stages'
        per-step hook, and every ``log_every_n_steps`` the train log. Never a device sync
        between two train logs."""
        step, update = self.step, self.built.update
        lrs = {k: groups[0]["lr"] for k, opt in self.built.optimizers.items() if (groups := opt.param_groups)}
        logging_now = step % self.cfg.train.log_every_n_steps == 0
        all_lrs = learning_rates(self.built.optimizers) if logging_now else {}  # before the schedules move them
        self.step_schedules(step)
        if (watchdog := current_watchdog()) is not None:
            watchdog.step = step  # shown when this rank stops responding
        if update.nonfinite_steps != self._nonfinite_seen:
            self._nonfinite_seen = update.nonfinite_steps
            log.warning("step %d: %s; its update was skipped (%d such step(s) so far; "
                        "train.on_nonfinite_loss = \"skip\")", step, update.skip_reason, update.nonfinite_steps)
        if self.train_metrics:
            self.train_metrics.update(out)
        epoch = self.data.where(step)[0].epoch
        metrics = dict(self.train_metrics.values) if self.train_metrics else {}
        self.window.add(out.loss, out.losses, out.num_rows, out.loss_weights)
        if step == self.run.start_step + 1:
            log_time_to_first_step(self.info.rank)
        call_lifecycle(self.pm, "tzrun_after_train_step", run=self.run,
                       step=StepInfo(step, epoch, out.loss, out.losses, out.num_rows, lrs, metrics))
        if logging_now:
            self.raise_if_nonfinite()
            record = self.window.close(step, epoch, all_lrs, metrics, update.dense_params, zch_counters(self.built.model))
            call_lifecycle(self.pm, "tzrun_after_train_log", run=self.run, log=record)

    def step_schedules(self, step: int) -> None:
        """Step the per-batch schedules, and at an epoch's end the per-epoch ones."""
        schedulers = self.built.schedulers.values()
        for scheduler in schedulers:
            if not getattr(scheduler, "by_epoch", False):
                scheduler.step()
        if step in self._epoch_end_steps:
            for scheduler in schedulers:
                if getattr(scheduler, "by_epoch", False):
                    scheduler.step()

    def raise_if_nonfinite(self) -> None:
        """Raise for the first non-finite training loss or gradient seen so far
        (``on_nonfinite_loss = "error"``): at a train log or a boundary, before anything is
        saved (one sync).

        Raises:
            NonFiniteLossError: naming the step, its epoch and batch, the rank, and the
                parameter whose gradient was not finite.
        """
        first = self.built.update.nonfinite.first()
        if first is None:
            return
        step = self.run.start_step + first.batch
        where, in_epoch = self.data.where(step)
        if first.parameter is None or not math.isfinite(first.loss):  # the loss first: it is the cause
            what = f"the training loss is {first.loss}"
        elif math.isfinite(first.magnitude):
            what = (f"the gradient of {first.parameter} reaches {first.magnitude:.3g}, whose square (Adam's and "
                    f"Adagrad's state) overflows float32 (the loss is {first.loss:.6g})")
        else:
            what = f"the gradient of {first.parameter} is {first.magnitude} (the loss is {first.loss:.6g})"
        raise NonFiniteLossError(
            f"step {step} (epoch {where.epoch}, batch {in_epoch} of the epoch) on rank {self.info.rank}: {what}; no "
            "checkpoint holds its effects (the last one is intact). Lower the learning rate, check the data of that "
            "batch (a huge dense value?), or set train.on_nonfinite_loss = \"skip\" to drop such steps"
        )

    # -- evaluation and checkpoints --------------------------------------------------------------

    def evaluate(self) -> EvalResult | None:
        """Evaluate at the current step (collective), with the weights evaluation uses (the
        EMA averages when configured); rank 0 records the result. None without an eval input."""
        if self.session.eval_input is None:
            return None
        told, self._told_already = self._told_already, []
        call_lifecycle(self.pm, "tzrun_before_eval", skip=told, run=self.run, step=self.step)
        model_dir = self.session.model_dir
        result = self.session.evaluate(self.run, self.step, lambda r: append_eval_result(model_dir, r))
        call_lifecycle(self.pm, "tzrun_after_eval", skip=told, run=self.run, step=self.step, result=result)
        self.last_eval = result
        return result

    def record_best(self, result: EvalResult) -> None:
        """Record the best checkpoint by ``eval.best_metric`` (rank 0 writes; then prunes), once
        it is complete."""
        self.wait_for_saves()
        best = record_best(self.session.model_dir, self.step, result.metrics, self.cfg.eval.best_metric,
                           self.cfg.eval.best_mode, write=self.info.rank == 0)
        self.checkpoint_complete(checkpoint_dir(self.session.model_dir, self.step), self.step,
                                 best=best is not None and best.step == self.step, final=False)
        self.prune()

    def checkpoint_complete(self, path: Path, step: int, *, best: bool, final: bool) -> None:
        """Tell the plugins that the checkpoint at ``path`` is complete and what it is
        (``tzrun_after_checkpoint_complete``: the ``[export]`` stage exports it there)."""
        call_lifecycle(self.pm, "tzrun_after_checkpoint_complete", run=self.run, step=step, path=path, best=best,
                       final=final, facts=self.session.facts)

    def prune(self) -> None:
        """Remove the checkpoints ``train.keep_checkpoint_max`` does not keep (rank 0)."""
        if self.info.rank == 0:
            prune_checkpoints(self.session.model_dir, self.cfg.train.keep_checkpoint_max)

    def any_rank_asks_to_stop(self) -> bool:
        """Whether a stage on any rank set ``stop_requested`` (one collective per boundary)."""
        run = self.run
        flag = torch.tensor([int(run.stop_requested)])
        if run.world_size > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if bool(flag.item()) and not run.stop_requested:
            run.stop_reason = run.stop_reason or "a stage on another rank asked to stop"
        run.stop_requested = bool(flag.item())
        if run.stop_requested:
            self._log0("stopping at step %d of %d: %s", self.step, self.total, run.stop_reason or "a stage asked to stop")
        return run.stop_requested

    # -- the end ---------------------------------------------------------------------------------

    def on_error(self, error: BaseException) -> None:
        """Tell every plugin about the error (each isolated: one that raises is logged and the
        others still run); the original error is the one that propagates."""
        try:
            call_lifecycle(self.pm, "tzrun_on_train_error", run=self.run, error=error)
        except Exception:
            log.exception("a plugin raised in tzrun_on_train_error")

    def result(self, seconds: float) -> TrainResult:
        """What the run reports."""
        run = self.run
        rows = (self.step - run.start_step) * run.global_batch_size
        assert self.last_checkpoint is not None
        stop_reason = (run.stop_reason or "a stage asked to stop") if run.stop_requested else None
        return TrainResult(self.step, self.last_checkpoint, self.last_eval, seconds,
                           rows / max(self.train_seconds, 1e-9), self.built.model, self.stopped_by, stop_reason)

    # -- logs ----------------------------------------------------------------------------------

    def _log0(self, message: str, *args: Any) -> None:
        if self.info.rank == 0:
            log.info(message, *args)

    def _log0_warning(self, message: str, *args: Any) -> None:
        if self.info.rank == 0:
            log.warning(message, *args)
