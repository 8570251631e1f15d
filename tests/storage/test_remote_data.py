"""Training data on an object store: ``data.train_input``/``eval_input`` as ``s3://`` URLs
(a prefix, a glob), read by the built-in readers from a real S3-compatible server on loopback
(moto's), train exactly as the same files on local disk, and are checked by ``tzrec-run check``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.warm_ranks import warm_cli
from tzrun.errors import DataError, StorageError
from tzrun.testing import run_tiny_training, tiny_config_text

#: the tiny config's id columns read as integers from text
CSV_READER = 'data.reader={type="csv", column_types={int_0="float32", cat_0="int64", cat_5="int64", cat_8="int64", label="int8"}}'
COLUMNS = ["label", "int_0", "cat_0", "cat_5", "cat_8"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,024 training rows in two Parquet files (one epoch of the tiny run) and 512 eval rows,
    plus the same rows as CSV (``train_csv/``, ``eval_csv/``) with empty fields and quoted values."""
    from tzrun_tools.synth import synth_criteo

    out = tmp_path_factory.mktemp("tiny_remote")
    synth_criteo(out, rows=1024, eval_rows=512, seed=0, rows_per_file=512, row_group_size=256)
    for split in ("train", "eval"):
        (out / f"{split}_csv").mkdir()
        for part in sorted((out / split).glob("*.parquet")):
            _write_csv(pq.read_table(part, columns=COLUMNS), out / f"{split}_csv" / part.with_suffix(".csv").name)
    return out


def _write_csv(table: pa.Table, path: Path) -> None:
    """``table`` as CSV: every 5th ``int_0`` empty, ids quoted (``"17"``)."""
    rows = table.to_pylist()
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC)
        out.writerow(COLUMNS)
        for i, row in enumerate(rows):
            out.writerow([row["label"], "" if i % 5 == 0 else row["int_0"], *(str(row[c]) for c in COLUMNS[2:])])


def _upload(local: Path, url: str) -> None:
    fsspec.filesystem("s3").put(str(local), url.removeprefix("s3://"), recursive=True)


def _overrides(train: str, eval_: str, *extra: str) -> list[str]:
    return [f'data.train_input="{train}"', f'data.eval_input="{eval_}"', *extra]


def _weights(run) -> dict:
    """The trained model's parameters (one rank: each table's only shard)."""
    return {k: (v.local_shards()[0].tensor if hasattr(v, "local_shards") else v).clone()
            for k, v in run.model.state_dict().items()}


def _assert_same_training(remote, local) -> None:
    assert remote.steps == local.steps == 4
    assert remote.metrics == local.metrics and local.metrics["loss/binary_cross_entropy"] > 0
    want = _weights(local)
    got = _weights(remote)
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_parquet_prefix_on_s3_read_by_forked_workers_trains_like_the_local_files(tiny_data, s3_bucket, tmp_path):
    _upload(tiny_data / "train", f"{s3_bucket}/data/train")
    _upload(tiny_data / "eval", f"{s3_bucket}/data/eval")
    # DataLoader workers forked from a process that already used the store (s3fs is not fork-safe)
    local = run_tiny_training(tmp_path / "local", in_process=True, overrides=_overrides(
        tiny_data / "train", tiny_data / "eval", "data.num_workers=2"))
    remote = run_tiny_training(tmp_path / "s3", in_process=True, overrides=_overrides(
        f"{s3_bucket}/data/train", f"{s3_bucket}/data/eval", "data.num_workers=2"))
    _assert_same_training(remote, local)


def test_csv_glob_with_empty_and_quoted_fields_on_s3_trains_like_the_local_files(tiny_data, s3_bucket, tmp_path):
    _upload(tiny_data / "train_csv", f"{s3_bucket}/csv/train")
    _upload(tiny_data / "eval_csv", f"{s3_bucket}/csv/eval")
    local = run_tiny_training(tmp_path / "local", in_process=True, overrides=_overrides(
        tiny_data / "train_csv" / "*.csv", tiny_data / "eval_csv", CSV_READER))
    remote = run_tiny_training(tmp_path / "s3", in_process=True, overrides=_overrides(
        f"{s3_bucket}/csv/train/*.csv", f"{s3_bucket}/csv/eval", CSV_READER))
    _assert_same_training(remote, local)


