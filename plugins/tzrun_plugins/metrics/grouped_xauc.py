"""Grouped XAUC: the exact XAUC of every group (e.g. user), averaged over groups.

This module provides the metric ``grouped_xauc``:

* :class:`GroupedXAUC` - a :class:`torchmetrics.Metric` whose ``update`` takes a group key per
  row,
* :func:`grouped_exact_xauc` - the same computation as a plain function,
* :func:`build_grouped_xauc` - builds the metric from :class:`GroupedXAUCConfig`.

**Definition.** ``XAUC_g`` is the exact XAUC (:mod:`tzrun_plugins.metrics.xauc`, same tie
policy: pairs with equal targets left out, equal predictions count one half) over the pairs
of rows inside group ``g``. A group is *valid* when it has at least one pair with different
targets; the result is::

    GXAUC = sum_{valid g} lambda_g XAUC_g / sum_{valid g} lambda_g

with ``lambda_g = n_g``, the group's number of rows of positive weight (the default,
``weight_by_size = true``), or ``lambda_g = 1`` (``weight_by_size = false``). With no valid
group the value is ``0.5`` with a :class:`RuntimeWarning`.

All groups are computed together in ``O(n log n)``: the pair counting of
:func:`~tzrun_plugins.metrics._pairs.pair_counts` orders groups so that no pair across two
groups is ever counted, and credits each pair to the group of its rows. Rows are gathered
from all ranks at ``compute``: the value does not depend on how rows or groups are split
over ranks.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tzrun_plugins.metrics._pairs import pair_counts
from tzrun_plugins.metrics._segments import dense_ids
from tzrun_plugins.metrics._states import NO_ROWS, GroupedRowMetric
from tzrun_plugins.metrics.options import GroupedXAUCConfig

__all__ = ["GroupedXAUC", "GroupedXAUCConfig", "build_grouped_xauc", "grouped_exact_xauc"]


def build_grouped_xauc(cfg: GroupedXAUCConfig) -> GroupedXAUC:
    """Build the ``grouped_xauc`` metric from its options."""
    return GroupedXAUC(weight_by_size=cfg.weight_by_size)


def _grouped_xauc(
    preds: Tensor, target: Tensor, weight: Tensor | None, group: Tensor, weight_by_size: bool
) -> Tensor | str:
    """GXAUC of checked rows, or why it is undefined."""
    if preds.numel() == 0:
        return NO_ROWS
    counts = pair_counts(preds, target, weight, dense_ids(group))
    valid = counts.comparable > 0
    if not bool(valid.any()):
        return "no group has two rows (with positive weight) with different targets"
    xauc = (counts.concordant[valid] + 0.5 * counts.tied[valid]) / counts.comparable[valid]
    if not weight_by_size:
        return xauc.mean()
    rows = counts.rows[valid]
    return (xauc * rows).sum() / rows.sum()


def grouped_exact_xauc(
    preds: Tensor,
    target: Tensor,
    group: Tensor,
    weight: Tensor | None = None,
    weight_by_size: bool = True,
) -> float:
    """Grouped XAUC of one set of rows (see the module docstring for the definition).

    Args:
        preds: Predictions, ``[B]`` or ``[B, 1]``.
        target: Finite real targets, same shape.
        group: Integer group keys, same shape.
        weight: Optional finite non-negative sample weights; rows of weight 0 are ignored.
        weight_by_size: Weight each group by its number of rows (default) instead of 1.

    Returns:
        The GXAUC in ``[0, 1]``; ``0.5`` with a :class:`RuntimeWarning` if no group is valid.

    Raises:
        ValueError: On invalid input (see :func:`tzrun_plugins.metrics.xauc.exact_xauc`) or
            non-integer group keys.
    """
    return GroupedXAUC.of_rows(preds, target, group, weight, weight_by_size)


class GroupedXAUC(GroupedRowMetric):
    """Grouped XAUC over every row of every rank (see the module docstring).

    ``update(preds, target, weight, group)`` takes one integer group key per row.

    Example:
        >>> metric = GroupedXAUC()
        >>> metric.update(torch.tensor([0.1, 0.5, 0.3, 0.2]), torch.tensor([1.0, 9.0, 2.0, 4.0]),
        ...               None, torch.tensor([5, 5, 6, 6]))
        >>> float(metric.compute())
        0.5
    """

    name, title, labels = "grouped_xauc", "grouped XAUC", "real"

    def __init__(self, weight_by_size: bool = True, **kwargs: Any) -> None:
        """Create the metric.

        Args:
            weight_by_size: Weight each group's XAUC by its number of rows (default) or by 1.
            **kwargs: Passed to :class:`torchmetrics.Metric`.
        """
        super().__init__(weight_by_size, **kwargs)

    grouped_value = staticmethod(_grouped_xauc)
