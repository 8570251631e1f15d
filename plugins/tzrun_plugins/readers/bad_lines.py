"""Bad rows of delimited text under ``data.on_bad_row = "skip"``: malformed lines and fields
that do not parse as their column's type, kept in place as null rows with their reasons in
``tzrun.BAD_ROW_COLUMN`` (see :class:`tzrun.Reader`).

The normal path costs nothing: a block is parsed with its declared types as always, and only
a block that fails to convert is parsed again as text, each failing column converted with its
unparsable values found by bisection (a few casts per bad value) and set to null.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun import BAD_ROW_COLUMN, BAD_ROW_SEPARATOR

__all__ = ["MALFORMED", "UNBALANCED_QUOTE", "convert_fields", "with_bad_rows", "with_rows_left_out"]

#: The reason of a line with the wrong number of fields (a truncated last line included).
MALFORMED = "malformed line"

#: The reason of a line that ends inside a quoted value (see :mod:`tzrun_plugins.readers.quoting`).
UNBALANCED_QUOTE = "unbalanced quote"


def _not_a(typ: pa.DataType) -> str:
    if pa.types.is_integer(typ):
        return "not an integer"
    if pa.types.is_floating(typ):
        return "not a number"
    if pa.types.is_boolean(typ):
        return "not a bool"
    return f"not a {typ}"


def _unparsable(values: pa.Array, typ: pa.DataType, offset: int = 0) -> list[int]:
    """The positions (plus ``offset``) of the values of the string array ``values`` that do not
    cast to ``typ``, found by bisection."""
    try:
        pc.cast(values, typ)
        return []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if len(values) == 1:
            return [offset]
    half = len(values) // 2
    return _unparsable(values.slice(0, half), typ, offset) + _unparsable(values.slice(half), typ, offset + half)


def convert_fields(table: pa.Table, types: Mapping[str, pa.DataType]) -> tuple[pa.Table, dict[int, list[str]]]:
    """``table`` (every column read as text) with each column cast to its type in ``types``, a
    field that does not parse becoming null.

    Returns:
        The converted table, and the reasons of each row (by position) that had such a field,
        ``"<column>: not a number"``.
    """
    reasons: dict[int, list[str]] = {}
    columns = []
    for name in table.column_names:
        text, typ = table.column(name).combine_chunks(), types[name]
        if typ == pa.string():
            columns.append(text)
            continue
        bad = _unparsable(text, typ)
        if bad:
            mask = np.zeros(len(text), bool)
            mask[bad] = True
            text = pc.if_else(pa.array(mask), pa.nulls(len(text), pa.string()), text)
            for row in bad:
                reasons.setdefault(row, []).append(f"{name}: {_not_a(typ)}")
        columns.append(pc.cast(text, typ))
    return pa.table(columns, names=table.column_names), reasons


def with_bad_rows(table: pa.Table, rows: int, malformed: Sequence[int], reasons: Mapping[int, list[str]]) -> pa.Table:
    """``rows`` rows: those of ``table`` (the rows parsed, ``malformed`` left out) in their
    places, a null row at each 0-based position in ``malformed``, and ``BAD_ROW_COLUMN``.

    Args:
        reasons: problems of rows of ``table``, by their position in ``table``.
    """
    if not malformed and not reasons:
        return table.append_column(BAD_ROW_COLUMN, pa.nulls(table.num_rows, pa.string()))
    place = np.ones(rows, bool)
    place[[m for m in malformed if 0 <= m < rows]] = False
    positions = np.flatnonzero(place)[: table.num_rows]
    if positions.size < table.num_rows:  # a row the parser could not place: keep the rows, put the nulls last
        positions = np.arange(table.num_rows)
    take = np.full(rows, -1, np.int64)
    take[positions] = np.arange(positions.size)
    full = table.take(pa.array(take, mask=take < 0)) if positions.size != rows else table
    why: list[str | None] = [None] * rows
    for at in np.flatnonzero(take < 0):
        why[int(at)] = MALFORMED
    for row, problems in reasons.items():
        why[int(positions[row])] = BAD_ROW_SEPARATOR.join(problems)
    return full.append_column(BAD_ROW_COLUMN, pa.array(why, pa.string()))


def with_rows_left_out(table: pa.Table, rows: int, at: np.ndarray, reason: str) -> pa.Table:
    """``rows`` rows: those of ``table`` (which has ``BAD_ROW_COLUMN``) in order, and a null row
    marked ``reason`` at each 0-based position in ``at`` (rows that were not parsed)."""
    left_out = np.zeros(rows, bool)
    left_out[at] = True
    take = np.full(rows, -1, np.int64)
    take[~left_out] = np.arange(rows - at.size)
    full = table.take(pa.array(take, mask=left_out))
    where = full.column_names.index(BAD_ROW_COLUMN)
    marks = pc.if_else(pa.array(left_out), pa.scalar(reason, pa.string()), full.column(where))
    return full.set_column(where, BAD_ROW_COLUMN, marks)
