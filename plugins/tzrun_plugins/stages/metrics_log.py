"""The ``metrics_log`` stage: every train log record and every evaluation, one JSON object per
line, appended to ``metrics.jsonl`` in the model dir (rank 0).

Lines::

    {"kind": "train", "step": 100, "epoch": 0, "steps": 100, "loss": 0.47, "losses": {...},
     "learning_rates": {...}, "metrics": {...}, "samples_per_s": ..., "data_wait_fraction": ...,
     "grad_norm": ..., "seconds": ..., "time": ..., "loss_weights": {...}, "skipped_rows": 3,
     "skipped_reasons": {"malformed line": 2, "int_3: not an integer": 1}, "rss_bytes": 571473920,
     "device_memory_bytes": null}
    {"kind": "eval", "step": 100, "rows": 40000, "metrics": {"auc": 0.77, ...}, "seconds": 0.4, "time": ...}

On resume the lines of steps after the checkpoint are dropped first (they are logged again as
the run replays those steps), and so is the evaluation of the checkpoint's own step when the
resumed run evaluates that step again (a checkpoint written at a boundary precedes its
evaluation), so the file holds each step once; a fresh run starts it anew.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Optional

import attrs

import tzrun

__all__ = ["MetricsLogConfig", "MetricsLogStage", "build_metrics_log"]


@attrs.frozen
class MetricsLogConfig:
    """Options of the ``metrics_log`` stage.

    Attributes:
        path: where to write (default ``<model_dir>/metrics.jsonl``); a relative path is
            taken from the model dir.
    """

    path: Optional[str] = None


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


class MetricsLogStage:
    """Appends train log records and eval results to a JSON-lines file."""

    def __init__(self, cfg: MetricsLogConfig) -> None:
        self.cfg = cfg
        self.path: Path | None = None

    def _write(self, record: dict[str, Any]) -> None:
        assert self.path is not None
        tzrun.append_jsonl(self.path, _finite(record))

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if not run.is_rank0:
            return
        path = self.cfg.path or tzrun.METRICS_FILE
        self.path = tzrun.under(run.model_dir, path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if run.start_step == 0 or not self.path.exists():
            self.path.write_text("", encoding="utf-8")
        else:  # resumed: keep what the checkpoint covers
            tzrun.keep_jsonl(self.path, lambda r: int(r.get("step", 0)) <= run.start_step)

    @tzrun.hookimpl
    def tzrun_after_train_log(self, run: tzrun.RunContext, log: tzrun.TrainLog) -> None:
        if self.path is not None:
            self._write({"kind": "train", **log.to_json()})

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        if self.path is not None:
            self._write({"kind": "eval", "step": step, "rows": result.rows, "metrics": dict(result.metrics),
                         "seconds": result.seconds, "time": time.time()})


def metrics_log_outputs(cfg: MetricsLogConfig) -> list[str]:
    """What the stage writes in the model dir (``--overwrite`` removes it)."""
    return [cfg.path or tzrun.METRICS_FILE]


def build_metrics_log(cfg: MetricsLogConfig) -> MetricsLogStage:
    """A metrics_log stage for one run."""
    return MetricsLogStage(cfg)
