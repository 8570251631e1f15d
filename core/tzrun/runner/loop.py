"""The training loop (see :mod:`tzrun.hookspecs` for it as pseudocode, with every hook).

Training runs in segments that end where a checkpoint and an evaluation are due (every
``train.save_checkpoints_steps`` and at the last step). Each segment is driven by a fresh
TorchRec train pipeline that drains at the boundary, so no batch is in flight while the model is
evaluated or saved. At a boundary the model is evaluated first and then saved, so that the
checkpoint holds what the stages concluded from that evaluation (early stopping's patience, say);
on resume, evaluations after the checkpoint's step are dropped from ``eval_results.jsonl`` and
run again.
"""

from __future__ import annotations

import itertools
import logging
import random
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import attrs
import numpy as np
import pluggy
import torch

from tzrun.config.load import RawConfig
from tzrun.config.schema import RunConfig
from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.data.sampling import with_negatives
from tzrun.errors import NonFiniteLossError, TzrunError
from tzrun.interfaces import EvalResult, RunContext, StepInfo
from tzrun.plugins import PluginManager, call_lifecycle, plugin_infos
from tzrun.registry import Registries
from tzrun.runner import faults
from tzrun.runner.allocator import tune_malloc
from tzrun.runner.build import build_run, group_columns, metric_slots
from tzrun.runner.checkpoint import (
    latest_checkpoint, load_training_state, remove_incomplete_checkpoints, save_checkpoint, sharding_summary,
)
from tzrun.runner.distributed import init_distributed
from tzrun.runner.evaluate import append_eval_result, evaluate, trim_eval_results
from tzrun.runner.init_from import InitFrom, init_from_checkpoint
from tzrun.runner.position import DataPosition, Layout, TrainData, plan_epochs, resume_layout_for
from tzrun.runner.records import ENV_FILE, METRICS_FILE, RESOLVED_JSON, RESOLVED_TOML, owner_differences, write_run_records
from tzrun.runner.retention import BEST_FILE, prune_checkpoints, record_best
from tzrun.runner.preflight import preflight
from tzrun.runner.stages import LogWindow, RunStages, TimedIterator, learning_rates, seconds_since_process_start
from tzrun.runner.train_metrics import TrainMetrics

__all__ = ["TrainResult", "train", "EXIT_STOPPED_BY_SIGNAL", "rng_state", "set_rng_state"]

log = logging.getLogger("tzrun")


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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's random number generator states (saved per rank in checkpoints)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


#: The exit code of a run stopped by SIGTERM or SIGUSR1 after writing its checkpoint: a retry
#: with ``--resume`` (torchrun ``--max-restarts`` does one) continues it.
EXIT_STOPPED_BY_SIGNAL = 75


