"""The ``export`` stage (``[export]``, or ``[[train.stages]] type = "export"``): exports for
serving written during training.

Each export is a version directory ``<dir>/step-N`` written like ``tzrec-run export`` writes
one, its marker last; then ``<dir>/latest`` names it (:mod:`tzrun_serving.publish`). A serving
system reads ``latest``, so it never loads half of an export. Rank 0 exports, from the complete
checkpoint on storage, with no collective: the other ranks wait at the next one. At the start
of a run, the versions of any other run are retired (rank 0), so that ``latest`` never names a
replaced run's model.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import attrs

import tzrun

__all__ = ["ExportConfig", "ExportStage", "build_export", "check_export", "export_outputs"]

log = logging.getLogger("tzrun")


@attrs.frozen
class ExportConfig:
    """``[export]``: exports for serving written during training (``tzrec-run help serving``).

    Attributes:
        on_best: export the checkpoint of each evaluation that improves ``eval.best_metric``.
        at_end: export the final checkpoint when training ends.
        dir: where the versions go (default: ``<model_dir>/exports``; local or a URL).
        keep: how many versions to keep (the newest; never the one ``latest`` names).
    """

    on_best: bool = False
    at_end: bool = True
    dir: Optional[str] = None
    keep: int = attrs.field(default=3, validator=attrs.validators.ge(1))


def check_export(cfg: ExportConfig, run_config: Any, eval_keys: Sequence[str]) -> list[tuple[str, str]]:
    """``on_best`` needs a best checkpoint to follow (a stage ``check``)."""
    if cfg.on_best and run_config.eval.best_metric is None:
        return [("on_best", "needs eval.best_metric (and data.eval_input): set it, or export at_end only")]
    return []


def export_outputs(cfg: ExportConfig) -> list[str]:
    """What the stage writes into the model dir (removed by ``train --overwrite``)."""
    return [] if cfg.dir else ["exports"]


class ExportStage:
    """Retires other runs' exports at the start, and exports complete checkpoints as ``cfg`` says."""

    def __init__(self, cfg: ExportConfig) -> None:
        self.cfg = cfg

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if not run.is_rank0:
            return
        from tzrun_serving.publish import export_root, retire_exports

        for path in retire_exports(export_root(self.cfg, run.model_dir), run.run_id):
            log.info("retired %s: an export of another run", path)

    @tzrun.hookimpl
    def tzrun_after_checkpoint_complete(self, run: tzrun.RunContext, step: int, path: Any, best: bool, final: bool,
                                        facts: Any) -> None:
        if not run.is_rank0 or not ((best and self.cfg.on_best) or (final and self.cfg.at_end)):
            return
        from tzrun_serving.publish import export_root, publish_export

        version = publish_export(facts, path, export_root(self.cfg, run.model_dir), self.cfg.keep, run.run_id)
        log.info("exported %s for serving: %s", tzrun.as_path(path).name, version)


def build_export(cfg: ExportConfig) -> ExportStage:
    """An export stage for one run."""
    return ExportStage(cfg)