def test_check_reads_every_s3_file_and_names_the_one_missing_a_column(tiny_data, s3_bucket, tmp_path, capsys):
    from tzrun.cli.main import main

    fs = fsspec.filesystem("s3")
    bucket = s3_bucket.removeprefix("s3://")
    table = pq.read_table(tiny_data / "train" / "part-00000.parquet", columns=COLUMNS).slice(0, 8)
    for i in range(4):
        with fs.open(f"{bucket}/train/part-{i}.parquet", "wb") as f:
            pq.write_table(table.drop_columns(["cat_5"]) if i == 2 else table, f)
    _upload(tiny_data / "eval", f"{s3_bucket}/eval")
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config_text(tiny_data, tmp_path / "run"), encoding="utf-8")
    argv = ["check", str(config), *(a for o in _overrides(f"{s3_bucket}/train", f"{s3_bucket}/eval") for a in ("--set", o))]
    assert main(argv) != 0
    out = capsys.readouterr()
    assert f"{s3_bucket}/train/part-2.parquet: column 'cat_5' missing" in out.err, out
    assert "part-0.parquet" not in out.err  # the other files are fine
    assert main([*argv, "--no-data"]) == 0  # config only: the data is not read
    from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

    reader = ParquetReader(ParquetConfig())
    third = reader.row_groups(f"{s3_bucket}/train")[2]
    with pytest.raises(DataError, match=rf"^{third.path}: column\(s\) 'cat_5' missing \(the file has: label, int_0"):
        list(reader.read(third, 0, 8, ["cat_5"]))  # and so does a run, at its first read of the file
    fs.rm(f"{bucket}/train/part-2.parquet")
    assert main(argv) == 0, capsys.readouterr()
    assert "data.train_input: schemas of 3 file(s) read" in capsys.readouterr().out


def test_a_bad_row_of_an_s3_csv_is_named_by_its_url_line_and_column(s3_bucket):
    from tzrun_plugins.readers.delimited import CsvConfig, CsvReader

    fsspec.filesystem("s3").pipe(f"{s3_bucket.removeprefix('s3://')}/csv/a.csv", b'id,x\n"1",2.5\n2,\n\n3,abc\n')
    reader = CsvReader(CsvConfig(column_types={"id": "int64", "x": "float32"}))
    groups = reader.row_groups(f"{s3_bucket}/csv/*.csv")
    assert [g.path for g in groups] == [f"{s3_bucket}/csv/a.csv"] and groups[0].num_rows == 3
    with pytest.raises(DataError, match=rf"^{s3_bucket}/csv/a.csv: line 5: column 'x' is declared float32 but holds"):
        list(reader.read(groups[0], 0, 3, ["id", "x"]))
    first = pa.Table.from_batches(list(reader.read(groups[0], 0, 2, ["id", "x"])))
    assert first.to_pydict() == {"id": [1, 2], "x": [2.5, None]}


def test_a_scheme_without_its_package_is_named_with_the_extra_to_install():
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed: gs:// is readable here")
    from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

    with pytest.raises(StorageError, match=r"^gs://b/train: cannot open gs:// paths .*pip install 'tzrec-run\[gcs\]'"):
        ParquetReader(ParquetConfig()).files("gs://b/train")


@pytest.mark.slow
def test_two_ranks_read_their_shards_from_s3(tiny_data, s3_bucket, tmp_path):
    _upload(tiny_data / "train", f"{s3_bucket}/train")
    _upload(tiny_data / "eval", f"{s3_bucket}/eval")
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config_text(tiny_data, tmp_path / "run"), encoding="utf-8")
    sets = [a for o in _overrides(f"{s3_bucket}/train", f"{s3_bucket}/eval", "train.num_steps=2")
            for a in ("--set", o)]
    trained = warm_cli(["train", str(config), *sets, "--nproc-per-node", "2"], timeout=300)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-5000:]
    final = json.loads((tmp_path / "run" / "eval_results.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert final["step"] == 2 and final["rows"] == 512  # both ranks' shards of the eval files were read


def test_vocab_files_and_item_tables_are_read_from_s3(s3_bucket, tmp_path):
    from tzrun.config.vocab import read_vocab_file
    from tzrun_plugins.samplers.negative import NegativeSamplerConfig, read_item_table

    fs = fsspec.filesystem("s3")
    bucket = s3_bucket.removeprefix("s3://")
    fs.pipe(f"{bucket}/vocab/city.txt", "köln\r\nparis\n\nrome\n".encode())
    assert read_vocab_file(f"{s3_bucket}/vocab/city.txt") == ("köln", "paris", "rome")
    with fs.open(f"{bucket}/items/part-0.parquet", "wb") as f:
        pq.write_table(pa.table({"item": [3, 5], "price": [1.5, 2.0]}), f)
    cfg = NegativeSamplerConfig(item_table=f"{s3_bucket}/items", item_id="item", num_negatives=1)
    assert read_item_table(cfg).to_pydict() == {"item": [3, 5], "price": [1.5, 2.0]}
    with pytest.raises(DataError, match=rf"^{s3_bucket}/nope.parquet: the item table \(data.sampler.item_table\) does not exist"):
        read_item_table(NegativeSamplerConfig(item_table=f"{s3_bucket}/nope.parquet", item_id="item", num_negatives=1))


def test_file_urls_read_as_local_paths(tiny_data):
    from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

    reader = ParquetReader(ParquetConfig())
    assert reader.row_groups(f"file://{tiny_data / 'train'}") == reader.row_groups(str(tiny_data / "train"))
