"""Row-keeping metrics: every rank stores its rows and ``compute`` gathers them.

The exact ranking metrics keep each row (``cat`` states, like
:class:`~tzrun_plugins.metrics.auc.AUC`): predictions, targets and weights in the metric's
dtype (``self.dtype``, float32 unless ``set_dtype`` changes it) and, for grouped metrics,
group keys in int64 whatever the metric's dtype, so that ``set_dtype`` never rounds an id.
A rank that saw no rows still contributes an (empty) int64 tensor of group keys, so every
rank gathers tensors of one dtype.

Their value is undefined on degenerate input (e.g. a single class); it is then ``0.5``, as
for ``auc``, with a :class:`RuntimeWarning` that says why (:func:`half_if_undefined`).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, ClassVar, Sequence

import torch
from torch import Tensor
from torch.nn import Module
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat
from torchmetrics.utilities.distributed import gather_all_tensors

from tzrun_plugins.metrics._inputs import LabelKind, weighted_rows

__all__ = ["NO_ROWS", "GroupedRowMetric", "RowStates", "half_if_undefined"]

_GROUP = "group"
NO_ROWS = "no rows (with positive weight) were given"


def half_if_undefined(result: Tensor | str, device: torch.device, what: str) -> Tensor:
    """``result`` as a float64 scalar, or ``0.5`` with a :class:`RuntimeWarning` when it is the
    reason why the value ``what`` is undefined."""
    if isinstance(result, str):
        warnings.warn(f"{what} is undefined because {result}; returning 0.5", RuntimeWarning, stacklevel=3)
        return torch.tensor(0.5, dtype=torch.float64, device=device)
    return result.to(torch.float64)


class RowStates:
    """Mixin for a :class:`torchmetrics.Metric` with list states ``preds``, ``target``,
    ``weight`` and optionally ``group`` (registered by the metric's ``__init__``)."""

    def append_rows(
        self: Any, preds: Tensor, target: Tensor, weight: Tensor | None, group: Tensor | None = None
    ) -> None:
        """Store checked rows (weight ``None`` stores ones)."""
        dtype, device = self.dtype, self.device
        self.preds.append(preds.detach().to(device=device, dtype=dtype))
        self.target.append(target.detach().to(device=device, dtype=dtype))
        if weight is None:
            self.weight.append(torch.ones(preds.shape, dtype=dtype, device=device))
        else:
            self.weight.append(weight.detach().to(device=device, dtype=dtype))
        if group is not None:
            self.group.append(group.detach().to(device=device, dtype=torch.int64))

    def _apply(self: Any, fn: Callable, exclude_state: Sequence[str] = ()) -> Module:
        if _GROUP not in self._defaults:
            return super()._apply(fn, exclude_state=exclude_state)  # type: ignore[misc]
        this = super()._apply(fn, exclude_state=(*exclude_state, _GROUP))  # type: ignore[misc]
        keys = this.group
        device = this.device
        this.group = [k.to(device) for k in keys] if isinstance(keys, list) else keys.to(device)
        return this

    def _sync_dist(self: Any, dist_sync_fn: Callable = gather_all_tensors, process_group: Any | None = None) -> None:
        if _GROUP in self._defaults and isinstance(self.group, list) and not self.group:
            self.group = [torch.empty(0, dtype=torch.int64, device=self.device)]
        super()._sync_dist(dist_sync_fn, process_group)  # type: ignore[misc]


class GroupedRowMetric(RowStates, Metric):
    """Base of ``grouped_auc`` and ``grouped_xauc``: ``update(preds, target, weight, group)``
    keeps the rows with one integer group key each; ``compute`` gathers all ranks' rows and
    passes them to :meth:`grouped_value`."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    name: ClassVar[str]
    title: ClassVar[str]
    labels: ClassVar[LabelKind]

    def __init__(self, weight_by_size: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.weight_by_size = weight_by_size
        for state in ("preds", "target", "weight", _GROUP):
            self.add_state(state, default=[], dist_reduce_fx="cat")

    @classmethod
    def grouped_value(
        cls, preds: Tensor, target: Tensor, weight: Tensor | None, group: Tensor, weight_by_size: bool
    ) -> Tensor | str:
        """The value over checked rows (all of positive weight, maybe none), or why it is
        undefined."""
        raise NotImplementedError

    @classmethod
    def of_rows(
        cls, preds: Tensor, target: Tensor, group: Tensor, weight: Tensor | None, weight_by_size: bool
    ) -> float:
        """Check rows and return the value over them (``0.5`` with a warning if undefined)."""
        preds, target, weight, keys = weighted_rows(cls.name, preds, target, weight, labels=cls.labels, group=group)
        assert keys is not None
        result = cls.grouped_value(preds, target, weight, keys, weight_by_size)
        return float(half_if_undefined(result, preds.device, cls.title))

    def update(self, preds: Tensor, target: Tensor, weight: Tensor | None, group: Tensor) -> None:
        """Add a batch of rows.

        Args:
            preds: Predictions, ``[B]`` or ``[B, 1]``.
            target: Labels of the kind the metric accepts, same shape.
            weight: Sample weights or ``None``; rows of weight 0 are dropped.
            group: Integer group keys (e.g. user ids), one per row.

        Raises:
            ValueError: On a bad shape, label, NaN prediction or weight, or non-integer keys.
        """
        preds, target, weight, keys = weighted_rows(self.name, preds, target, weight, labels=self.labels, group=group)
        self.append_rows(preds, target, weight, keys)

    def compute(self) -> Tensor:
        """The value over every row given to :meth:`update` on every rank (float64 scalar;
        ``0.5`` with a :class:`RuntimeWarning` if undefined)."""
        if isinstance(self.preds, list) and not self.preds:
            return half_if_undefined(NO_ROWS, self.device, self.title)
        result = self.grouped_value(
            dim_zero_cat(self.preds),
            dim_zero_cat(self.target),
            dim_zero_cat(self.weight),
            dim_zero_cat(self.group).to(torch.int64),
            self.weight_by_size,
        )
        return half_if_undefined(result, self.device, self.title)
