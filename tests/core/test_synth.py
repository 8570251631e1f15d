"""Tests of tzrun_tools.synth: the synthetic Criteo-shaped data with a known Bayes AUC."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun_tools import synth, synth_common
from tzrun_tools.synth import (
    CRITEO_CARDINALITIES,
    CRITEO_NUM_DENSE,
    CRITEO_NUM_SPARSE,
    DENSE_COLUMNS,
    LABEL_COLUMN,
    SPARSE_COLUMNS,
    SynthReport,
    read_report,
    synth_criteo,
)


def _read(out: Path, split: str) -> pa.Table:
    files = sorted((out / split).glob("part-*.parquet"))
    assert files, f"no part files in {out / split}"
    return pa.concat_tables(pq.read_table(f) for f in files)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SynthReport]:
    out = tmp_path_factory.mktemp("synth") / "criteo"
    report = synth_criteo(out, rows=20_000, eval_rows=5_000, seed=0, rows_per_file=7_000)
    return out, report


def test_constants() -> None:
    assert CRITEO_NUM_DENSE == 13 and CRITEO_NUM_SPARSE == 26
    assert len(CRITEO_CARDINALITIES) == 26
    assert all(3 <= c <= 5_000 for c in CRITEO_CARDINALITIES)
    assert sum(CRITEO_CARDINALITIES) <= 40_000
    assert DENSE_COLUMNS == tuple(f"int_{i}" for i in range(13))
    assert SPARSE_COLUMNS == tuple(f"cat_{i}" for i in range(26))
    assert LABEL_COLUMN == "label"
    assert set(synth.__all__) >= {"synth_criteo", "read_report", "SynthReport"}


def test_layout_and_schema(small: tuple[Path, SynthReport]) -> None:
    out, report = small
    train_files = sorted((out / "train").glob("part-*.parquet"))
    assert [f.name for f in train_files] == [f"part-{i:05d}.parquet" for i in range(3)]
    assert [pq.ParquetFile(f).metadata.num_rows for f in train_files] == [7_000, 7_000, 6_000]
    assert [f.name for f in (out / "eval").iterdir()] == ["part-00000.parquet"]
    assert (out / "synth.json").is_file()
    assert not list(out.rglob(".*.tmp"))

    table = _read(out, "train")
    assert table.num_rows == report.train_rows == 20_000
    assert _read(out, "eval").num_rows == report.eval_rows == 5_000
    assert table.column_names == [LABEL_COLUMN, *DENSE_COLUMNS, *SPARSE_COLUMNS]
    assert table.schema.field(LABEL_COLUMN).type == pa.int8()
    for name in DENSE_COLUMNS:
        assert table.schema.field(name).type == pa.float32()
    for name in SPARSE_COLUMNS:
        assert table.schema.field(name).type == pa.int64()
    assert set(np.unique(table[LABEL_COLUMN].to_numpy())) == {0, 1}


def test_row_groups(tmp_path: Path) -> None:
    synth_criteo(tmp_path, rows=2_500, eval_rows=10, rows_per_file=2_000, row_group_size=512)
    meta = pq.ParquetFile(tmp_path / "train" / "part-00000.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [512] * 3 + [464]
    assert pq.ParquetFile(tmp_path / "train" / "part-00001.parquet").metadata.num_rows == 500


def test_dense_values_and_nulls(small: tuple[Path, SynthReport]) -> None:
    table = _read(small[0], "train")
    with_nulls = 0
    for name in DENSE_COLUMNS:
        column = table[name]
        fraction = column.null_count / table.num_rows
        assert fraction == 0.0 or 0.01 <= fraction <= 0.06, (name, fraction)
        with_nulls += fraction > 0
        values = column.drop_null().to_numpy()
        assert (values >= 0).all() and (values == np.floor(values)).all()
        assert np.isfinite(values).all()
    assert 2 <= with_nulls <= 6
    # Heavy-tailed counts: some columns reach far beyond their median.
    spread = [np.max(table[n].drop_null().to_numpy()) for n in DENSE_COLUMNS]
    assert max(spread) > 1_000


def test_sparse_ids(small: tuple[Path, SynthReport]) -> None:
    table = _read(small[0], "train")
    for name, card in zip(SPARSE_COLUMNS, CRITEO_CARDINALITIES):
        column = table[name]
        assert column.null_count == 0
        ids = column.to_numpy()
        assert ids.min() >= 0 and ids.max() < card, name
    # Power law: the most frequent id of a large column is much more frequent than uniform,
    # and it is not simply id 0 in every column (ids are permuted per column).
    counts = np.bincount(table["cat_2"].to_numpy(), minlength=CRITEO_CARDINALITIES[2])
    assert counts.max() > 50 * table.num_rows / CRITEO_CARDINALITIES[2]
    top_ids = {int(np.argmax(np.bincount(table[n].to_numpy()))) for n in SPARSE_COLUMNS}
    assert len(top_ids) > 3


def test_report_and_json_round_trip(small: tuple[Path, SynthReport]) -> None:
    out, report = small
    assert report.out_dir == str(out)
    assert report.seed == 0
    assert report.cardinalities == CRITEO_CARDINALITIES
    assert 0.2 <= report.positive_rate <= 0.3
    labels = _read(out, "train")[LABEL_COLUMN].to_numpy()
    assert report.positive_rate == pytest.approx(labels.mean())
    assert 0.74 <= report.bayes_auc <= 0.84
    assert 0.76 <= report.bayes_auc_train <= 0.82

    assert read_report(out) == report
    assert read_report(str(out)) == report
    document = json.loads((out / "synth.json").read_text())
    assert document["description"]
    assert document["bayes_auc"] == report.bayes_auc
    assert SynthReport.from_json(report.to_json()) == report
    assert json.loads(json.dumps(report.to_json())) == report.to_json()


def test_same_seed_identical_different_seed_different(tmp_path: Path) -> None:
    a = synth_criteo(tmp_path / "a", rows=3_000, eval_rows=500, seed=7)
    b = synth_criteo(tmp_path / "b", rows=3_000, eval_rows=500, seed=7)
    c = synth_criteo(tmp_path / "c", rows=3_000, eval_rows=500, seed=8)
    for split in ("train", "eval"):
        ta, tb, tc = (_read(tmp_path / d, split) for d in "abc")
        assert ta.equals(tb)
        assert not ta.equals(tc)
        for f in (tmp_path / "a" / split).iterdir():
            assert f.read_bytes() == (tmp_path / "b" / split / f.name).read_bytes()
    assert (a.bayes_auc, a.positive_rate) == (b.bayes_auc, b.positive_rate)
    assert a.bayes_auc != c.bayes_auc


def test_prefix_stable_across_rows_and_files(tmp_path: Path) -> None:
    synth_criteo(tmp_path / "a", rows=1_000, eval_rows=300, seed=3)
    synth_criteo(tmp_path / "b", rows=20_000, eval_rows=300, seed=3, rows_per_file=333)
    assert _read(tmp_path / "a", "train").equals(_read(tmp_path / "b", "train").slice(0, 1_000))
    assert _read(tmp_path / "a", "eval").equals(_read(tmp_path / "b", "eval"))


def test_eval_rows_default(tmp_path: Path) -> None:
    assert synth_criteo(tmp_path / "small", rows=50).eval_rows == 1_000
    report = synth_criteo(tmp_path / "large", rows=15_000)
    assert report.eval_rows == 1_500
    assert _read(tmp_path / "large", "eval").num_rows == 1_500


def test_rerun_replaces_stale_parts(tmp_path: Path) -> None:
    synth_criteo(tmp_path, rows=3_000, eval_rows=10, rows_per_file=1_000)
    assert len(list((tmp_path / "train").glob("*.parquet"))) == 3
    report = synth_criteo(tmp_path, rows=1_500, eval_rows=10, rows_per_file=1_000)
    assert len(list((tmp_path / "train").glob("*.parquet"))) == 2
    assert _read(tmp_path, "train").num_rows == 1_500
    assert read_report(tmp_path) == report


def test_single_class_eval_gives_nan_auc(tmp_path: Path) -> None:
    report = synth_criteo(tmp_path, rows=10, eval_rows=1)
    assert np.isnan(report.bayes_auc)
    assert report.to_json()["bayes_auc"] is None
    assert np.isnan(read_report(tmp_path).bayes_auc)


def test_read_report_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tzrec-run data synth criteo"):
        read_report(tmp_path)
    (tmp_path / "synth.json").write_text("{}")
    with pytest.raises(ValueError, match="missing the field"):
        read_report(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rows": 0}, "rows must be an integer >= 1, got 0; pass the number of train rows"),
        ({"rows": -5}, "rows must be an integer >= 1"),
        ({"rows": 1.5}, r"rows must be an integer >= 1, got 1\.5 \(float\)"),
        ({"rows": True}, "rows must be an integer"),
        ({"rows": "100"}, "rows must be an integer"),
        ({"rows": 10, "eval_rows": 0}, "eval_rows must be an integer >= 1.*or None"),
        ({"rows": 10, "seed": -1}, "seed must be an integer >= 0.*non-negative"),
        ({"rows": 10, "rows_per_file": 0}, "rows_per_file must be an integer >= 1"),
        ({"rows": 10, "row_group_size": 0}, "row_group_size must be an integer >= 1"),
    ],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        synth_criteo(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_out_dir_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="is a file; pass a directory"):
        synth_criteo(path, rows=10)


def test_auc_matches_sklearn_with_ties() -> None:
    roc_auc_score = pytest.importorskip("sklearn.metrics").roc_auc_score
    rng = np.random.default_rng(0)
    for n, levels in [(50, 5), (1_000, 20), (10_000, 1_000), (5_000, None)]:
        labels = rng.random(n) < 0.3
        noise = rng.standard_normal(n)
        scores = labels + noise if levels is None else np.round((labels + noise) * levels / 4)
        assert synth_common.auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
        assert synth_common.auc(scores.astype(np.float32), labels.astype(np.int8)) == pytest.approx(
            roc_auc_score(labels, scores.astype(np.float32)), abs=1e-12
        )


def test_auc_edge_cases() -> None:
    assert synth_common.auc(np.array([0.1, 0.9]), np.array([0, 1])) == 1.0
    assert synth_common.auc(np.array([0.9, 0.1]), np.array([0, 1])) == 0.0
    assert synth_common.auc(np.ones(4), np.array([0, 1, 0, 1])) == 0.5
    assert np.isnan(synth_common.auc(np.arange(3.0), np.zeros(3)))


def test_bayes_auc_is_auc_of_true_logits() -> None:
    model = synth._build_model(0)
    block = synth._generate_block(model, synth_common.block_rng(0, synth._SPLIT_EVAL, 0))
    labels = block.table_columns[LABEL_COLUMN]
    assert 0.2 <= labels.mean() <= 0.3
    assert 0.76 <= synth_common.auc(block.logit, labels) <= 0.82


def test_does_not_import_torch() -> None:
    source = Path(synth.__file__).read_text()
    assert "import torch" not in source and "sklearn" not in source


def test_synth_criteo_text_format_matches_the_parquet_rows(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    from tests.conftest import cli
    from tzrun_tools.criteo_text import hex_id
    from tzrun_tools.synth import synth_criteo

    out = tmp_path / "text"
    proc = cli(["data", "synth", "criteo", "--rows", "3000", "--eval-rows", "1000", "--seed", "5", "--format", "text",
                "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (out / "train").iterdir()) == ["day_0.txt"] and (out / "synth.json").is_file()
    assert not (out / ".parquet").exists()
    reference = synth_criteo(tmp_path / "parquet", rows=3000, eval_rows=1000, seed=5)
    table = pq.read_table(tmp_path / "parquet" / "train")
    lines = (out / "train" / "day_0.txt").read_text().splitlines()
    assert len(lines) == 3000 and "Bayes-optimal eval AUC " + f"{reference.bayes_auc:.4f}" in proc.stdout
    fields = [line.split("\t") for line in lines]
    assert all(len(f) == 40 for f in fields)
    assert [float(f[0]) for f in fields] == table.column("label").to_pylist()
    ints = table.column("int_0").to_numpy(zero_copy_only=False)
    assert [f[1] for f in fields] == ["" if np.isnan(v) else str(int(v)) for v in ints]  # nulls are empty fields
    assert any(f[1] == "" for f in fields)
    assert [f[14] for f in fields] == [hex_id(v) for v in table.column("cat_0").to_pylist()]
    assert len({hex_id(v) for v in range(100_000)}) == 100_000  # distinct ids stay distinct
