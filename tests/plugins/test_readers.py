"""The ``parquet`` and ``csv`` readers: listing, splitting across ranks and workers, the
shuffle buffer, the Criteo text format, and errors naming the file and column."""

from __future__ import annotations

import gzip
import os
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig
from tzrun.data.dataset import merge_intervals, subtract_intervals
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.hashing import hash_to_buckets
from tzrun.data.loader import RankInput
from tzrun.errors import EXIT_CONFIG, DataError
from tzrun.testing import load_config_text
from tzrun_plugins.readers.delimited import CsvConfig, CsvReader
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

TOTAL = 1003


@pytest.fixture
def parquet_dir(tmp_path: Path) -> Path:
    """1,003 rows numbered by `row`, in three Parquet files (one in a subdirectory) with uneven row groups."""
    start = 0
    (tmp_path / "sub").mkdir()
    for name, rows, group in [("part-0.parquet", 400, 150), ("part-1.pq", 3, 2), ("sub/part-2.parquet", 600, 256)]:
        pq.write_table(pa.table({"row": np.arange(start, start + rows, dtype=np.int64)}), tmp_path / name, row_group_size=group)
        start += rows
    (tmp_path / "_SUCCESS").write_text("")
    return tmp_path


@pytest.fixture
def csv_dir(tmp_path: Path) -> Path:
    """The same 1,003 numbered rows as CSV, with a header, empty lines and CRLF endings."""
    start = 0
    for i, rows in enumerate([400, 3, 600]):
        lines = ["row,tag"] + [f"{r},t{r % 7}" for r in range(start, start + rows)]
        lines.insert(5, "")
        (tmp_path / f"part-{i}.csv").write_bytes(("\r\n".join(lines) + ("\r\n" if i else "")).encode())
        start += rows
    return tmp_path


def _numbered_builder() -> BatchBuilder:
    return BatchBuilder(feature_specs(FeaturesConfig(dense=(DenseFeatureConfig("row"),))), ["row"], None)


def _rows_of(batches) -> list[list[int]]:
    return [[int(v) for v in b.labels["row"][: b.num_rows].tolist()] for b in batches]


READERS = {
    "parquet": lambda: ParquetReader(ParquetConfig(batch_rows=64)),
    "csv": lambda: CsvReader(CsvConfig(column_types={"row": "int64"}, rows_per_group=97, batch_rows=50)),
}


@pytest.fixture(params=sorted(READERS))
def numbered(request, parquet_dir, csv_dir):
    """``(reader, input)`` of 1,003 numbered rows, for each reader."""
    return READERS[request.param](), str(parquet_dir if request.param == "parquet" else csv_dir)


@pytest.mark.parametrize("shuffle", [0, 150])
def test_two_ranks_with_two_workers_read_every_row_exactly_once(numbered, shuffle):
    reader, path = numbered
    seen, steps = [], set()
    for rank in range(2):
        rank_input = RankInput(reader, path, 64, 2, ["row"], _numbered_builder(), rank, 2, shuffle_buffer_rows=shuffle, seed=5)
        runs = rank_input.runs
        assert len(runs) == 2 and all(b > a for a, b in runs)  # both workers have batches
        batches = [b for w, (a, z) in enumerate(runs) for b in rank_input.stream.iter_run(a, z)]
        assert len(batches) == rank_input.split.num_batches
        rows = [r for b in _rows_of(batches) for r in b]
        assert len(rows) == rank_input.split.num_rows
        seen.extend(rows)
        steps.add(rank_input.steps)
    assert sorted(seen) == list(range(TOTAL))
    assert len(steps) == 1
    if shuffle:
        assert seen != sorted(seen)


