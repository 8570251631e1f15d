"""Input checks shared by the metrics: shapes, labels, sample weights, padding rows.

Every metric accepts ``[B]`` or ``[B, 1]`` columns and optional finite non-negative sample
weights. Rows of weight 0 are padding: :func:`weighted_rows` drops them before anything else
is checked, so their values (even NaN or an invalid label) never matter.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["LabelKind", "as_column", "check_groups", "check_weight", "weighted_rows"]

LabelKind = Literal["binary", "unit", "real"]
"""What a metric accepts as label: ``{0, 1}``, ``[0, 1]`` or any finite real."""


def as_column(x: Tensor, metric: str, name: str) -> Tensor:
    """Return ``x`` as a 1-D tensor, accepting ``[B]`` or ``[B, 1]``.

    Raises:
        ValueError: For any other shape.
    """
    x = torch.as_tensor(x)
    if x.ndim == 2 and x.shape[1] == 1:
        return x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"{metric}: {name} must have shape [B] or [B, 1], got {tuple(x.shape)}")
    return x


def check_weight(weight: Tensor, rows: int, metric: str) -> Tensor:
    """Return ``weight`` as a checked 1-D tensor of ``rows`` finite non-negative values.

    Raises:
        ValueError: On a bad shape or dtype, or a negative or non-finite value.
    """
    weight = as_column(weight, metric, "weight")
    if weight.shape[0] != rows:
        raise ValueError(f"{metric}: weight must have one value per row, got {weight.shape[0]} for {rows} rows")
    if weight.is_complex() or weight.dtype == torch.bool:
        raise ValueError(f"{metric}: weight must be a real number tensor, got dtype {weight.dtype}")
    if not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
        raise ValueError(f"{metric}: weight must be finite and non-negative")
    return weight


def _check_labels(target: Tensor, kind: LabelKind, metric: str) -> None:
    if target.is_complex():
        raise ValueError(f"{metric}: target must be real-valued, got dtype {target.dtype}")
    if kind == "binary":
        if not bool(((target == 0) | (target == 1)).all()):
            raise ValueError(f"{metric}: target values must be 0 or 1 (in rows with positive weight)")
    elif kind == "unit":
        if not bool(((target >= 0) & (target <= 1)).all()):
            raise ValueError(f"{metric}: target values must lie in [0, 1] (in rows with positive weight)")
    elif target.is_floating_point() and not bool(torch.isfinite(target).all()):
        raise ValueError(f"{metric}: target values must be finite (in rows with positive weight)")


def weighted_rows(
    metric: str,
    preds: Tensor,
    target: Tensor,
    weight: Tensor | None,
    *,
    labels: LabelKind,
    group: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Check one batch and keep its rows of positive weight.

    Args:
        metric: The metric's name, for error messages.
        preds: Predictions, ``[B]`` or ``[B, 1]``, real dtype, no NaN in kept rows.
        target: Labels, same number of rows, of the kind ``labels`` says.
        weight: Optional finite non-negative sample weights; rows of weight 0 are dropped.
        labels: The label kind the metric accepts.
        group: Optional integer group keys (e.g. user ids), one per row.

    Returns:
        ``(preds, target, weight, group)`` as 1-D tensors restricted to the rows of positive
        weight; ``weight`` is ``None`` if none was given, ``group`` if none was given.

    Raises:
        ValueError: On a bad shape or dtype, a label of the wrong kind, a NaN prediction, a
            negative or non-finite weight, or non-integer group keys.
    """
    preds = as_column(preds, metric, "preds")
    target = as_column(target, metric, "target")
    if preds.is_complex():
        raise ValueError(f"{metric}: preds must be real-valued, got dtype {preds.dtype}")
    if preds.shape != target.shape:
        raise ValueError(
            f"{metric}: preds and target must have the same shape, got {tuple(preds.shape)} and {tuple(target.shape)}"
        )
    if group is not None:
        group = check_groups(group, preds.shape[0], metric)
    if weight is not None:
        weight = check_weight(weight, preds.shape[0], metric)
        keep = weight > 0
        if not bool(keep.all()):
            preds, target, weight = preds[keep], target[keep], weight[keep]
            group = None if group is None else group[keep]
    _check_labels(target, labels, metric)
    if preds.is_floating_point() and bool(torch.isnan(preds).any()):
        raise ValueError(f"{metric}: preds contain NaN (in rows with positive weight)")
    return preds, target, weight, group


def check_groups(group: Tensor, rows: int, metric: str) -> Tensor:
    """Return the group keys as a 1-D int64 tensor.

    Raises:
        ValueError: If they are not an integer tensor with one key per row (float keys are
            refused: float32 cannot hold ids above 2**24 exactly).
    """
    group = as_column(group, metric, "group")
    if group.is_floating_point() or group.is_complex() or group.dtype == torch.bool:
        raise ValueError(f"{metric}: group keys must be an integer tensor (int64), got dtype {group.dtype}")
    if group.shape[0] != rows:
        raise ValueError(f"{metric}: group must have one key per row, got {group.shape[0]} for {rows} rows")
    return group.to(torch.int64)
