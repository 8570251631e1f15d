"""Registers the first-party metrics."""

from __future__ import annotations

from typing import Any

import tzrun
from tzrun_plugins.metrics.options import AUCConfig


def _build_auc(cfg: AUCConfig) -> Any:
    from tzrun_plugins.metrics.auc import build_auc

    return build_auc(cfg)


@tzrun.hookimpl
def tzrun_register_metrics(register: tzrun.Register) -> None:
    register("auc", config=AUCConfig, build=_build_auc,
             description="exact ROC AUC over all ranks (ties averaged); thresholds=N for the binned variant",
             prediction="probs")
