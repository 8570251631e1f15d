"""What reader and sampler plugins return: row groups read as Arrow record batches
(:class:`Reader`), the bad rows a reader isolates (:data:`BAD_ROW_COLUMN`), the item
table negatives are drawn from (:class:`ItemSampler`), and a sampler that replaces a batch's
rows (:class:`RowSampler`). Import them from :mod:`tzrun.interfaces`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

import attrs

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["RowGroup", "Reader", "BAD_ROW_COLUMN", "BAD_ROW_SEPARATOR", "ItemSampler", "RowSampler"]


@attrs.frozen
class RowGroup:
    """A readable unit of an input: a row group of a Parquet file, say.

    Attributes:
        path: the file it belongs to (named in errors).
        index: its index within the file.
        num_rows: how many rows it holds.
    """

    path: str
    index: int
    num_rows: int


#: The column a reader that sets ``isolates_bad_rows = True`` is asked for (among ``columns``)
#: under ``data.on_bad_row = "skip"``: see :class:`Reader`.
BAD_ROW_COLUMN = "__tzrun_bad_row__"
#: Separates the reasons of a row with several problems in :data:`BAD_ROW_COLUMN` (a reader
#: joins them with it; the core counts each reason).
BAD_ROW_SEPARATOR = "; "


class Reader(Protocol):
    """What a reader plugin's ``build(cfg)`` returns.

    Two more methods are optional; ``tzrec-run check`` uses them to check the input files'
    columns before a run (a reader without them is skipped there, with a note):

    * ``files(input_path) -> Sequence[str]``: the files of ``input_path``, in the order
      :meth:`row_groups` reads them, from a listing only (raises ``DataError`` naming the path
      when it matches nothing);
    * ``schema(path) -> pyarrow.Schema | None``: the columns of one file and the types
      :meth:`read` gives them, from metadata only (a Parquet footer, a CSV header line), or
      None for a file of which nothing is read (no rows); raises ``DataError`` naming the file
      when it cannot be read.

    Bad rows a reader can isolate (a malformed line, a field that does not parse as its
    column's type): with ``data.on_bad_row = "error"`` it raises ``DataError`` naming the file,
    the line and the column. A reader whose object has ``isolates_bad_rows = True`` is asked,
    under ``"skip"``, for the string column :data:`BAD_ROW_COLUMN` among ``columns``; it then
    keeps such a row in its place (nulls in its other columns) and gives the reason in that
    column (``"malformed line"``, ``"I1: not a number"``), null for a good row. The core leaves
    those rows out and counts them by reason, like the bad values it finds itself.
    """

    def row_groups(self, input_path: str) -> Sequence[RowGroup]:
        """Every row group of ``input_path`` (a file, a directory or a glob), in a stable
        order that is the same on every rank. Raises ``DataError`` naming the path when it
        matches nothing or cannot be read."""

    def read(
        self, group: RowGroup, start: int, stop: int, columns: Sequence[str]
    ) -> Iterator[pa.RecordBatch]:
        """Rows ``[start, stop)`` of ``group``, only ``columns``, as record batches in order.
        Raises ``DataError`` naming the file and the column when a column is missing.

        A reader may also have ``describe_row(group, row) -> str``: how an error names row
        ``row`` of ``group`` (``"line 151"``); without it errors say ``"row R of row group G"``."""


class ItemSampler(Protocol):
    """What a sampler plugin's ``build(cfg)`` returns (``[data.sampler]``): an item table and a
    way to draw negatives from it. The core encodes the table's feature columns once, with the
    run's ``[features]`` (those whose input column the table has), and appends the drawn items
    to every batch (see :mod:`tzrun.data.sampling`)."""

    @property
    def source(self) -> str:
        """The item table's file, named in errors."""

    @property
    def items(self) -> pa.Table:
        """One row per item; the columns are named like the input's (an id column and the
        item-side feature columns), and every other column is ignored."""

    @property
    def num_negatives(self) -> int:
        """Items drawn per batch."""

    def sample(self, rng: Any, batch: pa.Table) -> Any:
        """The rows of :attr:`items` drawn for one batch: an int64 numpy array of
        :attr:`num_negatives` row indices. ``rng`` is the batch's ``numpy.random.Generator``
        (seeded by the core from the run's seed, the rank, the pass and the step), the only
        source of randomness a sampler may use, so that a resumed run draws the same items.
        ``batch`` holds the batch's input rows of positive sample weight (its positives; no
        rows for a padding batch), for a sampler that leaves them out."""


class RowSampler(Protocol):
    """What a sampler plugin's ``build(cfg)`` returns when it is registered with
    ``expands_rows=True`` (``[data.sampler]``): it turns each batch's input rows into the rows
    that are trained and evaluated on, before the core encodes them with the run's
    ``[features]`` (see :mod:`tzrun.data.sampling`). TDM's sampler returns, for every input
    row, its item's ancestors and per-level negatives, the row's other columns repeated."""

    @property
    def source(self) -> str:
        """What the sampler reads (a file), named in errors."""

    def expand(self, rng: Any, table: pa.Table, labels: Sequence[str]) -> pa.Table:
        """The rows of one batch.

        Args:
            rng: the batch's ``numpy.random.Generator`` (seeded by the core from the run's seed,
                the rank, the pass and the step), the only source of randomness a sampler may
                use, so that a resumed run draws the same rows.
            table: the batch's input rows, with every input column the run reads and the
                core's ``__tzrun_input_row`` (each row's index: keep it with the row's other
                columns, so that a bad row is counted once per input row).
            labels: the run's label columns (``data.labels`` but derived labels, which are
                computed from the rows returned), which the sampler sets.

        Returns:
            A table with the same columns (any number of rows, 0 included); the core encodes it
            as it encodes an input batch (features, labels, sample weight, group keys) and
            names :attr:`source` when it lacks a column.
        """
