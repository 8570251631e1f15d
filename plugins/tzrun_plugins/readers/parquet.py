"""The ``parquet`` reader: files, directories or globs of Parquet files, read with pyarrow.

Row groups are the unit of splitting; a read decodes ``batch_rows`` rows at a time of one
row group's column chunks, and stops at the last row asked for, so memory stays bounded by
one row group's compressed columns, whatever the file sizes. A directory is searched
recursively for files ending in ``suffixes`` (``.parquet`` and ``.pq``; names starting with
``.`` or ``_`` are skipped); a glob may use ``**``.

Inputs may be URLs (``s3://bucket/train/``, ``gs://``, ``abfs://``, ``hdfs://``): a file on a
store is opened through fsspec and read by byte ranges, the footer first, then, for a read,
the wanted column chunks of one row group, fetched together (``pre_buffer``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import attrs
import pyarrow as pa
import pyarrow.parquet as pq

from tzrun import RowGroup, is_hashable, is_remote, list_files
from tzrun.errors import DataError
from tzrun_plugins.readers.inputs import open_input

__all__ = ["ParquetConfig", "ParquetReader", "build_parquet"]


@attrs.frozen
class ParquetConfig:
    """Options of the ``parquet`` reader.

    Attributes:
        batch_rows: rows per record batch pyarrow decodes at a time.
        dictionary_strings: read string and binary columns as Arrow dictionary arrays. Parquet
            writers store such columns dictionary-encoded by default, so each row decodes to
            an index instead of a copy of its string, and a hashed id feature hashes each
            distinct value of a row group once instead of every row (about 4x less reading
            and hashing on id columns with repeated values). A column whose values are nearly
            all distinct reads about 2x slower this way; set false for data made only of those.
            Features see the same values either way.
        suffixes: file endings read when the input is a directory (``[""]`` reads every file,
            e.g. Spark's or Hive's ``part-00000``).
    """

    batch_rows: int = attrs.field(default=65536, validator=attrs.validators.gt(0))
    dictionary_strings: bool = True
    suffixes: tuple[str, ...] = (".parquet", ".pq")


class ParquetReader:
    """Lists and reads row groups of Parquet files (see :class:`tzrun.Reader`)."""

    def __init__(self, cfg: ParquetConfig) -> None:
        self.cfg = cfg

    def row_groups(self, input_path: str) -> list[RowGroup]:
        """Every row group of every file of ``input_path``, files in sorted order, from the
        files' metadata only.

        Raises:
            DataError: when nothing matches or a file is not readable Parquet.
        """
        groups: list[RowGroup] = []
        for path in list_files(input_path, self.cfg.suffixes):
            with _parquet_file(path) as parquet_file:
                metadata = parquet_file.metadata
            groups.extend(RowGroup(path, i, metadata.row_group(i).num_rows) for i in range(metadata.num_row_groups))
        return groups

    def files(self, input_path: str) -> list[str]:
        """The files of ``input_path`` in reading order, from the listing only.

        Raises:
            DataError: when nothing matches.
        """
        return list_files(input_path, self.cfg.suffixes)

    def schema(self, path: str) -> pa.Schema | None:
        """The columns of the Parquet file ``path`` and their types, from its footer only;
        None when it has no rows (nothing of it is read).

        Raises:
            DataError: when it is not a readable Parquet file.
        """
        with _parquet_file(path) as parquet_file:
            metadata = parquet_file.metadata
            return metadata.schema.to_arrow_schema() if metadata.num_rows else None

    def describe_row(self, group: RowGroup, row: int) -> str:
        """``row N``: the 0-based index in its file of row ``row`` of ``group`` (named in errors)."""
        with _parquet_file(group.path) as parquet_file:
            metadata = parquet_file.metadata
        return f"row {sum(metadata.row_group(i).num_rows for i in range(group.index)) + row} (counting from 0)"

    def read(self, group: RowGroup, start: int, stop: int, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Rows ``[start, stop)`` of ``group``, only ``columns``, at most ``batch_rows`` per batch.

        Raises:
            DataError: naming the file, for a missing column or an unreadable row group.
        """
        with _source(group.path) as source:
            yield from self._read(source, group, start, stop, columns)

    def _read(self, source: Any, group: RowGroup, start: int, stop: int, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        parquet_file = _open(source, group.path)
        names = parquet_file.schema_arrow.names
        missing = [c for c in columns if c not in names]
        if missing:
            raise DataError(
                f"{group.path}: column(s) {', '.join(repr(c) for c in missing)} missing "
                f"(the file has: {', '.join(names)}); fix [features]/[data] or the data"
            )
        if self.cfg.dictionary_strings:
            schema = parquet_file.schema_arrow
            text = [c for c in columns if is_hashable(schema.field(c).type)]
            if text:
                parquet_file = _open(source, group.path, metadata=parquet_file.metadata, read_dictionary=text)
        # one thread: DataLoader workers are the parallelism, and Arrow's own pool would
        # oversubscribe the cores (and is one more thread pool a forked worker inherits).
        # Record batches are decoded one at a time and only up to ``stop``.
        batches = parquet_file.iter_batches(
            batch_size=self.cfg.batch_rows, row_groups=[group.index], columns=list(columns), use_threads=False
        )
        at = 0
        while at < stop:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"{group.path}: row group {group.index} cannot be read: {exc}") from None
            if batch is None:
                break
            lo, hi = max(start - at, 0), min(stop - at, batch.num_rows)
            at += batch.num_rows
            if lo < hi:
                yield batch.slice(lo, hi - lo)


@contextmanager
def _source(path: str) -> Iterator[Any]:
    """What pyarrow opens for ``path``: the path itself when local (read as always), an open
    file through :func:`open_input` for a URL (closed on leaving).

    Raises:
        DataError: naming the file, when it cannot be opened.
    """
    if not is_remote(path):
        yield path
        return
    try:
        source = open_input(path)
    except OSError as exc:
        raise DataError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        yield source
    finally:
        source.close()


def _open(source: Any, path: str, **options: Any) -> pq.ParquetFile:
    """``source`` (from :func:`_source`) as a Parquet file; a remote one fetches the column
    chunks of a read together (``pre_buffer``).

    Raises:
        DataError: naming the file, when it is not readable Parquet.
    """
    try:
        if source is path:
            return pq.ParquetFile(path, **options)
        return pq.ParquetFile(source, pre_buffer=True, **options)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path}: not a readable Parquet file: {exc}") from None


@contextmanager
def _parquet_file(path: str) -> Iterator[pq.ParquetFile]:
    """``path`` opened as Parquet (its footer read).

    Raises:
        DataError: naming the file, when it cannot be opened or is not Parquet.
    """
    with _source(path) as source:
        yield _open(source, path)


def build_parquet(cfg: ParquetConfig) -> ParquetReader:
    """The reader."""
    return ParquetReader(cfg)
