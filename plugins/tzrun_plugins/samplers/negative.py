"""The ``negative`` sampler: negatives for two-tower retrieval drawn from an item table.

TorchEasyRec's ``negative_sampler`` in tzrec-run's terms. The item table is one file (or a
directory of Parquet files) with one row per item: an id column, the item-side feature columns
named as in the training input, and optionally a weight column. Every batch draws
``num_negatives`` rows **with replacement**, shared by all rows of the batch, leaving out the
batch's own items (its rows of positive sample weight; ``exclude_batch_items``), as TorchEasyRec's
sampler draws "items not in batch":

* uniformly, ``P(item) = 1 / num_items``;
* or by popularity, ``P(item) = w_item^p / sum_j w_j^p`` with ``w`` the ``weight`` column
  (``p = weight_power``; 0.75 is word2vec's smoothing), or, with ``weight_by_count``, the number
  of rows of the item in the table (a log of clicks can serve as the table as it is).

The table is read once per process when the run starts, and checked then: a missing file, an
unreadable one, a missing column, a null id, an id listed twice (without ``weight_by_count``),
or a weight that is negative, NaN, infinite or 0 for every item stops the run with an error
naming the file and the column.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Mapping, Optional

import attrs

from tzrun.errors import DataError

__all__ = ["NegativeSamplerConfig", "NegativeSampler", "build_negative_sampler", "read_item_table"]

_TEXT_SUFFIXES = (".csv", ".tsv", ".txt")


def _non_empty(instance: Any, attribute: Any, value: str) -> None:
    if not value:
        raise ValueError("must not be empty", attribute)


def _one_char(instance: Any, attribute: Any, value: str) -> None:
    if len(value) != 1 or value in "\r\n":
        raise ValueError(f"must be one character other than a line break, got {value!r}", attribute)


@attrs.frozen
class NegativeSamplerConfig:
    """Options of the ``negative`` sampler (``[data.sampler] type = "negative"``).

    Attributes:
        item_table: the item table: a Parquet file or a directory of them, or a CSV file
            (``.csv``, ``.tsv``, ``.txt``, or ``format = "csv"``); a local path or a URL
            (``s3://bucket/items.parquet``).
        item_id: its id column (TorchEasyRec's ``item_id_field``).
        num_negatives: items drawn per batch, shared by every row of the batch
            (``num_sample``).
        weight: a column of non-negative popularity weights; unset: uniform (or counts, with
            ``weight_by_count``).
        weight_by_count: weight each item by its number of rows in the table (its features are
            taken from its first row); for a table that lists an item once per interaction.
        weight_power: weights are raised to this power first (1: proportional to popularity;
            0.75: word2vec's smoothing).
        exclude_batch_items: never draw an item that is the positive of a row of the batch
            (a row of positive sample weight); draws that hit one are drawn again, from the
            same distribution, up to 100 times. The input must have the ``item_id`` column
            (as a feature's column). ``false``: items are drawn regardless, and a row's own item
            can be among its negatives.
        format: ``"auto"`` (by the file name: CSV for ``.csv``/``.tsv``/``.txt``, else
            Parquet), ``"parquet"`` or ``"csv"``.
        delimiter: the CSV field delimiter.
        column_types: CSV column types by name (``"int64"``, ``"float32"``, ``"string"``, ...);
            other columns' types are inferred by pyarrow.
    """

    item_table: str = attrs.field(validator=_non_empty)
    item_id: str = attrs.field(validator=_non_empty)
    num_negatives: int = attrs.field(validator=attrs.validators.ge(1))
    weight: Optional[str] = None
    weight_by_count: bool = False
    weight_power: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))
    exclude_batch_items: bool = True
    format: Literal["auto", "parquet", "csv"] = "auto"
    delimiter: str = attrs.field(default=",", validator=_one_char)
    column_types: Mapping[str, str] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.weight is not None and self.weight_by_count:
            raise ValueError("set weight or weight_by_count, not both")
        from tzrun_plugins.readers.delimited import COLUMN_TYPES

        for column, name in self.column_types.items():
            if name not in COLUMN_TYPES:
                raise ValueError(f"column_types: column '{column}': unknown type {name!r} "
                                 f"(choose from {', '.join(COLUMN_TYPES)})")


def read_item_table(cfg: NegativeSamplerConfig) -> Any:
    """The item table as a ``pyarrow.Table``.

    Raises:
        DataError: naming the file, when it does not exist or cannot be read.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from tzrun import as_path, is_remote
    from tzrun_plugins.readers.delimited import COLUMN_TYPES

    path = cfg.item_table
    if not _exists(path):
        raise DataError(f"{path}: the item table (data.sampler.item_table) does not exist; "
                        "write it or fix the path (relative paths start at the working directory)")
    kind = cfg.format
    if kind == "auto":
        kind = "csv" if path.lower().endswith(_TEXT_SUFFIXES) else "parquet"
    try:
        if kind == "csv":
            types = {c: COLUMN_TYPES[t] for c, t in cfg.column_types.items()}
            options = {"parse_options": pacsv.ParseOptions(delimiter=cfg.delimiter),
                       "convert_options": pacsv.ConvertOptions(column_types=types)}
            if not is_remote(path):
                return pacsv.read_csv(os.fspath(as_path(path)), **options)
            with as_path(path).open("rb") as f:
                return pacsv.read_csv(f, **options)
        fs, inner = _arrow_filesystem(path)
        return pq.read_table(inner, filesystem=fs)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read the item table as {kind.upper()}: {exc}; "
                        "check the file (or data.sampler.format)") from None


def _arrow_filesystem(path: str) -> tuple[Any, str]:
    """What pyarrow needs to open ``path``: ``(None, path)`` for a local path; for a URL, a
    ``pyarrow.fs`` filesystem over the fsspec filesystem of :func:`tzrun.filesystem` (the one
    every other access uses: one set of credentials and endpoint) and the path inside it."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    from tzrun import as_path, filesystem, is_remote

    if not is_remote(path):
        return None, os.fspath(as_path(path))
    fs, inner = filesystem(path)
    return PyFileSystem(FSSpecHandler(fs)), inner


def _exists(path: str) -> bool:
    """Whether ``path`` (a local path or a URL) names a file or directory."""
    from tzrun import as_path, filesystem, is_remote

    if not is_remote(path):
        return os.path.exists(as_path(path))
    fs, inner = filesystem(path)
    return bool(fs.exists(inner))


class NegativeSampler:
    """Items of one table and the distribution negatives are drawn from (see the module docstring).

    Args:
        cfg: the sampler's options.

    Raises:
        DataError: naming the file and the column, for a bad table.
    """

    def __init__(self, cfg: NegativeSamplerConfig) -> None:
        import numpy as np

        self.cfg = cfg
        table = read_item_table(cfg)
        self._source = cfg.item_table
        ids = self._column(table, cfg.item_id, "data.sampler.item_id")
        if table.num_rows == 0:
            raise DataError(f"{self._source}: the item table has no rows")
        if ids.null_count:
            raise DataError(f"{self._source}: column '{cfg.item_id}' (data.sampler.item_id) has "
                            f"{ids.null_count} null id(s); every item needs an id")
        weights, table = self._weights(table, ids)
        if weights is None:
            self._cdf = None
        else:
            if cfg.weight_power != 1.0:
                weights = weights ** cfg.weight_power
            cdf = np.cumsum(weights)
            self._cdf = cdf / cdf[-1]
        self._items = table
        self._ids = table.column(cfg.item_id).combine_chunks()
        self._probabilities = self.probabilities()
        self._drawable = int(np.count_nonzero(self._probabilities > 0))  # items a draw can return

    def _column(self, table: Any, name: str, where: str) -> Any:
        if name not in table.column_names:
            raise DataError(f"{self._source}: column '{name}' ({where}) is missing from the item table "
                            f"(columns: {', '.join(table.column_names)}); fix {where} or the table")
        return table.column(name).combine_chunks()

    def _weights(self, table: Any, ids: Any) -> tuple[Any, Any]:
        """The items' weights (None: uniform) and the table with one row per item."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        cfg = self.cfg
        unique = pc.unique(ids)
        if cfg.weight_by_count:
            first = pc.index_in(unique, value_set=ids).to_numpy()  # first row of each id
            counts = pc.value_counts(ids).field("counts").to_numpy().astype(np.float64)
            # value_counts lists ids in order of first appearance, as unique does
            return counts, table.take(pa.array(first))
        if len(unique) != len(ids):
            counts = pc.value_counts(ids)
            repeated = counts.filter(pc.greater(counts.field("counts"), 1))
            raise DataError(
                f"{self._source}: column '{cfg.item_id}' (data.sampler.item_id) lists {len(repeated)} id(s) "
                f"more than once (first: {repeated[0]['values']}); keep one row per item, or set "
                "data.sampler.weight_by_count = true to weight items by their number of rows"
            )
        if cfg.weight is None:
            return None, table
        column = self._column(table, cfg.weight, "data.sampler.weight")
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            raise DataError(f"{self._source}: column '{cfg.weight}' (data.sampler.weight) has type {column.type}; "
                            "expected numbers")
        values = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
        bad = ~np.isfinite(values) | (values < 0)
        if column.null_count or bad.any():
            first = "null" if column.null_count else values[bad][0]
            raise DataError(f"{self._source}: column '{cfg.weight}' (data.sampler.weight) has "
                            f"{int(bad.sum())} null, negative, NaN or infinite weight(s) "
                            f"(first: {first}); weights must be finite and >= 0")
        if not values.sum() > 0:
            raise DataError(f"{self._source}: column '{cfg.weight}' (data.sampler.weight) is 0 for every item; "
                            "no item could be drawn")
        return values, table

    @property
    def source(self) -> str:
        """The item table's file."""
        return self._source

    @property
    def items(self) -> Any:
        """One row per item (the first row of each id with ``weight_by_count``)."""
        return self._items

    @property
    def num_negatives(self) -> int:
        """Items drawn per batch."""
        return self.cfg.num_negatives

    def probabilities(self) -> Any:
        """Each item's probability of being drawn, as a float64 numpy array."""
        import numpy as np

        if self._cdf is None:
            return np.full(self._items.num_rows, 1.0 / self._items.num_rows)
        return np.diff(self._cdf, prepend=0.0)

    def _draw(self, rng: Any, count: int) -> Any:
        import numpy as np

        if self._cdf is None:
            return rng.integers(0, self._items.num_rows, size=count, dtype=np.int64)
        rows = np.searchsorted(self._cdf, rng.random(count), side="right")
        return np.minimum(rows, len(self._cdf) - 1).astype(np.int64)

    def _batch_rows(self, batch: Any) -> Any:
        """The item-table rows of the ids in ``batch``'s ``item_id`` column (ids not in the table left out)."""
        import pyarrow.compute as pc

        name = self.cfg.item_id
        if name not in batch.column_names:
            raise DataError(f"{self._source}: data.sampler.exclude_batch_items needs the input column '{name}' "
                            "(data.sampler.item_id), which the run does not read; make it a feature's column, "
                            "or set exclude_batch_items = false")
        found = pc.index_in(batch.column(name).combine_chunks(), value_set=self._ids).drop_null()
        return found.to_numpy(zero_copy_only=False)

    def sample(self, rng: Any, batch: Any = None) -> Any:
        """``num_negatives`` row indices of :attr:`items`, drawn with replacement with ``rng``;
        with ``exclude_batch_items``, none of the items of ``batch`` (its positives)."""
        import numpy as np

        rows = self._draw(rng, self.cfg.num_negatives)
        if not self.cfg.exclude_batch_items or batch is None or batch.num_rows == 0:
            return rows
        # per batch, work in the batch's items only (not the whole item table)
        excluded = np.unique(self._batch_rows(batch))
        if excluded.size == 0 or np.count_nonzero(self._probabilities[excluded] > 0) == self._drawable:
            return rows  # nothing to leave out, or nothing else could be drawn
        for _ in range(100):
            hit = np.isin(rows, excluded)
            if not hit.any():
                break
            rows[hit] = self._draw(rng, int(hit.sum()))
        return rows


def build_negative_sampler(cfg: NegativeSamplerConfig) -> NegativeSampler:
    """Read and check the item table (see :class:`NegativeSampler`)."""
    return NegativeSampler(cfg)
