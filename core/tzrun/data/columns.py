"""One column of an Arrow record batch as numpy arrays, its bad values found.

What :class:`~tzrun.data.features.BatchBuilder` reads from each input column: dense values,
labels (derived ones computed from their source), sample weights, group keys and a feature's
ids; the rules are :mod:`tzrun.data.features`'. A bad value is handed to :class:`BadRows`,
which raises it (``data.on_bad_row = "error"``) or marks its rows to leave out (``"skip"``);
a missing column or a column of the wrong type is a :class:`~tzrun.errors.DataError` either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun.data.hashing import fnv1a_64, hash_to_buckets, is_hashable
from tzrun.data.ids import JaggedIds, jagged_ids
from tzrun.data.labels import DerivedLabel, LabelDomain, derive, violations
from tzrun.errors import BadRowError, DataError
from tzrun.interfaces import DenseFeature, SparseFeature

if TYPE_CHECKING:
    from tzrun.data.batch import SkippedRows

__all__ = [
    "BadRows",
    "HashedDictionaries",
    "read_column",
    "read_floats",
    "fill_nonfinite_dense",
    "read_label",
    "read_sample_weights",
    "read_group_keys",
    "read_ids",
]

class BadRows:
    """The bad rows of one batch: reported at once (``error``) or collected (``skip``)."""

    def __init__(self, source: str, rows: int, skip: bool) -> None:
        self.source, self.rows, self.skip = source, rows, skip
        self.masks: dict[str, np.ndarray] = {}

    def found(self, problem: str, bad: np.ndarray, message: Callable[[int], str]) -> None:
        """Rows ``bad`` (a mask over the batch's rows) have ``problem`` (``"<column>: <what>"``);
        ``message(count)`` is the error's text after the file name."""
        if not self.skip:
            detail = f'{message(int(np.count_nonzero(bad)))}, or set data.on_bad_row = "skip" to leave such rows out'
            raise BadRowError(f"{self.source}: {detail}", int(np.flatnonzero(bad)[0]), detail)
        seen = self.masks.get(problem)
        self.masks[problem] = bad if seen is None else seen | bad

    def dropped(self) -> np.ndarray | None:
        """The rows to leave out (``None`` when there are none)."""
        if not self.masks:
            return None
        return np.logical_or.reduce(list(self.masks.values()))

    def counts(self, dropped: np.ndarray) -> "SkippedRows":
        from tzrun.data.batch import SkippedRows

        return SkippedRows(int(np.count_nonzero(dropped)), {p: int(np.count_nonzero(m)) for p, m in self.masks.items()})


class HashedDictionaries:
    """Ids of hashed features read as dictionaries (``dictionary_strings`` of the Parquet
    reader), one builder's: each feature's last dictionary is kept with its buckets while the
    next batches have an equal one (every batch of a row group shares it)."""

    def __init__(self) -> None:
        # feature name -> (the last dictionary seen, its buckets)
        self._buckets: dict[str, tuple[pa.Array, np.ndarray]] = {}

    def ids(self, column: pa.DictionaryArray, feature: SparseFeature) -> JaggedIds:
        """The dictionary is hashed once, then each row takes its value's bucket; a null row has
        no id, as when the strings are read one by one."""
        dictionary = column.dictionary
        cached = self._buckets.get(feature.name)
        # equal values, equal buckets; Arrow answers at once when both share their memory
        if cached is not None and cached[0].equals(dictionary):
            buckets = cached[1]
        else:
            buckets = hash_to_buckets(dictionary, feature.hash_bucket_size)
            self._buckets[feature.name] = (dictionary, buckets)
        indices = column.indices
        lengths = np.ones(len(column), dtype=np.int32)
        if column.null_count:
            lengths[column.is_null().to_numpy(zero_copy_only=False)] = 0
            indices = indices.drop_null()
        return JaggedIds(buckets[indices.to_numpy(zero_copy_only=False)], lengths)


def read_column(table: pa.Table | pa.RecordBatch, name: str, source: str, dictionary: bool = False) -> pa.Array:
    """Column ``name`` as one array; a dictionary-encoded one decoded, unless ``dictionary``."""
    index = table.schema.get_field_index(name)
    if index < 0:
        raise DataError(
            f"{source}: column '{name}' is missing (columns: {', '.join(table.schema.names)}); "
            "fix the feature's column or the data"
        )
    column = table.column(index)
    if isinstance(column, pa.ChunkedArray):
        # chunks of a dictionary column may hold different dictionaries: Arrow unifies them
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type) and not dictionary:
        column = column.dictionary_decode()
    return column


