"""Registers the first-party losses."""

from __future__ import annotations

import tzrun
from tzrun_plugins.losses import binary, multiclass, ranking


@tzrun.hookimpl
def tzrun_register_losses(register: tzrun.RegisterLosses) -> None:
    register("binary_cross_entropy", config=binary.BCEConfig, build=binary.build_bce,
             description="sigmoid cross entropy on logits, label smoothing, sample-weighted", prediction="logits", labels="binary")
    register("binary_focal", config=binary.FocalConfig, build=binary.build_focal,
             description="focal loss (gamma, alpha) on logits", prediction="logits", labels="binary")
    register("softmax_cross_entropy", config=multiclass.SoftmaxCEConfig, build=multiclass.build_softmax_ce,
             description="softmax cross entropy over [B, C] logits, label smoothing", prediction="logits", labels="class_index")
    register("jrc", config=multiclass.JRCConfig, build=multiclass.build_jrc,
             description="joint ranking-calibration loss over [B, 2] logits within sessions (group_by)",
             prediction="logits", group="required", labels="binary", reads="class_logits")
    register("l2", config=ranking.L2Config, build=ranking.build_l2,
             description="weighted mean squared error (regression)", prediction="logits", labels="finite")
    register("pairwise_logistic", config=ranking.PairwiseLogisticConfig, build=ranking.build_pairwise_logistic,
             description="RankNet / BPR pairwise loss, optionally within groups (group_by)",
             prediction="logits", group="optional", labels="finite")
    register("in_batch_softmax", config=ranking.InBatchSoftmaxConfig, build=ranking.build_in_batch_softmax,
             description="two-tower in-batch softmax over a [B, B] similarity, with temperature",
             prediction="similarity")
    register("sampled_softmax", config=ranking.SampledSoftmaxConfig, build=ranking.build_sampled_softmax,
             description="two-tower sampled softmax over a [B, 1 + N] similarity (positive in column 0), with temperature",
             prediction="sampled_similarity")
