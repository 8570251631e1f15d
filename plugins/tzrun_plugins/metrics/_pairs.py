"""Exact weighted pair counts for XAUC in O(n log n), vectorized.

For rows ``i`` with prediction ``p_i``, target ``y_i``, weight ``w_i`` and optionally a group
``g_i``, :func:`pair_counts` returns per group (or once, without groups)

* ``concordant = sum w_i w_j [p_i < p_j]`` over pairs with ``y_i < y_j``,
* ``tied = sum w_i w_j`` over unordered pairs with ``p_i == p_j`` and ``y_i != y_j``,
* ``comparable = sum w_i w_j`` over unordered pairs with ``y_i != y_j``,
* ``pairs = sum w_i w_j`` over all unordered pairs of distinct rows,

pairs being taken within a group only. The concordant count is a 2-D dominance count:
rows are ranked by ``(g desc, p asc, y desc)`` (distinct ranks ``r``) and laid out in the
order ``(g asc, y asc, r desc)``; then a pair is concordant exactly when the earlier row has
the smaller rank, and pairs from different groups or with equal targets never are. That
count is taken by :func:`dominance`, a most-significant-bit-first radix partition of the
ranks: at bit ``b`` every bucket of ranks sharing the bits above ``b`` is scanned in layout
order, each row whose bit ``b`` is 1 counts the weight of the earlier rows whose bit is 0,
and the bucket is stably split by that bit. That is ``log2(n)`` passes of a few vectorized
int32 operations and one scatter each, and no Python loop over rows. Buckets are aligned blocks
of positions; only the last one may be shorter, so ``n`` need not be a power of two (no
padding). The layout needs no second sort by rank: it is a stable sort by ``(g, y)`` of the
rows taken in decreasing rank order. With unit weights every count is an integer computed
exactly in int64 (unordered pairs inside runs as ``C(length, 2)``).
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
        pairs: Weight of all unordered pairs of distinct rows.
    """

    concordant: Tensor
    tied: Tensor
    comparable: Tensor
    rows: Tensor
    pairs: Tensor


def _bucket_cumsum(values: Tensor, out: Tensor | None, rows: int, size: int) -> Tensor:
    """Inclusive cumulative sums of ``values`` restarting every ``size`` positions (the last
    bucket may be shorter), in ``values``' dtype (into ``out`` if given)."""
    full = rows * size
    if out is None:
        out = torch.empty_like(values)
    if rows:
        torch.cumsum(values[:full].view(rows, size), 1, out=out[:full].view(rows, size))
    if full < values.numel():
        torch.cumsum(values[full:], 0, out=out[full:])
    return out


def dominance(ranks: Tensor, weight: Tensor | None, per_row: bool = False) -> Tensor:
    """Weight of the pairs ``s < t`` (positions) with ``ranks[s] < ranks[t]``.

    Args:
        ranks: A permutation of ``0 .. n-1`` (any ``n``), int32.
        weight: Per-position weights, or ``None`` for 1.
        per_row: If true, return for every rank ``r`` the weight of the pairs whose later
            element has rank ``r`` (weighted by ``weight`` of both elements), indexed by rank.

    Returns:
        A float64 scalar, or a float64 tensor of ``n`` values if ``per_row``.
    """
    n = ranks.numel()
    device = ranks.device
    pos = torch.arange(n, dtype=torch.int32, device=device)
    one, upto, dest = torch.empty_like(ranks), torch.empty_like(ranks), torch.empty_like(ranks)
    ranks, spare = ranks.clone(), torch.empty_like(ranks)  # two buffers, used in turn
    total = torch.zeros((), dtype=torch.float64, device=device)
    offset = 0  # unweighted count: sum of (position x times a one sat there) minus this
    visits = torch.zeros(n, dtype=torch.int32, device=device) if weight is None and not per_row else None
    acc = None
    if per_row:
        acc = torch.zeros(n, dtype=torch.float64 if weight is not None else torch.int32, device=device)
    for bit in range((n - 1).bit_length() - 1, -1, -1):
        size, half = 2 << bit, 1 << bit
        rows = n // size
        full = rows * size
        tail_ones = max(0, n - full - half)  # the last, shorter bucket's ones
        torch.bitwise_right_shift(ranks, bit, out=one).bitwise_and_(1)
        _bucket_cumsum(one, upto, rows, size)  # ones up to and including each position
        index = torch.bitwise_and(pos, size - 1)  # position inside the bucket
        if weight is None and not per_row:
            assert visits is not None
            # a one at bucket index i with k ones before it follows i - k zeros: sum over the
            # ones of their positions, less their buckets' starts and the ones before them
            visits += one
            offset += half * size * rows * (rows - 1) // 2 + rows * half * (half - 1) // 2
            offset += tail_ones * full + tail_ones * (tail_ones - 1) // 2
        elif weight is None:
            assert acc is not None
            acc += (index + 1 - upto) * one
        else:
            zero_weight = weight * (one == 0)
            gained = (weight - zero_weight) * _bucket_cumsum(zero_weight.to(torch.float64), None, rows, size)
            if acc is not None:
                acc += gained
            else:
                total += gained.sum()
        # stable split of each bucket: its zeros first, then its ones. A zero goes to
        # pos - upto; a one to bucket start + half + (upto - 1). (A last bucket no longer
        # than half holds only zeros; a longer one has half zeros, as a full one.)
        torch.mul(upto, 2, out=dest)
        dest -= index
        dest += half - 1
        dest *= one
        dest += pos
        dest -= upto
        where = dest.to(torch.int64)
        ranks, spare = spare.scatter_(0, where, ranks), ranks
        if weight is not None:
            weight = torch.empty_like(weight).scatter_(0, where, weight)
        if acc is not None:
            acc = torch.empty_like(acc).scatter_(0, where, acc)
    if acc is not None:
        return acc.to(torch.float64)  # after the last split, position == rank
    if visits is not None:
        count = int((pos.to(torch.int64) * visits).sum()) - offset
        return torch.tensor(float(count), dtype=torch.float64, device=device)
    return total


