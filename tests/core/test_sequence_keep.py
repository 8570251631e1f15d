"""``[[features.sequence]] keep``: which ids a row longer than ``max_len`` keeps, on real rows
through the Parquet reader and through a model's forward, and its one-line config error."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.core.test_sequences import CONFIG
from tzrun.config.load import load_config, parse_config
from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.errors import BadRowError, ConfigError, DataError
from tzrun.interfaces import ModelContext
from tzrun.kernel.registry import collect_registries
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig
from tzrun_plugins.models.mmoe import MMoETaskConfig
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

#: per row, oldest first: 5 clicks (longer than max_len = 3), none, a null list, 2 clicks
CLICKS = [[1, 2, 3, 4, 5], [], None, [7, 8]]
CATES = [[0, 1, 2, 3, 4], [], None, [5, 0]]


def _config(tzrun_pm, *overrides: str):
    return load_config(parse_config(CONFIG, "<test>", list(overrides)), collect_registries(tzrun_pm))


def _table(clicks=CLICKS, cates=CATES) -> pa.Table:
    return pa.table({
        "adgroup_id": pa.array([1, 2, 3, 4]),
        "cate_id": pa.array(["a", "b", "c", "d"]),
        "user": pa.array([0, 1, 2, 3]),
        "label": pa.array([1.0, 0.0, 1.0, 0.0], pa.float32()),
        "seq_ad": pa.array(clicks, pa.list_(pa.int64())),
        "seq_cate": pa.array([None if c is None else ";".join(map(str, c)) for c in cates]),
    })


def _newest_first(rows):
    return [None if r is None else r[::-1] for r in rows]


def _read(tzrun_pm, tmp_path: Path, table: pa.Table, *overrides: str, on_bad_row: str = "error"):
    """The batches of ``table`` written as Parquet and read back through the reader."""
    pq.write_table(table, tmp_path / "part-0.parquet")
    cfg = _config(tzrun_pm, *overrides)
    specs = feature_specs(cfg.features)
    builder = BatchBuilder(specs, ["label"], None, on_bad_row=on_bad_row)
    rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path), 4, 0, specs.columns(["label"], None),
                           builder, 0, 1)
    skipped = SkippedRows()
    return list(tally_skipped(rank_input.one_pass(), skipped)), skipped


def _clicks(batch) -> list[list[int]]:
    jagged = batch.sequence.to_dict()["click_seq__adgroup_id"]
    values, out = jagged.values().tolist(), []
    for n in jagged.lengths().tolist():
        out.append(values[:n])
        values = values[n:]
    return out


def test_the_default_keeps_the_last_ids(tzrun_pm, tmp_path: Path):
    assert _config(tzrun_pm).features.sequence[0].keep == "last"
    assert feature_specs(_config(tzrun_pm).features).sequence_groups[0].keep == "last"
    (batch,), _ = _read(tzrun_pm, tmp_path, _table())
    assert _clicks(batch) == [[3, 4, 5], [], [], [7, 8]]


def test_keep_first_keeps_the_first_ids_of_every_aligned_sequence(tzrun_pm, tmp_path: Path):
    (batch,), _ = _read(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="first"')
    assert _clicks(batch) == [[1, 2, 3], [], [], [7, 8]]
    cates = batch.sequence.to_dict()["click_seq__cate_id"]
    assert cates.lengths().tolist() == [3, 0, 0, 2]
    last, _ = _read(tzrun_pm, tmp_path, _table())
    last_cates = last[0].sequence.to_dict()["click_seq__cate_id"].values().tolist()
    # the same hashed categories as keep = "last" gives for the rows' other end: "0;1;2" against "2;3;4"
    assert cates.values().tolist()[:3] != last_cates[:3]
    assert cates.values().tolist()[3:] == last_cates[3:]


def test_keep_all_truncates_nothing_and_a_longer_row_is_a_bad_row(tzrun_pm, tmp_path: Path):
    (batch,), _ = _read(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="all"', "features.sequence[0].max_len=5")
    assert _clicks(batch) == [[1, 2, 3, 4, 5], [], [], [7, 8]]
    with pytest.raises(DataError, match=r"part-0\.parquet: row 0 \(counting from 0\): column 'seq_ad' \(sequence "
                                        r"'click_seq__adgroup_id' of group 'click_seq'\) has 5 ids, more than max_len = 3, "
                                        r"and keep = \"all\" truncates none") as info:
        _read(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="all"')
    assert "raise max_len to the longest row" in str(info.value) and "\n" not in str(info.value)
    (batch,), skipped = _read(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="all"', on_bad_row="skip")
    assert skipped == SkippedRows(1, {"click_seq: longer than max_len": 1})
    assert _clicks(batch) == [[], [], [7, 8]]


def test_the_row_named_by_a_keep_all_error_is_the_first_longer_one(tzrun_pm):
    cfg = _config(tzrun_pm, 'features.sequence[0].keep="all"')
    builder = BatchBuilder(feature_specs(cfg.features), ["label"], None)
    rows = [[1], [1, 2, 3, 4], [], [7, 8]]
    with pytest.raises(BadRowError, match="has 4 ids, more than max_len = 3") as info:
        builder(_table(rows, rows), "t.parquet")
    assert info.value.batch_row == 1


@pytest.mark.parametrize("value", ["begin", "none", ""])
def test_an_unknown_keep_is_one_line_at_its_toml_path(tzrun_pm, value):
    with pytest.raises(ConfigError) as info:
        _config(tzrun_pm, f'features.sequence[0].keep="{value}"')
    (problem,) = info.value.problems
    assert problem.path == "features.sequence[0].keep"
    assert '"last", "first", "all"' in problem.message and "\n" not in problem.message


def _mmoe_logits(tzrun_pm, tmp_path: Path, table: pa.Table, *overrides: str) -> torch.Tensor:
    """mmoe's logits, its sequence group encoded by self-attention, from a fixed seed."""
    (batch,), _ = _read(tzrun_pm, tmp_path, table, *overrides)
    specs = feature_specs(_config(tzrun_pm, *overrides).features)
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), ("label",),
                       specs.sequence_groups, specs.sequence_tables)
    entry = collect_registries(tzrun_pm)["model"].get("mmoe", "model.type")
    torch.manual_seed(0)
    model = entry.build(entry.config(tasks=(MMoETaskConfig("ctr", (4,)),), num_experts=2, expert_hidden_units=(8,),
                                     sequence_encoders=(SequenceEncoderConfig("click_seq", "self_attention"),)), ctx)
    return model.eval()(batch)["logits/ctr"].detach()


def test_a_model_sees_the_kept_end_as_the_most_recent(tzrun_pm, tmp_path: Path):
    last = _mmoe_logits(tzrun_pm, tmp_path, _table())
    # the same behaviour stored newest first, keeping the first ids: the same ids at the same
    # distances from the most recent one, so the same predictions
    first = _mmoe_logits(tzrun_pm, tmp_path, _table(_newest_first(CLICKS), _newest_first(CATES)),
                         'features.sequence[0].keep="first"')
    torch.testing.assert_close(first, last)
    # keep = "first" on the oldest-first rows: row 0 keeps other ids, row 3 keeps its two but
    # reads 7 as the most recent; the empty rows 1 and 2 do not change
    other = _mmoe_logits(tzrun_pm, tmp_path, _table(), 'features.sequence[0].keep="first"')
    assert not torch.allclose(other[0], last[0]) and not torch.allclose(other[3], last[3])
    torch.testing.assert_close(other[1:3], last[1:3])
