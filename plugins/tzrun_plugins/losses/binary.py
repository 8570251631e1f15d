"""Binary classification losses."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["BCEConfig", "build_bce", "weighted_mean"]


@attrs.frozen
class BCEConfig:
    """Options of ``binary_cross_entropy``.

    Attributes:
        label_smoothing: the target becomes ``label * (1 - s) + 0.5 * s``.
    """

    label_smoothing: float = attrs.field(
        default=0.0, validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0))
    )


def weighted_mean(values: Any, weight: Any) -> Any:
    """``sum(w * v) / sum(w)``; 0 for a batch whose weights are all 0 (padding)."""
    return (values * weight).sum() / weight.sum().clamp_min(1e-12)


def build_bce(cfg: BCEConfig) -> Any:
    """The loss module: ``forward(logits, label, weight)`` is the weighted mean of
    ``binary_cross_entropy_with_logits`` over the batch."""
    import torch
    from torch.nn import functional as F

    class BinaryCrossEntropy(torch.nn.Module):
        def __init__(self, smoothing: float) -> None:
            super().__init__()
            self.smoothing = smoothing

        def forward(self, logits: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            target = label * (1.0 - self.smoothing) + 0.5 * self.smoothing if self.smoothing else label
            per_row = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
            return weighted_mean(per_row, weight)

    return BinaryCrossEntropy(cfg.label_smoothing)
