"""XAUC: how often the predictions order two rows the way their regression targets do.

This module provides the metric ``xauc`` (for targets such as watch time):

* :class:`XAUC` - a :class:`torchmetrics.Metric` with three modes (``exact``, ``sampled``,
  ``in_batch``),
* :func:`exact_xauc` - the exact value of one set of rows as a plain function,
* :func:`build_xauc` - builds the metric from :class:`XAUCConfig`.

**Definition** (``mode = "exact"``, the default). Over the unordered pairs of rows ``(i, j)``
whose targets differ, each weighted by ``w_i w_j``::

    XAUC = sum w_i w_j ([sign(p_i - p_j) == sign(y_i - y_j)] + 0.5 [p_i == p_j])
           / sum w_i w_j

**Tie policy** (``ties = "drop"``, the default): pairs with equal targets are not
comparable and are left out entirely; a comparable pair with equal predictions counts one half
(as a tie counts in the ROC AUC, of which XAUC is the generalisation: on 0/1 targets it equals
the AUC). When no pair is comparable (fewer than two distinct targets) the value is ``0.5``
with a :class:`RuntimeWarning`.

``ties = "wrong"`` is TorchEasyRec's rule: every unordered pair of distinct rows is in the
denominator, and a pair scores 1 only when ``(y_i - y_j)(p_i - p_j) > 0``::

    XAUC = sum_{i<j} w_i w_j [(y_i - y_j)(p_i - p_j) > 0] / sum_{i<j} w_i w_j

(pairs with equal targets or equal predictions score 0). Undefined only with fewer than two
rows.

The exact value is computed in ``O(n log n)`` without sampling (see
:mod:`tzrun_plugins.metrics._pairs`): two radix sorts and ``log2(n)`` vectorized passes.
Every rank keeps its rows and ``compute`` gathers them, so the value is the same for any
number of ranks and any split of the rows.

**Other modes**, for compatibility with TorchEasyRec's sampled variants:

* ``"sampled"``: at ``compute``, the rows of all ranks are put in a canonical order (sorted
  by target, prediction, weight, so the order does not depend on how rows were spread over
  ranks) and ``num_samples`` index pairs ``(i, j)`` are drawn uniformly, with replacement,
  from a CPU ``torch.Generator`` seeded with ``seed``. Drawn pairs with equal targets
  (including ``i == j``) are dropped and the formula above is taken over the rest. The same
  rows and seed give the same value on any number of ranks; it is an estimate of the exact
  value, not cheaper to compute on CPU.
* ``"in_batch"``: only pairs inside one ``update`` call count. With ``averaging =
  "pooled"`` (the default) each batch adds its exact numerator and denominator to two sums
  (summed across ranks), so the value is the pair-weighted pool of the batches,
  ``sum_b num_b / sum_b den_b``. With ``averaging = "per_batch"`` (TorchEasyRec's) each
  batch adds its own XAUC and a count of one to two sums: the value is the mean of the
  batches' XAUCs; a batch without a counted pair adds nothing. Either way it depends on how
  rows are batched, not on how batches are spread over ranks.

TorchEasyRec's in-batch XAUC is ``ties = "wrong"`` with ``averaging = "per_batch"``; its
sampled one is ``ties = "wrong"`` (``tzrec-run convert`` writes both).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tzrun_plugins.metrics._inputs import weighted_rows
from tzrun_plugins.metrics._pairs import PairCounts, pair_counts
from tzrun_plugins.metrics._segments import float_key, lexsort
from tzrun_plugins.metrics._states import PredictionRows, half_if_undefined
from tzrun_plugins.metrics.options import TieRule, XAUCAveraging, XAUCConfig, XAUCMode

__all__ = ["XAUC", "XAUCConfig", "agreement", "build_xauc", "exact_xauc"]

_NO_PAIR = {
    "drop": "no pair of rows (with positive weight) has different targets",
    "wrong": "fewer than two rows (with positive weight) were given",
}


def build_xauc(cfg: XAUCConfig) -> XAUC:
    """Build the ``xauc`` metric from its options."""
    return XAUC(mode=cfg.mode, num_samples=cfg.num_samples, seed=cfg.seed, ties=cfg.ties, averaging=cfg.averaging)


def agreement(counts: PairCounts, ties: TieRule) -> tuple[Tensor, Tensor]:
    """Numerator and denominator of the XAUC of ``counts`` (per group) under a tie rule.

    Args:
        counts: Pair counts of :func:`~tzrun_plugins.metrics._pairs.pair_counts`.
        ties: ``"drop"`` (equal targets left out, equal predictions 1/2) or ``"wrong"``
            (TorchEasyRec's: all pairs counted, only strictly concordant ones score).

    Returns:
        Two float64 tensors, one entry per group.
    """
    if ties == "drop":
        return counts.concordant + 0.5 * counts.tied, counts.comparable
    return counts.concordant, counts.pairs


def _ratio(counts: PairCounts, ties: TieRule) -> Tensor | str:
    agree, total = (x.sum() for x in agreement(counts, ties))
    if not bool(total > 0):
        return _NO_PAIR[ties]
    return agree / total


def exact_xauc(preds: Tensor, target: Tensor, weight: Tensor | None = None, ties: TieRule = "drop") -> float:
    """Exact XAUC of one set of rows (see the module docstring for definition and ties).

    Args:
        preds: Predictions, ``[B]`` or ``[B, 1]``.
        target: Finite real targets, same shape.
        weight: Optional finite non-negative sample weights; rows of weight 0 are ignored.
        ties: ``"drop"`` (default) or ``"wrong"`` (TorchEasyRec's rule).

    Returns:
        The XAUC in ``[0, 1]``; ``0.5`` with a :class:`RuntimeWarning` if no pair is
        comparable.

    Raises:
        ValueError: On a bad shape, a NaN prediction, a non-finite target or a negative or
            non-finite weight.
    """
    XAUCConfig(ties=ties)  # validates
    preds, target, weight, _ = weighted_rows("xauc", preds, target, weight, labels="real")
    return float(half_if_undefined(_ratio(pair_counts(preds, target, weight), ties), preds.device, "XAUC"))


def _sampled_xauc(
    preds: Tensor, target: Tensor, weight: Tensor, num_samples: int, seed: int, ties: TieRule
) -> Tensor | str:
    """XAUC over ``num_samples`` pairs drawn from the rows in their canonical order."""
    n = preds.numel()
    if n < 2:
        return _NO_PAIR[ties]
    order = lexsort([float_key(target), float_key(preds), float_key(weight)]).perm
    preds, target = preds[order].to(torch.float64), target[order].to(torch.float64)
    weight = weight[order].to(torch.float64)
    generator = torch.Generator().manual_seed(seed)
    i = torch.randint(n, (num_samples,), generator=generator).to(preds.device)
    j = torch.randint(n, (num_samples,), generator=generator).to(preds.device)
    dy = target[i] - target[j]
    dp = preds[i] - preds[j]
    if ties == "drop":
        pair_weight = weight[i] * weight[j] * (dy != 0)
        score = (torch.sign(dy) == torch.sign(dp)).to(torch.float64) + 0.5 * (dp == 0)
    else:
        pair_weight = weight[i] * weight[j] * (i != j)
        score = (torch.sign(dy) * torch.sign(dp) > 0).to(torch.float64)
    total = pair_weight.sum()
    if not bool(total > 0):
        return _NO_PAIR[ties]
    return (pair_weight * score).sum() / total


class XAUC(PredictionRows):
    """XAUC over the rows of all ranks (see the module docstring).

    ``exact`` and ``sampled`` modes keep every row (``cat`` states in ``self.dtype``,
    gathered at :meth:`compute`); ``in_batch`` keeps two float64 sums (numerator and
    denominator pooled, or the batches' XAUCs and their number).

    Example:
        >>> metric = XAUC()
        >>> metric.update(torch.tensor([0.1, 0.5, 0.3]), torch.tensor([1.0, 9.0, 4.0]))
        >>> float(metric.compute())
        1.0
    """

    is_differentiable = False
    agree: Tensor
    pairs: Tensor
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(
        self,
        mode: XAUCMode = "exact",
        num_samples: int = 1_000_000,
        seed: int = 0,
        ties: TieRule = "drop",
        averaging: XAUCAveraging = "pooled",
        **kwargs: Any,
    ) -> None:
        """Create the metric.

        Args:
            mode: ``"exact"``, ``"sampled"`` or ``"in_batch"``.
            num_samples: Pairs drawn in ``"sampled"`` mode.
            seed: Seed of the pair sampler in ``"sampled"`` mode.
            ties: ``"drop"`` or ``"wrong"`` (TorchEasyRec's rule).
            averaging: ``"in_batch"`` mode: ``"pooled"`` or ``"per_batch"`` (TorchEasyRec's).
            **kwargs: Passed to :class:`torchmetrics.Metric`.

        Raises:
            ValueError: On an unknown mode, tie rule or averaging, ``per_batch`` outside
                ``in_batch`` mode, or a non-positive ``num_samples``.
        """
        XAUCConfig(mode=mode, num_samples=num_samples, seed=seed, ties=ties, averaging=averaging)  # validates
        super().__init__(keep_rows=mode != "in_batch", **kwargs)
        self.mode, self.num_samples, self.seed, self.ties, self.averaging = mode, num_samples, seed, ties, averaging
        if mode == "in_batch":
            # pooled: numerator and denominator; per_batch: sum of batch values and batches
            self.add_state("agree", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("pairs", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, weight: Tensor | None = None) -> None:
        """Add a batch of rows.

        Args:
            preds: Predictions, ``[B]`` or ``[B, 1]``.
            target: Finite real targets.
            weight: Sample weights or ``None``; rows of weight 0 are dropped.

        Raises:
            ValueError: On invalid input (see :func:`exact_xauc`).
        """
        preds, target, weight, _ = weighted_rows("xauc", preds, target, weight, labels="real")
        if self.mode != "in_batch":
            self.append_scored(preds, target, weight)
            return
        counts = pair_counts(preds.detach(), target.detach(), None if weight is None else weight.detach())
        if not counts.rows.numel():
            return
        agree, total = (x.sum().to(self.agree.device) for x in agreement(counts, self.ties))
        if self.averaging == "pooled":
            self.agree, self.pairs = self.agree + agree, self.pairs + total
        elif bool(total > 0):
            self.agree, self.pairs = self.agree + agree / total, self.pairs + 1.0

    def compute(self) -> Tensor:
        """XAUC over all ranks' rows (float64 scalar; 0.5 with a warning if undefined)."""
        if self.mode == "in_batch":
            why = _NO_PAIR[self.ties] + (" in any batch" if self.averaging == "per_batch" else "")
            result: Tensor | str = self.agree / self.pairs if bool(self.pairs > 0) else why
        elif isinstance(self.preds, list) and not self.preds:
            result = _NO_PAIR[self.ties]
        else:
            preds, target, weight = self.rows("preds"), self.rows("target"), self.rows("weight")
            if self.mode == "exact":
                result = _ratio(pair_counts(preds, target, weight), self.ties)
            else:
                result = _sampled_xauc(preds, target, weight, self.num_samples, self.seed, self.ties)
        return half_if_undefined(result, self.device, "XAUC")
