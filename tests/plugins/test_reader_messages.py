"""Messages and small fixes for files as users bring them (issue 17, point 7): a UTF-8 BOM,
directories of files with other endings, string ids for ``num_buckets`` features, infinite
values and null labels named by file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from tzrun.errors import DataError
from tzrun_plugins.readers.delimited import CsvConfig, CsvReader

BOM = b"\xef\xbb\xbf"


def test_a_utf8_bom_before_the_header_is_not_part_of_the_first_column(tmp_path: Path):
    (tmp_path / "excel.csv").write_bytes(BOM + b"label,x\r\n1,0.5\r\n0,2\r\n")
    reader = CsvReader(CsvConfig(column_types={"label": "int64", "x": "float32"}))
    groups = reader.row_groups(str(tmp_path / "excel.csv"))
    table = next(iter(reader.read(groups[0], 0, 2, ["label", "x"])))
    assert table.column("label").to_pylist() == [1, 0]
    assert table.column("x").to_pylist() == [0.5, 2.0]


def test_a_utf8_bom_before_a_headerless_first_row_is_not_part_of_its_first_field(tmp_path: Path):
    (tmp_path / "excel.csv").write_bytes(BOM + b"1,0.5\n0,2\n")
    reader = CsvReader(CsvConfig(header=False, column_names=("label", "x"), column_types={"label": "int64"}))
    groups = reader.row_groups(str(tmp_path / "excel.csv"))
    table = next(iter(reader.read(groups[0], 0, 2, ["label"])))
    assert table.column("label").to_pylist() == [1, 0]
