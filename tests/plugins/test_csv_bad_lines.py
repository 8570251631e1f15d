"""The csv reader under ``data.on_bad_row = "skip"``: malformed lines and unparsable fields stay
in place as marked rows, and a pass leaves them out and counts them by reason."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import tzrun
from tzrun.config.schema import FeaturesConfig, SparseFeatureConfig
from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.data.reader_bad_rows import read_columns
from tzrun.errors import DataError
from tzrun_plugins.readers.delimited import CsvConfig, CsvReader
from tzrun_plugins.readers.quoting import unclosed_rows

TYPES = {"label": "float32", "a": "int64", "b": "float64"}


def _reader() -> CsvReader:
    return CsvReader(CsvConfig(column_types=TYPES))


def test_bad_lines_and_fields_keep_their_place_with_their_reasons(tmp_path: Path):
    path = tmp_path / "f.csv"
    path.write_text("label,a,b\n1,1,0.5\n0,x,y\n1,2\n\n0,3,1e3\n1,4,0.25,9\n0,5,z\n1,6")
    reader = _reader()
    group = reader.row_groups(str(path))[0]
    (table,) = reader.read(group, 0, group.num_rows, ["a", "b", tzrun.BAD_ROW_COLUMN])
    assert table.column("a").to_pylist() == [1, None, None, 3, None, 5, None]
    assert table.column("b").to_pylist() == [0.5, None, None, 1000.0, None, None, None]
    assert table.column(tzrun.BAD_ROW_COLUMN).to_pylist() == [
        None, "a: not an integer; b: not a number", "malformed line", None, "malformed line", "b: not a number",
        "malformed line",
    ]
    (plain,) = reader.read(group, 0, 1, ["a", "b"])  # without the mark column: as before
    assert plain.column_names == ["a", "b"]


def test_a_pass_leaves_out_and_counts_every_bad_line(tmp_path: Path):
    lines = ["label,a,b"] + [f"{i % 2},{i % 10},{i / 7:.3f}" for i in range(40)]
    lines[5] = "1,oops,0.1"       # an unparsable field
    lines[12] = "1,2"             # a line cut short
    for i in range(21, 31):       # a whole batch of lines with a field too many
        lines[i] += ",extra"
    (tmp_path / "f.csv").write_text("\n".join(lines) + "\n")
    features = FeaturesConfig(sparse=(SparseFeatureConfig("a", num_buckets=10),))
    builder = BatchBuilder(feature_specs(features), ["label"], None, on_bad_row="skip")
    reader = CsvReader(CsvConfig(column_types=TYPES, batch_rows=7))
    columns = read_columns(reader, ["label", "a"], "skip")
    rank_input = RankInput(reader, str(tmp_path / "f.csv"), 10, 0, columns, builder, 0, 1)
    total = SkippedRows()
    batches = list(tally_skipped(rank_input.one_pass(), total))
    assert len(batches) == rank_input.steps == 4  # the batch of only bad lines still takes its step
    assert sum(b.num_rows for b in batches) == 40 - 12
    assert total == SkippedRows(12, {"malformed line": 11, "a: not an integer": 1}) and total.read == 40
    assert batches[2].num_rows == 0 and batches[2].skipped.rows == 10


def test_readers_that_do_not_isolate_bad_rows_are_not_asked_to():
    class Plain:
        pass

    assert read_columns(Plain(), ["a"], "skip") == ["a"]
    assert read_columns(_reader(), ["a"], "error") == ["a"]
    assert read_columns(_reader(), ["a"], "skip") == ["a", tzrun.BAD_ROW_COLUMN]


def _stray_quote_file(tmp_path: Path) -> Path:
    """200 numbered rows; line 52 (row 50) has a stray quote opening its last field."""
    lines = ["label,a,b,c"] + [f"{i % 2},{i},0.5,id{i}" for i in range(200)]
    lines[51] = '1,50,0.5,"id50'
    path = tmp_path / "f.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("rows_per_group,batch_rows", [(7, 1), (7, 5), (65536, 65536)])
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_stray_quote_costs_one_line_on_any_ranks_and_groups(tmp_path: Path, rows_per_group, batch_rows, world_size):
    path = _stray_quote_file(tmp_path)
    features = FeaturesConfig(sparse=(SparseFeatureConfig("a", num_buckets=200),))
    reader = CsvReader(CsvConfig(column_types=TYPES, rows_per_group=rows_per_group, batch_rows=batch_rows))
    columns = read_columns(reader, ["label", "a"], "skip")
    total, ids = SkippedRows(), []
    for rank in range(world_size):
        builder = BatchBuilder(feature_specs(features), ["label"], None, on_bad_row="skip")
        rank_input = RankInput(reader, str(path), 16, 0, columns, builder, rank, world_size)
        for batch in tally_skipped(rank_input.one_pass(), total):
            ids += batch.sparse["a"].values().tolist()
    assert total == SkippedRows(1, {"unbalanced quote": 1}) and total.read == 200
    assert sorted(ids) == [i for i in range(200) if i != 50]


def test_a_stray_quote_in_error_mode_names_line_column_and_quote(tmp_path: Path):
    reader = CsvReader(CsvConfig(column_types=TYPES, rows_per_group=30))
    group = reader.row_groups(str(_stray_quote_file(tmp_path)))[1]
    message = 'line 52, column \'c\': an unbalanced double quote \\(\\"\\).*fix the quoting, or set data.on_bad_row = "skip"'
    with pytest.raises(DataError, match=message):
        list(reader.read(group, 0, group.num_rows, ["a", "c"]))
    (rows,) = reader.read(group, 0, 20, ["a"])  # the lines before it read as before
    assert rows.column("a").to_pylist() == list(range(30, 50))


def test_an_earlier_bad_line_is_named_before_a_later_stray_quote(tmp_path: Path):
    path = tmp_path / "f.csv"
    path.write_text('label,a,c\n1,1,x\n1,oops,y\n1,3,"z\n1,4,w\n')
    reader = CsvReader(CsvConfig(column_types={"a": "int64"}))
    group = reader.row_groups(str(path))[0]
    with pytest.raises(DataError, match="line 3: column 'a' is declared int64"):
        list(reader.read(group, 0, group.num_rows, ["a"]))


def test_quoted_fields_that_close_on_their_line_still_parse(tmp_path: Path):
    path = tmp_path / "f.csv"
    path.write_text(
        'label,a,c\n1,1,"a, ""b"" c"\n0,2,""\n1,3,5\'11"\n0,4,"x"y\n1,"5",""""\n0,6,"two\nlines"\n1,7,last\n'
    )
    reader = CsvReader(CsvConfig(column_types={"a": "int64"}, null_values=()))
    group = reader.row_groups(str(path))[0]
    (table,) = reader.read(group, 0, group.num_rows, ["a", "c", tzrun.BAD_ROW_COLUMN])
    assert table.column("c").to_pylist() == ['a, "b" c', "", "5'11\"", "xy", '"', None, None, "last"]
    assert table.column(tzrun.BAD_ROW_COLUMN).to_pylist() == [None] * 5 + ["unbalanced quote", "malformed line", None]