def test_inputs_are_files_directories_or_globs(parquet_dir, csv_dir):
    parquet = ParquetReader(ParquetConfig())
    assert sum(g.num_rows for g in parquet.row_groups(str(parquet_dir))) == TOTAL  # recursive, _SUCCESS skipped
    assert sum(g.num_rows for g in parquet.row_groups(str(parquet_dir / "**" / "*.parquet"))) == 1000
    assert sum(g.num_rows for g in parquet.row_groups(str(parquet_dir / "part-1.pq"))) == 3
    text = CsvReader(CsvConfig(column_types={"row": "int64"}, rows_per_group=100))
    groups = text.row_groups(str(csv_dir))
    assert [g.num_rows for g in groups if g.path.endswith("part-0.csv")] == [100, 100, 100, 100]
    assert sum(g.num_rows for g in groups) == TOTAL
    assert sum(g.num_rows for g in text.row_groups(str(csv_dir / "part-[12].csv"))) == 603


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_shuffled_pass_resumes_exactly_and_knows_its_consumed_rows(parquet_dir, workers):
    rank_input = RankInput(
        ParquetReader(ParquetConfig()), str(parquet_dir), 32, workers, ["row"], _numbered_builder(), 0, 1,
        shuffle_buffer_rows=100, seed=11,
    )
    whole = _rows_of(rank_input.one_pass(epoch=3))
    assert sorted(r for b in whole for r in b) == list(range(TOTAL))
    assert whole != _rows_of(rank_input.one_pass(epoch=4))  # another epoch, another order
    assert [len(b) for b in whole] == [len(b) for b in _rows_of(RankInput(
        ParquetReader(ParquetConfig()), str(parquet_dir), 32, workers, ["row"], _numbered_builder(), 0, 1).one_pass())]
    for k in (0, 1, 2, 5, 17, len(whole)):
        assert _rows_of(rank_input.one_pass(start=k, epoch=3)) == whole[k:], k
        consumed = rank_input.consumed(k, epoch=3)
        assert [r for a, b in consumed for r in range(a, b)] == sorted(r for b in whole[:k] for r in b), k


def test_shuffled_rows_left_after_an_interruption_are_read_once_on_a_new_layout(parquet_dir):
    reader, builder = ParquetReader(ParquetConfig()), _numbered_builder()
    consumed = []
    for rank in range(2):
        rank_input = RankInput(reader, str(parquet_dir), 64, 2, ["row"], builder, rank, 2, shuffle_buffer_rows=200, seed=1)
        consumed.extend(rank_input.consumed(3))
    remaining = subtract_intervals(TOTAL, merge_intervals(consumed))
    seen = [r for a, b in merge_intervals(consumed) for r in range(a, b)]
    for rank in range(3):
        rank_input = RankInput(reader, str(parquet_dir), 50, 1, ["row"], builder, rank, 3, rows=remaining,
                               shuffle_buffer_rows=200, seed=1)
        seen.extend(r for b in _rows_of(rank_input.one_pass()) for r in b)
    assert sorted(seen) == list(range(TOTAL))


# --- the Criteo display-advertising text format -------------------------------------------

CRITEO_NAMES = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]

#: data.reader of docs/data.md's Criteo example, as a TOML inline table.
CRITEO_READER = (
    '{ type = "csv", delimiter = "\\t", header = false, column_names = ['
    + ", ".join(f'"{n}"' for n in CRITEO_NAMES)
    + '], column_types = { label = "float32", '
    + ", ".join(f'I{i} = "float32"' for i in range(1, 14))
    + " } }"
)


def write_criteo(path: Path, rows: int, seed: int = 0) -> list[list[str]]:
    """Criteo-format lines: label, 13 integers, 26 8-digit hex ids, about 20% empty fields."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        ints = ["" if rng.random() < 0.2 else str(rng.randint(-2, 500)) for _ in range(13)]
        cats = ["" if rng.random() < 0.2 else f"{rng.randrange(16 ** 8):08x}" for _ in range(26)]
        out.append([str(rng.randint(0, 1)), *ints, *cats])
    path.write_text("".join("\t".join(fields) + "\n" for fields in out), encoding="utf-8")
    return out


def test_criteo_text_with_empty_fields_loads(tmp_path, tzrun_pm):
    lines = write_criteo(tmp_path / "day_0.txt", 300)
    lines[0][1:14] = [""] * 13  # a row with every integer missing
    lines[1][14:] = [""] * 26  # and one with every id missing
    (tmp_path / "day_0.txt").write_text("".join("\t".join(f) + "\n" for f in lines), encoding="utf-8")
    text = f"""
