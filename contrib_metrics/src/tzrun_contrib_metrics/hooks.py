"""The entry-point target: registers the metrics; imports nothing heavy."""

from __future__ import annotations

from typing import Any

import tzrun
from tzrun_contrib_metrics import options


def _build_ndcg(cfg: options.NDCGConfig) -> Any:
    from tzrun_contrib_metrics.ndcg import build_ndcg

    return build_ndcg(cfg)


def _build_average_precision(cfg: options.AveragePrecisionConfig) -> Any:
    from tzrun_contrib_metrics.average_precision import build_average_precision

    return build_average_precision(cfg)


def _build_copc(cfg: options.COPCConfig) -> Any:
    from tzrun_contrib_metrics.copc import build_copc

    return build_copc(cfg)


@tzrun.hookimpl
def tzrun_register_metrics(register: tzrun.RegisterMetrics) -> None:
    register("ndcg_at_k", config=options.NDCGConfig, build=_build_ndcg, prediction="probs", group="required",
             description="exact NDCG@k per group (group_by), tied predictions averaged, mean over groups")
    register("average_precision", config=options.AveragePrecisionConfig, build=_build_average_precision,
             prediction="probs",
             description="exact area under the precision-recall curve (sklearn's average_precision_score)")
    register("copc", config=options.COPCConfig, build=_build_copc, prediction="probs", group="optional",
             description="clicks / predicted clicks: pooled, or per group (group_by) and averaged")
