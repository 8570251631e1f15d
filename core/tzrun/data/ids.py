"""One sparse feature's column (and its weight column) -> jagged ids, lengths and weights.

A row's values are a scalar (one value, none when null), a list (several; nulls inside are
dropped), or with ``separator`` a string split on it (empty pieces are dropped). The values
then become ids in the feature's table:

* ``num_buckets``: integer ids as they are (range-checked by the caller); split pieces are
  parsed as base-10 integers.
* ``hash_bucket_size``: strings hashed with FNV-1a 64 (:mod:`tzrun.data.hashing`) modulo the
  size; integers taken modulo it.
* ``vocab``: ``vocab[i]`` is id ``i + 1``, every other value id 0 (``OOV_ID``); integers
  are matched by their decimal text.
* ``boundaries``: numbers bucketized, ``id = #{b in boundaries: b <= x}``; NaN counts as null.
* ``zch``: raw ids in ``[0, ZCH_ID_SPACE)`` for TorchRec's managed collision: strings hashed
  with FNV-1a 64, integers mixed with splitmix64's finalizer (so that ids spread evenly over
  the row-wise slices of the table, each of which manages one range of raw ids), both modulo
  ``ZCH_ID_SPACE``.

A weight column must give every row exactly as many values as the id column does (nulls in
the same places); its weights are the KeyedJaggedTensor's weights.
"""

from __future__ import annotations

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun.data.hashing import hash_to_buckets, is_hashable
from tzrun.config.vocab import OOV_ID
from tzrun.errors import DataError
from tzrun.interfaces import SparseFeature

__all__ = ["ZCH_ID_SPACE", "JaggedIds", "jagged_ids", "zch_raw_ids"]

#: The range of a collision-free feature's raw ids (TorchRec's default ``input_hash_size``).
ZCH_ID_SPACE = 2**63 - 1


@attrs.frozen
class JaggedIds:
    """A feature's ids for a batch of rows.

    Attributes:
        ids: int64 ids, row after row.
        lengths: int32 ids per row.
        weights: float32 weights parallel to ``ids`` (None without a weight column).
    """

    ids: np.ndarray
    lengths: np.ndarray
    weights: np.ndarray | None = None


def _is_text(typ: pa.DataType) -> bool:
    return pa.types.is_string(typ) or pa.types.is_large_string(typ)


def _is_list(typ: pa.DataType) -> bool:
    return pa.types.is_list(typ) or pa.types.is_large_list(typ)


def _values(column: pa.Array, feature: SparseFeature, where: str, role: str) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """``(flat values, values per row, kept mask over the flat values)`` of one column:
    nulls (and, with ``separator``, empty pieces) are not kept."""
    rows = len(column)
    if feature.separator is not None and not _is_list(column.type):
        if not _is_text(column.type):
            raise DataError(f"{where} has type {column.type}; separator = {feature.separator!r} needs a string {role}column")
        column = pc.split_pattern(column, feature.separator)
    if _is_list(column.type):
        lengths = np.array(column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int32)
        flat = column.flatten()
    else:
        lengths = np.ones(rows, dtype=np.int32)
        flat = column
        if column.null_count:
            lengths[column.is_null().to_numpy(zero_copy_only=False)] = 0
            flat = column.drop_null()
    keep = ~np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool) if flat.null_count else np.ones(len(flat), dtype=bool)
    if feature.separator is not None and _is_text(flat.type) and len(flat):
        keep &= np.asarray(pc.binary_length(flat).fill_null(0).to_numpy(zero_copy_only=False)) > 0
    if feature.boundaries is not None and pa.types.is_floating(flat.type) and len(flat):
        keep &= ~np.asarray(pc.is_nan(flat).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    return flat, lengths, keep


def _parsed(flat: pa.Array, target: pa.DataType, where: str, what: str) -> pa.Array:
    """Text pieces parsed as ``target`` numbers; a piece that is not one is an error."""
    try:
        return pc.cast(pc.utf8_trim_whitespace(flat), target)
    except pa.ArrowInvalid:
        for value in flat.to_pylist():
            try:
                pc.cast(pa.array([value.strip()]), target)
            except pa.ArrowInvalid:
                raise DataError(f"{where}: value {value!r} is not {what}") from None
        raise


def zch_raw_ids(values: np.ndarray) -> np.ndarray:
    """Integer ids mixed into ``[0, ZCH_ID_SPACE)`` (splitmix64's finalizer: a bijection of
    64-bit words, so distinct ids stay distinct before the modulo)."""
    z = values.astype(np.int64).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(ZCH_ID_SPACE)).astype(np.int64)


