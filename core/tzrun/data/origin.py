"""Where the rows of a batch came from, so that a bad value is named by its file and line.

A batch is cut from record batches of one or more row groups (and, when shuffling, permuted
within a window). :class:`RowOrigin` keeps the runs of rows it was cut from, and the
permutation; :func:`located` turns a :class:`~tzrun.errors.BadRowError` (which knows only the
bad row's position in the batch) into an error naming the file and the reader's description
of the row: ``line 151`` for text, ``row 150`` for Parquet (see :func:`describe_row`).
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from tzrun.errors import BadRowError, DataError
from tzrun.interfaces import Reader, RowGroup

__all__ = ["Run", "RowOrigin", "take_runs", "located", "describe_row"]


@attrs.frozen
class Run:
    """``num_rows`` consecutive rows of ``group``, the first being row ``start`` of the group."""

    group: RowGroup
    start: int
    num_rows: int


def take_runs(runs: Sequence[Run], n: int) -> tuple[list[Run], list[Run]]:
    """The runs of the first ``n`` rows of ``runs``, and the runs of the rest."""
    head: list[Run] = []
    rest = list(runs)
    while n > 0 and rest:
        run = rest.pop(0)
        if run.num_rows <= n:
            head.append(run)
            n -= run.num_rows
        else:
            head.append(Run(run.group, run.start, n))
            rest.insert(0, Run(run.group, run.start + n, run.num_rows - n))
            n = 0
    return head, rest


@attrs.frozen
class RowOrigin:
    """The rows a batch was cut from: row ``i`` of the batch is row ``order[i]`` of the
    concatenated ``runs`` (row ``i`` itself without ``order``)."""

    runs: tuple[Run, ...]
    order: Any = None

    def locate(self, row: int) -> tuple[RowGroup, int]:
        """The group of row ``row`` of the batch, and its row within the group."""
        at = int(self.order[row]) if self.order is not None else row
        for run in self.runs:
            if at < run.num_rows:
                return run.group, run.start + at
            at -= run.num_rows
        raise IndexError(row)


def describe_row(reader: Reader, group: RowGroup, row: int) -> str:
    """How ``reader`` names row ``row`` of ``group``: its ``describe_row(group, row)`` when it
    has one (the csv reader answers with the line number), else the row's index in the group."""
    describe = getattr(reader, "describe_row", None)
    if describe is not None:
        return str(describe(group, row))
    return f"row {row} of row group {group.index}"


def located(exc: DataError, origin: RowOrigin | None, reader: Reader) -> DataError:
    """``exc`` naming the file and row of the batch's first bad row, when it is a
    :class:`BadRowError` and the row can be found; ``exc`` itself otherwise."""
    if not isinstance(exc, BadRowError) or origin is None:
        return exc
    try:
        group, row = origin.locate(exc.batch_row)
        where = describe_row(reader, group, row)
    except Exception:  # locating is a courtesy: the batch's own message still holds
        return exc
    return BadRowError(f"{group.path}: {where}: {exc.detail}", exc.batch_row, exc.detail)
