"""Reading a rank's rows when they are scattered: each row group read once, only the wanted rows kept.

The rows of a resumed partial epoch are the rows not consumed yet; after a shuffled epoch
stopped mid-window they are thousands of single rows (the rest of a window's permutation).
Reading each such row on its own decodes its row group from the start every time, and the
one-row slice keeps the whole decoded record batch alive: memory grew without bound before the
first step (issue 20). Here consecutive pieces of one row group are read in one pass, and a
decoded record batch of which only a few rows are wanted is copied down to those rows, so
memory holds the wanted rows (at most twice over) plus one decoded record batch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa

from tzrun.data.origin import Run
from tzrun.interfaces import Reader, RowGroup

__all__ = ["group_pieces", "read_pieces"]

Interval = tuple[int, int]


def group_pieces(segments: Sequence[Any], row: int, stop_row: int) -> Iterator[tuple[RowGroup, list[Interval]]]:
    """Rows ``[row, stop_row)`` of the concatenated ``segments`` (each with ``group``, ``start``,
    ``stop``) as ``(group, pieces)``: runs of consecutive segments of one row group with rising
    rows, each piece a ``[start, stop)`` of rows of the group, in reading order."""
    group: RowGroup | None = None
    pieces: list[Interval] = []
    offset = 0
    for segment in segments:
        size = segment.stop - segment.start
        lo, hi = max(row, offset), min(stop_row, offset + size)
        first = offset
        offset += size
        if lo >= hi:
            continue
        start = segment.start + lo - first
        if pieces and (segment.group != group or start < pieces[-1][1]):
            assert group is not None
            yield group, pieces
            pieces = []
        group = segment.group
        pieces.append((start, start + hi - lo))
    if pieces:
        assert group is not None
        yield group, pieces


def read_pieces(
    reader: Reader, group: RowGroup, pieces: Sequence[Interval], columns: Sequence[str],
    see: Callable[[pa.Schema, str], None],
) -> Iterator[tuple[pa.RecordBatch, str, Run]]:
    """The rows of ``pieces`` of ``group`` (see :func:`group_pieces`), read in one pass of
    ``reader``: one record batch per piece (or part of a piece), with the file and the
    :class:`~tzrun.data.origin.Run` of rows it holds. ``see`` is called with each decoded
    record batch's schema and the file."""
    import numpy as np

    at, i = pieces[0][0], 0
    for record_batch in reader.read(group, pieces[0][0], pieces[-1][1], columns):
        see(record_batch.schema, group.path)
        end = at + record_batch.num_rows
        inside: list[Interval] = []  # the wanted rows of this record batch, relative to it
        while i < len(pieces) and pieces[i][0] < end:
            inside.append((max(pieces[i][0], at) - at, min(pieces[i][1], end) - at))
            if pieces[i][1] > end:
                break
            i += 1
        wanted = sum(b - a for a, b in inside)
        source, base = record_batch, None
        if wanted and 2 * wanted < record_batch.num_rows:  # copy out the few rows wanted
            source = record_batch.take(pa.array(np.concatenate([np.arange(a, b) for a, b in inside])))
            base = 0
        for a, b in inside:
            offset = a if base is None else base
            yield source.slice(offset, b - a), group.path, Run(group, at + a, b - a)
            if base is not None:
                base += b - a
        at = end
