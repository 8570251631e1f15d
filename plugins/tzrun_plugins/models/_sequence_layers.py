"""Sequence encoders: a padded sequence ``[B, L, D]`` with its mask ``[B, L]`` to one ``[B, D]``.

Every encoder takes ``(sequence, mask, query)`` (``query`` ``[B, D]``, or None where it reads
none) as :meth:`tzrun.sequence.SequenceFeatures.sequence` and ``.query`` give them: ids
left-aligned, oldest first, ``mask`` True at a real id, ``L <= max_len``. A row with no id
encodes to zeros. Nothing here branches on a tensor's value or shape in Python, so TorchRec's
pipelines can trace a model that uses them (``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` are leaves of that trace, as torch.nn modules; the masked
softmax is wrapped).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.fx
from torch import nn

__all__ = ["MeanEncoder", "TargetAttention", "SelfAttentionEncoder", "masked_softmax"]


@torch.fx.wrap
def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``softmax(scores)`` over the last dimension, taken over the True positions of ``mask``
    only: masked positions get weight 0, and a row with none True gets all zeros (not NaN)."""
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1) * mask.to(scores.dtype)


def masked_mean(sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``sequence``'s ``[B, L, D]`` rows over the True positions of ``mask``
    (zeros for a row with none)."""
    weights = mask.to(sequence.dtype)
    total = (sequence * weights.unsqueeze(-1)).sum(dim=1)
    return total / weights.sum(dim=1, keepdim=True).clamp(min=1.0)


class MeanEncoder(nn.Module):
    """The mean of the sequence's real ids (TorchEasyRec's ``pooling_encoder`` with ``mean``)."""

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
        return masked_mean(sequence, mask)


class TargetAttention(nn.Module):
    """DIN's target attention (Zhou et al., KDD 2018), as TorchEasyRec's ``DINEncoder``.

    Each position's score is ``linear(mlp([q, s, q - s, q * s]))`` for the query (the
    candidate) ``q`` and the position's embedding ``s``; the output is the sum of the
    positions' embeddings weighted by their scores. With ``softmax`` (TorchEasyRec's choice)
    the weights are the masked softmax of the scores; without it they are the raw scores of
    the real positions (the DIN paper, which keeps the intensity of the user's interest).
    Padded positions weigh 0 either way.

    Args:
        dim: the width ``D`` of the sequence and of the query.
        hidden_units: layer widths of the attention MLP (``Linear -> ReLU`` each).
        softmax: normalise the weights with a masked softmax.
    """

    def __init__(self, dim: int, hidden_units: Sequence[int], softmax: bool = True) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 4 * dim
        for units in hidden_units:
            layers += [nn.Linear(width, units), nn.ReLU()]
            width = units
        self.mlp = nn.Sequential(*layers)
        self.score = nn.Linear(width, 1)
        self.softmax = softmax

    def weights(self, sequence: torch.Tensor, mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The ``[B, L]`` attention weights of the positions for ``query``."""
        q = query.unsqueeze(1).expand_as(sequence)
        scores: torch.Tensor = self.score(self.mlp(torch.cat([q, sequence, q - sequence, q * sequence], dim=-1))).squeeze(-1)
        if self.softmax:
            return masked_softmax(scores, mask)
        return scores * mask.to(scores.dtype)

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
        if query is None:
            raise ValueError("target attention needs a query (the candidate's embedding)")
        return torch.bmm(self.weights(sequence, mask, query).unsqueeze(1), sequence).squeeze(1)


class SelfAttentionEncoder(nn.Module):
    """A small BST-style encoder (Chen et al., 2019): learned position embeddings added to the
    sequence, ``num_layers`` transformer encoder layers (multi-head self-attention over the real
    ids only, then a feed-forward block), and the mean of the real positions' outputs.

    Position ``p`` is the distance from the row's most recent id (the last real one, or the first
    with ``recent_first``): 0 for the most recent, so rows of different lengths share the
    meaning of a position. A row with no id attends to its first (padded) position only, so no
    softmax runs over nothing, and its output is zeros like every encoder's.

    Args:
        dim: the width ``D`` of the sequence (a multiple of ``num_heads``).
        max_len: the longest sequence (the size of the position table).
        num_heads: attention heads.
        num_layers: encoder layers.
        feedforward_dim: the width of each layer's feed-forward block.
        dropout: dropout in each layer (training only).
        recent_first: a row's first id is its most recent (the group's ``keep = "first"``).
    """

    def __init__(self, dim: int, max_len: int, num_heads: int = 2, num_layers: int = 1,
                 feedforward_dim: int = 64, dropout: float = 0.0, recent_first: bool = False) -> None:
        super().__init__()
        self.recent_first = recent_first
        self.positions = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, num_heads, dim_feedforward=feedforward_dim, dropout=dropout, batch_first=True)
            for _ in range(num_layers)
        )

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
        lengths = mask.sum(dim=1, keepdim=True)
        index = torch.arange(sequence.size(1), device=sequence.device).unsqueeze(0)
        # 0 = the most recent id; padding: masked out
        distance = index if self.recent_first else (lengths - 1 - index).clamp(min=0)
        x = sequence + self.positions(distance)
        # position 0 is real in every non-empty row (ids are left-aligned): unmasking it there
        # changes nothing, and gives an empty row one key to attend to
        padding = torch.cat([torch.zeros_like(mask[:, :1]), ~mask[:, 1:]], dim=1)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        return masked_mean(x, mask)
