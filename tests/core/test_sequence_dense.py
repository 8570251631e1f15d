"""``[[features.sequence.dense]]``: numeric sequences aligned with a group's ids, read from real
Parquet rows (normalised, truncated under each ``keep``, a misaligned row a named bad row), and
fed after the embeddings in the group's ``[B, max_len, D]`` view, the query zero-padded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.core.test_sequences import CONFIG
from tzrun.config.load import load_config, parse_config
from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.errors import BadRowError, ConfigError
from tzrun.kernel.registry import collect_registries
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

DENSE = """
[[features.sequence.dense]]
name = "click_seq__price"
column = "seq_price"
fill_value = -1.0
[[features.sequence.dense]]
name = "click_seq__gap"
column = "seq_gap"
log1p = true
mean = 1.0
std = 2.0
"""

#: per row, oldest first: 5 clicks (longer than max_len = 3), none, a null list, 2 clicks
CLICKS = [[1, 2, 3, 4, 5], [], None, [7, 8]]
PRICES = [[10.0, 20.0, None, 40.0, 50.0], [], None, [float("nan"), 80.0]]
GAPS = [[0.0, 1.0, 2.0, 3.0, 4.0], [], None, [5.0, 6.0]]


def _config(tzrun_pm, *overrides: str):
    return load_config(parse_config(CONFIG + DENSE, "<test>", list(overrides)), collect_registries(tzrun_pm))


def _table(prices=PRICES, gaps=GAPS) -> pa.Table:
    return pa.table({
        "adgroup_id": pa.array([1, 2, 3, 4]),
        "cate_id": pa.array(["a", "b", "c", "d"]),
        "user": pa.array([0, 1, 2, 3]),
        "label": pa.array([1.0, 0.0, 1.0, 0.0], pa.float32()),
        "seq_ad": pa.array(CLICKS, pa.list_(pa.int64())),
        "seq_cate": pa.array([None if c is None else ";".join("x" * len(c)) for c in CLICKS]),
        "seq_price": pa.array(prices, pa.list_(pa.float64())),
        # text split on the group's separator, as the id sequences may be
        "seq_gap": pa.array([None if g is None else ";".join(str(x) for x in g) for g in gaps]),
    })


def _read(tzrun_pm, tmp_path: Path, table: pa.Table, *overrides: str, on_bad_row: str = "error"):
    pq.write_table(table, tmp_path / "part-0.parquet")
    specs = feature_specs(_config(tzrun_pm, *overrides).features)
    builder = BatchBuilder(specs, ["label"], None, on_bad_row=on_bad_row)
    rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path), 4, 0, specs.columns(["label"], None),
                           builder, 0, 1)
    skipped = SkippedRows()
    return list(tally_skipped(rank_input.one_pass(), skipped)), skipped


def _gap(x: float) -> float:
    return (np.log1p(x) - 1.0) / 2.0


def test_dense_sequences_are_padded_normalised_and_keep_their_last_values(tzrun_pm, tmp_path: Path):
    (batch,), _ = _read(tzrun_pm, tmp_path, _table())
    values = batch.sequence_dense["click_seq"]
    assert values.shape == (4, 3, 2) and values.dtype == torch.float32
    # keep = "last": the last 3 of row 0; a null entry and NaN take fill_value, in place
    assert values[:, :, 0].tolist() == [[-1.0, 40.0, 50.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 80.0, 0.0]]
    assert values[0, :, 1].tolist() == pytest.approx([_gap(2.0), _gap(3.0), _gap(4.0)])
    assert values[3, :, 1].tolist() == pytest.approx([_gap(5.0), _gap(6.0), 0.0])


def test_keep_first_truncates_dense_values_as_it_truncates_ids(tzrun_pm, tmp_path: Path):
    (batch,), _ = _read(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="first"')
    assert batch.sequence_dense["click_seq"][0, :, 0].tolist() == [10.0, 20.0, -1.0]
    ids = batch.sequence.to_dict()["click_seq__adgroup_id"]
    assert ids.values()[:3].tolist() == [1, 2, 3]


def test_keep_all_reports_a_long_row_and_skips_it_with_its_values(tzrun_pm, tmp_path: Path):
    with pytest.raises(BadRowError, match="max_len = 3"):
        _read(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="all"')
    (batch,), skipped = _read(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="all"', on_bad_row="skip")
    assert skipped.rows == 1
    assert batch.sequence_dense["click_seq"][:, :, 0].tolist() == [[0.0] * 3, [0.0] * 3, [-1.0, 80.0, 0.0]]


def test_a_misaligned_row_is_a_bad_row_naming_the_column(tzrun_pm, tmp_path: Path):
    prices = [[1.0, 2.0, 3.0, 4.0, 5.0], [9.0], None, [7.0, 8.0]]
    with pytest.raises(BadRowError, match=r"column 'seq_price' \(dense sequence 'click_seq__price' of group "
                                          r"'click_seq'\) has 1 value\(s\) where column 'seq_ad' has 0 id\(s\)"):
        _read(tzrun_pm, tmp_path, _table(prices=prices))
    (batch,), skipped = _read(tzrun_pm, tmp_path, _table(prices=prices), on_bad_row="skip")
    assert skipped.problems == {"click_seq: sequences of different lengths": 1}
    assert batch.num_rows == 3 and batch.sequence_dense["click_seq"].shape == (3, 3, 2)
    assert batch.sequence.to_dict()["click_seq__adgroup_id"].lengths().tolist() == [3, 0, 2]


def test_an_infinite_value_is_a_bad_row(tzrun_pm, tmp_path: Path):
    prices = [[1.0, 2.0, 3.0, 4.0, float("inf")], [], None, [7.0, 8.0]]
    with pytest.raises(BadRowError, match="seq_price.*infinite"):
        _read(tzrun_pm, tmp_path, _table(prices=prices))


def test_config_errors_name_the_key(tzrun_pm):
    with pytest.raises(ConfigError, match=r"features.sequence\[0\].dense\[0\].std"):
        _config(tzrun_pm, "features.sequence[0].dense[0].std=0")
    with pytest.raises(ConfigError, match=r"features.sequence\[0\].dense\[1\].name: 'user' is already"):
        _config(tzrun_pm, 'features.sequence[0].dense[1].name="user"')


def test_the_padding_batch_carries_zeros_of_the_groups_width(tzrun_pm):
    specs = feature_specs(_config(tzrun_pm).features)
    padding = BatchBuilder(specs, ["label"], None).padding()
    assert padding.sequence_dense["click_seq"].shape == (1, 3, 2)
    assert padding.to(torch.device("cpu")).sequence_dense["click_seq"].shape == (1, 3, 2)


def test_check_reads_a_dense_sequence_columns_type(tzrun_pm, tmp_path: Path):
    from tzrun.data.input_check import check_inputs, column_uses

    split = _config(tzrun_pm)  # the group splits text on ";": the values tell, not the type
    assert not any(u.what.startswith("dense sequence") for u in column_uses(feature_specs(split.features), split.data, (), ()))
    cfg = load_config(parse_config((CONFIG + DENSE).replace('separator = ";"\n', ""), "<test>", []),
                      collect_registries(tzrun_pm))
    specs = feature_specs(cfg.features)
    uses = {u.what: u for u in column_uses(specs, cfg.data, (), ())}
    use = uses["dense sequence 'click_seq__price' of group 'click_seq'"]
    assert (use.column, use.lists) == ("seq_price", True)
    prices = pa.array([None if c is None else ["x"] * len(c) for c in CLICKS], pa.list_(pa.string()))
    pq.write_table(_table().set_column(6, "seq_price", prices), tmp_path / "part-0.parquet")
    report = check_inputs(ParquetReader(ParquetConfig()), {"data.train_input": str(tmp_path)},
                          specs.columns(["label"], None), list(uses.values()))
    assert any("seq_price" in p and "click_seq__price" in p for p in report.problems), report.problems


def test_a_column_of_the_wrong_type_or_a_piece_that_is_no_number_is_an_error(tzrun_pm, tmp_path: Path):
    from tzrun.errors import DataError

    scalar = _table().set_column(6, "seq_price", pa.array([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(DataError, match=r"column 'seq_price' \(dense sequence 'click_seq__price' of group 'click_seq'\) "
                                        r"has type double; expected a list of numbers, or text split on separator = ';'"):
        _read(tzrun_pm, tmp_path, scalar)
    gaps = _table().set_column(7, "seq_gap", pa.array(["1;2;3;4;x", "", None, "5;6"]))
    with pytest.raises(DataError, match=r"column 'seq_gap' .*: value 'x' is not a number"):
        _read(tzrun_pm, tmp_path, gaps)


def test_cost_aware_batches_carry_each_rows_values(tzrun_pm, tmp_path: Path):
    from tzrun.data.cost import BatchCost, SequenceCost

    pq.write_table(_table(), tmp_path / "part-0.parquet")
    specs = feature_specs(_config(tzrun_pm).features)
    builder = BatchBuilder(specs, ["label"], None)
    cost = BatchCost(5, "sequence_length", sequences=(SequenceCost("seq_ad", 3),))  # row costs 4, 1, 1, 3
    rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path), 4, 0, specs.columns(["label"], None),
                           builder, 0, 1, cost=cost)
    batches = list(rank_input.one_pass())
    assert [b.num_rows for b in batches] == [2, 2]  # [4, 1] [1, 3]
    (whole,), _ = _read(tzrun_pm, tmp_path, _table())
    torch.testing.assert_close(torch.cat([b.sequence_dense["click_seq"] for b in batches]), whole.sequence_dense["click_seq"])
