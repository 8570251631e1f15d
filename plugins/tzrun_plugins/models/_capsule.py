"""MIND's behaviour-to-interest (B2I) capsule layer and its label-aware attention, in
TorchEasyRec's shape (``tzrec/modules/capsule.py`` and ``MIND.label_aware_attention``).

Imported by ``build`` only (torch). Nothing here branches on a tensor's value in Python, so
TorchRec's pipelines can trace a model that uses it; the per-batch random draw of the routing
logits is a leaf of that trace (:func:`routing_noise`, and :func:`fixed_noise` in evaluation).
"""

from __future__ import annotations

import torch
import torch.fx
from torch import nn
from torch.nn import functional as F

__all__ = ["CapsuleLayer", "routing_noise", "fixed_noise", "squash", "interest_mask", "label_aware_attention"]


@torch.fx.wrap
def routing_noise(low: torch.Tensor, max_k: int) -> torch.Tensor:
    """``[B, L, max_k]`` standard normal draws from torch's CPU generator (seeded by
    ``train.seed``, saved per rank in checkpoints), moved to ``low``'s device and dtype: the same
    draws on any device, and a resumed run draws what the uninterrupted one would have."""
    shape = tuple(low.shape[:-1]) + (max_k,)
    return torch.randn(shape, dtype=torch.float32).to(device=low.device, dtype=low.dtype)


@torch.fx.wrap
def fixed_noise(init: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """``init`` (``[L, max_k]``) for each of ``low``'s ``B`` rows: ``[B, L, max_k]``."""
    return init.expand(low.shape[0], -1, -1)


def squash(x: torch.Tensor, power: float) -> torch.Tensor:
    """``(|x|² / (1 + |x|²))^power / |x| * x`` over the last dimension, ``|x|`` floored at 1e-7."""
    norm = torch.linalg.norm(x, dim=-1, keepdim=True).clamp(min=1e-7)
    squashed: torch.Tensor = torch.pow(norm.square() / (1 + norm.square()), power) / norm * x
    return squashed


def interest_mask(lengths: torch.Tensor, max_k: int, const: bool) -> torch.Tensor:
    """``[B, max_k]`` bool, True at a row's interests: all ``max_k`` with ``const``; otherwise the
    first ``ceil(clamp(log2(length), 1, max_k))`` (one for a row of 0 or 1 ids)."""
    count = torch.full_like(lengths, max_k, dtype=torch.float32) if const else \
        torch.log2(lengths.float()).clamp(min=1.0, max=float(max_k))
    return torch.arange(max_k, device=lengths.device).unsqueeze(0) < count.unsqueeze(1)


class CapsuleLayer(nn.Module):
    """B2I dynamic routing of a behaviour sequence ``[B, L, low_dim]`` into ``max_k`` interest
    capsules ``[B, max_k, high_dim]`` (Li et al., 2019, as TorchEasyRec's ``CapsuleLayer``).

    The low capsules are ``e_s S`` (one bilinear matrix ``S`` shared by all interests). The
    routing logits ``b`` start at ``stddev * noise`` and carry no gradient; each of ``num_iters``
    rounds sets ``w = softmax_k(scale * b)`` (the masked interests at ``-inf``), zeroes ``w`` at
    padded positions, and, before the last round, ``b = w + <sum_s w_sk (e_s S), normalize(e_s S)>``
    with the low capsules detached; the last round's ``squash(sum_s w_sk (e_s S), squash_pow)``
    are the interests, zeroed where masked.

    ``noise`` (:meth:`initial_logits`) is a fresh :func:`routing_noise` draw per batch in training;
    in evaluation and serving it is the buffer ``routing_init`` (``[max_len, max_k]``, drawn when the model is built,
    saved with the weights), so a user's interests depend on its features only.

    Args:
        low_dim: the width of the sequence's rows.
        high_dim: the width of an interest.
        max_k: the most interests a row has.
        max_len: the sequence group's ``max_len``.
        num_iters: routing rounds (at least 1).
        scale: ``routing_logits_scale``.
        stddev: ``routing_logits_stddev``.
        squash_pow: the power of the squash.
        const_caps_num: every row has ``max_k`` interests (else ``log2`` of its length).
        random_init: start from the noise (else from zeros: TorchEasyRec's ``routing_init_method
            = "zeros"``).
    """

    routing_init: torch.Tensor

    def __init__(self, low_dim: int, high_dim: int, max_k: int, max_len: int, *, num_iters: int, scale: float,
                 stddev: float, squash_pow: float, const_caps_num: bool, random_init: bool) -> None:
        super().__init__()
        self.max_k, self.num_iters, self.scale, self.stddev = max_k, num_iters, scale, stddev
        self.squash_pow, self.const_caps_num, self.random_init = squash_pow, const_caps_num, random_init
        self.bilinear = nn.Parameter(torch.randn(low_dim, high_dim))
        self.register_buffer("routing_init", torch.randn(max_len, max_k) if random_init else torch.zeros(max_len, max_k))

    def initial_logits(self, sequence: torch.Tensor) -> torch.Tensor:
        """The routing logits ``b`` before the first round for ``sequence`` ``[B, L, low_dim]``
        (``[B, L, max_k]``, no gradient). Called by the model outside :meth:`forward`, so that
        the draw stays out of the compiled dense modules (inductor's own random numbers would
        differ from the eager run's)."""
        if not self.random_init:
            return sequence.new_zeros(tuple(sequence.shape[:-1]) + (self.max_k,))
        noise = routing_noise(sequence, self.max_k) if self.training else fixed_noise(self.routing_init, sequence)
        return noise.detach() * self.stddev

    def forward(self, sequence: torch.Tensor, mask: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``[B, max_k, high_dim]`` interests of ``sequence`` (``[B, max_len, low_dim]``) with its
        ``mask`` (``[B, max_len]``, True at a real id), routed from ``logits`` (what
        :meth:`initial_logits` gives); masked interests are zeros."""
        capsules = interest_mask(mask.sum(dim=1), self.max_k, self.const_caps_num)
        seq_weights = mask.to(sequence.dtype).unsqueeze(2)
        low = torch.einsum("bsl,lh->bsh", sequence * seq_weights, self.bilinear)
        low_detached = low.detach()
        low_unit = F.normalize(low_detached, p=2.0, dim=-1)
        hidden = capsules.logical_not().unsqueeze(1)
        for i in range(self.num_iters):
            weights = torch.softmax(logits.masked_fill(hidden, float("-inf")) * self.scale, dim=2) * seq_weights
            if i + 1 < self.num_iters:
                high = torch.einsum("bsh,bsk->bkh", low_detached, weights)
                logits = weights + torch.einsum("bkh,bsh->bsk", high, low_unit)
        high = squash(torch.einsum("bsh,bsk->bkh", low, weights), self.squash_pow)
        return high * capsules.to(high.dtype).unsqueeze(-1)


def label_aware_attention(interests: torch.Tensor, item: torch.Tensor, mask: torch.Tensor, simi_pow: float) -> torch.Tensor:
    """``[B, D]``: the interests ``[B, K, D]`` weighted by ``softmax_k(simi_pow * <interest, item>)``
    over the row's interests (``mask`` ``[B, K]``) for its own item ``[B, D]``; the softmax of
    ``simi_pow`` times the scores is the MIND paper's ``pow(softmax(scores), p)`` renormalised."""
    scores = torch.einsum("bkd,bd->bk", interests, item).masked_fill(mask.logical_not(), float("-inf"))
    weights = torch.softmax(scores * simi_pow, dim=1)
    return torch.einsum("bk,bkd->bd", weights, interests)
