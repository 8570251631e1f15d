"""Regression, pairwise ranking and retrieval (in-batch and sampled softmax) losses.

Every loss is a sample-weighted mean, so padding rows (weight 0) contribute nothing.
"""

from __future__ import annotations

from typing import Any

import attrs

from tzrun_plugins.losses.binary import weighted_mean

__all__ = [
    "L2Config",
    "PairwiseLogisticConfig",
    "InBatchSoftmaxConfig",
    "SampledSoftmaxConfig",
    "build_l2",
    "build_pairwise_logistic",
    "build_in_batch_softmax",
    "build_sampled_softmax",
]


@attrs.frozen
class L2Config:
    """``l2`` has no options: ``sum_i w_i (x_i - y_i)^2 / sum_i w_i`` on the raw output."""


@attrs.frozen
class PairwiseLogisticConfig:
    """Options of ``pairwise_logistic`` (RankNet; BPR when labels are clicks).

    Over every pair (i, j) of the batch with ``y_i > y_j`` (and, with ``group_by``, the same
    group), ``l_ij = log(1 + exp(-(x_i - x_j)))`` = ``-log sigmoid(x_i - x_j)``; the loss is
    ``sum w_i w_j l_ij / sum w_i w_j`` over those pairs (0 when the batch has none).

    Attributes:
        chunk_rows: rows of the ``[chunk, B]`` pair block computed at once (memory bound).
    """

    chunk_rows: int = attrs.field(default=1024, validator=attrs.validators.ge(1))


@attrs.frozen
class InBatchSoftmaxConfig:
    """Options of ``in_batch_softmax`` for two-tower retrieval. The prediction is the
    ``[B, B]`` similarity of every user (row) with every item (column) of the batch; row i's
    positive is item i, the other items of the batch are its negatives:
    ``l_i = -log softmax(s_i / temperature)_i``, weighted mean over rows. Padding rows (weight 0)
    are not used as negatives either.

    Attributes:
        temperature: similarities are divided by it before the softmax.
    """

    temperature: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))


@attrs.frozen
class SampledSoftmaxConfig:
    """Options of ``sampled_softmax`` for two-tower retrieval with ``[data.sampler]``. The
    prediction is the ``[B, 1 + N]`` similarity of each user (row) with its own item (column 0)
    and the ``N`` items sampled for the batch (TorchEasyRec's softmax cross entropy with a
    negative sampler, label 0): ``l_i = -log softmax(s_i / temperature)_0``, weighted mean over
    rows. No correction for the sampling distribution is applied (as in TorchEasyRec).

    Attributes:
        temperature: similarities are divided by it before the softmax.
    """

    temperature: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))


def build_l2(cfg: L2Config) -> Any:
    """The loss module: ``forward(prediction, label, weight)``."""
    import torch

    class L2(torch.nn.Module):
        def forward(self, prediction: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return weighted_mean((prediction - label) ** 2, weight)

    return L2()


def build_pairwise_logistic(cfg: PairwiseLogisticConfig) -> Any:
    """The loss module: ``forward(scores, label, weight, group=None)``."""
    import torch
    from torch.nn import functional as F

    class PairwiseLogistic(torch.nn.Module):
        def forward(
            self, scores: torch.Tensor, label: torch.Tensor, weight: torch.Tensor, group: torch.Tensor | None = None
        ) -> torch.Tensor:
            total = scores.new_zeros(())
            norm = scores.new_zeros(())
            for start in range(0, scores.shape[0], cfg.chunk_rows):
                rows = slice(start, start + cfg.chunk_rows)
                better = label[rows, None] > label[None, :]
                if group is not None:
                    better = better & (group[rows, None] == group[None, :])
                pair_weight = weight[rows, None] * weight[None, :] * better
                margin = scores[rows, None] - scores[None, :]
                total = total + (F.softplus(-margin) * pair_weight).sum()
                norm = norm + pair_weight.sum()
            return total / norm.clamp_min(1e-12)

    return PairwiseLogistic()


def build_in_batch_softmax(cfg: InBatchSoftmaxConfig) -> Any:
    """The loss module: ``forward(similarity[B, B], label, weight)`` (the label is unused)."""
    import torch
    from torch.nn import functional as F

    class InBatchSoftmax(torch.nn.Module):
        def forward(self, similarity: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
                raise ValueError(f"in_batch_softmax needs a square [B, B] similarity, got {list(similarity.shape)}")
            logits = similarity / cfg.temperature
            padding = (weight <= 0)[None, :] & ~torch.eye(len(weight), dtype=torch.bool, device=weight.device)
            logits = logits.masked_fill(padding, float("-inf"))
            target = torch.arange(len(weight), device=similarity.device)
            return weighted_mean(F.cross_entropy(logits, target, reduction="none"), weight)

    return InBatchSoftmax()


def build_sampled_softmax(cfg: SampledSoftmaxConfig) -> Any:
    """The loss module: ``forward(similarity[B, 1 + N], label, weight)`` (the label is unused)."""
    import torch
    from torch.nn import functional as F

    class SampledSoftmax(torch.nn.Module):
        def forward(self, similarity: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            if similarity.dim() != 2 or similarity.shape[1] < 2:
                raise ValueError(
                    f"sampled_softmax needs a [B, 1 + num_negatives] similarity with num_negatives >= 1, got "
                    f"{list(similarity.shape)}; set [data.sampler] and read the model's sampled_similarity"
                )
            target = torch.zeros(similarity.shape[0], dtype=torch.int64, device=similarity.device)
            return weighted_mean(F.cross_entropy(similarity / cfg.temperature, target, reduction="none"), weight)

    return SampledSoftmax()
