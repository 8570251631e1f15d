"""Messages and small fixes for files as users bring them (issue 17, point 7): a UTF-8 BOM,
directories of files with other endings, string ids for ``num_buckets`` features, infinite
values and null labels named by file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig, SparseFeatureConfig
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
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


def _pass(reader, path: Path, features: FeaturesConfig, labels=("label",), batch_size: int = 4) -> list:
    builder = BatchBuilder(feature_specs(features), list(labels), None)
    columns = builder.specs.columns(list(labels), None)
    return list(RankInput(reader, str(path), batch_size, 0, columns, builder, 0, 1).one_pass())


def test_text_ids_for_num_buckets_name_the_column_file_and_column_types(tmp_path: Path):
    (tmp_path / "in.csv").write_text("label,item\n1,7\n0,3\n")
    features = FeaturesConfig(sparse=(SparseFeatureConfig("item_id", column="item", num_buckets=10),))
    with pytest.raises(DataError) as caught:
        _pass(CsvReader(CsvConfig(column_types={"label": "int64"})), tmp_path / "in.csv", features)
    message = str(caught.value)
    assert "in.csv: column 'item' (feature 'item_id') has type string; num_buckets needs integer ids" in message
    assert 'data.reader.column_types = { item = "int64" }' in message
    assert "hash_bucket_size" in message