def _to_ids(flat: pa.Array, feature: SparseFeature, where: str) -> np.ndarray:
    """The kept flat values as int64 ids (see the module docstring)."""
    text = is_hashable(flat.type)
    if feature.zch_size is not None:
        if pa.types.is_integer(flat.type):
            return zch_raw_ids(flat.to_numpy(zero_copy_only=False))
        if text:
            return hash_to_buckets(flat, ZCH_ID_SPACE)
        raise DataError(f"{where} has type {flat.type}; zch needs strings or integers")
    if feature.hash_bucket_size is not None:
        if pa.types.is_integer(flat.type):
            return np.mod(flat.to_numpy(zero_copy_only=False).astype(np.int64), feature.hash_bucket_size)
        if text:
            return hash_to_buckets(flat, feature.hash_bucket_size)
        raise DataError(f"{where} has type {flat.type}; hash_bucket_size needs strings or integers")
    if feature.vocab is not None:
        if pa.types.is_integer(flat.type):
            flat = pc.cast(flat, pa.string())
        elif not text:
            raise DataError(f"{where} has type {flat.type}; vocab needs strings or integers")
        index = pc.index_in(flat, value_set=pa.array(feature.vocab, pa.string()).cast(flat.type))
        return np.asarray(pc.add(index, 1).fill_null(OOV_ID).to_numpy(zero_copy_only=False), dtype=np.int64)
    if feature.boundaries is not None:
        if _is_text(flat.type):
            flat = _parsed(flat, pa.float64(), where, "a number")
        elif not (pa.types.is_integer(flat.type) or pa.types.is_floating(flat.type)):
            raise DataError(f"{where} has type {flat.type}; boundaries need numbers")
        x = np.asarray(flat.cast(pa.float64()).to_numpy(zero_copy_only=False))
        return np.searchsorted(np.asarray(feature.boundaries, dtype=np.float64), x, side="right").astype(np.int64)
    if feature.separator is not None and _is_text(flat.type):
        flat = _parsed(flat, pa.int64(), where, "an integer id")
    if not pa.types.is_integer(flat.type):
        raise DataError(f"{where} has type {flat.type}; num_buckets needs integer ids ({_integer_fix(flat.type, feature)})")
    return np.array(flat.to_numpy(zero_copy_only=False), dtype=np.int64, copy=True)


def _integer_fix(typ: pa.DataType, feature: SparseFeature) -> str:
    """What to do when a ``num_buckets`` feature's column is not made of integers."""
    if _is_text(typ):
        return (
            "a csv column is read as text unless declared: if it holds integer ids, declare its type, e.g. "
            f'data.reader.column_types = {{ {feature.column} = "int64" }}; for other strings use hash_bucket_size or vocab'
        )
    return "cast the column to integers, or use hash_bucket_size or boundaries"


def _weights(column: pa.Array, feature: SparseFeature, source: str, lengths: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The weight column's kept values as float32, checked against the ids' layout."""
    name = feature.weight_column
    where = f"{source}: column '{name}' (weights of feature '{feature.name}')"
    flat, wlengths, wkeep = _values(column, attrs.evolve(feature, boundaries=None), where, "weight ")
    if not np.array_equal(wlengths, lengths):
        row = int(np.flatnonzero(wlengths != lengths)[0])
        raise DataError(
            f"{where}: row {row} of this batch has {wlengths[row]} weight(s) for {lengths[row]} value(s) of column "
            f"'{feature.column}'; give one weight per value"
        )
    if _is_text(flat.type):
        flat = _parsed(pc.if_else(pa.array(wkeep), flat, "0"), pa.float32(), where, "a number")
    elif not (pa.types.is_integer(flat.type) or pa.types.is_floating(flat.type)):
        raise DataError(f"{where} has type {column.type}; expected numbers (a list column, or text with the separator)")
    missing = keep & ~wkeep
    if missing.any():
        raise DataError(f"{where}: {int(missing.sum())} weight(s) are missing where column '{feature.column}' has a value; fill them")
    weights = np.asarray(flat.cast(pa.float32()).fill_null(0.0).to_numpy(zero_copy_only=False), dtype=np.float32)[keep]
    if not np.isfinite(weights).all():
        raise DataError(f"{where}: weights must be finite, got {weights[~np.isfinite(weights)][0]}")
    return weights


def jagged_ids(column: pa.Array, feature: SparseFeature, source: str, weights: pa.Array | None = None) -> JaggedIds:
    """A feature's ids (and weights) for the rows of ``column``.

    Args:
        column: the feature's column.
        feature: the feature.
        source: the file, named in errors.
        weights: the feature's ``weight_column`` (None when it has none).

    Raises:
        DataError: naming ``source`` and the column, for a column of the wrong type, a piece
            that does not parse, or weights that do not match the ids row for row.
    """
    where = f"{source}: column '{feature.column}' (feature '{feature.name}')"
    flat, lengths, keep = _values(column, feature, where, "")
    weight_values = _weights(weights, feature, source, lengths, keep) if weights is not None else None
    if not keep.all():
        row_of = np.repeat(np.arange(len(column)), lengths)
        lengths = lengths - np.bincount(row_of[~keep], minlength=len(column)).astype(np.int32)
        flat = flat.filter(pa.array(keep))
    return JaggedIds(_to_ids(flat, feature, where), lengths, weight_values)