def read_floats(
    table: pa.Table | pa.RecordBatch, name: str, source: str, fill: float | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """A numeric column as float32 with its nulls set to ``fill``, or (``fill=None``) to NaN
    and their mask returned next to it (``None`` when there are none)."""
    column = read_column(table, name, source)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type)):
        raise DataError(f"{source}: column '{name}' has type {column.type}; expected a number")
    column = column.cast(pa.float32())
    nulls = None
    if column.null_count:
        if fill is None:
            nulls = column.is_null().to_numpy(zero_copy_only=False)
        else:
            column = pc.fill_null(column, fill)
    return np.array(column.to_numpy(zero_copy_only=False), dtype=np.float32, copy=True), nulls


def fill_nonfinite_dense(dense: np.ndarray, features: Sequence[DenseFeature], bad: BadRows) -> None:
    """Set NaN dense values to their features' ``fill_value``; report infinite ones."""
    for j, feature in enumerate(features):
        values = dense[:, j]
        values[np.isnan(values)] = feature.fill_value
        inf = np.isinf(values)
        if inf.any():
            first = values[inf][0]
            bad.found(
                f"{feature.column}: inf",
                inf,
                lambda n: f"column '{feature.column}' (dense feature '{feature.name}') has {n} infinite value(s) "
                f"in {bad.rows} rows of this batch (first: {first}); fix the data",
            )


def read_label(
    table: pa.Table | pa.RecordBatch,
    name: str,
    source: str,
    bad: BadRows,
    derived: DerivedLabel | None,
    domains: Sequence[LabelDomain],
) -> np.ndarray:
    """A label's values (a ``derived`` one computed from its source), its bad values reported:
    null, NaN, infinite, or outside one of ``domains`` (those its losses and metrics need)."""
    if derived is None:
        values, nulls = read_floats(table, name, source)
        column, role = name, ""
    else:
        values, nulls = derive(read_column(table, derived.source, source), derived, source, bad.found)
        column, role = derived.source, f" ({derived.expression})"
    values = _reported(values, nulls, column, role, bad)
    for domain, outside in violations(values, domains):
        first = values[outside][0]
        fix = (f'derive a label with [[data.derived_labels]] (e.g. name = "clicked", source = "{column}", '
               'op = ">=", value = 4) and name it in data.labels and the loss, or pick a loss for these labels'
               if domain.domain == "binary" else "fix the data or pick a loss for these labels")
        bad.found(
            f"{column}: outside {domain.domain}",
            outside,
            lambda n: f"column '{column}'{role} has {n} label(s) outside the {domain.domain} domain in {bad.rows} "
            f"rows of this batch (first: {first:g}); {domain.describe()}: {fix}",
        )
    return values


def read_sample_weights(table: pa.Table | pa.RecordBatch, name: str, source: str, bad: BadRows) -> np.ndarray:
    """The sample-weight column ``name``, its bad values reported."""
    values, nulls = read_floats(table, name, source)
    return _reported(values, nulls, name, " (sample_weight)", bad, negative=True)


