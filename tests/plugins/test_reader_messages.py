"""Messages and small fixes for files as users bring them (issue 17, point 7): a UTF-8 BOM,
directories of files with other endings, string ids for ``num_buckets`` features, infinite
values and null labels named by file, line and column."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig, SparseFeatureConfig
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.errors import DataError
from tzrun_plugins.readers.delimited import CsvConfig, CsvReader
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

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


def test_a_directory_of_part_files_names_what_it_holds_and_data_reader_suffixes(tmp_path: Path):
    for i in range(7):
        pq.write_table(pa.table({"label": [1.0, 0.0]}), tmp_path / f"part-{i:05d}")
    (tmp_path / "_SUCCESS").write_text("")
    with pytest.raises(DataError) as caught:
        ParquetReader(ParquetConfig()).row_groups(str(tmp_path))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path}: no input files found: no name ends in '.parquet', '.pq' ")
    assert "(the directory has: part-00000, part-00001, part-00002, part-00003, part-00004, ... (7 files))" in message
    assert "data.reader.suffixes" in message
    assert "_SUCCESS" not in message
    groups = ParquetReader(ParquetConfig(suffixes=("",))).row_groups(str(tmp_path))
    assert [g.path for g in groups] == [str(tmp_path / f"part-{i:05d}") for i in range(7)]


def test_a_directory_of_gzipped_csv_says_that_compressed_text_is_not_read(tmp_path: Path):
    (tmp_path / "day_0.csv.gz").write_bytes(gzip.compress(b"label\n1\n"))
    with pytest.raises(DataError) as caught:
        CsvReader(CsvConfig()).row_groups(str(tmp_path))
    message = str(caught.value)
    assert "no name ends in '.csv', '.tsv', '.txt' (the directory has: day_0.csv.gz)" in message
    assert "data.reader.suffixes" in message and "decompress them first" in message


def test_an_empty_directory_says_so(tmp_path: Path):
    with pytest.raises(DataError, match=r"no input files found: the directory has no files \(looked for names ending in '.csv'"):
        CsvReader(CsvConfig()).row_groups(str(tmp_path))


DENSE = FeaturesConfig(dense=(DenseFeatureConfig("price"),))


def test_an_infinite_csv_value_names_file_line_and_column(tmp_path: Path):
    (tmp_path / "in.csv").write_text("label,price\n1,0.5\n\n0,2\n1,3\n0,inf\n1,1\n")
    reader = CsvReader(CsvConfig(column_types={"label": "float32", "price": "float32"}, rows_per_group=2))
    with pytest.raises(DataError) as caught:
        _pass(reader, tmp_path / "in.csv", DENSE)
    assert str(caught.value).startswith(
        f"{tmp_path / 'in.csv'}: line 6: column 'price' (dense feature 'price') has 1 infinite value(s)"
    )


def test_a_null_csv_label_names_file_line_and_column_also_from_a_data_worker(tmp_path: Path):
    (tmp_path / "a.csv").write_text("label,price\n1,0.5\n0,2\n")
    (tmp_path / "b.csv").write_text("label,price\n1,0.5\n0,2\n1,1\n,4\n")
    reader = CsvReader(CsvConfig(column_types={"label": "float32", "price": "float32"}))
    builder = BatchBuilder(feature_specs(DENSE), ["label"], None)
    for workers in (0, 1):
        rank_input = RankInput(reader, str(tmp_path), 4, workers, ["price", "label"], builder, 0, 1)
        with pytest.raises(DataError) as caught:
            list(rank_input.one_pass())
        assert f"{tmp_path / 'b.csv'}: line 5: column 'label' has 1 null value(s)" in str(caught.value)


def test_a_bad_parquet_row_is_named_by_its_row_in_the_file_even_shuffled(tmp_path: Path):
    labels = [1.0] * 30
    labels[23] = None
    pq.write_table(pa.table({"label": labels, "price": [1.0] * 30}), tmp_path / "t.parquet", row_group_size=10)
    builder = BatchBuilder(feature_specs(DENSE), ["label"], None)
    for shuffle_rows in (0, 30):
        rank_input = RankInput(
            ParquetReader(ParquetConfig(batch_rows=4)), str(tmp_path), 8, 0, ["price", "label"], builder, 0, 1,
            shuffle_buffer_rows=shuffle_rows,
        )
        with pytest.raises(DataError) as caught:
            list(rank_input.one_pass())
        assert f"t.parquet: row 23 (counting from 0): column 'label' has 1 null value(s)" in str(caught.value)
