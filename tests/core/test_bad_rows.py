"""``data.on_bad_row``: bad rows stop the run with a precise error, or are left out and counted."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.core.test_data import FEATURES  # d0 (fill -1), d1 (log1p); c0, m0 in [0, 10), s0 hashed
from tzrun.config.schema import FeaturesConfig, SparseFeatureConfig
from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.errors import DataError
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

GROUPS = ("row", "user")


def _table(**overrides: pa.Array) -> pa.Table:
    """Five good rows; ``row`` numbers them, ``user`` is a string group key."""
    columns = {
        "d0": pa.array([0.5, None, 2.5, 3.5, 4.5], pa.float32()),
        "d1": pa.array([0, 1, 2, 3, 4], pa.int64()),
        "c0": pa.array([0, 1, None, 3, 4], pa.int64()),
        "s0": pa.array(["a", "b", "c", None, "e"]),
        "m0": pa.array([[0], [1, 1], [], None, [4, 4, 4]], pa.list_(pa.int64())),
        "label": pa.array([1, 0, 1, 0, 1], pa.int8()),
        "weight": pa.array([1.0, 2.0, 3.0, 4.0, 5.0], pa.float32()),
        "row": pa.array([0, 1, 2, 3, 4], pa.int64()),
        "user": pa.array(["u0", "u1", "u2", "u3", "u4"]),
    }
    columns.update(overrides)
    return pa.table(columns)


def _builder(on_bad_row: str = "skip", weight: str | None = "weight") -> BatchBuilder:
    return BatchBuilder(feature_specs(FEATURES), ["label"], weight, GROUPS, on_bad_row=on_bad_row)


def _assert_rows(batch, rows: list[int]) -> None:
    """``batch`` holds exactly rows ``rows`` of :func:`_table`, every column alike."""
    whole = _builder()(_table(), "good.parquet")
    assert batch.num_rows == batch.batch_size == len(rows)
    assert batch.groups["row"].tolist() == rows
    assert torch.equal(batch.groups["user"], whole.groups["user"][rows])
    assert torch.equal(batch.dense, whole.dense[rows])
    assert torch.equal(batch.labels["label"], whole.labels["label"][rows])
    assert torch.equal(batch.weights, whole.weights[rows])
    got, full = batch.sparse.to_dict(), whole.sparse.to_dict()
    for key in ("c0", "s0", "m0"):
        assert got[key].lengths().tolist() == [full[key].lengths()[r].item() for r in rows], key
        assert got[key].values().tolist() == [v for r in rows for v in full[key].to_dense()[r].tolist()], key


BAD = {
    "id outside, scalar": (
        {"c0": pa.array([0, 12, None, -1, 4], pa.int64())},
        {"c0: id outside [0, 10)": 2},
        r"bad\.parquet: column 'c0' \(feature 'c0'\): id 12 is outside \[0, 10\) \(2 of 5 rows of this batch",
    ),
    "id outside, in a list": (
        {"m0": pa.array([[0], [1, 10], [], None, [4, 11, 4]], pa.list_(pa.int64()))},
        {"m0: id outside [0, 10)": 2},
        r"bad\.parquet: column 'm0' \(feature 'm0'\): id 10 is outside \[0, 10\) \(2 of 5 rows of this batch",
    ),
    "null label": (
        {"label": pa.array([1, None, 1, 0, None], pa.int8())},
        {"label: null": 2},
        r"bad\.parquet: column 'label' has 2 null value\(s\) in 5 rows of this batch; labels must be finite",
    ),
    "NaN label": (
        {"label": pa.array([1, 0, math.nan, 0, 1], pa.float32())},
        {"label: NaN": 1},
        r"bad\.parquet: column 'label' has 1 NaN value\(s\) in 5 rows of this batch",
    ),
    "infinite label": (
        {"label": pa.array([1, 0, 1, -math.inf, math.inf], pa.float64())},
        {"label: inf": 2},
        r"bad\.parquet: column 'label' has 2 infinite value\(s\) in 5 rows of this batch \(first: -inf\)",
    ),
    "null weight": (
        {"weight": pa.array([1.0, None, 3.0, 4.0, 5.0], pa.float32())},
        {"weight: null": 1},
        r"bad\.parquet: column 'weight' \(sample_weight\) has 1 null value\(s\) in 5 rows of this batch; "
        r"sample weights must be finite and >= 0",
    ),
    "NaN weight": (
        {"weight": pa.array([1.0, 2.0, 3.0, math.nan, 5.0], pa.float32())},
        {"weight: NaN": 1},
        r"column 'weight' \(sample_weight\) has 1 NaN value\(s\)",
    ),
    "infinite weight": (
        {"weight": pa.array([math.inf, 2.0, 3.0, 4.0, 5.0], pa.float32())},
        {"weight: inf": 1},
        r"column 'weight' \(sample_weight\) has 1 infinite value\(s\) in 5 rows of this batch \(first: inf\)",
    ),
    "negative weight": (
        {"weight": pa.array([1.0, -0.5, 3.0, -2.0, 5.0], pa.float32())},
        {"weight: negative": 2},
        r"column 'weight' \(sample_weight\) has 2 negative value\(s\) in 5 rows of this batch \(first: -0\.5\)",
    ),
    "infinite dense value": (
        {"d1": pa.array([0.0, 1.0, 2.0, 3.0, -math.inf], pa.float64())},
        {"d1: inf": 1},
        r"column 'd1' \(dense feature 'd1'\) has 1 infinite value\(s\) in 5 rows of this batch \(first: -inf\)",
    ),
    "null group key (string)": (
        {"user": pa.array(["u0", None, "u2", "u3", "u4"])},
        {"user: null": 1},
        r"column 'user' \(a group_by key\) has 1 null value\(s\) in 5 rows of this batch",
    ),
    "null group key (integer)": (
        {"row": pa.array([0, 1, 2, None, 4], pa.int64())},
        {"row: null": 1},
        r"column 'row' \(a group_by key\) has 1 null value\(s\) in 5 rows of this batch",
    ),
}


@pytest.mark.parametrize(("overrides", "counts", "match"), BAD.values(), ids=BAD.keys())
def test_a_bad_row_is_an_error_naming_file_column_count_and_value(overrides, counts, match):
    with pytest.raises(DataError, match=match) as caught:
        _builder("error")(_table(**overrides), "bad.parquet")
    assert 'set data.on_bad_row = "skip"' in str(caught.value)


@pytest.mark.parametrize(("overrides", "counts", "match"), BAD.values(), ids=BAD.keys())
def test_a_bad_row_is_left_out_of_every_column_and_counted(overrides, counts, match):
    table = _table(**overrides)
    batch = _builder("skip")(table, "bad.parquet")
    assert batch.skipped == SkippedRows(sum(counts.values()), counts)
    if "row" in overrides:  # the kept rows' numbers are still 0..4 less the null one
        bad = {i for i, v in enumerate(overrides["row"].to_pylist()) if v is None}
    else:
        whole = _builder("skip")(_table(), "good.parquet")
        assert not whole.skipped and whole.num_rows == 5
        bad = set(range(5)) - set(batch.groups["row"].tolist())
    assert len(bad) == batch.skipped.rows
    _assert_rows(batch, [r for r in range(5) if r not in bad])


def test_error_is_the_default():
    with pytest.raises(DataError, match="id 12 is outside"):
        BatchBuilder(feature_specs(FEATURES), ["label"], "weight", GROUPS)(_table(c0=pa.array([12, 1, 2, 3, 4])), "f")


def test_a_row_with_several_problems_is_left_out_once_and_counted_under_each():
    table = _table(
        c0=pa.array([0, 12, None, 13, 4], pa.int64()),
        label=pa.array([1, math.nan, 1, 0, math.nan], pa.float32()),
        weight=pa.array([1.0, -1.0, 3.0, 4.0, 5.0], pa.float32()),
    )
    batch = _builder()(table, "bad.parquet")
    assert batch.skipped == SkippedRows(3, {"c0: id outside [0, 10)": 2, "label: NaN": 2, "weight: negative": 1})
    _assert_rows(batch, [0, 2])


def test_two_features_on_one_column_count_its_rows_once():
    features = FeaturesConfig(
        sparse=(SparseFeatureConfig("a", column="c0", num_buckets=10), SparseFeatureConfig("b", column="c0", num_buckets=10))
    )
    builder = BatchBuilder(feature_specs(features), ["label"], None, on_bad_row="skip")
    batch = builder(_table(c0=pa.array([0, 12, 2, 3, 4], pa.int64())), "f")
    assert batch.skipped == SkippedRows(1, {"c0: id outside [0, 10)": 1})
    assert batch.sparse["a"].values().tolist() == batch.sparse["b"].values().tolist() == [0, 2, 3, 4]


def test_a_dense_nan_takes_the_fill_value_and_is_not_a_bad_row():
    table = _table(d0=pa.array([math.nan, None, 2.5, 3.5, 4.5], pa.float32()), d1=pa.array([math.nan, 1, 2, 3, 4], pa.float64()))
    for mode in ("error", "skip"):
        batch = _builder(mode)(table, "f")
        assert not batch.skipped and batch.num_rows == 5
        assert batch.dense[:2, 0].tolist() == [-1.0, -1.0]  # d0's fill_value, for NaN and null alike
        assert batch.dense[0, 1].item() == 0.0  # d1: fill 0, then log1p


def test_a_null_inside_an_id_list_gives_no_id_and_is_not_a_bad_row():
    table = _table(m0=pa.array([[0, None], [None], [], None, [4, None, 5]], pa.list_(pa.int64())))
    batch = _builder("error")(table, "f")
    m0 = batch.sparse["m0"]
    assert m0.lengths().tolist() == [1, 0, 0, 0, 2] and m0.values().tolist() == [0, 4, 5]


def test_a_batch_whose_rows_are_all_bad_is_a_counted_padding_batch():
    builder = _builder()
    batch = builder(_table(label=pa.array([None] * 5, pa.int8()), c0=pa.array([0, 1, 2, 3, 99])), "bad.parquet")
    assert batch.skipped == SkippedRows(5, {"label: null": 5, "c0: id outside [0, 10)": 1})
    assert batch.num_rows == 0 and batch.weights.tolist() == [0.0]
    assert batch.sparse.stride() == 1 and batch.sparse.values().numel() == 0
    assert set(batch.groups) == set(GROUPS) and set(batch.labels) == {"label"}
    assert not builder.padding().skipped  # an ordinary padding batch skipped nothing


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (_table().drop_columns(["weight"]), r"f\.parquet: column 'weight' is missing"),
        (_table(c0=pa.array(["x"] * 5)), r"column 'c0' \(feature 'c0'\) has type string; num_buckets needs integer ids"),
        (_table(label=pa.array(["x"] * 5)), r"column 'label' has type string; expected a number"),
        (_table(user=pa.array([0.5] * 5)), r"column 'user' \(a group_by key\) has type double"),
    ],
)
def test_column_problems_are_errors_even_when_skipping(table, match):
    with pytest.raises(DataError, match=match):
        _builder("skip")(table, "f.parquet")


def test_on_bad_row_is_checked():
    with pytest.raises(ValueError, match="'error' or 'skip'"):
        BatchBuilder(feature_specs(FEATURES), ["label"], None, on_bad_row="drop")


def test_skip_counts_travel_with_the_batch():
    batch = _builder()(_table(label=pa.array([1, None, 1, 0, 1], pa.int8())), "f")
    assert batch.to(torch.device("cpu")).skipped == SkippedRows(1, {"label: null": 1})
    total = SkippedRows()
    assert list(tally_skipped([batch, batch], total)) == [batch, batch]
    assert total == SkippedRows(2, {"label: null": 2}) and batch.skipped.rows == 1
    assert SkippedRows.from_json(total.to_json()) == total
    total.add(SkippedRows(3, {"c0: id outside [0, 10)": 3}))
    assert str(total) == "5 rows (c0: id outside [0, 10): 3, label: null: 2)"


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2])
def test_counts_add_up_over_a_pass_with_dataloader_workers(tmp_path: Path, workers: int):
    """Every row is either in a batch or counted as skipped, exactly once, however the rows
    are split into batches and workers; a batch of only bad rows still takes its step."""
    rows = 300
    row = np.arange(rows)
    label = np.where(row % 7 == 3, np.nan, 1.0)
    label[100:110] = np.nan  # with batch size 10, batch 10 is all bad
    c0 = np.where(row % 11 == 5, 10 + row, row % 10)
    pq.write_table(pa.table({"row": row, "label": label, "c0": c0}), tmp_path / "part-0.parquet", row_group_size=64)
    nan_rows = set(np.flatnonzero(np.isnan(label)).tolist())
    outside_rows = set(np.flatnonzero(c0 >= 10).tolist())

    features = FeaturesConfig(sparse=(SparseFeatureConfig("c0", num_buckets=10),))
    builder = BatchBuilder(feature_specs(features), ["label"], None, ["row"], on_bad_row="skip")
    rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path), 10, workers, ["row", "label", "c0"], builder, 0, 1)
    total = SkippedRows()
    batches = list(tally_skipped(rank_input.one_pass(), total))
    assert len(batches) == rank_input.steps == 30
    kept = [r for b in batches for r in b.groups["row"][: b.num_rows].tolist()]
    assert sorted(kept) == sorted(set(range(rows)) - nan_rows - outside_rows)
    assert total == SkippedRows(
        len(nan_rows | outside_rows), {"label: NaN": len(nan_rows), "c0: id outside [0, 10)": len(outside_rows)}
    )
