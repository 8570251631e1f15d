"""Exact weighted pair counts for XAUC in O(n log n), vectorized.

For rows ``i`` with prediction ``p_i``, target ``y_i``, weight ``w_i`` and optionally a group
``g_i``, :func:`pair_counts` returns per group (or once, without groups)

* ``concordant = sum w_i w_j [p_i < p_j]`` over pairs with ``y_i < y_j``,
* ``tied = sum w_i w_j`` over unordered pairs with ``p_i == p_j`` and ``y_i != y_j``,
* ``comparable = sum w_i w_j`` over unordered pairs with ``y_i != y_j``,

pairs being taken within a group only. The concordant count is a 2-D dominance count:
rows are ranked by ``(g desc, p asc, y desc)`` (distinct ranks ``r``) and laid out in the
order ``(g asc, y asc, r desc)``; then a pair is concordant exactly when the earlier row has
the smaller rank, and pairs from different groups or with equal targets never are. That
count is taken by :func:`dominance`, a most-significant-bit-first radix partition of the
ranks: at bit ``b`` every bucket of ranks sharing the bits above ``b`` is scanned in layout
order, each row whose bit ``b`` is 1 counts the weight of the earlier rows whose bit is 0,
and the bucket is stably split by that bit. That is ``log2(n)`` passes of a few vectorized
operations each and no Python loop over rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tzrun_plugins.metrics._segments import (
    SortKey,
    descending,
    float_key,
    lexsort,
    segment_ids,
    segment_sum,
    segmented_cumsum,
)

__all__ = ["PairCounts", "dominance", "pair_counts"]


class PairCounts(NamedTuple):
    """Weighted pair counts (float64), one entry per group in group-key order.

    Attributes:
        concordant: Weight of pairs with different targets ordered the same way by the
            predictions.
        tied: Weight of pairs with different targets and equal predictions.
        comparable: Weight of all pairs with different targets.
        rows: Number of rows of each group.
    """

    concordant: Tensor
    tied: Tensor
    comparable: Tensor
    rows: Tensor


def dominance(ranks: Tensor, weight: Tensor | None, per_row: bool = False) -> Tensor:
    """Weight of the pairs ``s < t`` (positions) with ``ranks[s] < ranks[t]``.

    Args:
        ranks: A permutation of ``0 .. n-1`` (``n`` a power of two), int32.
        weight: Per-position weights, or ``None`` for 1.
        per_row: If true, return for every rank ``r`` the weight of the pairs whose later
            element has rank ``r`` (weighted by ``weight`` of both elements), indexed by rank.

    Returns:
        A float64 scalar, or a float64 tensor of ``n`` values if ``per_row``.
    """
    n = ranks.numel()
    device = ranks.device
    pos = torch.arange(n, dtype=torch.int32, device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    acc = torch.zeros(n, dtype=torch.float64 if weight is not None else torch.int32, device=device) if per_row else None
    for bit in range(n.bit_length() - 2, -1, -1):
        size, half = 2 << bit, 1 << bit
        rows = n // size
        zero = (ranks & half) == 0
        zeros_upto = zero.view(rows, size).cumsum(1, dtype=torch.int32).view(-1)
        if weight is None:
            if per_row:
                acc += zeros_upto * ~zero
            else:
                # each bucket's zeros carry 1, 2, ..., half: what is left is what the ones see
                count += int(zeros_upto.sum(dtype=torch.int64)) - rows * half * (half + 1) // 2
        else:
            zero_weight = weight * zero
            before = zero_weight.view(rows, size).cumsum(1, dtype=torch.float64).view(-1)
            gained = (weight - zero_weight).to(torch.float64) * before
            if per_row:
                acc += gained
            else:
                total += gained.sum()
        # stable split of each bucket: zeros to its first half, ones to its second half
        ones_dest = pos + half
        ones_dest -= zeros_upto
        zeros_dest = pos & -size
        zeros_dest += zeros_upto
        zeros_dest -= 1
        dest = torch.where(zero, zeros_dest, ones_dest).to(torch.int64)
        ranks = torch.empty_like(ranks).scatter_(0, dest, ranks)
        if weight is not None:
            weight = torch.empty_like(weight).scatter_(0, dest, weight)
        if acc is not None:
            acc = torch.empty_like(acc).scatter_(0, dest, acc)
    if acc is not None:
        return acc.to(torch.float64)  # after the last split, position == rank
    return total if weight is not None else torch.tensor(float(count), dtype=torch.float64, device=device)


def _cross_run_pairs(weight: Tensor | None, outer: Tensor | None, inner: Tensor) -> Tensor:
    """Pairs inside each outer run that straddle two inner runs.

    ``outer`` and ``inner`` are run-start masks of rows sorted so that every inner run lies
    inside one outer run (``outer=None``: all rows form one outer run); ``weight`` is in the
    same order (``None`` for 1). Returns, per outer run, ``sum W_a W_b`` over the unordered
    pairs of distinct inner runs ``a, b`` in it (``W`` = total weight of a run).
    """
    n = inner.numel()
    if outer is None and weight is None and bool(inner.all()):
        return torch.tensor([n * (n - 1) / 2], dtype=torch.float64, device=inner.device)
    first = torch.nonzero(inner).reshape(-1)
    if weight is None:
        ends = torch.cat([first[1:], first.new_full((1,), n)])
        inner_total = (ends - first).to(torch.float64)
    else:
        inner_ids, num_inner = segment_ids(inner)
        inner_total = segment_sum(weight, inner_ids, num_inner)
    if outer is None:
        earlier = torch.cumsum(inner_total, 0) - inner_total
        return (inner_total * earlier).sum().reshape(1)
    earlier = segmented_cumsum(inner_total, outer[first], exclusive=True)
    outer_ids, num_outer = segment_ids(outer)
    return segment_sum(inner_total * earlier, outer_ids[first], num_outer)


def pair_counts(preds: Tensor, target: Tensor, weight: Tensor | None, group: SortKey | None = None) -> PairCounts:
    """Exact weighted pair counts per group (see the module docstring).

    Args:
        preds: 1-D predictions without NaN.
        target: 1-D finite targets.
        weight: 1-D positive weights, or ``None`` for 1.
        group: Optional dense group ids (non-negative, with their width in bits); without
            it all rows form one group.

    Returns:
        The counts, one entry per distinct group id in increasing order (one entry without
        groups; none without rows).
    """
    n = preds.numel()
    device = preds.device
    if n == 0:
        empty = torch.zeros(0, dtype=torch.float64, device=device)
        return PairCounts(empty, empty, empty, empty)
    if weight is not None and bool((weight == 1).all()):
        weight = None
    pkey, ykey = float_key(preds), float_key(target)
    group_keys = [] if group is None else [group]
    k = len(group_keys)

    # rank order: groups decreasing, then predictions increasing, then targets decreasing
    by_rank = lexsort([descending(g) for g in group_keys] + [pkey, descending(ykey)])
    rank = torch.empty(n, dtype=torch.int64, device=device)
    rank[by_rank.perm] = torch.arange(n, device=device)
    if group is None:
        num_groups, group_of_rank = 1, None
        rows = torch.tensor([float(n)], dtype=torch.float64, device=device)
    else:
        group_of_rank, num_groups = segment_ids(by_rank.runs(k))
        group_of_rank = num_groups - 1 - group_of_rank  # increasing group index
        rows = torch.bincount(group_of_rank, minlength=num_groups).to(torch.float64)
    pred_runs = by_rank.runs(k + 1)
    if bool(pred_runs.all()):
        tied = torch.zeros(num_groups, dtype=torch.float64, device=device)
    else:
        rank_weight = None if weight is None else weight[by_rank.perm]
        tied_by_run = _cross_run_pairs(rank_weight, pred_runs, by_rank.runs(k + 2))
        if group_of_rank is None:
            tied = tied_by_run.sum().reshape(1)
        else:
            tied = segment_sum(tied_by_run, group_of_rank[pred_runs], num_groups)

    # layout order: groups increasing, then targets increasing, then ranks decreasing
    layout = lexsort(group_keys + [ykey, descending((rank, max(1, (n - 1).bit_length())))])
    layout_weight = None if weight is None else weight[layout.perm]
    comparable = _cross_run_pairs(layout_weight, layout.runs(k) if group is not None else None, layout.runs(k + 1))

    size = 1 << max(1, (n - 1).bit_length())
    # padding comes first, in decreasing rank order, so it forms no counted pair
    ranks = torch.cat([torch.arange(size - 1, n - 1, -1, device=device), rank[layout.perm]]).to(torch.int32)
    if layout_weight is not None:
        layout_weight = torch.cat([layout_weight.new_zeros(size - n), layout_weight])
    if group_of_rank is None:
        concordant = dominance(ranks, layout_weight).reshape(1)
    else:
        per_rank = dominance(ranks, layout_weight, per_row=True)[:n]
        concordant = segment_sum(per_rank, group_of_rank, num_groups)
    return PairCounts(concordant, tied, comparable, rows)
