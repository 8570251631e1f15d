"""The training loop (see :mod:`tzrun.hookspecs` for it as pseudocode, with every hook).

Training runs in segments that end where a checkpoint and an evaluation are due (every
``train.save_checkpoints_steps`` and at the last step). Each segment is driven by a fresh
TorchRec train pipeline that drains at the boundary, so no batch is in flight while the model is
evaluated or saved.
"""

from __future__ import annotations

import itertools
import json
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
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.errors import TzrunError
from tzrun.interfaces import EvalResult, RunContext, StepInfo
from tzrun.plugins import PluginManager, plugin_infos
from tzrun.registry import Registries
from tzrun.runner.build import build_run, group_columns, metric_slots
from tzrun.runner.checkpoint import latest_checkpoint, save_checkpoint
from tzrun.runner.distributed import init_distributed
from tzrun.runner.evaluate import evaluate
from tzrun.runner.train_metrics import TrainMetrics

__all__ = ["TrainResult", "train"]

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
    """

    steps: int
    checkpoint: Path
    eval: EvalResult | None
    seconds: float
    samples_per_second: float
    model: Any = attrs.field(default=None, repr=False)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _boundaries(total: int, every: int) -> list[int]:
    points = list(range(every, total, every)) if every else []
    return [*points, total]


def train(
    cfg: RunConfig, raw: RawConfig, pm: PluginManager, registries: Registries, *, overwrite: bool = False
) -> TrainResult:
    """Train, evaluate and checkpoint as ``cfg`` says, on every rank of the job.

    Args:
        cfg: the checked config.
        raw: the config as read (saved with checkpoints).
        pm: the run's plugin manager; the configured stages are registered on it.
        registries: the components collected from ``pm``.
        overwrite: remove the checkpoints and results of an earlier run in ``model_dir``
            first; without it, a ``model_dir`` that has checkpoints is refused.

    Returns:
        The result (the same on every rank, except timing).

    Raises:
        TzrunError: when ``model_dir`` already has checkpoints and ``overwrite`` is off.
    """
    info = init_distributed()
    _seed_everything(cfg.train.seed)
    model_dir = Path(cfg.model_dir)
    _claim_model_dir(model_dir, overwrite, info.rank)
    specs = feature_specs(cfg.features)
    reader = registries["reader"].get(cfg.data.reader.type, "data.reader.type").build(cfg.data.reader.config)
    groups = group_columns(cfg)
    builder = BatchBuilder(specs, cfg.data.labels, cfg.data.sample_weight, groups)
    columns = specs.columns(cfg.data.labels, cfg.data.sample_weight, groups)
    def rank_input(path: str, batch_size: int) -> RankInput:
        return RankInput(reader, path, batch_size, cfg.data.num_workers, columns, builder, info.rank, info.world_size)

    train_input = rank_input(cfg.data.train_input, cfg.data.batch_size)
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
    stages = []
    for i, component in enumerate(cfg.train.stages):
        stage = registries["stage"].get(component.type, f"train.stages[{i}].type").build(component.config)
        pm.register(stage, name=f"stage:{i}:{component.type}")
        stages.append(stage)
    pipeline_entry = registries["train_pipeline"].get(cfg.train.pipeline.type, "train.pipeline.type")

    def make_pipeline() -> Any:
        return pipeline_entry.build(cfg.train.pipeline.config, built.model, built.update, info.device)

    steps_per_epoch = train_input.steps
    total = cfg.train.num_steps if cfg.train.num_steps is not None else cfg.train.num_epochs * steps_per_epoch
    if info.rank == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        log.info(
            "training %d steps (%d per epoch) on %d rank(s), %d rows per step; model_dir %s",
            total, steps_per_epoch, info.world_size, run.global_batch_size, model_dir,
        )
    stream = _train_stream(train_input, total)
    slots = metric_slots(cfg, registries)
    train_metrics = TrainMetrics(metric_slots(cfg, registries, "train_metrics"), registries, info.device)
    meta_base = {
        "world_size": info.world_size,
        "plugins": [p.to_json() for p in plugin_infos(pm, registries)],
        "config": dict(raw.data),
        "config_source": raw.source,
        "steps_per_epoch": steps_per_epoch,
    }
    step, last_eval, last_ckpt = 0, None, None
    train_seconds, started = 0.0, time.perf_counter()
    try:
        pm.hook.tzrun_before_train(run=run)
        for boundary in _boundaries(total, cfg.train.save_checkpoints_steps):
            segment_start = time.perf_counter()
            step = _run_segment(
                run, pm, built, make_pipeline(), itertools.islice(stream, boundary - step), step, steps_per_epoch, train_metrics
            )
            built.update.flush()  # no gradient stays pending across a checkpoint
            train_seconds += time.perf_counter() - segment_start
            state: dict[str, Any] = {}
            pm.hook.tzrun_before_checkpoint_save(run=run, step=step, state=state)
            last_ckpt = save_checkpoint(
                model_dir, step, model=built.model, optimizer=built.optimizer, schedulers=built.schedulers,
                update=built.update.state_dict(),
                meta={**meta_base, "step": step, "epoch": (step - 1) // steps_per_epoch, "stages": state,
                      "plan": str(built.plan)},
                rank=info.rank,
            )
            if eval_input is not None:
                with built.update.eval_weights():
                    last_eval = _evaluate_and_record(run, pm, eval_input, slots, registries, make_pipeline, step)
            if _any_rank_asks_to_stop(run):
                break
        pm.hook.tzrun_after_train(run=run, step=step)
    except BaseException as error:
        pm.hook.tzrun_on_train_error(run=run, error=error)
        raise
    finally:
        for stage in stages:
            pm.unregister(stage)
    seconds = time.perf_counter() - started
    rows = step * run.global_batch_size
    assert last_ckpt is not None
    return TrainResult(step, last_ckpt, last_eval, seconds, rows / max(train_seconds, 1e-9), built.model)


def _claim_model_dir(model_dir: Path, overwrite: bool, rank: int) -> None:
    existing = latest_checkpoint(model_dir)
    if existing is not None and not overwrite:
        raise TzrunError(
            f"{model_dir} already has checkpoints (latest: {existing.name}); pass --overwrite to "
            "start over in it, or --model-dir to train elsewhere"
        )
    if overwrite and rank == 0:
        for name in ("checkpoints", "predictions"):
            shutil.rmtree(model_dir / name, ignore_errors=True)
        (model_dir / "eval_results.jsonl").unlink(missing_ok=True)
    torch.distributed.barrier()


def _any_rank_asks_to_stop(run: RunContext) -> bool:
    """Whether a stage on any rank set ``stop_requested`` (one collective per boundary)."""
    flag = torch.tensor([int(run.stop_requested)])
    if run.world_size > 1:
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    run.stop_requested = bool(flag.item())
    return run.stop_requested


def _train_stream(train_input: RankInput, total: int) -> Iterator[Any]:
    """Exactly ``total`` batches: passes over the train input, each truncated at the end."""
    remaining = total
    while remaining > 0:
        for batch in train_input.one_pass(max_steps=remaining):
            remaining -= 1
            yield batch


def _run_segment(
    run: RunContext,
    pm: pluggy.PluginManager,
    built: Any,
    pipeline: Any,
    batches: Iterator[Any],
    step: int,
    steps_per_epoch: int,
    train_metrics: Any = None,
) -> int:
    hook = pm.hook.tzrun_after_train_step
    per_batch = [s for s in built.schedulers.values() if not getattr(s, "by_epoch", False)]
    per_epoch = [s for s in built.schedulers.values() if getattr(s, "by_epoch", False)]
    optimizers = built.optimizers
    # The schedules are closed-form in the number of steps: stepping one before its optimizer
    # has stepped (a dense optimizer inside an accumulation window) skips nothing.
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
    try:
        while True:
            try:
                out = pipeline.progress(batches)
            except StopIteration:
                break
            step += 1
            lrs = {k: groups[0]["lr"] for k, opt in optimizers.items() if (groups := opt.param_groups)}
            for scheduler in per_batch:
                scheduler.step()
            if per_epoch and step % steps_per_epoch == 0:
                for scheduler in per_epoch:
                    scheduler.step()
            if train_metrics:
                train_metrics.update(out)
            hook(run=run, step=StepInfo(
                step, (step - 1) // steps_per_epoch, out.loss, out.losses, out.num_rows, lrs,
                dict(train_metrics.values) if train_metrics else {},
            ))
    finally:
        quiet.__exit__(None, None, None)
        if hasattr(pipeline, "detach"):
            pipeline.detach()
    return step


def _evaluate_and_record(
    run: RunContext,
    pm: pluggy.PluginManager,
    eval_input: RankInput,
    slots: Any,
    registries: Registries,
    make_pipeline: Any,
    step: int,
) -> EvalResult:
    pm.hook.tzrun_before_eval(run=run, step=step)
    result = evaluate(run, eval_input.one_pass(run.config.eval.num_steps), slots, registries, make_pipeline, step)
    if run.is_rank0:
        with open(Path(run.model_dir) / "eval_results.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "rows": result.rows, **result.metrics}) + "\n")
    pm.hook.tzrun_after_eval(run=run, step=step, result=result)
    return result