def _run_lengths(starts: Tensor) -> tuple[Tensor, Tensor]:
    """The first position and the length (int64) of every run of a run-start mask."""
    first = torch.nonzero(starts).reshape(-1)
    ends = torch.cat([first[1:], first.new_full((1,), starts.numel())])
    return first, ends - first


def _cross_run_counts(outer: Tensor | None, inner: Tensor) -> Tensor:
    """:func:`_cross_run_pairs` with unit weights, exactly in int64: per outer run,
    ``C(outer length, 2)`` less ``C(length, 2)`` of each inner run in it."""
    first, length = _run_lengths(inner)
    inner_pairs = length * (length - 1) // 2
    if outer is None:
        n = inner.numel()
        count = n * (n - 1) // 2 - int(inner_pairs.sum())
        return torch.tensor([float(count)], dtype=torch.float64, device=inner.device)
    _, outer_length = _run_lengths(outer)
    outer_of_inner = torch.cumsum(outer[first].to(torch.int64), 0) - 1
    within = torch.zeros_like(outer_length).index_add_(0, outer_of_inner, inner_pairs)
    return (outer_length * (outer_length - 1) // 2 - within).to(torch.float64)


def _cross_run_pairs(weight: Tensor | None, outer: Tensor | None, inner: Tensor) -> Tensor:
    """Pairs inside each outer run that straddle two inner runs.

    ``outer`` and ``inner`` are run-start masks of rows sorted so that every inner run lies
    inside one outer run (``outer=None``: all rows form one outer run); ``weight`` is in the
    same order (``None`` for 1). Returns, per outer run, ``sum W_a W_b`` over the unordered
    pairs of distinct inner runs ``a, b`` in it (``W`` = total weight of a run).
    """
    if weight is None:
        return _cross_run_counts(outer, inner)
    first = torch.nonzero(inner).reshape(-1)
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
        return PairCounts(empty, empty, empty, empty, empty)
    if weight is not None and bool((weight == 1).all()):
        weight = None
    pkey, ykey = float_key(preds), float_key(target)
    group_keys = [] if group is None else [group]
    k = len(group_keys)

    # rank order: groups decreasing, then predictions increasing, then targets decreasing
    by_rank = lexsort([descending(g) for g in group_keys] + [pkey, descending(ykey)])
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

    # layout order: groups increasing, then targets increasing, then ranks decreasing: a
    # stable sort of the rows taken in decreasing rank order, by (group, target) only
    by_rank_desc = by_rank.perm.flip(0)
    layout = lexsort([(values[by_rank_desc], bits) for values, bits in group_keys + [ykey]])
    layout_weight = None if weight is None else weight[by_rank_desc[layout.perm]]
    comparable = _cross_run_pairs(layout_weight, layout.runs(k) if group is not None else None, layout.runs(k + 1))

    ranks = (n - 1) - layout.perm.to(torch.int32)  # the row at position i of by_rank_desc has rank n-1-i
    if group_of_rank is None:
        concordant = dominance(ranks, layout_weight).reshape(1)
    else:
        per_rank = dominance(ranks, layout_weight, per_row=True)
        concordant = segment_sum(per_rank, group_of_rank, num_groups)
    if weight is None:
        pairs = rows * (rows - 1) / 2
    else:
        every_row = torch.ones(n, dtype=torch.bool, device=device)
        pairs = _cross_run_pairs(layout_weight, layout.runs(k) if group is not None else None, every_row)
    return PairCounts(concordant, tied, comparable, rows, pairs)
