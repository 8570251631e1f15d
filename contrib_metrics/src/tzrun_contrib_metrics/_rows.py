"""What the metrics share: input checks and the value of an undefined metric (their row
states are :class:`tzrun.RowMetric`'s)."""

from __future__ import annotations

import warnings
from typing import Any, Optional, cast

import torch
from torch import Tensor

__all__ = ["checked_rows", "undefined"]


def _flat(x: Any, metric: str, what: str) -> Tensor:
    x = torch.as_tensor(x)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"{metric}: {what} must have shape [B] or [B, 1], got {tuple(x.shape)}")
    return cast(Tensor, x)


def checked_rows(
    metric: str,
    prediction: Any,
    label: Any,
    weight: Optional[Any] = None,
    group: Optional[Any] = None,
    *,
    binary_label: bool = False,
    non_negative_prediction: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Flatten and check one batch, and drop its rows of weight 0 (padding).

    Args:
        metric: the metric's name, for errors.
        prediction, label: ``[B]`` or ``[B, 1]`` real tensors.
        weight: ``[B]`` finite non-negative sample weights; ``None`` means all 1.
        group: ``[B]`` integer group keys, or ``None``.
        binary_label: labels must be 0 or 1 (otherwise finite and non-negative).
        non_negative_prediction: predictions must be at least 0.

    Returns:
        ``(prediction, label, weight, group)`` of the rows of positive weight: float64, and
        the group keys as int64 (``None`` when not given). Checks beyond shapes and dtypes
        apply to those rows only, so padding rows may hold anything.

    Raises:
        ValueError: naming the metric and what is wrong.
    """
    p = _flat(prediction, metric, "prediction")
    y = _flat(label, metric, "label")
    if p.is_complex() or y.is_complex():
        raise ValueError(f"{metric}: prediction and label must be real numbers")
    if y.shape != p.shape:
        raise ValueError(f"{metric}: prediction and label have different shapes {tuple(p.shape)} and {tuple(y.shape)}")
    if weight is None:
        w = torch.ones(p.shape, dtype=torch.float64, device=p.device)
    else:
        w = _flat(weight, metric, "weight")
        if w.shape != p.shape:
            raise ValueError(f"{metric}: weight has shape {tuple(w.shape)}, prediction {tuple(p.shape)}")
        w = w.to(torch.float64)
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            raise ValueError(f"{metric}: weights must be finite and non-negative")
    g = None
    if group is not None:
        g = _flat(group, metric, "group")
        if g.shape != p.shape:
            raise ValueError(f"{metric}: group has shape {tuple(g.shape)}, prediction {tuple(p.shape)}")
        if g.is_floating_point() or g.is_complex() or g.dtype == torch.bool:
            raise ValueError(f"{metric}: group keys must be integers, got {g.dtype}")
        g = g.to(torch.int64)
    keep = w > 0
    if not bool(keep.all()):
        p, y, w = p[keep], y[keep], w[keep]
        g = None if g is None else g[keep]
    p, y = p.to(torch.float64), y.to(torch.float64)
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"{metric}: predictions must be finite (in rows of positive weight)")
    if non_negative_prediction and bool((p < 0).any()):
        raise ValueError(f"{metric}: predictions must be at least 0 (probabilities; in rows of positive weight)")
    if binary_label:
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError(f"{metric}: labels must be 0 or 1 (in rows of positive weight)")
    elif not bool(torch.isfinite(y).all()) or bool((y < 0).any()):
        raise ValueError(f"{metric}: labels must be finite and non-negative (in rows of positive weight)")
    return p, y, w, g


def undefined(metric: str, reason: str, value: float, device: torch.device) -> Tensor:
    """Warn that ``metric`` is undefined because of ``reason`` and return ``value``."""
    warnings.warn(f"{metric} is undefined because {reason}; returning {value}", RuntimeWarning, stacklevel=3)
    return torch.tensor(value, dtype=torch.float64, device=device)
