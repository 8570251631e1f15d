"""``tzrec-run check`` reads the input files' schemas (Parquet footers, CSV header lines) and
names every file with a missing, misspelled or mistyped column before a run starts."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.cli.main import main
from tzrun.errors import EXIT_DATA

CONFIG = """\
model_dir = "{root}/model"

[data]
train_input = "{train}"
{eval_line}
batch_size = 8
num_workers = 0
labels = ["label"]
{reader}

[model]
type = "deepfm"
deep_hidden_units = [8]
final_hidden_units = [4]
wide_embedding_dim = 4

[[losses]]
type = "binary_cross_entropy"

{metrics}
[train]
num_steps = 2
stages = []
sparse_optimizer = {{ type = "sgd", lr = 0.1 }}
dense_optimizer = {{ type = "sgd", lr = 0.1 }}

[[features.dense]]
name = "price"

[[features.sparse]]
name = "cat3"
num_buckets = 100
embedding_dim = 4

[[features.sparse]]
name = "user"
hash_bucket_size = 50
embedding_dim = 4
"""


def _table(rows: int = 4, **override: pa.Array) -> pa.Table:
    columns = {
        "label": pa.array([0, 1] * (rows // 2), pa.int64()),
        "price": pa.array([1.5] * rows, pa.float64()),
        "cat3": pa.array(list(range(rows)), pa.int64()),
        "user": pa.array([f"u{i}" for i in range(rows)]),
    }
    columns.update(override)
    return pa.table({k: v for k, v in columns.items() if v is not None})


def _config(tmp_path: Path, train: Path | str, eval_input: Path | str | None = None, reader: str = "",
            **changes: str) -> Path:
    text = CONFIG.format(root=tmp_path.as_posix(), train=Path(train).as_posix(), reader=reader,
                         eval_line=f'eval_input = "{Path(eval_input).as_posix()}"' if eval_input else "",
                         metrics='[[metrics]]\ntype = "auc"\n' if eval_input else "")
    for old, new in changes.items():
        text = text.replace(old, new)
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def _parquet_dir(root: Path, tables: list[pa.Table]) -> Path:
    root.mkdir(parents=True)
    for i, table in enumerate(tables):
        pq.write_table(table, root / f"part-{i:05d}.parquet")
    return root


def _check(capsys: pytest.CaptureFixture[str], config: Path, *flags: str) -> tuple[int, str, str]:
    code = main(["check", str(config), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_column_missing_in_the_third_file_is_named_with_the_file(tmp_path, capsys):
    train = _parquet_dir(tmp_path / "train", [_table(), _table(), _table(cat3=None), _table()])
    code, out, err = _check(capsys, _config(tmp_path, train))
    assert code == EXIT_DATA, out
    third = (train / "part-00002.parquet").as_posix()
    lines = [line.strip() for line in err.splitlines()]
    assert f"{third}: column 'cat3' missing (the file has 3 columns)" in lines, err
    assert "part-00000" not in err and "part-00001" not in err and "part-00003" not in err


def test_the_same_directory_passes_with_no_data_and_when_complete(tmp_path, capsys):
    train = _parquet_dir(tmp_path / "train", [_table(), _table(), _table(cat3=None)])
    config = _config(tmp_path, train)
    code, out, err = _check(capsys, config, "--no-data")
    assert code == 0, err
    assert "ok" in out and "data:" not in out
    (train / "part-00002.parquet").unlink()
    code, out, err = _check(capsys, config)
    assert code == 0, err
    assert "data: data.train_input: schemas of 2 file(s) read" in out


def test_a_misspelled_feature_column_gets_a_did_you_mean_once_for_all_files(tmp_path, capsys):
    train = _parquet_dir(tmp_path / "train", [_table(), _table(), _table()])
    config = _config(tmp_path, train, **{'name = "cat3"': 'name = "cat_3"'})
    code, out, err = _check(capsys, config)
    assert code == EXIT_DATA
    first = (train / "part-00000.parquet").as_posix()
    assert f"{first}: column 'cat_3' missing (did you mean 'cat3'?) (and in 2 more files)" in err, err
    assert "1 data problem " in err


def test_int64_in_one_file_and_string_in_another_names_both_files(tmp_path, capsys):
    train = _parquet_dir(tmp_path / "train", [_table(), _table(), _table(cat3=pa.array(["a", "b", "c", "d"]))])
    code, out, err = _check(capsys, _config(tmp_path, train))
    assert code == EXIT_DATA
    one, three = (train / "part-00000.parquet").as_posix(), (train / "part-00002.parquet").as_posix()
    assert f"{three}: column 'cat3' is string here but int64 in {one}" in err, err


def test_compatible_drift_passes(tmp_path, capsys):
    """Integer widths and nullability may differ, as at run time."""
    narrow = _table(cat3=pa.array([0, 1, 2, 3], pa.int32()), price=pa.array([1.0] * 4, pa.float32()))
    train = _parquet_dir(tmp_path / "train", [_table(), narrow])
    code, out, err = _check(capsys, _config(tmp_path, train))
    assert code == 0, err


def test_a_string_column_for_num_buckets_points_at_column_types_in_csv(tmp_path, capsys):
    train = tmp_path / "train"
    train.mkdir()
    for i in range(2):
        (train / f"part-{i}.csv").write_text("label,price,cat3,user\n0,1.5,3,u1\n1,2.5,4,u2\n")
    csv = '[data.reader]\ntype = "csv"\ncolumn_types = { label = "int64", price = "float64" }'
    code, out, err = _check(capsys, _config(tmp_path, train, reader=csv))
    assert code == EXIT_DATA
    first = (train / "part-0.csv").as_posix()
    assert (f"{first}: column 'cat3' is string, which feature 'cat3' (num_buckets) cannot read; declare integer ids "
            '(a csv column is text unless data.reader.column_types = { cat3 = "int64" })') in err, err
    # the hashed string column is fine: only cat3 is named
    assert err.count("column '") == 1
    csv = csv.replace('price = "float64"', 'price = "float64", cat3 = "int64"')
    code, out, err = _check(capsys, _config(tmp_path, train, reader=csv))
    assert code == 0, err


def test_a_csv_header_missing_a_column_in_a_later_file(tmp_path, capsys):
    train = tmp_path / "train"
    train.mkdir()
    header = {0: "label,price,cat3,user", 1: "label,price,cat3,user", 2: "label,prize,cat3,user"}
    for i, line in header.items():
        (train / f"part-{i}.csv").write_text(f"{line}\n0,1.5,3,u1\n")
    csv = '[data.reader]\ntype = "csv"\ncolumn_types = { label = "int64", price = "float64", prize = "float64", cat3 = "int64" }'
    code, out, err = _check(capsys, _config(tmp_path, train, reader=csv))
    assert code == EXIT_DATA
    # column_types naming a column the header lacks is the reader's own error, named per file
    assert (train / "part-0.csv").as_posix() in err
    csv = '[data.reader]\ntype = "csv"\ndefault_type = "int64"'
    code, out, err = _check(capsys, _config(tmp_path, train, reader=csv))
    assert code == EXIT_DATA
    assert f"{(train / 'part-2.csv').as_posix()}: column 'price' missing (did you mean 'prize'?)" in err, err
    assert "part-0.csv" not in err and "part-1.csv" not in err


def test_a_missing_input_path_is_a_problem_when_the_other_input_exists(tmp_path, capsys):
    train = _parquet_dir(tmp_path / "train", [_table()])
    code, out, err = _check(capsys, _config(tmp_path, train, eval_input=tmp_path / "evl"))
    assert code == EXIT_DATA
    assert f"{(tmp_path / 'evl').as_posix()}: data.eval_input does not exist" in err, err


def test_no_input_reachable_is_a_note_unless_data_is_required(tmp_path, capsys):
    """The docs' snippets and the examples point at data a fresh clone does not have."""
    config = _config(tmp_path, tmp_path / "nowhere" / "train", eval_input=tmp_path / "nowhere" / "eval")
    code, out, err = _check(capsys, config)
    assert code == 0, err
    assert "data not checked: data.train_input" in out and "--require-data" in out
    code, out, err = _check(capsys, config, "--require-data")
    assert code == EXIT_DATA
    assert "data.train_input does not exist" in err and "data.eval_input does not exist" in err


def test_a_directory_without_readable_files_is_a_problem(tmp_path, capsys):
    train = tmp_path / "train"
    train.mkdir()
    (train / "part-00000").write_bytes(b"x")
    code, out, err = _check(capsys, _config(tmp_path, train))
    assert code == EXIT_DATA
    assert "no input files found" in err and "data.reader.suffixes" in err


def test_many_files_are_sampled_and_the_count_said(tmp_path, capsys, monkeypatch):
    import tzrun.data.input_check as input_check

    train = _parquet_dir(tmp_path / "train", [_table() for _ in range(7)] + [_table(cat3=None)])
    monkeypatch.setattr(input_check, "MAX_FILES", 3)
    config = _config(tmp_path, train)
    code, out, err = _check(capsys, config)
    assert code == EXIT_DATA  # the last file is always among those read
    assert "part-00007.parquet: column 'cat3' missing" in err
    (train / "part-00007.parquet").unlink()
    code, out, err = _check(capsys, config)
    assert code == 0, err
    assert "data: data.train_input: schemas of 3 of 7 files (evenly spread) read" in out
