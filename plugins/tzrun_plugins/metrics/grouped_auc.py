"""Grouped AUC (GAUC): the exact ROC AUC of every group (e.g. user), averaged over groups.

This module provides the metric ``grouped_auc``:

* :class:`GroupedAUC` - a :class:`torchmetrics.Metric` whose ``update`` takes a group key per
  row and whose ``compute`` gives the average over all ranks' rows,
* :func:`grouped_binary_auc` - the same computation as a plain function,
* :func:`build_grouped_auc` - builds the metric from :class:`GroupedAUCConfig`.

**Definition.** For group ``g`` with weighted positives ``P_g = sum w_i y_i`` and negatives
``N_g = sum w_i (1 - y_i)``::

    AUC_g = sum_{i pos, j neg in g} w_i w_j ([p_i > p_j] + 0.5 [p_i == p_j]) / (P_g N_g)

which is ``sklearn.metrics.roc_auc_score`` on the group's rows (tied predictions count one
half). Only groups with ``P_g > 0`` and ``N_g > 0`` are *valid*; the result is::

    GAUC = sum_{valid g} lambda_g AUC_g / sum_{valid g} lambda_g

with ``lambda_g = 1`` (the default, a plain mean over groups) or, with
``weight_by_size=True``, ``lambda_g = n_g``, the number of rows of ``g`` with positive
weight (sample weights weight pairs inside a group, not the group itself). With no valid
group the value is ``0.5`` and a :class:`RuntimeWarning` says why.

**Computation.** One sort of all rows by ``(group, prediction)`` (both packed into one int64
key when the group keys span fewer than ``2**31`` values and predictions are stored in
float32, otherwise two radix sorts), then segment sums over runs of equal
``(group, prediction)`` and over groups. No Python loop over groups. Every rank keeps its
rows (``cat`` states) and ``compute`` gathers them, so groups split across ranks, and
duplicated rows, give exactly the value one process gives over the same rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tzrun_plugins.metrics._segments import (
    dense_ids,
    float_key,
    lexsort,
    segment_ids,
    segment_sum,
    segmented_cumsum,
)
from tzrun_plugins.metrics._states import NO_ROWS, GroupedRowMetric
from tzrun_plugins.metrics.options import GroupedAUCConfig

__all__ = ["GroupedAUC", "GroupedAUCConfig", "build_grouped_auc", "grouped_binary_auc"]


def build_grouped_auc(cfg: GroupedAUCConfig) -> GroupedAUC:
    """Build the ``grouped_auc`` metric from its options."""
    return GroupedAUC(weight_by_size=cfg.weight_by_size)


def _grouped_auc(
    preds: Tensor, target: Tensor, weight: Tensor | None, group: Tensor, weight_by_size: bool
) -> Tensor | str:
    """GAUC of checked rows (all of positive weight), or why it is undefined."""
    if preds.numel() == 0:
        return NO_ROWS
    if weight is not None and bool((weight == 1).all()):
        weight = None
    order = lexsort([dense_ids(group), float_key(preds)])
    group_starts = order.runs(1)
    pred_runs = order.runs(2)
    y = target[order.perm].to(torch.float64)
    w = None if weight is None else weight[order.perm].to(torch.float64)
    pos = y if w is None else w * y
    neg = 1.0 - y if w is None else w - pos

    run_ids, num_runs = segment_ids(pred_runs)
    run_pos = segment_sum(pos, run_ids, num_runs)
    run_neg = segment_sum(neg, run_ids, num_runs)
    first = torch.nonzero(pred_runs).reshape(-1)
    group_of_row, num_groups = segment_ids(group_starts)
    group_of_run = group_of_row[first]
    # negatives of the same group with a lower prediction, run by run (ascending order)
    # without sample weights the sums are counts: exact in float64 (below 2**53 rows)
    lower_neg = segmented_cumsum(run_neg, group_starts[first], exclusive=True, integral=w is None)
    wins = segment_sum(run_pos * (lower_neg + 0.5 * run_neg), group_of_run, num_groups)
    total_pos = segment_sum(run_pos, group_of_run, num_groups)
    total_neg = segment_sum(run_neg, group_of_run, num_groups)

    valid = (total_pos > 0) & (total_neg > 0)
    if not bool(valid.any()):
        return "no group has both a positive and a negative row (with positive weight)"
    auc = wins[valid] / (total_pos[valid] * total_neg[valid])
    if not weight_by_size:
        return auc.mean()
    group_rows = torch.bincount(group_of_row, minlength=num_groups).to(torch.float64)[valid]
    return (auc * group_rows).sum() / group_rows.sum()


def grouped_binary_auc(
    preds: Tensor,
    target: Tensor,
    group: Tensor,
    weight: Tensor | None = None,
    weight_by_size: bool = False,
) -> float:
    """Grouped AUC of one set of rows (see the module docstring for the definition).

    Args:
        preds: Scores (probabilities or logits), ``[B]`` or ``[B, 1]``.
        target: Labels in ``{0, 1}``, same shape.
        group: Integer group keys (e.g. user ids), same shape.
        weight: Optional finite non-negative sample weights; rows of weight 0 are ignored.
        weight_by_size: Weight each group's AUC by its number of rows instead of 1.

    Returns:
        The GAUC in ``[0, 1]``; ``0.5`` with a :class:`RuntimeWarning` if no group has both
        classes.

    Raises:
        ValueError: On a bad shape, a label outside ``{0, 1}``, a NaN prediction, a negative or
            non-finite weight, or non-integer group keys.
    """
    return GroupedAUC.of_rows(preds, target, group, weight, weight_by_size)


class GroupedAUC(GroupedRowMetric):
    """Grouped AUC over every row of every rank (see the module docstring).

    ``update(preds, target, weight, group)`` takes one integer group key per row. Rows are
    stored like :class:`~tzrun_plugins.metrics.auc.AUC` stores them (``self.dtype``, float32 by
    default; group keys always int64) and gathered across ranks at :meth:`compute`.

    Example:
        >>> metric = GroupedAUC()
        >>> metric.update(torch.tensor([0.1, 0.9, 0.3, 0.2]), torch.tensor([0, 1, 1, 0]),
        ...               None, torch.tensor([7, 7, 8, 8]))
        >>> float(metric.compute())
        1.0
    """

    name, title, labels = "grouped_auc", "grouped AUC", "binary"

    def __init__(self, weight_by_size: bool = False, **kwargs: Any) -> None:
        """Create the metric.

        Args:
            weight_by_size: Weight each group's AUC by its number of rows (of positive
                weight) instead of 1.
            **kwargs: Passed to :class:`torchmetrics.Metric`.
        """
        super().__init__(weight_by_size, **kwargs)

    grouped_value = staticmethod(_grouped_auc)
