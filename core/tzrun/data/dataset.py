"""Splitting an input across ranks and DataLoader workers, and streaming batches from it.

The rows of an input (its row groups, concatenated in the reader's order) are split into one
contiguous range per rank whose sizes differ by at most one row; each rank's range is cut into
batches of ``batch_size`` rows (the last may be shorter), and each DataLoader worker of the rank
reads a contiguous run of those batches. Every row is read exactly once per pass. The split
comes from row-group metadata only, so every rank knows every rank's batch count without a
collective; ranks with fewer batches feed weight-0 padding batches so that all ranks run the
same number of steps (TorchRec's sharded embeddings need matching collectives on every step).
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import attrs
import pyarrow as pa

from tzrun.interfaces import Reader, RowGroup

__all__ = [
    "Segment",
    "RankSplit",
    "split_rows",
    "worker_runs",
    "round_robin",
    "resume_layout",
    "consumed_rows",
    "merge_intervals",
    "subtract_intervals",
    "BatchStream",
    "padded",
]


@attrs.frozen
class Segment:
    """Rows ``[start, stop)`` of one row group."""

    group: RowGroup
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


@attrs.frozen
class RankSplit:
    """What one rank reads in one pass, and how many steps every rank runs.

    Attributes:
        segments: this rank's rows, in order.
        num_rows: rows this rank reads.
        num_batches: batches this rank reads.
        steps: batches per pass on every rank (the most any rank has).
        rows: this rank's rows as global row intervals, in reading order.
    """

    segments: tuple[Segment, ...]
    num_rows: int
    num_batches: int
    steps: int
    rows: tuple[tuple[int, int], ...] = ()


Interval = tuple[int, int]


def split_rows(
    groups: Sequence[RowGroup],
    rank: int,
    world_size: int,
    batch_size: int,
    rows: Sequence[Interval] | None = None,
) -> RankSplit:
    """Rank ``rank``'s share of ``groups`` (see the module docstring).

    Args:
        rows: the global row intervals ``[start, stop)`` to read in this pass, in order
            (default: every row). A resumed epoch reads only the rows not consumed yet; they
            are shared out across the ranks as if they were the whole input.
    """
    total = sum(g.num_rows for g in groups)
    wanted = [(0, total)] if rows is None else [(a, b) for a, b in rows if b > a]
    count = sum(b - a for a, b in wanted)
    bounds = [count * r // world_size for r in range(world_size + 1)]
    mine = _take(wanted, bounds[rank], bounds[rank + 1])
    segments = []
    for start, stop in mine:
        offset = 0
        for group in groups:
            lo, hi = max(start, offset), min(stop, offset + group.num_rows)
            if lo < hi:
                segments.append(Segment(group, lo - offset, hi - offset))
            offset += group.num_rows
    size = bounds[rank + 1] - bounds[rank]
    steps = max(math.ceil((bounds[r + 1] - bounds[r]) / batch_size) for r in range(world_size))
    return RankSplit(tuple(segments), size, math.ceil(size / batch_size), steps, tuple(mine))


def _take(intervals: Sequence[Interval], begin: int, end: int) -> list[Interval]:
    """Rows ``[begin, end)`` of the concatenation of ``intervals``, as global intervals."""
    out, offset = [], 0
    for a, b in intervals:
        lo, hi = max(begin, offset), min(end, offset + b - a)
        if lo < hi:
            out.append((a + lo - offset, a + hi - offset))
        offset += b - a
    return out


def worker_runs(num_batches: int, num_workers: int) -> list[Interval]:
    """The contiguous run of batch indices each DataLoader worker of a rank reads."""
    return [(num_batches * w // num_workers, num_batches * (w + 1) // num_workers) for w in range(num_workers)]


def round_robin(runs: Sequence[Interval], skip: Sequence[int] | None = None, first: int = 0) -> Iterator[tuple[int, int]]:
    """The ``(worker, batch)`` order in which a DataLoader yields the batches of workers with
    the given runs: one batch per active worker in turn (starting at worker ``first``), a
    worker leaving the cycle when its run is done. ``skip`` batches of each run are left out."""
    nexts = [a + (skip[w] if skip else 0) for w, (a, _) in enumerate(runs)]
    active = [w for w in list(range(first, len(runs))) + list(range(first)) if nexts[w] < runs[w][1]]
    while active:
        still = []
        for w in active:
            yield w, nexts[w]
            nexts[w] += 1
            if nexts[w] < runs[w][1]:
                still.append(w)
        active = still


def resume_layout(runs: Sequence[Interval], done: int) -> tuple[list[Interval], list[int]]:
    """Where each worker stands after the first ``done`` batches of the round-robin order,
    and the worker order that continues it exactly.

    Returns:
        ``(remaining_runs, order)``: each worker's not-yet-read run, and the workers listed
        in the order a fresh DataLoader must cycle through them (give new worker ``i`` the
        run of ``order[i]``; exhausted workers come last, with empty runs).
    """
    consumed = [0] * len(runs)
    next_worker = 0
    for i, (w, _) in enumerate(round_robin(runs)):
        if i == done:
            next_worker = w
            break
        consumed[w] += 1
    remaining = [(a + consumed[w], b) for w, (a, b) in enumerate(runs)]
    cycle = list(range(next_worker, len(runs))) + list(range(next_worker))
    order = [w for w in cycle if remaining[w][0] < remaining[w][1]]
    order += [w for w in cycle if remaining[w][0] >= remaining[w][1]]
    return remaining, order


def consumed_rows(split_rows_in_order: Sequence[Interval], batch_size: int, num_rows: int, runs: Sequence[Interval], done: int) -> list[Interval]:
    """The global row intervals a rank has consumed after ``done`` steps of a pass.

    Args:
        split_rows_in_order: the rank's rows, as global intervals in reading order.
        batch_size: rows per batch.
        num_rows: rows of the rank.
        runs: its workers' batch runs.
        done: steps done in the pass (padding steps consume nothing).
    """
    remaining, _ = resume_layout(runs, done)
    taken = []
    for (a, _), (r, _) in zip(runs, remaining):
        if r > a:
            taken.extend(_take(split_rows_in_order, a * batch_size, min(r * batch_size, num_rows)))
    return merge_intervals(taken)


def merge_intervals(intervals: Sequence[Interval]) -> list[Interval]:
    """Sorted, merged, non-empty intervals."""
    out: list[list[int]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract_intervals(total: int, taken: Sequence[Interval]) -> list[Interval]:
    """``[0, total)`` minus ``taken``."""
    out, at = [], 0
    for a, b in merge_intervals(taken):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < total:
        out.append((at, total))
    return out


class BatchStream:
    """An iterable over one rank's batches for one pass; picklable for DataLoader workers.

    Args:
        reader: the run's reader.
        split: this rank's rows.
        batch_size: rows per batch.
        columns: input columns to read.
        builder: turns an Arrow table into a :class:`~tzrun.data.batch.Batch`.
    """

    def __init__(
        self, reader: Reader, split: RankSplit, batch_size: int, columns: Sequence[str], builder: Any
    ) -> None:
        self.reader, self.split, self.batch_size = reader, split, batch_size
        self.columns, self.builder = list(columns), builder

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """The batches of worker ``worker`` of ``num_workers``, in order."""
        first, last = worker_runs(self.split.num_batches, num_workers)[worker]
        return self.iter_run(first, last)

    def iter_run(self, first: int, last: int) -> Iterator[Any]:
        """Batches ``first`` to ``last - 1`` of this rank's pass, in order."""
        if first >= last:
            return
        row, stop_row = first * self.batch_size, min(last * self.batch_size, self.split.num_rows)
        pending: list[pa.RecordBatch] = []
        pending_rows, source = 0, ""
        offset = 0
        for segment in self.split.segments:
            lo, hi = max(row, offset), min(stop_row, offset + segment.num_rows)
            offset += segment.num_rows
            if lo >= hi:
                continue
            source = segment.group.path
            start = segment.start + (lo - (offset - segment.num_rows))
            for record_batch in self.reader.read(segment.group, start, start + (hi - lo), self.columns):
                pending.append(record_batch)
                pending_rows += record_batch.num_rows
                while pending_rows >= self.batch_size:
                    table = pa.Table.from_batches(pending)
                    yield self.builder(table.slice(0, self.batch_size), source)
                    rest = table.slice(self.batch_size)
                    pending = rest.to_batches()
                    pending_rows = rest.num_rows
        if pending_rows:
            yield self.builder(pa.Table.from_batches(pending), source)

    def torch_dataset(self, runs: Sequence[tuple[int, int]]) -> Any:
        """A ``torch.utils.data.IterableDataset`` whose worker ``i`` reads batch run ``runs[i]``."""
        from torch.utils.data import IterableDataset, get_worker_info

        stream = self
        plan = list(runs)

        class _Dataset(IterableDataset):
            def __iter__(self) -> Iterator[Any]:
                info = get_worker_info()
                worker = info.id if info else 0
                return stream.iter_run(*plan[worker])

        return _Dataset()


def padded(batches: Iterator[Any], steps: int, make_padding: Any) -> Iterator[Any]:
    """``batches`` followed by padding batches up to ``steps`` in all."""
    count = 0
    for batch in batches:
        if count == steps:
            return
        count += 1
        yield batch
    for _ in range(steps - count):
        yield make_padding()