def _reported(
    values: np.ndarray, nulls: np.ndarray | None, name: str, role: str, bad: BadRows, negative: bool = False
) -> np.ndarray:
    """``values`` of a label (``negative=False``) or sample-weight column, with its null,
    NaN, infinite (and for weights, negative) values reported."""
    finite = np.isfinite(values)
    if nulls is None and finite.all() and not (negative and values.size and values.min() < 0):
        return values
    need = "sample weights must be finite and >= 0" if negative else "labels must be finite numbers"
    where = f"column '{name}'{role} has"
    rows = bad.rows
    if nulls is not None:
        bad.found(f"{name}: null", nulls, lambda n: f"{where} {n} null value(s) in {rows} rows of this batch; {need}")
    nan = np.isnan(values) if nulls is None else np.isnan(values) & ~nulls
    if nan.any():
        bad.found(f"{name}: NaN", nan, lambda n: f"{where} {n} NaN value(s) in {rows} rows of this batch; {need}")
    inf = np.isinf(values)
    if inf.any():
        first = values[inf][0]
        bad.found(
            f"{name}: inf", inf, lambda n: f"{where} {n} infinite value(s) in {rows} rows of this batch (first: {first}); {need}"
        )
    below = finite & (values < 0) if negative else None
    if below is not None and below.any():
        first = values[below][0]
        bad.found(
            f"{name}: negative", below, lambda n: f"{where} {n} negative value(s) in {rows} rows of this batch (first: {first}); {need}"
        )
    return values


def read_group_keys(table: pa.Table | pa.RecordBatch, name: str, source: str, bad: BadRows) -> np.ndarray:
    """A ``group_by`` key column as int64: integers as they are, strings hashed with FNV-1a 64."""
    column = read_column(table, name, source)
    is_int = pa.types.is_integer(column.type)
    if not (is_int or pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type)):
        raise DataError(f"{source}: column '{name}' (a group_by key) has type {column.type}; expected integers or strings")
    if column.null_count:
        bad.found(
            f"{name}: null",
            column.is_null().to_numpy(zero_copy_only=False),
            lambda n: f"column '{name}' (a group_by key) has {n} null value(s) in {bad.rows} rows of this batch; fill them",
        )
        if is_int:
            column = column.fill_null(0)
    if is_int:
        return np.array(column.to_numpy(zero_copy_only=False), dtype=np.int64, copy=True)
    return fnv1a_64(column).view(np.int64)


def read_ids(
    table: pa.Table | pa.RecordBatch, feature: SparseFeature, source: str, bad: BadRows, dictionaries: HashedDictionaries
) -> JaggedIds:
    """The ids of one id feature, an id outside ``[0, num_buckets)`` reported."""
    column = read_column(table, feature.column, source, dictionary=True)
    if pa.types.is_dictionary(column.type):
        if _hashes_dictionary(feature, column):
            return dictionaries.ids(column, feature)
        column = column.dictionary_decode()
    weights = read_column(table, feature.weight_column, source) if feature.weight_column else None
    jagged = jagged_ids(column, feature, source, weights)
    ids, rows = jagged.ids, len(column)
    limit = feature.num_buckets
    if limit is not None and ids.size and (ids.min() < 0 or ids.max() >= limit):
        outside = (ids < 0) | (ids >= limit)
        rows_outside = np.zeros(rows, dtype=bool)
        rows_outside[np.repeat(np.arange(rows), jagged.lengths)[outside]] = True
        first = ids[outside][0]
        bad.found(
            f"{feature.column}: id outside [0, {limit})",
            rows_outside,
            lambda n: f"column '{feature.column}' (feature '{feature.name}'): id {first} is outside [0, {limit}) "
            f"({n} of {rows} rows of this batch have an id outside it); raise num_buckets or use hash_bucket_size",
        )
    return jagged


def _hashes_dictionary(feature: SparseFeature, column: pa.DictionaryArray) -> bool:
    """Whether a dictionary column's ids come from hashing its dictionary once: a hashed
    feature of one string (or binary) value per row, without weights, whose dictionary holds
    no null (a null there would be a row with no id)."""
    return (
        feature.hash_bucket_size is not None
        and feature.separator is None
        and feature.weight_column is None
        and is_hashable(column.type.value_type)
        and column.dictionary.null_count == 0
    )
