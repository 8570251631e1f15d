"""TDM's layers: the multi-window attention over a behaviour sequence and the final MLP.
Imported by ``build`` only (torch)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MultiWindowAttention", "final_mlp"]


def _activation(name: str) -> nn.Module:
    return nn.PReLU() if name == "prelu" else nn.ReLU()


class MultiWindowAttention(nn.Module):
    """TorchEasyRec's ``MultiWindowDINEncoder``: attention-weighted means of the sequence over
    consecutive windows of positions, most recent first, and the query (see
    :mod:`tzrun_plugins.models.tdm`).

    Args:
        dim: the width ``D`` of the sequence and of the query.
        max_len: the group's ``max_len`` (the padded sequence's length).
        windows: ids per window, most recent first.
        hidden_units: layer widths of the attention MLP over ``[s, q * s, q]``.
        activation: ``relu`` or ``prelu``, after each of its layers.
        recent_first: a row's first id is its most recent (``keep = "first"``); otherwise its
            last real id is, and the windows are counted back from there.
    """

    membership: torch.Tensor
    windows: torch.Tensor
    starts: torch.Tensor

    def __init__(self, dim: int, max_len: int, windows: Sequence[int], hidden_units: Sequence[int], activation: str,
                 recent_first: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 3 * dim
        for units in hidden_units:
            layers += [nn.Linear(width, units), _activation(activation)]
            width = units
        self.mlp = nn.Sequential(*layers)
        self.score = nn.Linear(width, 1)
        self.active = nn.PReLU()
        self.recent_first = recent_first
        self.max_len = max_len
        self.total = sum(windows)
        window_of = torch.repeat_interleave(torch.arange(len(windows)), torch.tensor(list(windows)))
        self.register_buffer("membership", F.one_hot(window_of, len(windows)).float(), persistent=False)
        self.register_buffer("windows", torch.tensor(list(windows)), persistent=False)
        self.register_buffer("starts", torch.cumsum(self.windows, 0) - self.windows, persistent=False)
        self.width = dim * (len(windows) + 1)

    def _most_recent_first(self, sequence: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``sequence`` with each row's real ids reversed (the padding stays after them)."""
        positions = torch.arange(self.max_len, device=sequence.device).unsqueeze(0)
        index = torch.where(positions < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - positions, positions)
        return sequence.gather(1, index.unsqueeze(-1).expand_as(sequence))

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """``[B, (W + 1) * D]`` of ``sequence`` ``[B, max_len, D]``, ``mask`` and ``query`` ``[B, D]``."""
        lengths = mask.sum(dim=1)
        if not self.recent_first:
            sequence = self._most_recent_first(sequence, lengths)
        q = query.unsqueeze(1).expand_as(sequence)
        weights = self.active(self.score(self.mlp(torch.cat([sequence, q * sequence, q], dim=-1))))
        weighted = weights * sequence  # zero at padding: the padded sequence is zeros there
        if self.max_len < self.total:
            weighted = F.pad(weighted, (0, 0, 0, self.total - self.max_len))
        elif self.max_len > self.total:
            weighted = weighted[:, :self.total]
        sums = torch.einsum("btd,tw->bwd", weighted, self.membership.to(weighted.dtype))
        counts = torch.minimum(lengths.unsqueeze(1) - self.starts.unsqueeze(0), self.windows.unsqueeze(0))
        means = sums / counts.clamp(min=1).unsqueeze(-1).to(sums.dtype)
        return torch.cat([means, query.unsqueeze(1)], dim=1).flatten(1)


def final_mlp(in_features: int, units: Sequence[int], batch_norm: bool) -> nn.Sequential:
    """``Linear -> ReLU`` per width of ``units``; with ``batch_norm``, ``Linear`` (no bias)
    ``-> BatchNorm1d -> ReLU`` (TorchEasyRec's ``MLP`` with ``use_bn``)."""
    layers: list[nn.Module] = []
    for width in units:
        layers.append(nn.Linear(in_features, width, bias=not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm1d(width))
        layers.append(nn.ReLU())
        in_features = width
    return nn.Sequential(*layers)
