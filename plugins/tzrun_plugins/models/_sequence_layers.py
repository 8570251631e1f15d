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

from tzrun_plugins.models._dice import Activation, AttentionMLP

__all__ = ["MeanEncoder", "TargetAttention", "SelfAttentionEncoder", "SimpleAttention", "MultiWindowDIN",
           "TorchEasyRecSelfAttention", "masked_softmax", "recent_first_order"]


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
        hidden_units: layer widths of the attention MLP (``Linear -> activation`` each).
        softmax: normalise the weights with a masked softmax.
        activation: the attention MLP's, ``"relu"``, ``"prelu"`` or ``"dice"`` (its statistics
            over the real ids).
    """

    def __init__(self, dim: int, hidden_units: Sequence[int], softmax: bool = True, activation: Activation = "relu") -> None:
        super().__init__()
        self.mlp = AttentionMLP(4 * dim, hidden_units, activation)
        self.score = nn.Linear(self.mlp.out_features, 1)
        self.softmax = softmax

    def weights(self, sequence: torch.Tensor, mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The ``[B, L]`` attention weights of the positions for ``query``."""
        q = query.unsqueeze(1).expand_as(sequence)
        features = torch.cat([q, sequence, q - sequence, q * sequence], dim=-1)
        scores: torch.Tensor = self.score(self.mlp(features, mask)).squeeze(-1)
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


class SimpleAttention(nn.Module):
    """Dot-product attention, as TorchEasyRec's ``SimpleAttention``: the weights are the masked
    softmax of ``s . q`` over the real positions, the output their weighted sum of the
    positions' embeddings. It has no parameters."""

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
        if query is None:
            raise ValueError("simple attention needs a query (the candidate's embedding)")
        scores = torch.bmm(sequence, query.unsqueeze(2)).squeeze(2)
        return torch.bmm(masked_softmax(scores, mask).unsqueeze(1), sequence).squeeze(1)


def recent_first_order(sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's real ids reversed (its last real id first), padding left where it is: an
    oldest-first row as a most-recent-first one."""
    lengths = mask.sum(dim=1, keepdim=True)
    index = torch.arange(sequence.size(1), device=sequence.device).unsqueeze(0)
    order = torch.where(mask, lengths - 1 - index, index)
    return torch.gather(sequence, 1, order.unsqueeze(-1).expand_as(sequence))


class MultiWindowDIN(nn.Module):
    """TorchEasyRec's ``MultiWindowDINEncoder``: DIN-style weights pooled per time window.

    Each position's weight is ``prelu(linear(mlp([s, q * s, q])))`` (one PReLU slope, starting
    at 0.25; no softmax). Window ``w`` holds the ``lengths[w]`` positions after the windows
    before it, counted from the row's most recent id; its output is the weighted sum of its
    real positions divided by their number (at least 1). Positions past the last window are
    not read. The output is ``[window_0, ..., window_{W-1}, q]`` flattened: ``(W + 1) * D``.

    Args:
        dim: the width ``D`` of the sequence and of the query.
        lengths: the windows' lengths, most recent first.
        hidden_units: layer widths of the attention MLP.
        activation: the attention MLP's, ``"relu"``, ``"prelu"`` or ``"dice"``.
        recent_first: a row's first id is its most recent (``keep = "first"``, TorchEasyRec's
            order); else its last real id is, and windows count back from it.

    Attributes:
        out_features: the output's width, ``(W + 1) * D``.
    """

    windows: torch.Tensor
    starts: torch.Tensor
    membership: torch.Tensor

    def __init__(self, dim: int, lengths: Sequence[int], hidden_units: Sequence[int],
                 activation: Activation = "relu", recent_first: bool = False) -> None:
        super().__init__()
        self.recent_first = recent_first
        self.mlp = AttentionMLP(3 * dim, hidden_units, activation)
        self.score = nn.Linear(self.mlp.out_features, 1)
        self.prelu = nn.PReLU()
        total = sum(lengths)
        starts = [sum(lengths[:w]) for w in range(len(lengths))]
        window_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths)))
        self.register_buffer("windows", torch.tensor(list(lengths)), persistent=False)
        self.register_buffer("starts", torch.tensor(starts), persistent=False)
        self.register_buffer("membership", (window_of.unsqueeze(0) == torch.arange(len(lengths)).unsqueeze(1)).float(),
                             persistent=False)  # [W, total]
        self.total = total
        self.out_features = (len(lengths) + 1) * dim

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
        if query is None:
            raise ValueError("multi-window DIN needs a query (the candidate's embedding)")
        if not self.recent_first:
            sequence = recent_first_order(sequence, mask)
        q = query.unsqueeze(1).expand_as(sequence)
        weights = self.prelu(self.score(self.mlp(torch.cat([sequence, q * sequence, q], dim=-1), mask)))
        weighted = weights * mask.unsqueeze(-1).to(sequence.dtype) * sequence
        fitted = nn.functional.pad(weighted, (0, 0, 0, self.total - sequence.size(1)))  # cut or pad to the windows
        pooled = torch.matmul(self.membership.to(sequence.dtype), fitted)  # [B, W, D]
        lengths = mask.sum(dim=1, keepdim=True)
        counts = torch.minimum(lengths - self.starts.unsqueeze(0), self.windows.unsqueeze(0)).clamp(min=1)
        pooled = pooled / counts.unsqueeze(-1).to(sequence.dtype)
        return torch.cat([pooled, query.unsqueeze(1)], dim=1).flatten(1)


class TorchEasyRecSelfAttention(nn.Module):
    """TorchEasyRec's ``SelfAttentionEncoder``: the sequence projected to ``attention_dim`` by
    three linear layers (Q, K, V), one ``nn.MultiheadAttention`` over them (each real position
    attends to the real positions; its own input projections and output projection), and the
    sum of the real positions' outputs divided by the row's length (at least 1). No position
    embedding, no feed-forward block, no residual: the order of the ids does not matter. The
    output is ``attention_dim`` wide; dropout acts on the attention weights (training only).

    Args:
        dim: the width ``D`` of the sequence.
        attention_dim: the width of the projections and of the output (a multiple of ``num_heads``).
        num_heads: attention heads.
        dropout: dropout of the attention weights.
    """

    def __init__(self, dim: int, attention_dim: int, num_heads: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        self.query = nn.Linear(dim, attention_dim)
        self.key = nn.Linear(dim, attention_dim)
        self.value = nn.Linear(dim, attention_dim)
        self.attention = nn.MultiheadAttention(attention_dim, num_heads, dropout=dropout, batch_first=True)

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
        # an empty row's padded position 0 is one key to attend to (its output is masked): no NaN
        padding = torch.cat([torch.zeros_like(mask[:, :1]), ~mask[:, 1:]], dim=1)
        out, _ = self.attention(self.query(sequence), self.key(sequence), self.value(sequence),
                                key_padding_mask=padding, need_weights=False)
        weights = mask.to(sequence.dtype).unsqueeze(-1)
        pooled: torch.Tensor = (out * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return pooled
