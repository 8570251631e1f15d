"""Dice (Zhou et al., KDD 2018), the data-adaptive activation of DIN's attention MLP, and the
attention MLP that applies it over a padded sequence.

``dice(x) = p * x + alpha * (1 - p) * x`` with ``p = sigmoid((x - mean) / sqrt(var + eps))``,
per channel: in training ``mean`` and ``var`` (biased) are the statistics of the batch, and
running statistics are updated as ``torch.nn.BatchNorm1d``'s (momentum 0.1, the unbiased
variance); in evaluation and in an export the running statistics are used. ``alpha`` is learned,
one per channel, starting at 0. This is TorchEasyRec's ``Dice`` (a ``BatchNorm1d`` without
affine parameters), with one difference: over a padded sequence ``[B, L, C]`` the statistics are
those of the real positions only (``mask``), where TorchEasyRec's count the padded positions up
to the batch's longest row too. The two agree when no row is shorter than the batch's longest.

Statistics are per process: on N ranks each rank normalises with its own batch and keeps its
own running statistics (as TorchEasyRec, no ``SyncBatchNorm``); a checkpoint holds one rank's
copy (``torch.distributed.checkpoint`` saves one copy of a replicated buffer) and every rank
resumes, and every export is made, from that copy.
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence

import torch
from torch import nn

__all__ = ["Dice", "AttentionMLP"]

#: the activations an attention MLP offers (``attention_activation``)
Activation = Literal["relu", "prelu", "dice"]


class Dice(nn.Module):
    """Dice over the last dimension (``channels`` wide) of ``[N, C]`` or ``[B, L, C]`` inputs.

    Args:
        channels: the width ``C``.
        eps: added to the variance.
        momentum: the running statistics' update weight.
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``dice(x)``; ``mask`` (``x``'s shape less the last dimension, True at a real
        position) picks the positions whose statistics count (default: all)."""
        if self.training:
            mean, var = self._batch_statistics(x, mask)
        else:
            mean, var = self.running_mean, self.running_var
        p = torch.sigmoid((x - mean) * torch.rsqrt(var + self.eps))
        return p * x + self.alpha * (1.0 - p) * x

    def _batch_statistics(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1, x.shape[-1])
        weights = torch.ones_like(flat[:, 0]) if mask is None else mask.reshape(-1).to(x.dtype)
        count = weights.sum()
        n = count.clamp(min=1.0)
        mean = (flat * weights.unsqueeze(1)).sum(dim=0) / n
        var = ((flat - mean) ** 2 * weights.unsqueeze(1)).sum(dim=0) / n
        with torch.no_grad():  # no batch without a real position moves the running statistics
            step = self.momentum * (count > 0).to(x.dtype)
            unbiased = var * n / (n - 1.0).clamp(min=1.0)
            self.running_mean.mul_(1.0 - step).add_(step * mean.detach())
            self.running_var.mul_(1.0 - step).add_(step * unbiased.detach())
        return mean, var


def _activation(name: Activation, width: int) -> nn.Module:
    if name == "dice":
        return Dice(width)
    return nn.PReLU() if name == "prelu" else nn.ReLU()


class AttentionMLP(nn.Sequential):
    """``Linear -> activation`` per width of ``units``, over ``[B, L, C]`` positions: the MLP of
    DIN's attention score. Its activation is ReLU, PReLU (one slope per layer, as
    ``nn.PReLU()``) or :class:`Dice`, whose statistics count the positions ``mask`` marks. Holds
    the layers as ``nn.Sequential`` (``0``, ``1``, ...), so a ReLU MLP's weights keep their names.

    Args:
        in_features: the input width.
        units: layer widths (at least one).
        activation: ``"relu"``, ``"prelu"`` or ``"dice"``.
    """

    def __init__(self, in_features: int, units: Sequence[int], activation: Activation = "relu") -> None:
        layers: list[nn.Module] = []
        for width in units:
            layers += [nn.Linear(in_features, width), _activation(activation, width)]
            in_features = width
        super().__init__(*layers)
        self.out_features = in_features

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The MLP of ``x`` ``[B, L, C]``; ``mask`` ``[B, L]`` marks the real positions."""
        for layer in self:
            x = layer(x, mask) if isinstance(layer, Dice) else layer(x)
        return x
