"""Tests of tzrun_tools.synth_taobao: the synthetic Taobao-shaped data with click and buy labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun_tools.synth_taobao import (
    DENSE_COLUMNS,
    ITEM_CARDINALITIES,
    LABEL_COLUMNS,
    PIDS,
    SEQUENCE_COLUMN,
    SEQUENCE_LENGTH,
    SEQUENCE_SIDE_COLUMNS,
    USER_CARDINALITIES,
    TaobaoSynthReport,
    read_taobao_report,
    synth_taobao,
)


def _read(out: Path, split: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in sorted((out / split).glob("part-*.parquet")))


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TaobaoSynthReport]:
    out = tmp_path_factory.mktemp("synth") / "taobao"
    return out, synth_taobao(out, rows=20_000, eval_rows=20_000, seed=0, rows_per_file=7_000, row_group_size=3_000)


def test_schema_and_value_ranges(small):
    out, report = small
    table = _read(out, "train")
    assert table.num_rows == report.train_rows == 20_000
    assert len(list((out / "train").glob("part-*.parquet"))) == 3  # 7,000 rows per file
    assert table.schema.names == [
        *LABEL_COLUMNS, *USER_CARDINALITIES, *ITEM_CARDINALITIES, "pid", *DENSE_COLUMNS, SEQUENCE_COLUMN, *SEQUENCE_SIDE_COLUMNS
    ]
    assert table.schema.field(SEQUENCE_COLUMN).type == pa.list_(pa.int64())
    assert all(table.column(c).null_count == 0 for c in table.schema.names)
    for name, card in {**USER_CARDINALITIES, **ITEM_CARDINALITIES}.items():
        ids = table.column(name).to_numpy()
        assert table.schema.field(name).type == pa.int64() and ids.min() >= 0 and ids.max() < card, name
    assert set(table.column("pid").to_pylist()) == set(PIDS)
    assert (table.column("price").to_numpy() > 0).all()
    ctr = table.column("item_ctr_7d").to_numpy()
    assert ((ctr >= 0) & (ctr <= 1)).all()
    lengths = pa.compute.list_value_length(table.column(SEQUENCE_COLUMN)).to_numpy()
    assert lengths.min() == 0 and lengths.max() == SEQUENCE_LENGTH
    seq = pa.compute.list_flatten(table.column(SEQUENCE_COLUMN)).to_numpy()
    assert seq.min() >= 0 and seq.max() < ITEM_CARDINALITIES["adgroup_id"]


def test_each_user_and_ad_keeps_its_attributes(small):
    table = _read(small[0], "train")
    for key, columns in (("user_id", list(USER_CARDINALITIES)[1:]), ("adgroup_id", [*list(ITEM_CARDINALITIES)[1:], "price"])):
        keys = table.column(key).to_numpy()
        for column in columns:
            values = table.column(column).to_numpy()
            first = np.full(keys.max() + 1, np.nan)
            first[keys[::-1]] = values[::-1]  # the value of each key's first row
            assert (first[keys] == values).all(), (key, column)


def test_buy_implies_click_and_the_rates_are_the_documented_ones(small):
    out, report = small
    table = _read(out, "train")
    click, buy = (table.column(c).to_numpy() for c in LABEL_COLUMNS)
    assert not (buy & ~click.astype(bool)).any()
    assert report.click_rate == pytest.approx(click.mean()) and 0.22 < report.click_rate < 0.28
    assert report.buy_rate == pytest.approx(buy.mean()) and 0.1 < buy.sum() / click.sum() < 0.2


def test_bayes_auc_of_both_labels_is_reported_and_written(small):
    out, report = small
    assert set(report.bayes_auc) == set(report.bayes_auc_train) == {"click", "buy"}
    assert 0.8 < report.bayes_auc["click"] < 0.87 and 0.8 < report.bayes_auc["buy"] < 0.9
    document = json.loads((out / "synth.json").read_text())
    assert document["format"] == "tzrec-run synthetic taobao v2"
    assert document["sequence_side_columns"] == SEQUENCE_SIDE_COLUMNS
    assert read_taobao_report(out) == report


def test_the_clicked_ads_follow_the_users_interests(small):
    """What a two-tower model learns: a user's clicked ads share categories with the ads of
    their click sequence far more often than two random rows do."""
    table = _read(small[0], "train")
    cate_of = np.zeros(ITEM_CARDINALITIES["adgroup_id"], dtype=np.int64)
    cate_of[table.column("adgroup_id").to_numpy()] = table.column("cate_id").to_numpy()
    clicked = table.filter(pa.compute.equal(table.column("click"), 1))
    seqs = clicked.column(SEQUENCE_COLUMN).to_pylist()
    cates = clicked.column("cate_id").to_numpy()
    own = np.mean([np.mean(cate_of[s] == c) for s, c in zip(seqs, cates) if s])
    shuffled = np.mean([np.mean(cate_of[s] == c) for s, c in zip(seqs, np.roll(cates, 1)) if s])
    assert own > 3 * shuffled


def test_same_seed_same_bytes_other_seed_other_data(small, tmp_path):
    out, _ = small
    again = synth_taobao(tmp_path / "again", rows=20_000, eval_rows=20_000, seed=0, rows_per_file=7_000, row_group_size=3_000)
    for split in ("train", "eval"):
        for a, b in zip(sorted((out / split).glob("*.parquet")), sorted((tmp_path / "again" / split).glob("*.parquet"))):
            assert a.read_bytes() == b.read_bytes()
    assert again.bayes_auc == small[1].bayes_auc
    other = synth_taobao(tmp_path / "other", rows=2_000, eval_rows=1_000, seed=1)
    assert not _read(tmp_path / "other", "train").slice(0, 100).equals(_read(out, "train").slice(0, 100))
    assert other.seed == 1


def test_eval_split_is_drawn_apart_from_train(small):
    out, _ = small
    assert not _read(out, "train").slice(0, 1000).equals(_read(out, "eval").slice(0, 1000))


def test_bad_arguments_say_what_to_pass(tmp_path):
    with pytest.raises(ValueError, match="rows must be an integer >= 1, got 0"):
        synth_taobao(tmp_path, rows=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        synth_taobao(tmp_path / "file", rows=10)
    with pytest.raises(FileNotFoundError, match="tzrec-run data synth taobao"):
        read_taobao_report(tmp_path / "nothing")


def test_cli_synth_taobao_prints_both_bayes_aucs(tmp_path):
    from tests.conftest import cli

    proc = cli(["data", "synth", "taobao", "--rows", "1000", "--eval-rows", "1000", "--out", str(tmp_path / "d")])
    assert proc.returncode == 0, proc.stderr
    assert "wrote 1000 train and 1000 eval rows" in proc.stdout
    assert "Bayes-optimal eval AUC click 0." in proc.stdout and ", buy 0." in proc.stdout


def test_sequence_side_columns_hold_the_ids_of_the_clicked_ads(small):
    """click_50_seq__<column> is aligned with click_50_seq and holds the ids the candidate's own
    <column> gives the same ad, so a sequence can share the candidate's table."""
    table = _read(small[0], "train")
    seq = table.column(SEQUENCE_COLUMN)
    ads = pa.compute.list_flatten(seq).to_numpy()
    of_ad = {name: np.full(ITEM_CARDINALITIES["adgroup_id"], -1) for name in SEQUENCE_SIDE_COLUMNS.values()}
    for name, ids in of_ad.items():
        ids[table.column("adgroup_id").to_numpy()] = table.column(name).to_numpy()
    for column, name in SEQUENCE_SIDE_COLUMNS.items():
        side = table.column(column)
        assert pa.compute.list_value_length(side).equals(pa.compute.list_value_length(seq)), column
        values = pa.compute.list_flatten(side).to_numpy()
        seen = of_ad[name][ads] >= 0  # ads that also appear as a candidate in these rows
        assert seen.mean() > 0.5 and (values[seen] == of_ad[name][ads][seen]).all(), column


