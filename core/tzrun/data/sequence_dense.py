"""The numeric sequences of a ``[[features.sequence]]`` group (``[[features.sequence.dense]]``)
-> one padded ``[rows, max_len, k]`` float32 array per group (``batch.sequence_dense``).

A row's values are a list of numbers (or, with the group's ``separator``, a string split on it,
empty pieces dropped); a null row is an empty sequence. A null or NaN entry takes the feature's
``fill_value`` and keeps its place, so the row stays aligned with its ids. A row whose length
differs from the group's id sequences', and an infinite value, are bad rows
(``data.on_bad_row``). Rows are truncated as the group's ``keep`` says, exactly as its ids are,
then ``log1p`` and ``(x - mean) / std`` apply, and each row is left-aligned with zeros after it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun.data.columns import BadRows, read_column
from tzrun.errors import DataError
from tzrun.interfaces import DenseFeature, SequenceGroup

__all__ = ["read_sequence_dense", "kept_positions"]


def _is_list(typ: pa.DataType) -> bool:
    return bool(pa.types.is_list(typ) or pa.types.is_large_list(typ))


def _jagged_floats(column: pa.Array, feature: DenseFeature, separator: str | None, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(float32 values row after row, values per row)``; nulls and NaN set to ``fill_value``."""
    if not _is_list(column.type):
        text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        if not (text and separator is not None):
            need = "a list of numbers" + (f", or text split on separator = {separator!r}" if separator else "")
            raise DataError(f"{where} has type {column.type}; expected {need}")
        column = pc.split_pattern(column, separator)
        flat = column.flatten()
        keep = np.asarray(pc.binary_length(flat).fill_null(0).to_numpy(zero_copy_only=False)) > 0
        row_of = np.repeat(np.arange(len(column)), np.asarray(column.value_lengths().fill_null(0), dtype=np.int64))
        lengths = np.bincount(row_of[keep], minlength=len(column)).astype(np.int32)
        flat = _parsed(flat.filter(pa.array(keep)), where)
    else:
        lengths = np.array(column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int32)
        flat = column.flatten()
        if not (pa.types.is_integer(flat.type) or pa.types.is_floating(flat.type) or pa.types.is_boolean(flat.type)):
            raise DataError(f"{where} has type {column.type}; expected a list of numbers")
    values = np.array(flat.cast(pa.float32()).fill_null(feature.fill_value).to_numpy(zero_copy_only=False),
                      dtype=np.float32, copy=True)
    values[np.isnan(values)] = feature.fill_value
    return values, lengths


def _parsed(pieces: pa.Array, where: str) -> pa.Array:
    """Text pieces as float64; a piece that is no number is an error naming it."""
    try:
        return pc.cast(pc.utf8_trim_whitespace(pieces), pa.float64())
    except pa.ArrowInvalid:
        for value in pieces.to_pylist():
            try:
                float(value)
            except ValueError:
                raise DataError(f"{where}: value {value!r} is not a number") from None
        raise


def kept_positions(lengths: np.ndarray, max_len: int, first: bool) -> np.ndarray:
    """A mask over a jagged array's values: each row's last ``max_len`` (its first with
    ``first``), the rule the group's ids are truncated by."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    position = np.arange(int(lengths.sum())) - starts
    return np.asarray(position < max_len if first else position >= np.repeat(lengths, lengths) - max_len)


def _padded(values: np.ndarray, lengths: np.ndarray, max_len: int) -> np.ndarray:
    """Rows of at most ``max_len`` values as ``[rows, max_len]``, left-aligned, zeros after."""
    out = np.zeros((lengths.size, max_len), dtype=np.float32)
    rows = np.repeat(np.arange(lengths.size), lengths)
    position = np.arange(values.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, position] = values
    return out


def _check_row(group: SequenceGroup, feature: DenseFeature, values: np.ndarray, lengths: np.ndarray,
               id_lengths: np.ndarray, bad: BadRows) -> None:
    """Report rows whose length differs from the ids', and rows with an infinite value."""
    ids = group.features[0]
    differ = lengths != id_lengths
    if differ.any():
        row = int(np.flatnonzero(differ)[0])
        bad.found(
            f"{group.name}: sequences of different lengths",
            differ,
            lambda n: f"column '{feature.column}' (dense sequence '{feature.name}' of group '{group.name}') has "
            f"{lengths[row]} value(s) where column '{ids.column}' has {id_lengths[row]} id(s) ({n} of {bad.rows} rows "
            "of this batch differ); a group's sequences must be aligned",
        )
    inf = np.isinf(values)
    if inf.any():
        rows = np.zeros(lengths.size, dtype=bool)
        rows[np.repeat(np.arange(lengths.size), lengths)[inf]] = True
        first = values[inf][0]
        bad.found(
            f"{feature.column}: inf",
            rows,
            lambda n: f"column '{feature.column}' (dense sequence '{feature.name}' of group '{group.name}') has an "
            f"infinite value in {n} of {bad.rows} rows of this batch (first: {first}); fix the data",
        )


def read_sequence_dense(table: pa.Table | pa.RecordBatch, group: SequenceGroup, id_lengths: np.ndarray, source: str,
                        bad: BadRows) -> np.ndarray:
    """The group's dense sequences as ``[rows, max_len, len(group.dense)]`` float32.

    Args:
        table: the input rows.
        group: the sequence group (with at least one ``dense`` feature).
        id_lengths: ids per row of the group's first id sequence, before truncation.
        source: the file, named in errors.
        bad: where misaligned rows and infinite values are reported.

    Raises:
        DataError: for a missing column, one of the wrong type, or a piece that is no number.
    """
    out = np.zeros((table.num_rows, group.max_len, len(group.dense)), dtype=np.float32)
    for j, feature in enumerate(group.dense):
        where = f"{source}: column '{feature.column}' (dense sequence '{feature.name}' of group '{group.name}')"
        values, lengths = _jagged_floats(read_column(table, feature.column, source), feature, group.features[0].separator,
                                          where)
        _check_row(group, feature, values, lengths, id_lengths, bad)
        if lengths.size and int(lengths.max()) > group.max_len:
            values = values[kept_positions(lengths, group.max_len, group.keep == "first")]
            lengths = np.minimum(lengths, group.max_len).astype(np.int32)
        if feature.log1p:
            values = np.log1p(np.maximum(values, 0.0))
        if feature.mean != 0.0 or feature.std != 1.0:
            values = (values - np.float32(feature.mean)) / np.float32(feature.std)
        out[:, :, j] = _padded(values.astype(np.float32), lengths, group.max_len)
    return out
