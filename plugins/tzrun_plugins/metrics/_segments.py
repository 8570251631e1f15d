"""Vectorized building blocks for the exact ranking metrics: sort keys and segment sums.

Floats are sorted through integer keys that have the same order (torch sorts int64 with a
radix sort on CPU, several times faster than a float sort), and several keys are packed into
one int64 whenever their bits fit, so a lexicographic order usually costs one sort. Segment
sums never subtract prefix sums taken over the whole array: a segment's value is accurate
relative to the segment, however many rows precede it.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from torch import Tensor

__all__ = [
    "SortKey",
    "Sorted",
    "dense_ids",
    "descending",
    "float_key",
    "lexsort",
    "run_starts",
    "segment_ids",
    "segment_sum",
    "segmented_cumsum",
]

SortKey = tuple[Tensor, int]
"""An int64 tensor and its width in bits: ``0 <= key < 2**bits`` for ``bits < 64``; a
64-bit key is any int64, sorted as signed."""

def float_key(x: Tensor) -> SortKey:
    """An integer key with the same order as the real tensor ``x`` (which holds no NaN).

    ``-0.0`` and ``0.0`` get the same key. Floats of up to 32 bits give a 32-bit key,
    float64 a 64-bit one; integer tensors are returned as they are (64 bits).
    """
    if not x.is_floating_point():
        return x.to(torch.int64), 64
    if x.dtype == torch.float64:
        bits = (x + 0.0).view(torch.int64)
        return torch.where(bits < 0, bits ^ 0x7FFF_FFFF_FFFF_FFFF, bits), 64
    bits = (x.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, bits ^ 0x7FFF_FFFF, bits) + (1 << 31), 32


def descending(key: SortKey) -> SortKey:
    """The key that sorts in the opposite order."""
    values, bits = key
    if bits == 64:
        return torch.bitwise_not(values), 64
    return ((1 << bits) - 1) - values, bits


def _pack(high: SortKey, low: SortKey) -> SortKey:
    """One key ordering like ``(high, low)``; both unsigned and at most 64 bits together."""
    (hi, hi_bits), (lo, lo_bits) = high, low
    if hi_bits + lo_bits < 64:
        return hi * (1 << lo_bits) + lo, hi_bits + lo_bits
    # exactly 64 bits: centre the high part so the result fits a signed int64, order kept
    return (hi - (1 << (hi_bits - 1))) * (1 << lo_bits) + lo, 64


class Sorted(NamedTuple):
    """The result of :func:`lexsort`.

    Attributes:
        perm: The sorting permutation.
        packed: The sorted values of the single packed key, or ``None`` when the keys took
            several sorts.
        widths: The widths of the keys, most significant first.
        keys: The keys as given.
    """

    perm: Tensor
    packed: Tensor | None
    widths: tuple[int, ...]
    keys: tuple[SortKey, ...]

    def runs(self, prefix: int) -> Tensor:
        """Run-start mask of the sorted rows over the first ``prefix`` keys (``prefix >= 1``)."""
        if self.packed is not None:
            return run_starts(self.packed >> sum(self.widths[prefix:]))
        return run_starts(*(values[self.perm] for values, _ in self.keys[:prefix]))


def lexsort(keys: Sequence[SortKey]) -> Sorted:
    """Sort rows by ``keys`` (most significant first), ties kept stable.

    Adjacent keys narrower than 64 bits are packed into one int64 while their widths add up
    to at most 64 bits; each packed chunk costs one (radix) sort.
    """
    chunks: list[SortKey] = []
    for key in reversed(keys):
        width = chunks[-1][1] + key[1] if chunks else 0
        if chunks and chunks[-1][1] < 64 and (width < 64 or (width == 64 and key[1] > 1)):
            chunks[-1] = _pack(key, chunks[-1])
        else:
            chunks.append(key)
    if not chunks:
        raise ValueError("lexsort needs at least one key")
    if len(chunks) == 1:
        values, bits = chunks[0]
        if bits <= 32:  # an int32 radix sort is much faster; the shift keeps order and runs
            values = (values - (1 << 31)).to(torch.int32)
        packed, perm = torch.sort(values, stable=True)
        return Sorted(perm, packed, tuple(bits for _, bits in keys), tuple(keys))
    perm = torch.sort(chunks[0][0], stable=True).indices
    for values, _ in chunks[1:]:
        perm = perm[torch.sort(values[perm], stable=True).indices]
    return Sorted(perm, None, tuple(bits for _, bits in keys), tuple(keys))


def dense_ids(keys: Tensor) -> SortKey:
    """Map int64 keys to small non-negative ids with the same order.

    Keys spanning fewer than ``2**31`` values are only shifted (no sort); others are replaced
    by their index among the distinct keys.
    """
    if keys.numel() == 0:
        return keys.to(torch.int64), 1
    low, high = int(keys.min()), int(keys.max())
    if high - low < (1 << 31):
        return keys - low, max(1, (high - low).bit_length())
    distinct, inverse = torch.unique(keys, return_inverse=True)
    return inverse, max(1, (distinct.numel() - 1).bit_length())


def run_starts(*sorted_keys: Tensor) -> Tensor:
    """A bool mask, true at the first row and wherever any of the (sorted) keys changes."""
    n = sorted_keys[0].numel()
    starts = torch.zeros(n, dtype=torch.bool, device=sorted_keys[0].device)
    if n:
        starts[0] = True
        for key in sorted_keys:
            starts[1:] |= key[1:] != key[:-1]
    return starts


def segment_ids(starts: Tensor) -> tuple[Tensor, int]:
    """The segment index of every row and the number of segments, from a start mask."""
    ids = torch.cumsum(starts, 0) - 1
    return ids, int(ids[-1]) + 1 if ids.numel() else 0


def segment_sum(values: Tensor, ids: Tensor, num: int) -> Tensor:
    """``out[k] = sum(values[ids == k])`` in float64 (``ids`` need not be sorted)."""
    out = torch.zeros(num, dtype=torch.float64, device=values.device)
    return out.index_add_(0, ids, values.to(torch.float64))


def segmented_cumsum(values: Tensor, starts: Tensor, exclusive: bool = False, integral: bool = False) -> Tensor:
    """Cumulative sums of float64 ``values`` that restart at every segment start.

    The running sum is reset at each start by subtracting the previous segment's own total,
    so the rounding error of a value stays relative to its segment, not to the whole array.
    With ``integral=True`` the caller promises whole-number values whose total stays below
    ``2**53`` (counts, with no sample weights): every float64 partial sum is then exact, and one
    running sum minus its value at each segment's start does it in fewer passes.
    """
    values = values.to(torch.float64)
    ids, num = segment_ids(starts)
    if num <= 1:
        inclusive = torch.cumsum(values, 0)
        return inclusive - values if exclusive else inclusive
    first = torch.nonzero(starts).reshape(-1)
    if integral:
        inclusive = torch.cumsum(values, 0)
        before = inclusive - values
        out = before if exclusive else inclusive
        return out.sub_(before[first][ids])
    totals = segment_sum(values, ids, num)
    adjusted = values.clone()
    adjusted[first[1:]] -= totals[:-1]
    # after the reset, the running sum carries only the rounding residue of earlier segments
    inclusive = torch.cumsum(adjusted, 0)
    residue = inclusive[first] - values[first]
    inclusive -= residue[ids]
    return inclusive - values if exclusive else inclusive
