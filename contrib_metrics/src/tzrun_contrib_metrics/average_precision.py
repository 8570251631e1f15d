"""``average_precision``: the area under the precision-recall curve, exactly as
``sklearn.metrics.average_precision_score`` computes it.

**Definition.** Rows are binary (label 0 or 1) with sample weights ``w``. Every distinct
prediction value ``t`` is a threshold; rows with prediction ``>= t`` are called positive, so
tied predictions enter together. With ``TP(t)`` and ``FP(t)`` the weights of the labelled
positive and negative rows called positive, ``P`` the weight of all positive rows::

    precision(t) = TP(t) / (TP(t) + FP(t)),   recall(t) = TP(t) / P
    AP = sum over thresholds t, from the highest:  (recall(t) - recall(t_previous)) * precision(t)

with ``recall = 0`` before the first threshold. This is the step-wise area, not the
trapezoid (which overestimates it). With no positive row the value is 0.0 (sklearn's), with
a :class:`RuntimeWarning`. Rows of weight 0 are dropped.

**Computation.** Every rank keeps its rows (float64 prediction, weighted positive and negative
mass); ``compute`` gathers all ranks' rows and runs one sort, so the value does not depend on
how rows were split over ranks.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from tzrun import RowMetric

from tzrun_contrib_metrics._rows import checked_rows, undefined
from tzrun_contrib_metrics.options import AveragePrecisionConfig

__all__ = ["AveragePrecision", "average_precision", "build_average_precision"]


def average_precision(preds: Tensor, positive: Tensor, negative: Tensor) -> Tensor | str:
    """AP of rows given as predictions and their positive and negative weights (``w * y`` and
    ``w * (1 - y)``), or why it is undefined (module docstring)."""
    if preds.numel() == 0:
        return "no rows (with positive weight) were given"
    sorted_preds, order = torch.sort(preds, descending=True)
    last_of_tie = torch.ones_like(sorted_preds, dtype=torch.bool)
    last_of_tie[:-1] = sorted_preds[1:] != sorted_preds[:-1]
    tp = torch.cumsum(positive[order].to(torch.float64), 0)[last_of_tie]
    fp = torch.cumsum(negative[order].to(torch.float64), 0)[last_of_tie]
    total = tp[-1]
    if not bool(total > 0):
        return "no row with label 1 (and a positive weight) was given"
    recall = tp / total
    previous = torch.cat([recall.new_zeros(1), recall[:-1]])
    return ((recall - previous) * (tp / (tp + fp))).sum()


class AveragePrecision(RowMetric):
    """Average precision over every rank's rows (module docstring).

    Example:
        >>> metric = AveragePrecision()
        >>> metric.update(torch.tensor([0.9, 0.5, 0.5, 0.1]), torch.tensor([1, 0, 1, 0]))
        >>> round(float(metric.compute()), 4)  # 0.5 * 1 + 0.5 * 2/3
        0.8333
    """

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    preds: list[Tensor]
    positive: list[Tensor]
    negative: list[Tensor]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_rows_state("preds", torch.float64)
        self.add_rows_state("positive", torch.float64)
        self.add_rows_state("negative", torch.float64)

    def update(self, prediction: Tensor, label: Tensor, weight: Optional[Tensor] = None) -> None:
        """Add a batch: scores (probabilities or logits: only their order counts), 0/1 labels,
        sample weights (rows of weight 0 are dropped)."""
        p, y, w, _ = checked_rows("average_precision", prediction, label, weight, binary_label=True)
        positive = w * y
        self.append_rows("preds", p)
        self.append_rows("positive", positive)
        self.append_rows("negative", w - positive)

    def compute(self) -> Tensor:
        """AP over all rows; 0.0 with a warning when there is no positive row."""
        result = average_precision(self.rows("preds"), self.rows("positive"), self.rows("negative"))
        if isinstance(result, str):
            return undefined("average_precision", result, 0.0, self.device)
        return result


def build_average_precision(cfg: AveragePrecisionConfig) -> AveragePrecision:
    """The ``average_precision`` metric."""
    return AveragePrecision()