class StopSignals:
    """SIGTERM / SIGUSR1 on any rank: every rank stops at the same step boundary.

    A handler only sets a flag. The ranks agree on it with one all-reduce every
    ``CHECK_EVERY`` steps on a separate gloo group, issued asynchronously and read at the next
    check, so it never waits on the hot path; all ranks see the same value at the same step.
    """

    SIGNALS = ("SIGTERM", "SIGUSR1")
    #: Steps between two agreements of several ranks (a gloo all-reduce costs time on the hot
    #: path even when asynchronous: measured 0.87 vs 1.02 of the hand-written loop's samples/s
    #: on 2 ranks with one per step).
    CHECK_EVERY = 8

    def __init__(self, world_size: int) -> None:
        import signal
        import threading

        self.received: str | None = None
        self._calls = 0
        self._previous: dict[int, Any] = {}
        self._pending: Any = None
        self._group = torch.distributed.new_group(backend="gloo") if world_size > 1 else None
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name, None)
                if number is not None:
                    self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, number: int, frame: Any) -> None:
        import signal

        self.received = signal.Signals(number).name

    def should_stop(self) -> bool:
        """Called once per step on every rank: whether all ranks stop now. With several ranks
        the agreement runs every ``CHECK_EVERY`` steps, so a stop comes at most about twice
        that many steps after the signal."""
        if self._group is None:
            return self.received is not None
        self._calls += 1
        if self._calls % self.CHECK_EVERY:
            return False
        stop = False
        if self._pending is not None:
            self._pending.wait()
            stop = bool(self._flag_result.item())
        self._flag_result = torch.tensor([int(self.received is not None)], dtype=torch.int32)
        self._pending = torch.distributed.all_reduce(
            self._flag_result, op=torch.distributed.ReduceOp.MAX, group=self._group, async_op=True
        )
        return stop

    def agree_now(self) -> bool:
        """At a checkpoint boundary (every rank is there): whether any rank got a signal.
        One small synchronous all-reduce; the check in flight, if any, is drained first."""
        self.drain()
        if self._group is None:
            return self.received is not None
        flag = torch.tensor([int(self.received is not None)], dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    def drain(self) -> None:
        """Complete the all-reduce in flight (before the ranks do anything else together)."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None

    def restore(self) -> None:
        """Put the previous signal handlers back."""
        import signal

        self.drain()
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def train(
    cfg: RunConfig,
    raw: RawConfig,
    pm: PluginManager,
    registries: Registries,
    *,
    overwrite: bool = False,
    resume: bool = False,
    init_from: InitFrom | None = None,
) -> TrainResult:
    """Train, evaluate and checkpoint as ``cfg`` says, on every rank of the job.

    Args:
        cfg: the checked config.
        raw: the config as read (saved with checkpoints).
        pm: the run's plugin manager; the configured stages are registered on it.
        registries: the components collected from ``pm``.
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
    preflight(cfg, registries, raw.source)
    tuned = tune_malloc() if cfg.train.tune_malloc else {}
    info = init_distributed()
    _seed_everything(cfg.train.seed)
    model_dir = Path(cfg.model_dir)
    resume_from = _claim_model_dir(model_dir, overwrite, resume, info.rank, cfg)
    specs = feature_specs(cfg.features)
    reader = registries["reader"].get(cfg.data.reader.type, "data.reader.type").build(cfg.data.reader.config)
    groups = group_columns(cfg)
    builder = BatchBuilder(specs, cfg.data.labels, cfg.data.sample_weight, groups, on_bad_row=cfg.data.on_bad_row)
    builder = with_negatives(builder, cfg, registries, info.rank)  # [data.sampler]: sampled items in every batch
    columns = specs.columns(cfg.data.labels, cfg.data.sample_weight, groups)

    def rank_input(path: str, batch_size: int, rows: Any = None, shuffle: int = 0) -> RankInput:
        return RankInput(reader, path, batch_size, cfg.data.num_workers, columns, builder, info.rank, info.world_size, rows,
                         shuffle_buffer_rows=shuffle, seed=cfg.train.seed, prefetch=cfg.data.prefetch_batches,
                         nice=cfg.data.reader_nice)

    eval_input = None
    if cfg.data.eval_input is not None:
        eval_input = rank_input(cfg.data.eval_input, cfg.data.eval_batch_size or cfg.data.batch_size)

    built = build_run(cfg, registries, specs, info)
    run = RunContext(
        config=cfg,
        model_dir=model_dir,
        rank=info.rank,
        world_size=info.world_size,
        local_rank=info.local_rank,
        device=info.device,
        model=built.model,
        optimizer=built.optimizer,
        global_batch_size=cfg.data.batch_size * info.world_size,
    )
    plugins = [p.to_json() for p in plugin_infos(pm, registries)]  # the run's plugin set, before its stages join
    stages = RunStages(cfg, registries, pm)
    pipeline_entry = registries["train_pipeline"].get(cfg.train.pipeline.type, "train.pipeline.type")

    def make_pipeline() -> Any:
        return pipeline_entry.build(cfg.train.pipeline.config, built.model, built.update, info.device)

    slots = metric_slots(cfg, registries)
    train_metrics = TrainMetrics(metric_slots(cfg, registries, "train_metrics"), registries, info.device)
    whole = Layout(info.world_size, cfg.data.num_workers, cfg.data.batch_size)
    start_step, start_epoch, start_layout, start_in_epoch = 0, 0, whole, 0
    saved_stages: dict[str, Any] = {}
    if resume_from is not None:
        meta = load_training_state(
            resume_from, model=built.model, optimizer=built.optimizer, schedulers=built.schedulers, update=built.update
        )
        start_step = int(meta["step"])
        position = DataPosition.from_json(meta["data"])
        start_epoch = position.epoch
        start_layout, start_in_epoch = resume_layout_for(position, whole)
        train_metrics.load_state_dict(meta.get("train_metrics", {}))
        rank_file = resume_from / "ranks" / f"rank-{info.rank}.pt"
        if rank_file.is_file() and meta.get("world_size") == info.world_size:
            rank_state = torch.load(rank_file, weights_only=False)
            set_rng_state(rank_state["rng"])
            train_metrics.load_window_state(rank_state.get("train_metric_windows", {}))
        saved_stages = dict(meta.get("stages", {}))
        if info.rank == 0:
            trim_eval_results(model_dir, start_step)
        _warn_if_plugins_changed(meta, plugins, info.rank)
        if info.rank == 0:
            how = "exactly where it stopped" if start_layout == position.layout else (
                f"on a new layout: the {sum(b - a for a, b in start_layout.rows or ())} rows of epoch "
                f"{start_epoch} not consumed yet are shared out across {info.world_size} rank(s)")
            log.info("resuming from %s (step %d, epoch %d), %s", resume_from, start_step, start_epoch, how)

    if resume_from is None and init_from is not None:
        report = init_from_checkpoint(init_from, model=built.model, optimizer=built.optimizer, model_dir=model_dir, rank=info.rank)
        if info.rank == 0:
            log.info("%s", report.summary())
    elif resume_from is not None and init_from is not None and info.rank == 0:
        log.info("resuming: --init-from %s is not applied (the checkpoint being resumed already holds the run)", init_from.checkpoint)

    def steps_of(layout: Layout) -> int:
        return data.input_for(layout).steps

    data = TrainData([], lambda layout: rank_input(cfg.data.train_input, layout.batch_size, layout.rows,
                                                   cfg.data.shuffle_buffer_rows))
    data.plan = plan_epochs(
        num_steps=cfg.train.num_steps, num_epochs=cfg.train.num_epochs, start_step=start_step,
        start_epoch=start_epoch, start_layout=start_layout, start_in_epoch=start_in_epoch,
        whole_layout=whole, steps_of=steps_of,
    )
    total = max(data.total, start_step)
    steps_per_epoch = data.input_for(whole).steps
    run.total_steps, run.steps_per_epoch, run.start_step = total, steps_per_epoch, start_step
    run.dense_parameters = built.update.named_dense_params
    if info.rank == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        if tuned:
            log.info("glibc malloc keeps freed memory (train.tune_malloc): %s",
                     ", ".join(f"{k}={v >> 20} MiB" for k, v in tuned.items()))
        log.info(
            "training %d steps (%d per epoch) on %d rank(s), %d rows per step; model_dir %s",
            total - start_step, steps_per_epoch, info.world_size, run.global_batch_size, model_dir,
        )
        env = write_run_records(model_dir, cfg, raw, world_size=info.world_size, plugins=plugins)
        for problem in env["stack_problems"]:
            log.warning("%s (tzrec-run env checks this)", problem)
    meta_base = {
        "world_size": info.world_size,
        "plugins": plugins,
        "config": dict(raw.data),
        "config_source": raw.source,
        "steps_per_epoch": steps_per_epoch,
    }
    boundaries = _boundaries(start_step, total, cfg.train.save_checkpoints_steps,
                             data.epoch_ends() if cfg.train.save_checkpoints_epochs else [],
                             cfg.train.save_checkpoints_epochs)
    skipped = SkippedRows()
    stream = TimedIterator(tally_skipped(data.batches(start_step), skipped))
    window = LogWindow(stream, info.world_size)
    signals = StopSignals(info.world_size)
    step, last_eval, last_ckpt, stopped_by = start_step, None, None, None
    train_seconds, started = 0.0, time.perf_counter()
    try:
        if resume_from is not None:
            stages.load_state_dict(saved_stages)
            call_lifecycle(pm, "tzrun_after_checkpoint_load", run=run, step=start_step, state=saved_stages)
        call_lifecycle(pm, "tzrun_before_train", run=run)
        for boundary in boundaries:
            segment_start = time.perf_counter()
            window.resume_clock()
            step, stopped = _run_segment(
                run, pm, built, make_pipeline(), itertools.islice(stream, boundary - step), step, data,
                train_metrics, signals, window,
            )
            built.update.flush()  # no gradient stays pending across a checkpoint
            train_seconds += time.perf_counter() - segment_start
            if stopped or signals.agree_now():
                stopped_by = signals.received or "a signal on another rank"
            if cfg.data.on_bad_row == "skip":
                _log_skipped(skipped, info, step)
            if stopped_by is not None:
                last_ckpt = _save(run, pm, built, data, train_metrics, meta_base, step, info, stages)
                if info.rank == 0:
                    log.warning("stopped by %s at step %d after writing %s; rerun with --resume to continue "
                                "(exit code %d)", stopped_by, step, last_ckpt, EXIT_STOPPED_BY_SIGNAL)
                break
            # evaluate first, so that the checkpoint holds the stages' state after this evaluation
            result = None
            if eval_input is not None:
                with built.update.eval_weights():
                    result = last_eval = _evaluate_and_record(run, pm, eval_input, slots, registries, make_pipeline, step)
            last_ckpt = _save(run, pm, built, data, train_metrics, meta_base, step, info, stages)
            if result is not None and cfg.eval.best_metric is not None:
                record_best(model_dir, step, result.metrics, cfg.eval.best_metric, cfg.eval.best_mode, write=info.rank == 0)
                if info.rank == 0:
                    prune_checkpoints(model_dir, cfg.train.keep_checkpoint_max)
            if _any_rank_asks_to_stop(run):
                if info.rank == 0:
                    log.info("stopping at step %d of %d: %s", step, total, run.stop_reason or "a stage asked to stop")
                break
        if last_ckpt is None:  # resumed at the very end: nothing left to train
            last_ckpt = latest_checkpoint(model_dir)
        call_lifecycle(pm, "tzrun_after_train", run=run, step=step)
    except BaseException as error:
        try:
            pm.hook.tzrun_on_train_error(run=run, error=error)
        except Exception:  # the hook must not raise; the original error is the one to report
            log.exception("a plugin raised in tzrun_on_train_error")
        raise
    finally:
        signals.restore()
        stages.unregister()
    seconds = time.perf_counter() - started
    rows = (step - start_step) * run.global_batch_size
    assert last_ckpt is not None
    stop_reason = (run.stop_reason or "a stage asked to stop") if run.stop_requested else None
    return TrainResult(step, last_ckpt, last_eval, seconds, rows / max(train_seconds, 1e-9), built.model, stopped_by,
                       stop_reason)


def _save(run: RunContext, pm: Any, built: Any, data: TrainData, train_metrics: Any, meta_base: dict[str, Any],
          step: int, info: Any, stages: RunStages) -> Path:
    state: dict[str, Any] = stages.state_dict()
    call_lifecycle(pm, "tzrun_before_checkpoint_save", run=run, step=step, state=state)

    def gather(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if info.world_size == 1:
            return intervals
        everyone: list[Any] = [None] * info.world_size
        torch.distributed.all_gather_object(everyone, intervals)
        return [tuple(i) for part in everyone for i in part]

    position = data.position(step, gather) if step > 0 else None
    epoch = position.epoch if position is not None else 0
    path = save_checkpoint(
        run.model_dir, step, model=built.model, optimizer=built.optimizer, schedulers=built.schedulers,
        update=built.update.state_dict(),
        rank_state={"rng": rng_state(), "train_metric_windows": train_metrics.window_state()},
        meta={**meta_base, "step": step, "epoch": epoch, "data": position.to_json() if position else None,
              "stages": state, "train_metrics": train_metrics.state_dict(),
              "learning_rates": {k: g[0]["lr"] for k, o in built.optimizers.items() if (g := o.param_groups)},
              "plan": str(built.plan), "sharding": sharding_summary(built.plan)},
        rank=info.rank,
    )
    if info.rank == 0:
        prune_checkpoints(run.model_dir, run.config.train.keep_checkpoint_max)
    return path


def _log_skipped(skipped: SkippedRows, info: Any, step: int) -> None:
    """Log the rows ``data.on_bad_row = "skip"`` left out so far, over all ranks (a collective
    at each checkpoint boundary; counts include batches the pipeline had prefetched)."""
    total = SkippedRows()
    if info.world_size > 1:
        parts: list[Any] = [None] * info.world_size
        torch.distributed.all_gather_object(parts, skipped.to_json())
        for part in parts:
            total.add(SkippedRows.from_json(part))
    else:
        total.add(skipped)
    if total and info.rank == 0:
        log.warning("bad rows left out of training so far (data.on_bad_row = \"skip\"), at step %d: %s", step, total)


def _boundaries(start: int, total: int, every: int, epoch_ends: list[int], by_epoch: int | None) -> list[int]:
    """The steps after ``start`` where a checkpoint (and an evaluation) is due."""
    points = set(range(every, total, every)) if every else set()
    if by_epoch:
        points.update(end for i, end in enumerate(epoch_ends, 1) if i % by_epoch == 0)
    points.add(total)
    return sorted(p for p in points if start < p <= total)


def _warn_if_plugins_changed(meta: dict[str, Any], plugins: list[dict[str, Any]], rank: int) -> None:
    def keys(infos: list[dict[str, Any]]) -> set[tuple[Any, Any, Any]]:
        return {(p.get("name"), p.get("distribution"), p.get("version")) for p in infos}

    saved, now = keys(meta.get("plugins", [])), keys(plugins)
    if saved and saved != now and rank == 0:
        gone = sorted(f"{n} ({d} {v})" for n, d, v in saved - now)
        new = sorted(f"{n} ({d} {v})" for n, d, v in now - saved)
        log.warning("the plugin set changed since the checkpoint: removed or changed %s; added %s",
                    ", ".join(gone) or "none", ", ".join(new) or "none")


def _claim_model_dir(model_dir: Path, overwrite: bool, resume: bool, rank: int, cfg: RunConfig) -> Path | None:
    """Apply the policy for a model dir that already has checkpoints, or records of another run
    (another ``[model]`` or ``[[features]]``); returns the checkpoint to resume from, if any.
    Removes checkpoint directories that an interrupted save left behind."""
    if not overwrite:
        differences = owner_differences(model_dir, cfg)
        if differences:
            raise TzrunError(
                f"{model_dir} holds another run ({RESOLVED_JSON} differs in [model] or [[features]]):\n"
                + "\n".join(f"  {d}" for d in differences)
                + "\npass --overwrite to replace that run, or --model-dir to train elsewhere"
            )
    existing = latest_checkpoint(model_dir)
    if existing is not None and not (overwrite or resume):
        raise TzrunError(
            f"{model_dir} already has checkpoints (latest: {existing.name}); pass --resume to continue "
            "from it, --overwrite to start over in it, or --model-dir to train elsewhere"
        )
    if rank == 0:
        if overwrite:
            for name in OWNED_DIRS:
                shutil.rmtree(model_dir / name, ignore_errors=True)
            for name in OWNED_FILES:
                (model_dir / name).unlink(missing_ok=True)
        else:
            remove_incomplete_checkpoints(model_dir)
    torch.distributed.barrier()
    return existing if resume and not overwrite else None


#: What ``--overwrite`` removes from a model dir: the earlier run's outputs (default names).
OWNED_DIRS = ("checkpoints", "predictions", "tensorboard", "profiler", "plots")
OWNED_FILES = ("eval_results.jsonl", BEST_FILE, METRICS_FILE, RESOLVED_TOML, RESOLVED_JSON, ENV_FILE, "init_report.json")


def _any_rank_asks_to_stop(run: RunContext) -> bool:
    """Whether a stage on any rank set ``stop_requested`` (one collective per boundary)."""
    flag = torch.tensor([int(run.stop_requested)])
    if run.world_size > 1:
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    if bool(flag.item()) and not run.stop_requested:
        run.stop_reason = run.stop_reason or "a stage on another rank asked to stop"
    run.stop_requested = bool(flag.item())
    return run.stop_requested


def _run_segment(
    run: RunContext,
    pm: pluggy.PluginManager,
    built: Any,
    pipeline: Any,
    batches: Iterator[Any],
    step: int,
    data: TrainData,
    train_metrics: Any,
    signals: StopSignals,
    window: LogWindow,
) -> tuple[int, bool]:
    """Train the batches of one segment; returns the last step and whether every rank agreed
    to stop early (a signal)."""
    per_batch = [s for s in built.schedulers.values() if not getattr(s, "by_epoch", False)]
    per_epoch = [s for s in built.schedulers.values() if getattr(s, "by_epoch", False)]
    epoch_ends = set(data.epoch_ends()) if per_epoch else set()
    optimizers = built.optimizers
    log_every = run.config.train.log_every_n_steps
    nonfinite = built.update.nonfinite_steps
    injected = faults.faults()
    # The schedules are closed-form in the number of steps: stepping one before its optimizer
    # has stepped (a dense optimizer inside an accumulation window) skips nothing.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
        try:
            while True:
                try:
                    out = pipeline.progress(batches)
                except StopIteration:
                    break
                except NonFiniteLossError as error:
                    where, in_epoch = data.where(step + 1)
                    raise NonFiniteLossError(
                        f"step {step + 1} (epoch {where.epoch}, batch {in_epoch} of the epoch) on rank {run.rank}: {error}; "
                        "no checkpoint holds its effects (the last one is intact). Lower the learning rate, "
                        "check the data of that batch, or set train.on_nonfinite_loss = \"skip\" to drop such steps"
                    ) from None
                step += 1
                lrs = {k: groups[0]["lr"] for k, opt in optimizers.items() if (groups := opt.param_groups)}
                logging_now = step % log_every == 0
                if logging_now:
                    all_lrs = learning_rates(optimizers)  # before the schedules move them on
                for scheduler in per_batch:
                    scheduler.step()
                if step in epoch_ends:
                    for scheduler in per_epoch:
                        scheduler.step()
                if built.update.nonfinite_steps != nonfinite:
                    nonfinite = built.update.nonfinite_steps
                    log.warning("step %d: the loss is not finite; its update was skipped (%d such step(s) so far; "
                                "train.on_nonfinite_loss = \"skip\")", step, nonfinite)
                if train_metrics:
                    train_metrics.update(out)
                epoch = data.where(step)[0].epoch
                metrics = dict(train_metrics.values) if train_metrics else {}
                window.add(out.loss, out.losses, out.num_rows)
                if step == run.start_step + 1 and run.is_rank0:
                    since = seconds_since_process_start()
                    if since is not None:
                        log.info("first training step done %.1f s after the process started (imports, set-up, "
                                 "sharding, data start and pipeline fill)", since)
                call_lifecycle(pm, "tzrun_after_train_step", run=run, step=StepInfo(
                    step, epoch, out.loss, out.losses, out.num_rows, lrs, metrics,
                ))
                if logging_now:
                    record = window.close(step, epoch, all_lrs, metrics, built.update.dense_params)
                    call_lifecycle(pm, "tzrun_after_train_log", run=run, log=record)
                if injected:
                    faults.at_step(step, run.rank)
                if signals.should_stop():
                    return step, True
        finally:
            if hasattr(pipeline, "detach"):
                pipeline.detach()
    return step, False


def _evaluate_and_record(
    run: RunContext,
    pm: pluggy.PluginManager,
    eval_input: RankInput,
    slots: Any,
    registries: Registries,
    make_pipeline: Any,
    step: int,
) -> EvalResult:
    call_lifecycle(pm, "tzrun_before_eval", run=run, step=step)
    result = evaluate(run, eval_input.one_pass(run.config.eval.num_steps), slots, registries, make_pipeline, step)
    if run.is_rank0:
        append_eval_result(run.model_dir, result)
    call_lifecycle(pm, "tzrun_after_eval", run=run, step=step, result=result)
    return result
