"""Binary classification losses on one logit per row: cross entropy and focal loss.

Every loss here is a sample-weighted mean: ``sum_i w_i * l_i / sum_i w_i``, so rows of weight 0
(padding) contribute nothing, and a batch of padding only gives 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["BCEConfig", "FocalConfig", "build_bce", "build_focal", "weighted_mean"]

_unit_closed = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0))


def _open_unit(instance: Any, attribute: Any, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"must be between 0 and 1 (exclusive), got {value}", attribute)


@attrs.frozen
class BCEConfig:
    """Options of ``binary_cross_entropy``.

    Attributes:
        label_smoothing: the target becomes ``label * (1 - s) + 0.5 * s``.
    """

    label_smoothing: float = attrs.field(default=0.0, validator=_unit_closed)


@attrs.frozen
class FocalConfig:
    """Options of ``binary_focal`` (Lin et al., 2017), on logits.

    ``l_i = a_i * BCE(x_i, y_i)`` with the (constant, not differentiated) modulating factor
    ``a_i = alpha * y_i * (1 - p_i)**gamma + (1 - alpha) * (1 - y_i) * p_i**gamma``, ``p = sigmoid(x)``.

    Attributes:
        gamma: focusing parameter; 0 gives ``alpha``-weighted BCE.
        alpha: weight of the positive class, in (0, 1).
    """

    gamma: float = attrs.field(default=2.0, validator=attrs.validators.ge(0.0))
    alpha: float = attrs.field(default=0.5, validator=_open_unit)


def weighted_mean(values: Tensor, weight: Tensor) -> Tensor:
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


def build_focal(cfg: FocalConfig) -> Any:
    """The loss module: ``forward(logits, label, weight)``, see :class:`FocalConfig`."""
    import torch
    from torch.nn import functional as F

    class BinaryFocal(torch.nn.Module):
        def __init__(self, gamma: float, alpha: float) -> None:
            super().__init__()
            self.gamma, self.alpha = gamma, alpha

        def forward(self, logits: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                p = torch.sigmoid(logits)
                factor = self.alpha * label * (1 - p).pow(self.gamma) + (1 - self.alpha) * (1 - label) * p.pow(self.gamma)
            per_row = F.binary_cross_entropy_with_logits(logits, label, reduction="none") * factor
            return weighted_mean(per_row, weight)

    return BinaryFocal(cfg.gamma, cfg.alpha)
