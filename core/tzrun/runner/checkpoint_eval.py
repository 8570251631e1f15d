"""``tzrec-run evaluate``: evaluate a saved checkpoint on ``data.eval_input``.

The run is built from the config as for training (any world size: the checkpoint is resharded),
the checkpoint's model weights are loaded after its manifest is checked, and the result is
appended to ``model_dir/eval_results.jsonl`` with ``"checkpoint"`` and ``"command": "evaluate"``.

The checkpoint must have been written with the same ``[model]`` and ``[[features.*]]`` as the
config: those decide the parameters and what they mean. Every other section may differ (other
eval data, metrics, losses, batch sizes). Which weights are evaluated follows the config as in
training: the EMA averages when ``train.dense_optimizer.ema.use_for_eval``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

import attrs

from tzrun.config.load import RawConfig
from tzrun.config.schema import RunConfig
from tzrun.errors import CheckpointError, ConfigError, ConfigProblem, IncompleteCheckpointError
from tzrun.interfaces import EvalResult
from tzrun.registry import Registries
from tzrun.runner.checkpoint import (
    MARKER,
    is_complete,
    latest_checkpoint,
    previous_checkpoint,
    read_meta,
    verify_checkpoint,
)
from tzrun.runner.retention import BEST_FILE, read_best

__all__ = ["CheckpointEvaluation", "COMPARED_SECTIONS", "resolve_checkpoint", "config_differences", "evaluate_checkpoint"]

log = logging.getLogger("tzrun")

#: The config sections a checkpoint must share with the config that evaluates it.
COMPARED_SECTIONS = ("model", "features")


@attrs.frozen
class CheckpointEvaluation:
    """What :func:`evaluate_checkpoint` returns.

    Attributes:
        checkpoint: the checkpoint directory evaluated.
        result: the evaluation (``step`` is the checkpoint's step).
        ema: whether the EMA averages of the dense weights were evaluated.
    """

    checkpoint: Path
    result: EvalResult
    ema: bool


def resolve_checkpoint(model_dir: Path, which: str) -> Path:
    """The checkpoint ``--checkpoint`` names: ``latest``, ``best``, a path, or ``step-N`` in
    ``model_dir/checkpoints``.

    Raises:
        CheckpointError: when there is no such checkpoint (with what to do instead).
        IncompleteCheckpointError: when the directory's save never finished.
    """
    model_dir = Path(model_dir)
    if which == "latest":
        path = latest_checkpoint(model_dir)
        if path is None:
            raise CheckpointError(f"{model_dir}: no complete checkpoint to evaluate (train first, or pass --checkpoint PATH)")
        return path
    if which == "best":
        best = read_best(model_dir)
        if best is None:
            raise CheckpointError(
                f"{model_dir}: no {BEST_FILE}: set eval.best_metric (and data.eval_input) when training to record the "
                "best checkpoint, or pass --checkpoint latest or a path"
            )
        path = best.path(model_dir)
        if not is_complete(path):
            raise CheckpointError(f"{model_dir / BEST_FILE} names {path}, which is no longer a complete checkpoint; "
                                  "pass --checkpoint latest or a path")
        return path
    path = Path(which)
    if not path.exists() and (model_dir / "checkpoints" / which).exists():
        path = model_dir / "checkpoints" / which
    if not path.exists():
        raise CheckpointError(f"{which}: no such checkpoint (pass latest, best, a checkpoint directory, or step-N of {model_dir / 'checkpoints'})")
    if not is_complete(path):
        previous = previous_checkpoint(path)
        hint = f"; the previous complete one is {previous}" if previous else ""
        raise IncompleteCheckpointError(f"{path}: not a complete checkpoint (no {MARKER} marker: its save never finished){hint}")
    return path


def _normalised(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _diff(saved: Any, now: Any, where: str, out: list[str], saved_as: str) -> None:
    if isinstance(saved, Mapping) and isinstance(now, Mapping):
        for key in sorted(set(saved) | set(now)):
            _diff(saved.get(key), now.get(key), f"{where}.{key}", out, saved_as)
    elif isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        for i, (a, b) in enumerate(zip(saved, now)):
            _diff(a, b, f"{where}[{i}]", out, saved_as)
    elif saved != now:
        def show(v: Any) -> str:
            return "unset" if v is None else json.dumps(v)

        out.append(f"{where}: {show(saved)} {saved_as}, {show(now)} now")


def config_differences(saved: Mapping[str, Any], now: Mapping[str, Any], saved_as: str = "in the checkpoint") -> list[str]:
    """The differences in :data:`COMPARED_SECTIONS` between a saved config (a checkpoint's
    ``meta.json["config"]``, say) and a config, one line each with its TOML path:
    ``<path>: <saved> <saved_as>, <now> now``."""
    out: list[str] = []
    saved, now = _normalised(dict(saved)), _normalised(dict(now))
    for section in COMPARED_SECTIONS:
        _diff(saved.get(section), now.get(section), section, out, saved_as)
    return out


def evaluate_checkpoint(
    cfg: RunConfig, raw: RawConfig, registries: Registries, which: str
) -> CheckpointEvaluation:
    """Evaluate the checkpoint ``which`` names (collective: every rank of the job calls it);
    rank 0 appends the result to ``eval_results.jsonl``.

    Raises:
        ConfigError: without ``data.eval_input``.
        CheckpointError: for a missing, incomplete or damaged checkpoint, or one written with
            another ``[model]`` or ``[[features]]``.
    """
    import torch

    from tzrun.data.features import BatchBuilder, feature_specs
    from tzrun.data.loader import RankInput
    from tzrun.data.sampling import with_negatives
    from tzrun.interfaces import RunContext
    from tzrun.runner.build import build_run, group_columns, metric_slots
    from tzrun.runner.checkpoint import load_model_state
    from tzrun.runner.distributed import init_distributed
    from tzrun.runner.evaluate import append_eval_result, evaluate

    if cfg.data.eval_input is None:
        raise ConfigError(raw.source, [ConfigProblem("data.eval_input", "tzrec-run evaluate needs an eval input; set it (or --set data.eval_input=\"...\")")])
    if cfg.train.tune_malloc:
        from tzrun.runner.allocator import tune_malloc

        tune_malloc()
    info = init_distributed()
    model_dir = Path(cfg.model_dir)
    path = resolve_checkpoint(model_dir, which)
    verify_checkpoint(path)
    meta = read_meta(path)
    differences = config_differences(meta.get("config", {}), raw.data)
    if differences:
        raise CheckpointError(
            f"{path} was written with another model or features than {raw.source}:\n"
            + "\n".join(f"  {d}" for d in differences)
            + "\nEvaluate it with the config it was trained with (its config is in meta.json), or pass --set to match."
        )

    specs = feature_specs(cfg.features)
    reader = registries["reader"].get(cfg.data.reader.type, "data.reader.type").build(cfg.data.reader.config)
    groups = group_columns(cfg)
    builder = BatchBuilder(specs, cfg.data.labels, cfg.data.sample_weight, groups)
    builder = with_negatives(builder, cfg, registries, info.rank)  # [data.sampler]: sampled items in every batch
    columns = specs.columns(cfg.data.labels, cfg.data.sample_weight, groups)
    eval_input = RankInput(reader, cfg.data.eval_input, cfg.data.eval_batch_size or cfg.data.batch_size,
                           cfg.data.num_workers, columns, builder, info.rank, info.world_size,
                           prefetch=cfg.data.prefetch_batches,
                           nice=cfg.data.reader_nice)
    built = build_run(cfg, registries, specs, info)
    load_model_state(path, built.model, verify=False)
    update_file = path / "update.pt"
    saved_update = torch.load(update_file, weights_only=False) if update_file.is_file() else {}
    ema = bool(built.update.ema_for_eval)
    if ema and not saved_update.get("ema"):
        raise CheckpointError(
            f"{path} holds no EMA averages, but the config evaluates with them (train.dense_optimizer.ema.use_for_eval); "
            "remove train.dense_optimizer.ema (or set use_for_eval = false) to evaluate its weights"
        )
    built.update.load_state_dict(saved_update)
    if not ema and saved_update.get("ema") and info.rank == 0:
        log.info("%s also holds EMA averages of the dense weights; set train.dense_optimizer.ema to evaluate them", path)

    run = RunContext(config=cfg, model_dir=model_dir, rank=info.rank, world_size=info.world_size,
                     local_rank=info.local_rank, device=info.device, model=built.model, optimizer=built.optimizer,
                     global_batch_size=cfg.data.batch_size * info.world_size)
    pipeline_entry = registries["train_pipeline"].get(cfg.train.pipeline.type, "train.pipeline.type")

    def make_pipeline() -> Any:
        return pipeline_entry.build(cfg.train.pipeline.config, built.model, built.update, info.device)

    step = int(meta["step"])
    if info.rank == 0:
        log.info("evaluating %s (step %d) on %s over %d rank(s)%s", path, step, cfg.data.eval_input, info.world_size,
                 " with the EMA weights" if ema else "")
    with built.update.eval_weights():
        result = evaluate(run, eval_input.one_pass(cfg.eval.num_steps), metric_slots(cfg, registries), registries,
                          make_pipeline, step)
    if info.rank == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        append_eval_result(model_dir, result, checkpoint=str(path), command="evaluate", ema=ema)
    return CheckpointEvaluation(path, result, ema)
