"""The ``early_stopping`` stage: end training when an eval metric stops improving.

After each evaluation: the value improves when it beats the best so far by more than
``min_delta`` (``mode = "max"``: ``value > best + min_delta``; ``"min"``: ``value < best -
min_delta``); the first evaluation sets the best. After ``patience`` evaluations in a row
without improvement the stage asks the loop to stop: that evaluation's checkpoint is already
written, every rank agrees (they all see the same eval result), and the run ends normally.

It monitors ``eval.best_metric`` by default, the metric that marks (and keeps) the best
checkpoint in ``best.json``, so the checkpoint to use after an early stop is ``--checkpoint
best``. Its state (best value and step, evaluations without improvement) is saved in every
checkpoint and survives ``--resume``.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Literal, Optional, Sequence

import attrs

import tzrun

__all__ = ["EarlyStoppingConfig", "EarlyStoppingStage", "build_early_stopping", "check_early_stopping"]

log = logging.getLogger("tzrun.early_stopping")



@attrs.frozen
class EarlyStoppingConfig:
    """Options of the ``early_stopping`` stage.

    Attributes:
        metric: the eval result to monitor (a metric name or ``loss/<name>``; default
            ``eval.best_metric``).
        mode: ``"max"`` or ``"min"`` (default ``eval.best_mode``).
        patience: evaluations in a row without improvement before stopping.
        min_delta: how much a value must beat the best by to count as an improvement.
    """

    metric: Optional[str] = None
    mode: Optional[Literal["max", "min"]] = None
    patience: int = attrs.field(default=3, validator=attrs.validators.gt(0))
    min_delta: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))


def check_early_stopping(cfg: EarlyStoppingConfig, run_config: Any, eval_keys: Sequence[str]) -> list[tuple[str, str]]:
    """The problems of an ``early_stopping`` table given the whole config (a stage ``check``,
    run by ``tzrec-run check`` and before training)."""
    if run_config.data.eval_input is None:
        return [("", "early stopping needs evaluations: set data.eval_input")]
    best = run_config.eval.best_metric
    metric = cfg.metric or best
    if metric is None:
        return [("metric", "is not set and neither is eval.best_metric; set eval.best_metric (it also marks "
                           "the best checkpoint) or metric here")]
    problems = []
    if metric not in eval_keys:
        problems.append(("metric", f"'{metric}' is not an eval result (available: {', '.join(eval_keys) or 'none'})"))
    if best is not None and cfg.metric is not None and cfg.metric != best:
        problems.append(("metric", f"'{cfg.metric}' differs from eval.best_metric '{best}': the best checkpoint "
                                   "and early stopping must follow one metric; drop one of them"))
    if best is not None and cfg.mode is not None and cfg.mode != run_config.eval.best_mode:
        problems.append(("mode", f"'{cfg.mode}' differs from eval.best_mode '{run_config.eval.best_mode}'"))
    return problems


class EarlyStoppingStage:
    """Counts evaluations without improvement and stops the run after ``patience`` of them."""

    def __init__(self, cfg: EarlyStoppingConfig) -> None:
        self.cfg = cfg
        self.metric = ""
        self.mode = "max"
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad_evals = 0

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        self.metric = self.cfg.metric or run.config.eval.best_metric or ""
        self.mode = self.cfg.mode or run.config.eval.best_mode

    def improved(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta``."""
        if self.best is None:
            return True
        if self.mode == "max":
            return value > self.best + self.cfg.min_delta
        return value < self.best - self.cfg.min_delta

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        value = result.metrics.get(self.metric)
        if value is None or math.isnan(value):
            return
        if self.improved(value):
            self.best, self.best_step, self.bad_evals = float(value), step, 0
            return
        self.bad_evals += 1
        if self.bad_evals >= self.cfg.patience:
            run.stop_requested = True
            run.stop_reason = (
                f"early_stopping: {self.metric} did not improve on {self.best:.6g} (step {self.best_step}) by more than "
                f"{self.cfg.min_delta:g} for {self.bad_evals} evaluation(s)"
            )
        elif run.is_rank0:
            log.info("%s did not improve on %.6g (step %s): %d of %d evaluation(s) of patience used",
                     self.metric, self.best, self.best_step, self.bad_evals, self.cfg.patience)

    def state_dict(self) -> dict[str, Any]:
        """The best value and its step, and evaluations without improvement since."""
        return {"metric": self.metric, "best": self.best, "best_step": self.best_step, "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.best = state.get("best")
        self.best_step = state.get("best_step")
        self.bad_evals = int(state.get("bad_evals", 0))


def build_early_stopping(cfg: EarlyStoppingConfig) -> EarlyStoppingStage:
    """An early_stopping stage for one run."""
    return EarlyStoppingStage(cfg)
