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

__all__ = ["Segment", "RankSplit", "split_rows", "BatchStream", "padded"]


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
    """

    segments: tuple[Segment, ...]
    num_rows: int
    num_batches: int
    steps: int


def split_rows(groups: Sequence[RowGroup], rank: int, world_size: int, batch_size: int) -> RankSplit:
    """Rank ``rank``'s share of ``groups`` (see the module docstring)."""
    total = sum(g.num_rows for g in groups)
    bounds = [total * r // world_size for r in range(world_size + 1)]
    begin, end = bounds[rank], bounds[rank + 1]
    segments, offset = [], 0
    for group in groups:
        lo, hi = max(begin, offset), min(end, offset + group.num_rows)
        if lo < hi:
            segments.append(Segment(group, lo - offset, hi - offset))
        offset += group.num_rows
    steps = max(math.ceil((bounds[r + 1] - bounds[r]) / batch_size) for r in range(world_size))
    return RankSplit(tuple(segments), end - begin, math.ceil((end - begin) / batch_size), steps)


def _worker_batches(num_batches: int, worker: int, num_workers: int) -> tuple[int, int]:
    return num_batches * worker // num_workers, num_batches * (worker + 1) // num_workers


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
        first, last = _worker_batches(self.split.num_batches, worker, num_workers)
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

    def torch_dataset(self) -> Any:
        """A ``torch.utils.data.IterableDataset`` that splits this stream across workers."""
        from torch.utils.data import IterableDataset, get_worker_info

        stream = self

        class _Dataset(IterableDataset):
            def __iter__(self) -> Iterator[Any]:
                info = get_worker_info()
                worker, workers = (info.id, info.num_workers) if info else (0, 1)
                return stream.iter_worker(worker, workers)

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
