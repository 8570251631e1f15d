"""Metrics of semantic-ID (SID) models, with TorchEasyRec's definitions.

This module provides the metrics ``relative_l1`` and ``unique_ratio`` (TorchEasyRec's
``RelativeL1`` and ``UniqueRatio``, which its SID models report as ``rel_loss`` and
``unique_sid_ratio``):

* :class:`RelativeL1` - mean symmetric relative L1 error of a reconstruction, element-wise::

      relative_l1 = sum_i w_i sum_d |t_id - p_id| / (max(|t_id|, |p_id|) + eps)
                    / sum_i w_i D

  over rows ``i`` with ``D`` elements each (``[B]`` or ``[B, D]`` inputs). Without sample
  weights it is TorchEasyRec's value: the mean over all elements seen. 0 is an exact
  reconstruction; it tends to 1 for unrelated values.
* :class:`UniqueRatio` - the mean over batches of the share of distinct code rows in the
  batch::

      unique_ratio = mean_b (number of distinct rows of codes_b) / (rows of batch b)

  ``update(codes, target, weight)`` takes the codes ``[B, L]`` (or ``[B]``) as the
  prediction; the label is not used. A diversity proxy that depends on the batch size (a
  code repeated in two batches counts in each), not the coverage of the codebook.

Both keep float64 ``sum`` states (a sum and a count), added across ranks: the value is the
same on any number of ranks, up to the rounding of float64 additions. Rows of weight 0 are
padding and are dropped first; a batch left without rows adds nothing to ``unique_ratio``.
Before any row the value is NaN with a :class:`RuntimeWarning` (TorchEasyRec returns NaN
too).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from tzrun_plugins.metrics._inputs import check_weight
from tzrun_plugins.metrics.options import NoOptionsConfig, RelativeL1Config

__all__ = ["RelativeL1", "UniqueRatio", "build_relative_l1", "build_unique_ratio"]


def _rows(name: str, x: Tensor, what: str) -> Tensor:
    """``x`` as a ``[B, D]`` tensor (``[B]`` becomes ``[B, 1]``)."""
    x = torch.as_tensor(x)
    if x.ndim == 1:
        return x.reshape(-1, 1)
    if x.ndim != 2:
        raise ValueError(f"{name}: {what} must have shape [B] or [B, D], got {tuple(x.shape)}")
    return x


def _kept(name: str, x: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Drop the rows of weight 0; returns the rows and their (positive) weights."""
    if weight is None:
        return x, None
    weight = check_weight(weight, x.shape[0], name)
    keep = weight > 0
    return x[keep], weight[keep]


def _nan(name: str, why: str, device: torch.device) -> Tensor:
    warnings.warn(f"{name} is undefined because {why}; returning NaN", RuntimeWarning, stacklevel=3)
    return torch.tensor(math.nan, dtype=torch.float64, device=device)


class RelativeL1(Metric):
    """Mean symmetric relative L1 error (see the module docstring).

    Example:
        >>> metric = RelativeL1(eps=0.0)
        >>> metric.update(torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 2.0]]))
        >>> float(metric.compute())
        0.25
    """

    is_differentiable = False
    error: Tensor
    elements: Tensor
    higher_is_better = False
    full_state_update = False

    def __init__(self, eps: float = 1e-4, **kwargs: Any) -> None:
        """Create the metric.

        Args:
            eps: Added to the denominator ``max(|t|, |p|)`` (TorchEasyRec's ``epsilon``).
            **kwargs: Passed to :class:`torchmetrics.Metric`.

        Raises:
            ValueError: If ``eps`` is negative or not finite.
        """
        RelativeL1Config(eps=eps)  # validates
        super().__init__(**kwargs)
        self.eps = eps
        self.add_state("error", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("elements", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, weight: Tensor | None = None) -> None:
        """Add a batch of rows.

        Args:
            preds: The reconstruction, ``[B]`` or ``[B, D]``.
            target: What it reconstructs, same shape.
            weight: Optional finite non-negative sample weights, one per row.

        Raises:
            ValueError: On a bad shape, a NaN value, or a negative or non-finite weight.
        """
        preds, target = _rows("relative_l1", preds, "preds"), _rows("relative_l1", target, "target")
        if preds.shape != target.shape:
            raise ValueError(
                f"relative_l1: preds and target must have the same shape, got {tuple(preds.shape)} "
                f"and {tuple(target.shape)}"
            )
        both, weight = _kept("relative_l1", torch.stack([preds.detach(), target.detach()]).transpose(0, 1), weight)
        p, t = both[:, 0].to(torch.float64), both[:, 1].to(torch.float64)
        if bool(torch.isnan(p).any()) or bool(torch.isnan(t).any()):
            raise ValueError("relative_l1: preds or target contain NaN (in rows with positive weight)")
        rel = (t - p).abs() / (torch.maximum(t.abs(), p.abs()) + self.eps)
        w = torch.ones(p.shape[0], dtype=torch.float64, device=p.device) if weight is None else weight.to(torch.float64)
        self.error = self.error + (w * rel.sum(1)).sum().to(self.error.device)
        self.elements = self.elements + (w.sum() * p.shape[1]).to(self.elements.device)

    def compute(self) -> Tensor:
        """The weighted mean relative L1 error over all ranks' elements (NaN before any)."""
        if not bool(self.elements > 0):
            return _nan("relative_l1", "no rows (with positive weight) were given", self.device)
        return self.error / self.elements


class UniqueRatio(Metric):
    """Mean per-batch share of distinct code rows (see the module docstring).

    Example:
        >>> metric = UniqueRatio()
        >>> metric.update(torch.tensor([[1, 2], [1, 2], [3, 4], [5, 6]]), None)
        >>> float(metric.compute())
        0.75
    """

    is_differentiable = False
    ratio_sum: Tensor
    batches: Tensor
    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        """Create the metric (``kwargs`` go to :class:`torchmetrics.Metric`)."""
        super().__init__(**kwargs)
        self.add_state("ratio_sum", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("batches", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, codes: Tensor, target: Tensor | None = None, weight: Tensor | None = None) -> None:
        """Add one batch.

        Args:
            codes: The batch's semantic-ID codes, ``[B, L]`` (or ``[B]``).
            target: Not used (the core passes the label column).
            weight: Optional sample weights, one per row; rows of weight 0 are left out.

        Raises:
            ValueError: On a bad shape or weight.
        """
        codes, _ = _kept("unique_ratio", _rows("unique_ratio", codes, "codes").detach(), weight)
        if codes.shape[0] == 0:
            return
        distinct = torch.unique(codes, dim=0).shape[0]
        self.ratio_sum = self.ratio_sum + distinct / codes.shape[0]
        self.batches = self.batches + 1.0

    def compute(self) -> Tensor:
        """The mean over all ranks' batches (NaN before any non-empty batch)."""
        if not bool(self.batches > 0):
            return _nan("unique_ratio", "no batch with rows (of positive weight) was given", self.device)
        return self.ratio_sum / self.batches


def build_relative_l1(cfg: RelativeL1Config) -> RelativeL1:
    """Build ``relative_l1``."""
    return RelativeL1(eps=cfg.eps)


def build_unique_ratio(cfg: NoOptionsConfig) -> UniqueRatio:
    """Build ``unique_ratio``."""
    return UniqueRatio()
