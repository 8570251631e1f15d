"""Bad rows a reader isolates itself (malformed lines, unparsable fields) under
``data.on_bad_row = "skip"``: the reader marks them in :data:`~tzrun.interfaces.BAD_ROW_COLUMN`
(see :class:`~tzrun.interfaces.Reader`), and they are left out before the batch is built,
counted by reason in the batch's :attr:`~tzrun.data.batch.Batch.skipped`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa

from tzrun.interfaces import BAD_ROW_COLUMN, BAD_ROW_SEPARATOR, Reader

if TYPE_CHECKING:
    from tzrun.data.batch import SkippedRows

__all__ = ["read_columns", "split_bad_rows", "with_reader_skipped", "check_bad_row_fraction"]

def read_columns(reader: Reader, columns: Sequence[str], on_bad_row: str) -> list[str]:
    """``columns``, and ``BAD_ROW_COLUMN`` when ``on_bad_row`` is ``"skip"`` and ``reader``
    isolates bad rows (``isolates_bad_rows = True``)."""
    if on_bad_row == "skip" and getattr(reader, "isolates_bad_rows", False):
        return [*columns, BAD_ROW_COLUMN]
    return list(columns)


def split_bad_rows(table: pa.Table | pa.RecordBatch) -> tuple[pa.Table | pa.RecordBatch, "SkippedRows | None"]:
    """``table`` without the rows its reader marked bad (and without ``BAD_ROW_COLUMN``), and
    their counts by reason (``None`` when the reader marked nothing)."""
    from tzrun.data.batch import SkippedRows

    if BAD_ROW_COLUMN not in table.column_names:
        return table, None
    at = table.column_names.index(BAD_ROW_COLUMN)
    marks = table.column(at)
    table = table.remove_column(at)
    if marks.null_count == len(marks):
        return table, None
    bad = np.asarray(marks.is_valid())
    counts: dict[str, int] = {}
    for why in marks.filter(pa.array(bad)).to_pylist():
        for reason in str(why).split(BAD_ROW_SEPARATOR):
            counts[reason] = counts.get(reason, 0) + 1
    return table.filter(pa.array(~bad)), SkippedRows(int(bad.sum()), counts)


def with_reader_skipped(batch: Any, skipped: "SkippedRows") -> Any:
    """``batch`` with ``skipped`` (the rows its reader marked bad) added to its counts."""
    from tzrun.data.batch import SkippedRows

    total = SkippedRows()
    total.add(batch.skipped)
    total.add(skipped)
    batch.skipped = total
    return batch


def check_bad_row_fraction(total: "SkippedRows", max_fraction: float | None) -> None:
    """Stop the run when the rows left out are more than ``max_fraction`` of those read.

    Args:
        total: the counts over all ranks (:attr:`~tzrun.data.batch.SkippedRows.read` set).
        max_fraction: ``data.max_bad_row_fraction`` (``None``: no limit).

    Raises:
        DataError: naming the fraction, the counts per reason and the option.
    """
    from tzrun.errors import DataError

    if max_fraction is None or total.read <= 0 or total.rows <= max_fraction * total.read:
        return
    reasons = ", ".join(f"{p}: {n}" for p, n in sorted(total.problems.items(), key=lambda item: (-item[1], item[0])))
    raise DataError(
        f"{total.rows / total.read:.2%} of the training rows read so far were bad and left out ({total.rows} of "
        f"{total.read}, all ranks; {reasons}), more than data.max_bad_row_fraction = {max_fraction:g}; fix the data "
        f"or data.reader (column_types, delimiter), or raise data.max_bad_row_fraction"
    )
