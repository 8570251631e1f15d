"""Splitting an input across ranks and DataLoader workers, and streaming batches from it.

The rows of an input (its row groups, concatenated in the reader's order) are split into one
contiguous range per rank whose sizes differ by at most one row; each rank's range is cut into
batches of ``batch_size`` rows (the last may be shorter), and each DataLoader worker of the rank
reads a contiguous run of those batches. Every row is read exactly once per pass. The split
comes from row-group metadata only, so every rank knows every rank's batch count without a
collective; ranks with fewer batches feed weight-0 padding batches so that all ranks run the
same number of steps (TorchRec's sharded embeddings need matching collectives on every step).

With a :class:`Shuffle`, each worker's run is cut into windows of ``window_batches`` batches
(from the run's first batch; the last window may be shorter), and the rows of each window are
permuted before they are cut into batches. The permutation depends only on the seed, the epoch
and the window's first global row, so a pass resumed at any step yields the same batches, and
the rows consumed after any step are known exactly (:func:`consumed_rows`). Batch counts and
sizes do not change; memory holds one window.
"""

from __future__ import annotations

import bisect
import collections
import math
from typing import Any, Iterator, Sequence

import attrs
import pyarrow as pa

from tzrun.data.origin import RowOrigin, Run, located, take_runs
from tzrun.data.pieces import group_pieces, read_pieces
from tzrun.data.reader_bad_rows import split_bad_rows, with_reader_skipped
from tzrun.data.schemas import SchemaUnifier
from tzrun.errors import DataError
from tzrun.interfaces import Reader, RowGroup