model_dir = "m"
[data]
train_input = "{tmp_path / 'day_0.txt'}"
reader = {CRITEO_READER}
[model]
type = "deepfm"
[[losses]]
type = "binary_cross_entropy"
[train]
num_steps = 1
sparse_optimizer = {{ type = "sgd", lr = 0.1 }}
dense_optimizer = {{ type = "sgd", lr = 0.1 }}
""" + "".join(f'[[features.dense]]\nname = "I{i}"\nlog1p = true\n' for i in range(1, 14)) + "".join(
        f'[[features.sparse]]\nname = "C{i}"\nhash_bucket_size = 1000\nembedding_dim = 8\n' for i in range(1, 27)
    )
    cfg, registries = load_config_text(text, tzrun_pm)
    reader = registries["reader"].get("csv", "data.reader.type").build(cfg.data.reader.config)
    specs = feature_specs(cfg.features)
    builder = BatchBuilder(specs, cfg.data.labels, None)
    rank_input = RankInput(reader, cfg.data.train_input, 128, 0, specs.columns(["label"], None), builder, 0, 1)
    batches = list(rank_input.one_pass())
    assert [b.num_rows for b in batches] == [128, 128, 44]
    first = batches[0]
    assert first.labels["label"][:3].tolist() == [float(f[0]) for f in lines[:3]]
    assert first.dense[0].tolist() == [0.0] * 13  # empty integers take fill_value 0, log1p(0) = 0
    expected = [np.log1p(max(float(v), 0.0)) if v else 0.0 for v in lines[2][1:14]]
    assert np.allclose(first.dense[2].numpy(), expected)
    ids = first.sparse.to_dict()
    assert [ids[f"C{i}"].lengths()[1].item() for i in range(1, 27)] == [0] * 26  # empty ids give none
    c1 = [f[14] for f in lines[:128]]
    assert ids["C1"].values().tolist() == hash_to_buckets(pa.array([v for v in c1 if v]), 1000).tolist()


# --- malformed input ------------------------------------------------------------------------

def _csv(tmp_path: Path, body: str, **cfg) -> tuple[CsvReader, list]:
    (tmp_path / "in.csv").write_text(body, encoding="utf-8")
    reader = CsvReader(CsvConfig(**{"column_types": {"a": "int64", "b": "float32"}, **cfg}))
    return reader, reader.row_groups(str(tmp_path / "in.csv"))


def test_csv_missing_column_names_file_and_column(tmp_path):
    reader, groups = _csv(tmp_path, "a,b\n1,2\n")
    with pytest.raises(DataError, match=r"in\.csv: column\(s\) 'c' missing \(the file has: a, b\)"):
        list(reader.read(groups[0], 0, 1, ["a", "c"]))


def test_csv_type_mismatch_names_file_line_and_column(tmp_path):
    reader, groups = _csv(tmp_path, "a,b\n1,2\n\n2,x\n")
    with pytest.raises(DataError, match=r"in\.csv: line 4: column 'b' is declared float32 but holds invalid value 'x'"):
        list(reader.read(groups[0], 0, 2, ["a", "b"]))


def test_csv_line_with_the_wrong_number_of_fields_names_file_and_line(tmp_path):
    reader, groups = _csv(tmp_path, "a\tb\n1\t2\n3\n", delimiter="\t")
    with pytest.raises(DataError, match=r"in\.csv: line 3 has 1 field\(s\), expected 2 separated by '\\t': '3'"):
        list(reader.read(groups[0], 0, 2, ["a"]))


def test_parquet_type_mismatch_names_file_and_column(tmp_path):
    pq.write_table(pa.table({"d0": pa.array(["x", "y"]), "label": pa.array([0.0, 1.0])}), tmp_path / "t.parquet")
    builder = BatchBuilder(feature_specs(FeaturesConfig(dense=(DenseFeatureConfig("d0"),))), ["label"], None)
    rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path), 2, 0, ["d0", "label"], builder, 0, 1)
    with pytest.raises(DataError, match=r"t\.parquet: column 'd0' has type string; expected a number"):
        list(rank_input.one_pass())


def test_csv_column_types_the_header_does_not_have(tmp_path):
    with pytest.raises(DataError, match=r"in\.csv: data.reader.column_types names column\(s\) 'b'"):
        _csv(tmp_path, "a,c\n1,2\n")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_files_are_named(tmp_path):
    (tmp_path / "locked.csv").write_text("a\n1\n")
    (tmp_path / "locked.csv").chmod(0)
    with pytest.raises(DataError, match=r"locked\.csv: cannot be read: Permission denied"):
        CsvReader(CsvConfig()).row_groups(str(tmp_path / "locked.csv"))


def test_a_file_gone_after_listing_is_named(tmp_path):
    reader, groups = _csv(tmp_path, "a,b\n1,2\n")
    (tmp_path / "in.csv").unlink()
    with pytest.raises(DataError, match=r"in\.csv: cannot be read: No such file or directory"):
        list(reader.read(groups[0], 0, 1, ["a"]))


def test_compressed_and_broken_files_are_named(tmp_path):
    (tmp_path / "day.csv").write_bytes(gzip.compress(b"a\n1\n"))
    with pytest.raises(DataError, match=r"day\.csv: is gzip-compressed"):
        CsvReader(CsvConfig()).row_groups(str(tmp_path / "day.csv"))
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=r"broken\.parquet: not a readable Parquet file"):
        ParquetReader(ParquetConfig()).row_groups(str(tmp_path / "broken.parquet"))
    with pytest.raises(DataError, match=r"nothing-here: no input files found"):
        CsvReader(CsvConfig()).row_groups(str(tmp_path / "nothing-here"))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("header = false", "data.reader.column_names: name the columns in file order when header = false"),
        ('column_names = ["a"]', "data.reader.column_names: the header names the columns"),
        ('delimiter = ";;"', "data.reader.delimiter: must be one character"),
        ('column_types = { a = "int" }', "data.reader.column_types: column 'a': unknown type 'int'"),
        ("rows_per_group = 0", "data.reader.rows_per_group"),
    ],
)
def test_bad_csv_options_are_config_errors(tzrun_pm, options, expected):
    from tests.core.test_config import MINIMAL, problems_of

    text = MINIMAL.replace('eval_input = "data/eval"', f'eval_input = "data/eval"\nreader = {{ type = "csv", {options} }}')
    problems = problems_of(text, pm=tzrun_pm)
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.slow
def test_a_criteo_text_input_trains_end_to_end(tmp_path):
    from tzrun.testing import run_tiny_training

    write_criteo(tmp_path / "train.txt", 2048, seed=1)
    write_criteo(tmp_path / "eval.txt", 512, seed=2)
    run = run_tiny_training(
        tmp_path,
        in_process=True,
        data_dir=tmp_path,  # unused: the inputs are overridden
        overrides=[
            f'data.train_input="{tmp_path / "train.txt"}"',
            f'data.eval_input="{tmp_path / "eval.txt"}"',
            f"data.reader={CRITEO_READER}",
            "data.num_workers=1",
            "data.shuffle_buffer_rows=512",
            'features.dense=[{ name = "I1", log1p = true }, { name = "I2", log1p = true, mean = 1.0, std = 2.0 }]',
            'features.sparse=[{ name = "C1", hash_bucket_size = 1000, embedding_dim = 8 }, '
            '{ name = "C2", hash_bucket_size = 100, embedding_dim = 8 }, '
            '{ name = "I3_bucket", column = "I3", boundaries = [0.0, 10.0, 100.0], embedding_dim = 8 }]',
        ],
    )
    assert run.steps == 4
    assert 0.0 <= run.metrics["auc"] <= 1.0


def test_the_documented_criteo_text_config_checks(tzrun_pm):
    """docs/data.md's Criteo text config passes both config passes as written."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```toml\n(.*?)```", doc, re.S) if 'type = "csv"' in b)
    cfg, _ = load_config_text(block, tzrun_pm)
    assert cfg.data.reader.config.column_names == tuple(CRITEO_NAMES)
    assert [f.name for f in cfg.features.sparse] == [f"C{i}" for i in range(1, 27)]
    # the reader the tests use is the documented one
    assert cfg.data.reader.config == load_config_text(block, tzrun_pm, [f"data.reader={CRITEO_READER}"])[0].data.reader.config


