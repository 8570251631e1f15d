"""Which checkpoints stay: the best one by ``eval.best_metric`` (recorded in
``model_dir/best.json``) and the newest ``train.keep_checkpoint_max``.

Rank 0 records the best step after each evaluation and prunes once per checkpoint boundary:
after the save, or, when the boundary's evaluation records the best, after that. Pruning never removes the newest complete checkpoint (the one a resume or
``evaluate --checkpoint latest`` picks) nor the best one, so a checkpoint is removed only once a
newer complete one exists.

Reading ``best.json`` and pruning do not import torch.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import attrs

from tzrun.errors import CheckpointError, ConfigError, ConfigProblem, did_you_mean
from tzrun.io.files import write_atomic
from tzrun.runner.checkpoint import checkpoint_step, list_checkpoints
from tzrun.runner.manifest import MARKER
from tzrun.io.storage import as_path, remove_tree

if TYPE_CHECKING:
    from tzrun.runner.facts import RunFacts

__all__ = [
    "BEST_FILE",
    "BestCheckpoint",
    "read_best",
    "record_best",
    "prune_checkpoints",
    "check_best_metric",
]

log = logging.getLogger("tzrun")

BEST_FILE = "best.json"


@attrs.frozen
class BestCheckpoint:
    """What ``best.json`` holds.

    Attributes:
        step: the step of the best evaluation so far.
        metric: the eval result it was chosen by (``eval.best_metric``).
        value: its value at that step.
        mode: ``max`` or ``min`` (``eval.best_mode``).
        checkpoint: the checkpoint of that step, relative to the model dir.
    """

    step: int
    metric: str
    value: float
    mode: str
    checkpoint: str

    def path(self, model_dir: Path) -> Path:
        """The checkpoint directory."""
        return as_path(model_dir) / self.checkpoint


def read_best(model_dir: Path) -> BestCheckpoint | None:
    """The best checkpoint recorded in ``model_dir``, or None.

    Raises:
        CheckpointError: when ``best.json`` is damaged (not JSON, or without its fields),
            naming the file and the fix.
    """
    path = as_path(model_dir) / BEST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return BestCheckpoint(int(data["step"]), str(data["metric"]), float(data["value"]), str(data.get("mode", "max")),
                              str(data["checkpoint"]))
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # UnicodeDecodeError, JSONDecodeError: ValueError
        what = f"no field {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        raise CheckpointError(
            f"{path}: damaged ({what}); remove it (the next evaluation records the best checkpoint again, and "
            f"pruning may then remove the one it named) or restore it from a copy, and rerun") from None


def _better(value: float, than: float, mode: str) -> bool:
    return value > than if mode == "max" else value < than


def record_best(
    model_dir: Path, step: int, metrics: Mapping[str, float], metric: str, mode: str, *, write: bool
) -> BestCheckpoint | None:
    """After the evaluation of ``step`` (whose checkpoint is written), make it the best when it
    improves on ``best.json`` (strictly; a NaN never does). Call on every rank; only the rank
    with ``write`` writes the file, atomically.

    Returns:
        The best checkpoint after this evaluation (None while no value was finite).

    Raises:
        ConfigError: when ``metric`` is not one of the eval results, naming them.
    """
    if metric not in metrics:
        raise ConfigError("eval.best_metric", [_unknown_metric(metric, list(metrics))])
    model_dir = as_path(model_dir)
    value = float(metrics[metric])
    current = read_best(model_dir)
    if current is not None and (current.metric, current.mode) != (metric, mode):
        if write:
            log.warning("%s was chosen by %s (%s); eval.best_metric is now %s (%s): choosing again from step %d",
                        BEST_FILE, current.metric, current.mode, metric, mode, step)
        current = None
    if math.isnan(value) or (current is not None and not _better(value, current.value, mode)):
        return current
    best = BestCheckpoint(step, metric, value, mode, f"checkpoints/step-{step}")
    if write:
        write_atomic(model_dir / BEST_FILE, (json.dumps(attrs.asdict(best), indent=2) + "\n").encode("utf-8"))
    return best


def prune_checkpoints(model_dir: Path, keep: int) -> list[Path]:
    """Remove the oldest complete checkpoints beyond the newest ``keep`` (0: keep all), except
    the best one; returns what was removed. Call on one rank only.

    The completion marker goes first, so no new reader picks a checkpoint being removed.
    """
    if keep <= 0:
        return []
    complete = list_checkpoints(model_dir)
    best = read_best(model_dir)
    best_step = checkpoint_step(Path(best.checkpoint)) if best is not None else None
    removed = []
    for step, path in complete[:-keep]:
        if step == best_step:
            continue
        (path / MARKER).unlink(missing_ok=True)
        remove_tree(path)
        removed.append(path)
    if removed:
        log.info("removed %d old checkpoint(s) (train.keep_checkpoint_max = %d): %s", len(removed), keep,
                 ", ".join(p.name for p in removed))
    return removed


def _unknown_metric(metric: str, available: list[str]) -> ConfigProblem:
    listed = ", ".join(available) if available else "none"
    guess = did_you_mean(metric, available)
    hint = f"; did you mean '{guess}'?" if guess else ""
    return ConfigProblem("eval.best_metric", f"'{metric}' is not an eval result (available: {listed}{hint})")


def check_best_metric(facts: RunFacts, source: str) -> None:
    """Check ``eval.best_metric`` against the keys the run's evaluation reports
    (:attr:`RunFacts.eval_result_keys <tzrun.runner.facts.RunFacts.eval_result_keys>`) before a run starts.

    Raises:
        ConfigError: when it names no eval result, or there is no eval input.
    """
    cfg = facts.cfg
    metric = cfg.eval.best_metric
    if metric is None:
        return
    if cfg.data.eval_input is None:
        raise ConfigError(source, [ConfigProblem(
            "eval.best_metric", "is set but there is no data.eval_input to evaluate on; set one or remove eval.best_metric")])
    available = facts.eval_result_keys
    if metric not in available:
        raise ConfigError(source, [_unknown_metric(metric, available)])

