"""The base of a metric that keeps rows: exact ranking metrics (AUC, NDCG, XAUC, COPC, ...).

Such a metric cannot sum its rows into a few scalars: every rank stores its rows in ``cat``
list states and ``compute`` gathers them. Two things go wrong when each metric writes that by
hand, and :class:`RowMetric` gets them right once:

* a rank that saw no rows must still contribute a tensor of each state's dtype to the gather
  (torchmetrics sends ``self.dtype`` placeholders, which cannot be concatenated with int64
  group keys or float64 rows of the other ranks);
* ``set_dtype`` (``Metric.half()``, ``.double()``) must not round integer ids (group keys):
  a state declared with a dtype keeps it, and only moves with the metric's device.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.nn import Module
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat
from torchmetrics.utilities.distributed import gather_all_tensors

__all__ = ["RowMetric"]


class RowMetric(Metric):
    """A :class:`torchmetrics.Metric` that keeps per-row tensors, gathered from every rank.

    Subclass it, declare each row state in ``__init__`` with :meth:`add_rows_state`, store a
    batch's rows in ``update`` with :meth:`append_rows` and read every rank's rows in
    ``compute`` with :meth:`rows`::

        class LabelMedian(tzrun.RowMetric):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(**kwargs)
                self.add_rows_state("label", torch.float64)

            def update(self, prediction: Tensor, label: Tensor, weight: Tensor | None = None) -> None:
                self.append_rows("label", label[weight > 0] if weight is not None else label)

            def compute(self) -> Tensor:
                return self.rows("label").median()

    Each state is a ``cat`` list state (``dist_reduce_fx="cat"``, not saved in checkpoints):
    merged states (``merge_state``) and gathered ranks concatenate in order.
    """

    is_differentiable = False
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        """Create the metric; ``kwargs`` go to :class:`torchmetrics.Metric`."""
        super().__init__(**kwargs)
        self._row_dtypes: dict[str, torch.dtype | None] = {}

    def add_rows_state(self, name: str, dtype: torch.dtype | None = None) -> None:
        """Declare the row state ``name``.

        Args:
            name: the attribute that holds it (a list of tensors until ``compute`` syncs).
            dtype: what its rows are stored as: a dtype (``torch.int64`` for group keys,
                ``torch.float64``) that ``set_dtype`` never changes, or ``None`` for the
                metric's own dtype (``self.dtype``, float32 unless ``set_dtype`` changes it).
        """
        self.add_state(name, default=[], dist_reduce_fx="cat")
        self._row_dtypes[name] = dtype

    def append_rows(self, name: str, rows: Tensor) -> None:
        """Store ``rows`` in the row state ``name``: detached, on the metric's device, in the
        state's dtype."""
        getattr(self, name).append(rows.detach().to(device=self.device, dtype=self._dtype_of(name)))

    def rows(self, name: str) -> Tensor:
        """Every row stored in ``name`` (every rank's, inside ``compute``), concatenated; an
        empty tensor of the state's dtype when there are none."""
        value = getattr(self, name)
        if isinstance(value, list) and not value:
            return self._no_rows(name)
        return dim_zero_cat(value)

    def _dtype_of(self, name: str) -> torch.dtype:
        return self._row_dtypes[name] or self.dtype

    def _no_rows(self, name: str) -> Tensor:
        return torch.empty(0, dtype=self._dtype_of(name), device=self.device)

    def _apply(self, fn: Callable[[Tensor], Tensor], exclude_state: Sequence[str] = ()) -> Module:
        fixed = tuple(n for n, d in getattr(self, "_row_dtypes", {}).items() if d is not None)
        this = super()._apply(fn, exclude_state=(*exclude_state, *fixed))
        device = this.device
        for name in fixed:
            value = getattr(this, name)
            setattr(this, name, [t.to(device) for t in value] if isinstance(value, list) else value.to(device))
        return this

    def _sync_dist(
        self, dist_sync_fn: Callable[..., Any] = gather_all_tensors, process_group: Any | None = None
    ) -> None:
        for name in self._row_dtypes:
            value = getattr(self, name)
            if isinstance(value, list) and not value:
                setattr(self, name, [self._no_rows(name)])
        super()._sync_dist(dist_sync_fn, process_group)
