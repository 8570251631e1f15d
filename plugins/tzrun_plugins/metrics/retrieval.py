"""Retrieval metrics over a score matrix: ``recall_at_k`` and ``hit_rate_at_k``.

``update(scores, target, weight)`` takes a ``[B, C]`` matrix: row ``i`` scores ``C``
candidates for query ``i`` (e.g. user-item similarities of a two-tower model). Its
positives are given by one of

* ``target`` of shape ``[B]`` (or ``[B, 1]``): the column of row ``i``'s single positive
  (integer values; a float tensor is accepted if it holds whole numbers);
* ``target`` of shape ``[B, C]``: a 0/1 relevance matrix (any number of positives per row);
* ``in_batch=True``: ``scores`` is ``[B, B]`` and row ``i``'s positive is column ``i`` (the
  other rows' items are its negatives); ``target`` is not used and may be ``None``;
* ``sampled=True``: ``scores`` is ``[B, 1 + N]`` and every row's positive is column 0 (the
  other columns are sampled negatives); ``target`` is not used and may be ``None``.

**Ties.** The top ``k`` is taken as if ties between scores were broken uniformly at random,
in expectation, so the value is deterministic: a positive with ``a`` candidates scored
strictly higher and ``m`` candidates (itself included) scored equal is retrieved with
probability ``clamp((k - a) / m, 0, 1)``.

**Definitions** (``w_i`` the row's sample weight)::

    recall_at_k   = sum_i w_i E[#positives of row i in its top k] / sum_i w_i #positives_i
    hit_rate_at_k = sum_i w_i P[row i has a positive in its top k] / sum_i w_i [#positives_i > 0]

Rows without positives count in neither. With one positive per row the two are equal. For a
relevance matrix, ``P[hit]`` under random tie-breaking is ``1`` if a positive scores above the
``k``-th largest score ``v``, else ``1 - C(m - q, s) / C(m, s)`` where ``m`` candidates score
``v``, ``q`` of them positive, and ``s`` of the ``k`` slots are left for them.

**Padding.** Rows of weight 0 are dropped; in ``in_batch`` mode their columns are dropped
too, so padding never competes as a candidate. Values are float64 sums over rows, summed
across ranks: given the same batches, the value does not depend on the number of ranks.
In-batch values do depend on the batch composition (as in-batch negatives do).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar

import torch
from torch import Tensor
from torchmetrics import Metric

from tzrun_plugins.metrics._inputs import as_column, check_weight
from tzrun_plugins.metrics.options import TopKConfig

__all__ = ["HitRateAtK", "RecallAtK", "build_hit_rate_at_k", "build_recall_at_k"]


def _scores_and_positives(
    name: str, scores: Tensor, target: Tensor | None, weight: Tensor | None, in_batch: bool, sampled: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Checked float64 scores of the kept rows, their positives (``[B]`` index or ``[B, C]``
    bool), and their weights."""
    scores = torch.as_tensor(scores)
    if scores.ndim != 2 or scores.is_complex():
        raise ValueError(f"{name}: scores must be a real [B, C] matrix, got shape {tuple(scores.shape)}")
    rows = scores.shape[0]
    keep = None
    if weight is not None:
        weight = check_weight(weight, rows, name).detach()
        keep = weight > 0
        weight = weight[keep].to(torch.float64)
    scores = scores.detach()
    if in_batch:
        if scores.shape[1] != rows:
            raise ValueError(f"{name}: in_batch needs a square [B, B] score matrix, got {tuple(scores.shape)}")
        if keep is not None:
            scores = scores[keep][:, keep]
        positives: Tensor = torch.arange(scores.shape[0], device=scores.device)
    elif sampled:
        if keep is not None:
            scores = scores[keep]
        positives = torch.zeros(scores.shape[0], dtype=torch.int64, device=scores.device)
    elif target is None:
        raise ValueError(f"{name}: target is required unless in_batch or sampled = true")
    else:
        target = torch.as_tensor(target).detach()
        if target.shape == scores.shape:
            positives = target if keep is None else target[keep]
            if not bool(((positives == 0) | (positives == 1)).all()):
                raise ValueError(f"{name}: a [B, C] target must hold 0 or 1")
            positives = positives.bool()
        else:
            index = as_column(target, name, "target")
            if index.shape[0] != rows:
                raise ValueError(f"{name}: target must be [B] column indices or a [B, C] matrix like scores")
            index = index if keep is None else index[keep]
            if index.is_floating_point() and not bool((index == index.round()).all()):
                raise ValueError(f"{name}: target column indices must be whole numbers")
            positives = index.to(torch.int64)
            if bool(((positives < 0) | (positives >= scores.shape[1])).any()):
                raise ValueError(f"{name}: target column indices must lie in [0, {scores.shape[1]})")
        if keep is not None:
            scores = scores[keep]
    scores = scores.to(torch.float64)
    if bool(torch.isnan(scores).any()):
        raise ValueError(f"{name}: scores contain NaN (in rows with positive weight)")
    return scores, positives, weight