__all__ = [
    "Shuffle",
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
class Shuffle:
    """Row shuffling within windows of batches (see the module docstring).

    Attributes:
        window_batches: batches per window (at least 1).
        seed: the run's seed.
    """

    window_batches: int
    seed: int

    @classmethod
    def of(cls, buffer_rows: int, batch_size: int, seed: int) -> "Shuffle | None":
        """The shuffle of ``data.shuffle_buffer_rows = buffer_rows`` (None when 0): windows of
        ``buffer_rows`` rounded down to whole batches, at least one."""
        return cls(max(1, buffer_rows // batch_size), seed) if buffer_rows > 0 else None

    def permutation(self, epoch: int, first_row: int, num_rows: int) -> Any:
        """The order of the ``num_rows`` rows of the window whose first global row is
        ``first_row``, in epoch ``epoch``: a numpy array of positions."""
        import numpy as np

        key = [self.seed & (2**64 - 1), epoch, first_row]
        return np.random.Generator(np.random.PCG64(key)).permutation(num_rows)


def windows(run: Interval, window_batches: int) -> list[Interval]:
    """The windows of batch indices of a worker's run ``[a, b)``: from ``a`` on, each
    ``window_batches`` long, the last one shorter."""
    a, b = run
    return [(w, min(w + window_batches, b)) for w in range(a, b, window_batches)]


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
        bounds: cost-aware batches (:mod:`tzrun.data.cost`): the first row of each batch, then
            ``num_rows``; empty: batches of ``batch_size`` rows.
    """

    segments: tuple[Segment, ...]
    num_rows: int
    num_batches: int
    steps: int
    rows: tuple[tuple[int, int], ...] = ()
    bounds: tuple[int, ...] = ()

    def batch_start(self, index: int, batch_size: int = 0) -> int:
        """The first row (in this rank's reading order) of batch ``index``; ``num_rows`` past the last."""
        if self.bounds:
            return self.bounds[min(index, len(self.bounds) - 1)]
        return min(index * batch_size, self.num_rows)


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
    firsts = [0]  # each group's first global row
    for group in groups:
        firsts.append(firsts[-1] + group.num_rows)
    segments = []
    for start, stop in mine:  # thousands of intervals in a resumed shuffled epoch: no scan of every group
        g = bisect.bisect_right(firsts, start) - 1
        while g < len(groups) and firsts[g] < stop:
            lo, hi = max(start, firsts[g]), min(stop, firsts[g + 1])
            if lo < hi:
                segments.append(Segment(groups[g], lo - firsts[g], hi - firsts[g]))
            g += 1
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


def consumed_rows(
    split_rows_in_order: Sequence[Interval],
    batch_size: int,
    num_rows: int,
    runs: Sequence[Interval],
    done: int,
    shuffle: Shuffle | None = None,
    epoch: int = 0,
    bounds: Sequence[int] = (),
) -> list[Interval]:
    """The global row intervals a rank has consumed after ``done`` steps of a pass.

    Args:
        split_rows_in_order: the rank's rows, as global intervals in reading order.
        batch_size: rows per batch.
        num_rows: rows of the rank.
        runs: its workers' batch runs.
        done: steps done in the pass (padding steps consume nothing).
        shuffle, epoch: the pass's shuffle: the rows of a window read in part are the
            permuted ones (several intervals; at most one window per worker is in part).
        bounds: cost-aware batches' first rows (:attr:`RankSplit.bounds`; not with a shuffle).
    """
    def start(index: int) -> int:
        return bounds[min(index, len(bounds) - 1)] if bounds else min(index * batch_size, num_rows)

    remaining, _ = resume_layout(runs, done)
    taken = []
    for (a, b), (r, _) in zip(runs, remaining):
        if r <= a:
            continue
        whole_until = r
        if shuffle is not None:
            w0, w1 = next(w for w in windows((a, b), shuffle.window_batches) if w[0] <= r - 1 < w[1])
            if r < w1:  # a window read in part
                whole_until = w0
                lo, hi = w0 * batch_size, min(w1 * batch_size, num_rows)
                order = shuffle.permutation(epoch, _global_row(split_rows_in_order, lo), hi - lo)
                taken.extend(_positions(split_rows_in_order, lo + order[: (r - w0) * batch_size]))
        if whole_until > a:
            taken.extend(_take(split_rows_in_order, start(a), start(whole_until)))
    return merge_intervals(taken)


def _global_row(intervals: Sequence[Interval], position: int) -> int:
    """The global row at ``position`` of the concatenation of ``intervals``."""
    return _take(intervals, position, position + 1)[0][0]


def _positions(intervals: Sequence[Interval], positions: Any) -> list[Interval]:
    """Positions of the concatenation of ``intervals`` as merged global row intervals."""
    import numpy as np

    starts = np.array([a for a, _ in intervals], dtype=np.int64)
    sizes = np.array([b - a for a, b in intervals], dtype=np.int64)
    ends = np.cumsum(sizes)
    positions = np.sort(np.asarray(positions, dtype=np.int64))
    which = np.searchsorted(ends, positions, side="right")
    rows = starts[which] + positions - (ends[which] - sizes[which])
    if not rows.size:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks, [rows.size]]) - 1
    return merge_intervals([(int(rows[i]), int(rows[j]) + 1) for i, j in zip(firsts, lasts)])


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
        builder: turns an Arrow table into a :class:`~tzrun.data.batch.Batch`:
            ``builder(table, source)``, or, when it has one, ``builder.build_at(table, source,
            epoch, index)`` with the batch's pass and its index in the rank's pass (the same
            whether a pass is read whole, resumed, or by DataLoader workers; see
            :class:`~tzrun.data.sampling.NegativesBuilder`).
    """

    def __init__(
        self,
        reader: Reader,
        split: RankSplit,
        batch_size: int,
        columns: Sequence[str],
        builder: Any,
        shuffle: Shuffle | None = None,
    ) -> None:
        self.reader, self.split, self.batch_size = reader, split, batch_size
        self.columns, self.builder = list(columns), builder
        self.shuffle = shuffle
        #: files' schemas may drift (nullability, integer and float widths): see tzrun.data.schemas
        self.schemas = SchemaUnifier()

    def iter_worker(self, worker: int, num_workers: int, epoch: int = 0) -> Iterator[Any]:
        """The batches of worker ``worker`` of ``num_workers``, in order."""
        first, last = worker_runs(self.split.num_batches, num_workers)[worker]
        return self.iter_run(first, last, epoch=epoch)

    def iter_run(self, first: int, last: int, origin: int | None = None, epoch: int = 0) -> Iterator[Any]:
        """Batches ``first`` to ``last - 1`` of this rank's pass, in order.

        Args:
            origin: the first batch of the worker's whole run, where shuffle windows start
                (default ``first``); ``last`` must be the run's end when shuffling.
            epoch: the pass (it picks the shuffle's permutations).
        """
        if first >= last:
            return
        build_at = getattr(self.builder, "build_at", None)
        for index, (table, source, rows) in enumerate(self._iter_tables(first, last, origin, epoch), first):
            table, reader_skipped = split_bad_rows(table)  # rows the reader marked bad (on_bad_row = "skip")
            if reader_skipped is not None and table.num_rows == 0:
                yield self.builder.padding(reader_skipped)
                continue
            try:
                batch = self.builder(table, source) if build_at is None else build_at(table, source, epoch, index)
            except DataError as exc:
                raise located(exc, rows if reader_skipped is None else None, self.reader) from None
            yield batch if reader_skipped is None else with_reader_skipped(batch, reader_skipped)

    def _iter_tables(
        self, first: int, last: int, origin: int | None, epoch: int
    ) -> Iterator[tuple[pa.Table, str, RowOrigin]]:
        """The rows of batches ``first`` to ``last - 1`` (see :meth:`iter_run`), one table per
        batch, each with the file(s) it came from and where each of its rows came from."""
        if self.shuffle is None:
            sizes = [self.split.batch_start(i + 1, self.batch_size) - self.split.batch_start(i, self.batch_size)
                     for i in range(first, last)]
            yield from self._iter_rows(self.split.batch_start(first, self.batch_size), sizes)
            return
        for w0, w1 in windows((first if origin is None else origin, last), self.shuffle.window_batches):
            if w1 <= first:
                continue
            yield from self._iter_window(w0, w1, max(first, w0), epoch)

    def _iter_window(self, w0: int, w1: int, first: int, epoch: int) -> Iterator[tuple[pa.Table, str, RowOrigin]]:
        """The rows of the batches ``first`` to ``w1 - 1`` of the shuffled window of batches ``[w0, w1)``."""
        assert self.shuffle is not None
        lo, hi = w0 * self.batch_size, min(w1 * self.batch_size, self.split.num_rows)
        parts, sources, runs = [], [], []
        for record_batch, path, run in self._iter_record_batches(lo, hi):
            parts.append(record_batch)
            sources.append(path)
            runs.append(run)
        source = ", ".join(dict.fromkeys(sources))
        order = self.shuffle.permutation(epoch, _global_row(self.split.rows, lo), hi - lo)[(first - w0) * self.batch_size :]
        window = self.schemas.table(parts).take(pa.array(order))
        for start in range(0, window.num_rows, self.batch_size):
            rows = RowOrigin(tuple(runs), order[start : start + self.batch_size])
            yield window.slice(start, self.batch_size), source, rows

    def _iter_record_batches(self, row: int, stop_row: int) -> Iterator[tuple[pa.RecordBatch, str, Run]]:
        """Rows ``[row, stop_row)`` of this rank as the reader's record batches, in order,
        each with the file and the rows of its group it came from."""
        for group, pieces in group_pieces(self.split.segments, row, stop_row):
            yield from read_pieces(self.reader, group, pieces, self.columns, self.schemas.see)

    def _iter_rows(self, row: int, sizes: Sequence[int]) -> Iterator[tuple[pa.Table, str, RowOrigin]]:
        """The rows of this rank from ``row`` on in order, cut into batches' tables of ``sizes`` rows."""
        pending: list[pa.RecordBatch] = []
        runs: list[Run] = []
        pending_rows, source = 0, ""
        todo = collections.deque(n for n in sizes if n > 0)
        for record_batch, source, run in self._iter_record_batches(row, row + sum(todo)):
            pending.append(record_batch)
            runs.append(run)
            pending_rows += record_batch.num_rows
            while todo and pending_rows >= todo[0]:
                size = todo.popleft()
                table = self.schemas.table(pending)
                head, runs = take_runs(runs, size)
                yield table.slice(0, size), source, RowOrigin(tuple(head))
                rest = table.slice(size)
                pending = rest.to_batches()
                pending_rows = rest.num_rows
        if pending_rows:
            yield self.schemas.table(pending), source, RowOrigin(tuple(runs))

    def torch_dataset(
        self, runs: Sequence[tuple[int, int]], origins: Sequence[int] | None = None, epoch: int = 0
    ) -> Any:
        """A ``torch.utils.data.IterableDataset`` whose worker ``i`` reads batch run ``runs[i]``
        (whose whole run started at batch ``origins[i]``) of pass ``epoch``."""
        from torch.utils.data import IterableDataset, get_worker_info

        stream = self
        plan = list(runs)
        starts = list(origins) if origins is not None else [a for a, _ in plan]

        class _Dataset(IterableDataset):
            def __iter__(self) -> Iterator[Any]:
                info = get_worker_info()
                worker = info.id if info else 0
                return stream.iter_run(*plan[worker], origin=starts[worker], epoch=epoch)

        return _Dataset()


def padded(batches: Iterator[Any], steps: int, make_padding: Any) -> Iterator[Any]:
    """``batches`` followed by padding batches up to ``steps`` in all. ``batches`` is closed
    (when it can be) once done with, also when the pass is cut short."""
    count = 0
    try:
        for batch in batches:
            if count == steps:
                return
            count += 1
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    for _ in range(steps - count):
        yield make_padding()
