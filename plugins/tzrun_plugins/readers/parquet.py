"""The ``parquet`` reader: files, directories or globs of Parquet files, read with pyarrow.

Row groups are the unit of reading: memory stays bounded by the largest row group.
"""

from __future__ import annotations

import glob
import os
from typing import Iterator, Sequence

import attrs
import pyarrow as pa
import pyarrow.parquet as pq

from tzrun import RowGroup
from tzrun.errors import DataError

__all__ = ["ParquetConfig", "ParquetReader", "build_parquet", "list_files"]


@attrs.frozen
class ParquetConfig:
    """Options of the ``parquet`` reader.

    Attributes:
        batch_rows: rows per record batch pyarrow decodes at a time.
    """

    batch_rows: int = attrs.field(default=65536, validator=attrs.validators.gt(0))


def list_files(input_path: str, suffixes: Sequence[str]) -> list[str]:
    """The files of ``input_path`` (a file, a directory searched recursively for ``suffixes``,
    or a glob), sorted so every rank sees the same order.

    Raises:
        DataError: when nothing matches.
    """
    if os.path.isdir(input_path):
        files = [
            os.path.join(root, name)
            for root, _, names in os.walk(input_path)
            for name in names
            if name.endswith(tuple(suffixes)) and not name.startswith((".", "_"))
        ]
    elif any(ch in input_path for ch in "*?["):
        files = [f for f in glob.glob(input_path, recursive=True) if os.path.isfile(f)]
    else:
        files = [input_path] if os.path.isfile(input_path) else []
    if not files:
        raise DataError(
            f"{input_path}: no input files found (expected a file, a directory with "
            f"{'/'.join(suffixes)} files, or a glob)"
        )
    return sorted(files)


class ParquetReader:
    """Lists and reads row groups of Parquet files (see :class:`tzrun.Reader`)."""

    def __init__(self, cfg: ParquetConfig) -> None:
        self.cfg = cfg

    def row_groups(self, input_path: str) -> list[RowGroup]:
        groups = []
        for path in list_files(input_path, (".parquet", ".pq")):
            try:
                metadata = pq.ParquetFile(path).metadata
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
            groups.extend(RowGroup(path, i, metadata.row_group(i).num_rows) for i in range(metadata.num_row_groups))
        return groups

    def read(self, group: RowGroup, start: int, stop: int, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        try:
            parquet_file = pq.ParquetFile(group.path)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{group.path}: not a readable Parquet file: {exc}") from None
        names = parquet_file.schema_arrow.names
        missing = [c for c in columns if c not in names]
        if missing:
            raise DataError(
                f"{group.path}: column(s) {', '.join(repr(c) for c in missing)} missing "
                f"(the file has: {', '.join(names)}); fix [features]/[data] or the data"
            )
        try:
            # one thread: DataLoader workers are the parallelism, and Arrow's own pool would
            # oversubscribe the cores (and is one more thread pool a forked worker inherits)
            table = parquet_file.read_row_group(group.index, columns=list(columns), use_threads=False)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{group.path}: row group {group.index} cannot be read: {exc}") from None
        yield from table.slice(start, stop - start).to_batches(max_chunksize=self.cfg.batch_rows)


def build_parquet(cfg: ParquetConfig) -> ParquetReader:
    """The reader."""
    return ParquetReader(cfg)
