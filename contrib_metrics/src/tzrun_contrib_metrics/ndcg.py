"""``ndcg_at_k``: normalized discounted cumulative gain at ``k``, per group, averaged.

**Definition.** Rows are grouped by their group key (a query, a user: ``group_by``). Row ``i``
has the gain ``G_i = w_i * y_i`` (``gain = "linear"``) or ``w_i * (2^y_i - 1)``
(``"exponential"``), with ``w_i`` its sample weight. A group's rows are ranked by prediction,
highest first; position ``r = 1, 2, ...`` has the discount ``D_r = 1 / log2(r + 1)`` for
``r <= k`` and 0 beyond. Rows with equal predictions take the average of every order among
them (McSherry & Najork 2008, what ``sklearn.metrics.ndcg_score`` does): a block of tied rows
at positions ``a..b`` contributes ``mean(G over the block) * sum(D_a..D_b)``. So::

    DCG_g  = sum over tie blocks of g:  mean(G) * sum(D over the block's positions)
    IDCG_g = sum_r D_r * (the r-th largest gain of g)
    NDCG_g = DCG_g / IDCG_g

A group with ``IDCG_g = 0`` (no gain at all) is left out, or counts as 0 or 1
(``empty_groups``). The value is the plain mean of ``NDCG_g`` over the groups that count;
when no group counts it is 0.0, with a :class:`RuntimeWarning`.

Rows of weight 0 are dropped before anything else: they take no position.

**Computation.** Every rank keeps its rows' predictions, gains and group keys (float64,
float64, int64); ``compute`` gathers them from all ranks, so groups split over ranks give the
value of one process. Two stable sorts, then segment sums: O(n log n), no loop over groups.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from tzrun import RowMetric

from tzrun_contrib_metrics._rows import checked_rows, undefined
from tzrun_contrib_metrics.options import NDCGConfig

__all__ = ["NDCGAtK", "build_ndcg", "grouped_ndcg"]

_EMPTY_GROUPS = ("skip", "zero", "one")


def _sorted_by_group(groups: Tensor, key: Tensor) -> Tensor:
    """The permutation that sorts rows by group, and by ``key`` descending within a group."""
    by_key = torch.argsort(key, descending=True, stable=True)
    return by_key[torch.argsort(groups[by_key], stable=True)]


def grouped_ndcg(preds: Tensor, gains: Tensor, groups: Tensor, k: int, empty_groups: str = "skip") -> Tensor | str:
    """NDCG@k of checked rows, averaged over groups (module docstring), or why it is undefined.

    Args:
        preds: float predictions.
        gains: the rows' gains (sample weight already applied), non-negative.
        groups: int64 group keys.
        k: the cut-off, at least 1.
        empty_groups: ``"skip"``, ``"zero"`` or ``"one"``.

    Returns:
        A float64 scalar tensor, or a string saying why no group counts.
    """
    n = preds.numel()
    if n == 0:
        return "no rows (with positive weight) were given"
    keys, group_id = torch.unique(groups, return_inverse=True)
    num_groups = keys.numel()
    order = _sorted_by_group(group_id, preds)
    g, p, gain = group_id[order], preds[order], gains[order].to(torch.float64)
    counts = torch.bincount(g, minlength=num_groups)
    position = torch.arange(n, device=preds.device) - (torch.cumsum(counts, 0) - counts)[g]  # 0-based
    discount = torch.where(
        position < k, 1.0 / torch.log2(position.to(torch.float64) + 2.0), torch.zeros((), dtype=torch.float64)
    )
    starts = torch.ones(n, dtype=torch.bool, device=preds.device)
    starts[1:] = (g[1:] != g[:-1]) | (p[1:] != p[:-1])
    block = torch.cumsum(starts, 0) - 1
    num_blocks = int(block[-1]) + 1
    block_gain = torch.zeros(num_blocks, dtype=torch.float64, device=preds.device).index_add_(0, block, gain)
    block_size = torch.bincount(block, minlength=num_blocks).to(torch.float64)
    block_discount = torch.zeros(num_blocks, dtype=torch.float64, device=preds.device).index_add_(0, block, discount)
    dcg = torch.zeros(num_groups, dtype=torch.float64, device=preds.device).index_add_(
        0, g[starts], block_gain / block_size * block_discount
    )
    ideal = gains[_sorted_by_group(group_id, gains)].to(torch.float64)  # same group layout as g
    idcg = torch.zeros(num_groups, dtype=torch.float64, device=preds.device).index_add_(0, g, ideal * discount)
    relevant = idcg > 0
    values = dcg[relevant] / idcg[relevant]
    missing = int((~relevant).sum())
    if empty_groups != "skip" and missing:
        fill = 0.0 if empty_groups == "zero" else 1.0
        values = torch.cat([values, torch.full((missing,), fill, dtype=torch.float64, device=preds.device)])
    if values.numel() == 0:
        return "no group has a row with a positive label (and weight)"
    return values.mean()


class NDCGAtK(RowMetric):
    """NDCG@k per group, averaged over groups, over every rank's rows (module docstring).

    Example:
        >>> metric = NDCGAtK(k=2)
        >>> metric.update(torch.tensor([0.9, 0.8, 0.1]), torch.tensor([0, 1, 1]), group=torch.tensor([7, 7, 7]))
        >>> round(float(metric.compute()), 4)  # (1/log2(3)) / (1 + 1/log2(3))
        0.3869
    """

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    preds: list[Tensor]
    gains: list[Tensor]
    groups: list[Tensor]

    def __init__(self, k: int, gain: str = "linear", empty_groups: str = "skip", **kwargs: Any) -> None:
        """Create the metric.

        Args:
            k: the cut-off, at least 1.
            gain: ``"linear"`` or ``"exponential"``.
            empty_groups: ``"skip"``, ``"zero"`` or ``"one"``.
            **kwargs: passed to :class:`torchmetrics.Metric`.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"ndcg_at_k: k must be an integer of at least 1, got {k!r}")
        if gain not in ("linear", "exponential"):
            raise ValueError(f"ndcg_at_k: gain must be \"linear\" or \"exponential\", got {gain!r}")
        if empty_groups not in _EMPTY_GROUPS:
            raise ValueError(f"ndcg_at_k: empty_groups must be one of {_EMPTY_GROUPS}, got {empty_groups!r}")
        super().__init__(**kwargs)
        self.k, self.gain, self.empty_groups = k, gain, empty_groups
        self.add_rows_state("preds", torch.float64)
        self.add_rows_state("gains", torch.float64)
        self.add_rows_state("groups", torch.int64)

    def update(self, prediction: Tensor, label: Tensor, weight: Optional[Tensor] = None, group: Optional[Tensor] = None) -> None:
        """Add a batch: predictions, labels (non-negative relevances), sample weights (rows of
        weight 0 are dropped) and the group key of every row."""
        if group is None:
            raise ValueError("ndcg_at_k needs the group key of every row: set group_by = \"<column>\" in its [[metrics]] table")
        p, y, w, g = checked_rows("ndcg_at_k", prediction, label, weight, group)
        relevance = y if self.gain == "linear" else torch.exp2(y) - 1.0
        self.append_rows("preds", p)
        self.append_rows("gains", w * relevance)
        assert g is not None  # checked_rows returns the keys it was given
        self.append_rows("groups", g)

    def compute(self) -> Tensor:
        """The mean NDCG@k over groups; 0.0 with a warning when no group counts."""
        result = grouped_ndcg(self.rows("preds"), self.rows("gains"), self.rows("groups"), self.k, self.empty_groups)
        if isinstance(result, str):
            return undefined("ndcg_at_k", result, 0.0, self.device)
        return result


def build_ndcg(cfg: NDCGConfig) -> NDCGAtK:
    """The ``ndcg_at_k`` metric from its options."""
    return NDCGAtK(k=cfg.k, gain=cfg.gain, empty_groups=cfg.empty_groups)
