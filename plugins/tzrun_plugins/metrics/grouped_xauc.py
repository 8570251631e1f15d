"""Grouped XAUC: the exact XAUC of every group (e.g. user), averaged over groups.

This module provides the metric ``grouped_xauc``:

* :class:`GroupedXAUC` - a :class:`torchmetrics.Metric` whose ``update`` takes a group key per
  row,
* :func:`grouped_exact_xauc` - the same computation as a plain function,
* :func:`build_grouped_xauc` - builds the metric from :class:`GroupedXAUCConfig`.

**Definition.** ``XAUC_g`` is the exact XAUC (:mod:`tzrun_plugins.metrics.xauc`, same tie
rules: by default pairs with equal targets left out, equal predictions count one half;
``ties = "wrong"`` for TorchEasyRec's rule) over the pairs of rows inside group ``g``. A group
is *valid* when it has at least one pair that counts (one with different targets; with
``ties = "wrong"``, any two rows); the result is::

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

import functools
from typing import Any

from torch import Tensor

from tzrun_plugins.metrics._inputs import weighted_rows
from tzrun_plugins.metrics._pairs import pair_counts
from tzrun_plugins.metrics._segments import dense_ids
from tzrun_plugins.metrics._states import NO_ROWS, GroupedRowMetric, half_if_undefined
from tzrun_plugins.metrics.options import GroupedXAUCConfig, TieRule
from tzrun_plugins.metrics.xauc import agreement

__all__ = ["GroupedXAUC", "GroupedXAUCConfig", "build_grouped_xauc", "grouped_exact_xauc"]


def build_grouped_xauc(cfg: GroupedXAUCConfig) -> GroupedXAUC:
    """Build the ``grouped_xauc`` metric from its options."""
    return GroupedXAUC(weight_by_size=cfg.weight_by_size, ties=cfg.ties)


def _grouped_xauc(
    preds: Tensor, target: Tensor, weight: Tensor | None, group: Tensor, weight_by_size: bool, ties: TieRule = "drop"
) -> Tensor | str:
    """GXAUC of checked rows, or why it is undefined."""
    if preds.numel() == 0:
        return NO_ROWS
    counts = pair_counts(preds, target, weight, dense_ids(group))
    agree, total = agreement(counts, ties)
    valid = total > 0
    if not bool(valid.any()):
        if ties == "wrong":
            return "no group has two rows (with positive weight)"
        return "no group has two rows (with positive weight) with different targets"
    xauc = agree[valid] / total[valid]
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
    ties: TieRule = "drop",
) -> float:
    """Grouped XAUC of one set of rows (see the module docstring for the definition).

    Args:
        preds: Predictions, ``[B]`` or ``[B, 1]``.
        target: Finite real targets, same shape.
        group: Integer group keys, same shape.
        weight: Optional finite non-negative sample weights; rows of weight 0 are ignored.
        weight_by_size: Weight each group by its number of rows (default) instead of 1.
        ties: ``"drop"`` (default) or ``"wrong"`` (TorchEasyRec's rule).

    Returns:
        The GXAUC in ``[0, 1]``; ``0.5`` with a :class:`RuntimeWarning` if no group is valid.

    Raises:
        ValueError: On invalid input (see :func:`tzrun_plugins.metrics.xauc.exact_xauc`) or
            non-integer group keys.
    """
    GroupedXAUCConfig(weight_by_size=weight_by_size, ties=ties)  # validates
    preds, target, weight, keys = weighted_rows("grouped_xauc", preds, target, weight, labels="real", group=group)
    assert keys is not None
    result = _grouped_xauc(preds, target, weight, keys, weight_by_size, ties)
    return float(half_if_undefined(result, preds.device, GroupedXAUC.title))


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

    def __init__(self, weight_by_size: bool = True, ties: TieRule = "drop", **kwargs: Any) -> None:
        """Create the metric.

        Args:
            weight_by_size: Weight each group's XAUC by its number of rows (default) or by 1.
            ties: ``"drop"`` (default) or ``"wrong"`` (TorchEasyRec's rule).
            **kwargs: Passed to :class:`torchmetrics.Metric`.

        Raises:
            ValueError: On another tie rule.
        """
        GroupedXAUCConfig(weight_by_size=weight_by_size, ties=ties)  # validates
        super().__init__(weight_by_size, **kwargs)
        self.ties = ties
        self.grouped_value = functools.partial(_grouped_xauc, ties=ties)

    grouped_value = staticmethod(_grouped_xauc)