def test_lines_ending_inside_quotes_are_the_ones_pyarrow_reads_on_from():
    """The vectorized rule agrees with pyarrow's own parser on random lines of a, ',', '"'."""
    rng = random.Random(3)
    lines = ["".join(rng.choice('a,""') for _ in range(rng.randint(1, 8))) + ("\r" if rng.random() < 0.2 else "")
             for _ in range(1500)]
    data = ("\n".join(lines) + "\n").encode()
    starts = np.array([0] + [i + 1 for i, byte in enumerate(data[:-1]) if byte == 10], np.int64)
    found = set(unclosed_rows(data, np.frombuffer(data, np.uint8), starts, ",", '"').tolist())

    def reads_on(line: str) -> bool:  # pyarrow sees one row, not two, in the line and "END"
        rows = []
        table = pacsv.read_csv(
            pa.py_buffer((line + "\nEND\n").encode()), read_options=pacsv.ReadOptions(column_names=["x"]),
            parse_options=pacsv.ParseOptions(invalid_row_handler=lambda row: rows.append(row) or "skip"),
        )
        return table.num_rows + len(rows) < 2

    assert [i for i, line in enumerate(lines) if reads_on(line) != (i in found)] == []
    assert 100 < len(found) < 1400


def test_random_quoting_gives_the_same_rows_whatever_the_groups(tmp_path: Path):
    """Lines of random fields with quotes in random places: every split into groups and runs of
    rows reads the same rows and marks the same bad ones as each line read on its own."""
    rng = random.Random(7)
    fields = ["1", "2", "x", '"a,b"', '"q""q"', '"', 'in"ch', '""', '"z']
    lines = [",".join([str(i % 2), str(i)] + [rng.choice(fields) for _ in range(2)]) for i in range(150)]
    path = tmp_path / "f.csv"
    path.write_text("label,a,c,d\n" + "\n".join(lines))

    def read(rows_per_group: int, batch_rows: int) -> list:
        reader = CsvReader(CsvConfig(column_types={"a": "int64"}, rows_per_group=rows_per_group, batch_rows=batch_rows))
        out = []
        for group in reader.row_groups(str(path)):
            for batch in reader.read(group, 0, group.num_rows, ["a", "c", "d", tzrun.BAD_ROW_COLUMN]):
                out += batch.to_pylist()
        return out

    one_by_one = read(1, 1)
    assert read(150, 150) == read(13, 4) == one_by_one
    assert 10 < sum(row[tzrun.BAD_ROW_COLUMN] == "unbalanced quote" for row in one_by_one) < 140
