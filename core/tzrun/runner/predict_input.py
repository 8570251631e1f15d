"""The rows ``tzrec-run predict`` scores on one rank: its share of the input, in input order,
cut into chunks that remember each row's global position and which rows were left out.

The rows of the input (its row groups in the reader's order) are shared out as in training
and evaluation (:func:`~tzrun.data.dataset.split_rows`: one contiguous range per rank, rank 0
first), and each rank reads its range in order, without shuffling or DataLoader workers, so
that writing each rank's scores in rank order gives the input's order. Every chunk knows the
global row number of each of its rows, so a row left out under ``data.on_bad_row = "skip"``
is listed by number, never silently shifted.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import attrs
import numpy as np
import pyarrow as pa

from tzrun.data.dataset import RankSplit, split_rows
from tzrun.data.origin import RowOrigin, take_runs
from tzrun.data.pieces import group_pieces, read_pieces
from tzrun.data.schemas import SchemaUnifier
from tzrun.interfaces import BAD_ROW_COLUMN, BAD_ROW_SEPARATOR, Reader

__all__ = ["Chunk", "Skipped", "rank_split", "read_chunks", "drop_reader_marked", "drop_rows", "prefetched", "mapped"]


@attrs.define
class Skipped:
    """Input rows left out, by global row number, each with its problem(s)."""

    rows: list[int] = attrs.field(factory=list)
    problems: list[str] = attrs.field(factory=list)

    def add(self, rows: np.ndarray, problems: Sequence[str]) -> None:
        self.rows.extend(int(r) for r in rows)
        self.problems.extend(problems)


@attrs.define
class Chunk:
    """Consecutive rows of this rank's share, as read.

    Attributes:
        table: the rows still to score (rows found bad so far removed).
        rows: the global row number of each row of ``table`` (int64).
        source: the file(s) the rows came from, for messages.
        origin: where each row of the chunk as read came from (for a bad row's file and line).
    """

    table: pa.Table
    rows: np.ndarray
    source: str
    origin: RowOrigin


def rank_split(reader: Reader, path: str, batch_size: int, rank: int, world_size: int) -> RankSplit:
    """This rank's rows of the input at ``path`` (``steps``: the chunks of the rank with the most)."""
    from tzrun.errors import DataError

    groups = reader.row_groups(path)
    if sum(g.num_rows for g in groups) == 0:
        raise DataError(f"{path}: the input has no rows")
    return split_rows(groups, rank, world_size, batch_size)


def read_chunks(reader: Reader, split: RankSplit, batch_size: int, columns: Sequence[str]) -> Iterator[Chunk]:
    """This rank's rows in order, ``batch_size`` at a time (the last chunk may be shorter)."""
    unifier = SchemaUnifier()
    at = split.rows[0][0] if split.rows else 0
    pending: list[pa.RecordBatch] = []
    runs: list[Any] = []
    count, source = 0, ""
    for group, pieces in group_pieces(split.segments, 0, split.num_rows):
        for record_batch, source, run in read_pieces(reader, group, pieces, columns, unifier.see):
            pending.append(record_batch)
            runs.append(run)
            count += record_batch.num_rows
            while count >= batch_size:
                table = unifier.table(pending)
                head, runs = take_runs(runs, batch_size)
                yield Chunk(table.slice(0, batch_size), np.arange(at, at + batch_size, dtype=np.int64), source,
                            RowOrigin(tuple(head)))
                at += batch_size
                rest = table.slice(batch_size)
                pending, count = rest.to_batches(), rest.num_rows
    if count:
        yield Chunk(unifier.table(pending), np.arange(at, at + count, dtype=np.int64), source, RowOrigin(tuple(runs)))


def drop_reader_marked(chunk: Chunk, skipped: Skipped) -> Chunk:
    """``chunk`` without the rows its reader marked bad (:data:`BAD_ROW_COLUMN`, asked for under
    ``data.on_bad_row = "skip"``), which are added to ``skipped`` with the reader's reasons."""
    table = chunk.table
    if BAD_ROW_COLUMN not in table.column_names:
        return chunk
    marks = table.column(BAD_ROW_COLUMN)
    table = table.drop_columns([BAD_ROW_COLUMN])
    bad = np.asarray(marks.is_valid())
    if bad.any():
        skipped.add(chunk.rows[bad], [str(m) for m in marks.filter(pa.array(bad)).to_pylist()])
    return drop_rows(attrs.evolve(chunk, table=table), bad, skipped=None)


def drop_rows(chunk: Chunk, bad: np.ndarray | None, *, skipped: Skipped | None = None,
              masks: dict[str, np.ndarray] | None = None) -> Chunk:
    """``chunk`` without the rows ``bad`` marks; with ``masks`` (problem -> rows), those rows go
    to ``skipped`` with their problems joined by ``"; "``."""
    if bad is None or not bad.any():
        return chunk
    if skipped is not None and masks:
        which = np.flatnonzero(bad)
        skipped.add(chunk.rows[which],
                    [BAD_ROW_SEPARATOR.join(p for p, m in masks.items() if m[i]) for i in which])
    keep = ~bad
    return attrs.evolve(chunk, table=chunk.table.filter(pa.array(keep)), rows=chunk.rows[keep])


def prefetched(items: Iterator[Any], depth: int, nice: int) -> Iterator[Any]:
    """``items`` built up to ``depth`` ahead on a background thread (``data.prefetch_batches``)."""
    if depth <= 0:
        return items
    from tzrun.data.loader import ThreadPrefetcher

    return ThreadPrefetcher(items, depth, nice)


def mapped(items: Iterator[Any], function: Callable[[Any], Any]) -> Iterator[Any]:
    """``function`` of each item (lazily, on whichever thread takes them)."""
    for item in items:
        yield function(item)