def test_check_refuses_a_column_a_headerless_file_does_not_have(capsys):
    """A headerless CSV has only column_names: check names every other column the run reads
    (features, labels, group keys) at data.reader.column_names, before any file is opened."""
    from tests.conftest import REPO
    from tzrun.cli.main import main

    config = REPO / "examples" / "deepfm_criteo_text.toml"
    assert main(["check", str(config)]) == 0
    capsys.readouterr()
    code = main(["check", str(config), "--set", 'features.sparse[0].column="C27"', "--set", 'data.labels=["click"]'])
    assert code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"{config}: 1 problem\n  data.reader.column_names: the run reads column(s) " in err
    assert "'C27'" in err and "'click'" in err


def test_the_csv_check_lists_the_missing_columns():
    from tzrun_plugins.readers.delimited import CsvConfig, check_columns

    cfg = CsvConfig(header=False, column_names=("label", "I1", "C1"))
    assert check_columns(cfg, ["label", "I1", "C1"]) == []
    assert check_columns(cfg, ["click", "I1", "C27"]) == [(
        "column_names",
        "the run reads column(s) 'click', 'C27', which column_names does not name (it has 3: label, I1, C1); "
        "add them, or fix [features]/[data]",
    )]
    assert check_columns(CsvConfig(), ["anything"]) == []  # a header names the columns: checked at read time
