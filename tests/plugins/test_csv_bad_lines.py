"""The csv reader under ``data.on_bad_row = "skip"``: malformed lines and unparsable fields stay
in place as marked rows, and a pass leaves them out and counts them by reason."""

from __future__ import annotations

from pathlib import Path


import tzrun
from tzrun.config.schema import FeaturesConfig, SparseFeatureConfig
from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.data.reader_bad_rows import read_columns
from tzrun_plugins.readers.delimited import CsvConfig, CsvReader

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
