"""``copc``: clicks over predicted clicks, the calibration of a click model.

**Definition.** With labels ``y`` (clicks, 0/1 or counts), predicted click probabilities ``p``
and sample weights ``w``:

* without ``group_by``, over all rows (pooled)::

      COPC = sum(w * y) / sum(w * p)

* with ``group_by`` (an ad, a position, a user), per group ``g`` and then the plain mean over
  groups, each group counting the same::

      COPC_g = sum_g(w * y) / sum_g(w * p),   COPC = mean of COPC_g over groups with sum_g(w * p) > 0

  (Weighting the groups by their predicted clicks instead gives back the pooled value, which
  is the one without ``group_by``.)

1.0 is calibrated; above 1 the model under-predicts clicks, below 1 it over-predicts. When the
predictions sum to 0 (no row, or no group with a predicted click) the value is undefined:
NaN, with a :class:`RuntimeWarning`. Rows of weight 0 are dropped.

**Computation.** Each batch is reduced to one (group, clicks, predicted clicks) triple per
group key in it, in float64; ``compute`` gathers every rank's triples and sums them per group,
so groups split over ranks give the value of one process.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from tzrun import RowMetric

from tzrun_contrib_metrics._rows import checked_rows, undefined
from tzrun_contrib_metrics.options import COPCConfig

__all__ = ["COPC", "build_copc", "copc"]


def _sum_by_group(groups: Tensor, *values: Tensor) -> tuple[Tensor, ...]:
    keys, index = torch.unique(groups, return_inverse=True)
    sums = tuple(torch.zeros(keys.numel(), dtype=torch.float64, device=v.device).index_add_(0, index, v) for v in values)
    return (keys, *sums)


def copc(groups: Tensor, clicks: Tensor, predicted: Tensor) -> Tensor | str:
    """The mean over groups of ``clicks / predicted`` (sums per group key; one key gives the
    pooled value), or why it is undefined."""
    _, clicks, predicted = _sum_by_group(groups, clicks.to(torch.float64), predicted.to(torch.float64))
    counted = predicted > 0
    if not bool(counted.any()):
        return "the predictions sum to 0 (in every group)"
    return (clicks[counted] / predicted[counted]).mean()


class COPC(RowMetric):
    """Clicks over predicted clicks, pooled or averaged over groups (module docstring).

    Example:
        >>> metric = COPC()
        >>> metric.update(torch.tensor([0.2, 0.3]), torch.tensor([1, 0]))
        >>> float(metric.compute())  # 1 / 0.5
        2.0
    """

    higher_is_better = None  # 1.0 is best

    groups: list[Tensor]
    clicks: list[Tensor]
    predicted: list[Tensor]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_rows_state("groups", torch.int64)
        self.add_rows_state("clicks", torch.float64)
        self.add_rows_state("predicted", torch.float64)

    def update(self, prediction: Tensor, label: Tensor, weight: Optional[Tensor] = None, group: Optional[Tensor] = None) -> None:
        """Add a batch: predicted probabilities, clicks, sample weights (rows of weight 0 are
        dropped) and, with ``group_by``, the group key of every row."""
        p, y, w, g = checked_rows("copc", prediction, label, weight, group, non_negative_prediction=True)
        if g is None:
            g = torch.zeros(p.shape, dtype=torch.int64, device=p.device)
        keys, clicks, predicted = _sum_by_group(g, w * y, w * p)
        self.append_rows("groups", keys)
        self.append_rows("clicks", clicks)
        self.append_rows("predicted", predicted)

    def compute(self) -> Tensor:
        """COPC over all rows of all ranks; NaN with a warning when undefined."""
        result = copc(self.rows("groups"), self.rows("clicks"), self.rows("predicted"))
        if isinstance(result, str):
            return undefined("copc", result, float("nan"), self.device)
        return result


def build_copc(cfg: COPCConfig) -> COPC:
    """The ``copc`` metric."""
    return COPC()
