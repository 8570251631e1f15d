"""Row-keeping metrics: every rank stores its rows and ``compute`` gathers them.

The exact ranking metrics keep each row (:class:`tzrun.RowMetric` states): predictions,
targets and weights in the metric's dtype (``self.dtype``, float32 unless ``set_dtype``
changes it) and, for grouped metrics, group keys in int64 whatever the metric's dtype, so that
``set_dtype`` never rounds an id.

Their value is undefined on degenerate input (e.g. a single class); it is then ``0.5``, as
for ``auc``, with a :class:`RuntimeWarning` that says why (:func:`half_if_undefined`).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch
from torch import Tensor

from tzrun import RowMetric
from tzrun_plugins.metrics._inputs import LabelKind, weighted_rows

__all__ = ["NO_ROWS", "GroupedRowMetric", "PredictionRows", "half_if_undefined"]

_GROUP = "group"
NO_ROWS = "no rows (with positive weight) were given"


def half_if_undefined(result: Tensor | str, device: torch.device, what: str) -> Tensor:
    """``result`` as a float64 scalar, or ``0.5`` with a :class:`RuntimeWarning` when it is the
    reason why the value ``what`` is undefined."""
    if isinstance(result, str):
        warnings.warn(f"{what} is undefined because {result}; returning 0.5", RuntimeWarning, stacklevel=3)
        return torch.tensor(0.5, dtype=torch.float64, device=device)
    return result.to(torch.float64)


class PredictionRows(RowMetric):
    """A :class:`tzrun.RowMetric` of scored rows: ``preds``, ``target`` and ``weight`` in the
    metric's dtype, and, when ``grouped``, ``group`` keys in int64."""

    preds: list[Tensor] | Tensor
    target: list[Tensor] | Tensor
    weight: list[Tensor] | Tensor
    group: list[Tensor] | Tensor

    def __init__(self, grouped: bool = False, keep_rows: bool = True, **kwargs: Any) -> None:
        """Declare the row states (none unless ``keep_rows``, for a metric that sums instead)."""
        super().__init__(**kwargs)
        for state in ("preds", "target", "weight") if keep_rows else ():
            self.add_rows_state(state)
        if grouped and keep_rows:
            self.add_rows_state(_GROUP, torch.int64)

    def append_scored(self, preds: Tensor, target: Tensor, weight: Tensor | None, group: Tensor | None = None) -> None:
        """Store checked rows (weight ``None`` stores ones)."""
        self.append_rows("preds", preds)
        self.append_rows("target", target)
        self.append_rows("weight", torch.ones(preds.shape, dtype=self.dtype, device=self.device) if weight is None else weight)
        if group is not None:
            self.append_rows(_GROUP, group)


class GroupedRowMetric(PredictionRows):
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
        super().__init__(grouped=True, **kwargs)
        self.weight_by_size = weight_by_size

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
        self.append_scored(preds, target, weight, keys)

    def compute(self) -> Tensor:
        """The value over every row given to :meth:`update` on every rank (float64 scalar;
        ``0.5`` with a :class:`RuntimeWarning` if undefined)."""
        if isinstance(self.preds, list) and not self.preds:
            return half_if_undefined(NO_ROWS, self.device, self.title)
        result = self.grouped_value(
            self.rows("preds"), self.rows("target"), self.rows("weight"), self.rows(_GROUP), self.weight_by_size
        )
        return half_if_undefined(result, self.device, self.title)
