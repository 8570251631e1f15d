"""Registers the first-party data readers."""

from __future__ import annotations

import tzrun
from tzrun_plugins.readers import delimited, parquet


@tzrun.hookimpl
def tzrun_register_readers(register: tzrun.RegisterReaders) -> None:
    register("parquet", config=parquet.ParquetConfig, build=parquet.build_parquet,
             description="Parquet files, directories or globs through pyarrow, split by row group")
    register("csv", config=delimited.CsvConfig, build=delimited.build_csv, check=delimited.check_columns,
             description="delimited text (CSV, TSV, Criteo) through pyarrow, split into groups of rows")