def _mean_pooled_features(item_vec: np.ndarray, candidate: np.ndarray, offsets: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """What a pooled model sees of a row's sequence: the mean of its ads' vectors, against the candidate's."""
    n, lengths = candidate.size, np.diff(offsets)
    row = np.repeat(np.arange(n), lengths)
    mean = np.stack([np.bincount(row, item_vec[seq][:, k], minlength=n) for k in range(item_vec.shape[1])], 1)
    mean /= np.maximum(lengths, 1)[:, None]
    vec = item_vec[candidate]
    unit = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-9)
    base = np.stack([np.einsum("nk,nk->n", vec, mean), np.einsum("nk,nk->n", vec, unit), np.linalg.norm(mean, axis=1),
                     np.linalg.norm(vec, axis=1), lengths > 0, lengths], 1).astype(np.float64)
    return np.concatenate([np.ones((n, 1)), base, base**2, base[:, :1] * base[:, 1:]], axis=1)


def test_the_click_depends_on_the_closest_sequence_ads_not_only_their_average(small):
    """The true click probability reaches the reported Bayes AUC; a predictor that knows every other
    part of the true logit but sees the sequence only through its average (the best quadratic fit of
    the sequence part on mean-pooled features) stays clearly below it."""
    from tzrun_tools import synth_taobao as st
    from tzrun_tools.synth_common import auc, block_rng

    out, report = small
    model = st._build_model(0)
    blocks = [st._block(model, 0, st._SPLIT_EVAL, b) for b in range(2)]
    p_click = np.concatenate([b[1] for b in blocks])[: report.eval_rows]
    click = np.concatenate([b[3] for b in blocks])[: report.eval_rows]
    assert auc(p_click, click) == pytest.approx(report.bayes_auc["click"], abs=1e-12)

    rows = st._draw_rows(model, block_rng(0, st._SPLIT_EVAL, 0), 16_384)  # the rows of block 0
    logit, _ = st._logits(model, rows)
    sequence = model.scale["sequence"] * st._click_parts(model, rows)["sequence"]
    pooled = _mean_pooled_features(model.item_vec, rows.item, rows.seq_offsets, rows.seq_items)
    fit, *_ = np.linalg.lstsq(pooled, sequence, rcond=None)
    labels = click[:16_384]
    bayes, averaged = auc(logit, labels), auc(logit - sequence + pooled @ fit, labels)
    assert bayes == pytest.approx(auc(p_click[:16_384], labels))
    assert bayes - averaged > 0.01, (bayes, averaged)