def _retrieved(scores: Tensor, positives: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per row: expected positives in the top ``k``, ``P[hit]``, number of positives."""
    rows, cols = scores.shape
    if positives.ndim == 1:
        own = scores.gather(1, positives[:, None])
        above = (scores > own).sum(1)
        equal = (scores == own).sum(1)
        found = ((k - above).to(torch.float64) / equal).clamp(0.0, 1.0)
        return found, found, torch.ones(rows, dtype=torch.float64, device=scores.device)
    ascending = torch.sort(scores, dim=1).values
    up_to = torch.searchsorted(ascending, scores, right=True)
    below = torch.searchsorted(ascending, scores, right=False)
    chance = ((k - (cols - up_to)).to(torch.float64) / (up_to - below)).clamp(0.0, 1.0)
    found = (chance * positives).sum(1)
    count = positives.sum(1).to(torch.float64)

    # P[hit]: v = the min(k, C)-th largest score of the row
    kth = ascending[:, cols - min(k, cols)][:, None]
    above_kth = (scores > kth).sum(1)
    at_kth = (scores == kth).sum(1)
    slots = min(k, cols) - above_kth
    sure = (positives & (scores > kth)).any(1)
    tied_pos = (positives & (scores == kth)).sum(1)
    left = at_kth - tied_pos
    log_miss = (
        torch.lgamma((left + 1).double())
        - torch.lgamma((left - slots + 1).clamp_min(1).double())
        - torch.lgamma((at_kth + 1).double())
        + torch.lgamma((at_kth - slots + 1).double())
    )
    miss = torch.where(left >= slots, torch.exp(log_miss), torch.zeros_like(log_miss))
    hit = torch.where(sure, torch.ones_like(miss), 1.0 - miss)
    return found, hit * (count > 0), count


class _TopK(Metric):
    """Sums of retrieved positives per row (float64, summed across ranks)."""

    is_differentiable = False
    hits: Tensor
    total: Tensor
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    name: ClassVar[str]

    def __init__(self, k: int = 10, in_batch: bool = False, sampled: bool = False, **kwargs: Any) -> None:
        """Create the metric.

        Args:
            k: Number of top-scored candidates retrieved per row.
            in_batch: ``scores`` is ``[B, B]`` with row ``i``'s positive in column ``i``.
            sampled: ``scores`` is ``[B, 1 + N]`` with every row's positive in column 0.
            **kwargs: Passed to :class:`torchmetrics.Metric`.
        """
        TopKConfig(k=k, in_batch=in_batch, sampled=sampled)  # validates
        super().__init__(**kwargs)
        self.k, self.in_batch, self.sampled = k, in_batch, sampled
        self.add_state("hits", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def _add(self, found: Tensor, hit: Tensor, count: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def update(self, scores: Tensor, target: Tensor | None, weight: Tensor | None = None) -> None:
        """Add a batch of rows.

        Args:
            scores: ``[B, C]`` candidate scores (``[B, B]`` in in-batch mode).
            target: ``[B]`` positive column per row, or ``[B, C]`` 0/1 relevance; unused in
                in-batch and sampled modes.
            weight: Optional finite non-negative per-row weights; rows (and, in-batch, their
                columns) of weight 0 are dropped.

        Raises:
            ValueError: On a bad shape, a NaN score, an index outside ``[0, C)``, a
                relevance value other than 0/1, or a negative or non-finite weight.
        """
        scores, positives, weight = _scores_and_positives(self.name, scores, target, weight, self.in_batch, self.sampled)
        if scores.shape[0] == 0:
            return
        found, hit, count = _retrieved(scores, positives, self.k)
        w = torch.ones_like(found) if weight is None else weight.to(found.device)
        hits, total = self._add(found, hit, count, w)
        self.hits = self.hits + hits.to(self.hits.device)
        self.total = self.total + total.to(self.total.device)

    def compute(self) -> Tensor:
        """The value over all ranks' rows; NaN with a warning if no row has a positive."""
        if not bool(self.total > 0):
            why = "no row has a positive"
            warnings.warn(f"{self.name} is undefined because {why}; returning NaN", RuntimeWarning, stacklevel=2)
            return torch.tensor(math.nan, dtype=torch.float64, device=self.device)
        return self.hits / self.total


class RecallAtK(_TopK):
    """Weighted share of positives retrieved in the top ``k`` (see the module docstring)."""

    name = "recall_at_k"

    def _add(self, found: Tensor, hit: Tensor, count: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        return (weight * found).sum(), (weight * count).sum()


class HitRateAtK(_TopK):
    """Weighted share of rows with a positive in the top ``k`` (see the module docstring)."""

    name = "hit_rate_at_k"

    def _add(self, found: Tensor, hit: Tensor, count: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        return (weight * hit).sum(), (weight * (count > 0)).sum()


def build_recall_at_k(cfg: TopKConfig) -> RecallAtK:
    """Build ``recall_at_k``."""
    return RecallAtK(k=cfg.k, in_batch=cfg.in_batch, sampled=cfg.sampled)


def build_hit_rate_at_k(cfg: TopKConfig) -> HitRateAtK:
    """Build ``hit_rate_at_k``."""
    return HitRateAtK(k=cfg.k, in_batch=cfg.in_batch, sampled=cfg.sampled)
