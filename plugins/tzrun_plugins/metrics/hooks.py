"""Registers the first-party metrics.

Modules holding torch code are imported when a metric is built, not when the plugin loads.
``grouped_auc`` and ``grouped_xauc`` are registered with ``group="required"``: their
``update(preds, target, weight, group)`` takes the int64 key the core reads from the
``group_by`` column. Regression metrics read the raw output, ``logits``, as ``l2`` does.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import tzrun
from tzrun_plugins.metrics.options import (
    AccuracyConfig,
    AUCConfig,
    GroupedAUCConfig,
    GroupedXAUCConfig,
    LogLossConfig,
    NoOptionsConfig,
    RelativeL1Config,
    TopKConfig,
    XAUCConfig,
)


def _lazy(module: str, builder: str) -> Callable[[Any], Any]:
    """A ``build(cfg)`` that imports ``tzrun_plugins.metrics.<module>`` on first use."""

    def build(cfg: Any) -> Any:
        return getattr(importlib.import_module(f"tzrun_plugins.metrics.{module}"), builder)(cfg)

    build.__name__ = build.__qualname__ = builder
    return build


@tzrun.hookimpl
def tzrun_register_metrics(register: tzrun.RegisterMetrics) -> None:
    register("auc", config=AUCConfig, build=_lazy("auc", "build_auc"),
             description="exact ROC AUC over all ranks (ties averaged); thresholds=N for the binned variant",
             prediction="probs", labels="binary")
    register("xauc", config=XAUCConfig, build=_lazy("xauc", "build_xauc"),
             description="pairwise ordering accuracy for regression targets; exact O(n log n) by default",
             prediction="logits", labels="finite")
    register("grouped_auc", config=GroupedAUCConfig, build=_lazy("grouped_auc", "build_grouped_auc"),
             description="exact AUC per group (group_by), averaged over groups with both classes",
             prediction="probs", group="required", labels="binary")
    register("grouped_xauc", config=GroupedXAUCConfig, build=_lazy("grouped_xauc", "build_grouped_xauc"),
             description="exact XAUC per group (group_by), size-weighted by default",
             prediction="logits", group="required", labels="finite")
    register("log_loss", config=LogLossConfig, build=_lazy("pointwise", "build_log_loss"),
             description="weighted binary cross entropy of probabilities", prediction="probs", labels="binary")
    register("normalized_entropy", config=LogLossConfig, build=_lazy("pointwise", "build_normalized_entropy"),
             description="log loss divided by the entropy of the weighted base rate", prediction="probs", labels="binary")
    register("calibration", config=NoOptionsConfig, build=_lazy("pointwise", "build_calibration"),
             description="sum of weighted probabilities / sum of weighted labels", prediction="probs", labels="binary")
    register("accuracy", config=AccuracyConfig, build=_lazy("pointwise", "build_accuracy"),
             description="weighted share of rows with (prob > threshold) == label; compare = '>=' for >=",
             prediction="probs", labels="binary")
    register("mae", config=NoOptionsConfig, build=_lazy("pointwise", "build_mae"),
             description="weighted mean absolute error", prediction="logits", labels="finite")
    register("mse", config=NoOptionsConfig, build=_lazy("pointwise", "build_mse"),
             description="weighted mean squared error", prediction="logits", labels="finite")
    register("rmse", config=NoOptionsConfig, build=_lazy("pointwise", "build_rmse"),
             description="square root of the weighted mean squared error", prediction="logits", labels="finite")
    register("relative_l1", config=RelativeL1Config, build=_lazy("sid", "build_relative_l1"),
             description="mean |t - p| / (max(|t|, |p|) + eps) over all elements (TorchEasyRec's SID rel_loss)",
             prediction="logits")
    register("unique_ratio", config=NoOptionsConfig, build=_lazy("sid", "build_unique_ratio"),
             description="mean over batches of the share of distinct code rows (TorchEasyRec's unique_sid_ratio)",
             prediction="codes")
    register("recall_at_k", config=TopKConfig, build=_lazy("retrieval", "build_recall_at_k"),
             description="share of positives in the top k of a [B, C] score matrix (in-batch or given)",
             prediction="similarity")
    register("hit_rate_at_k", config=TopKConfig, build=_lazy("retrieval", "build_hit_rate_at_k"),
             description="share of rows with a positive in the top k of a [B, C] score matrix",
             prediction="similarity")
