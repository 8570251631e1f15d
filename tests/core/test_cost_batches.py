"""Cost-aware batches (``data.batch_cost_size``): the cap, ranks in step, exact resume, the costs
of a row, and the config checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig
from tzrun.data.cost import BatchCost, SequenceCost, batch_bounds
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.errors import DataError
from tzrun.runner.position import Layout
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

ROWS = 1003


@pytest.fixture
def costed(tmp_path: Path) -> Path:
    """Three Parquet files, uneven row groups, 1,003 rows numbered by `row`, each with a `cost`
    (0 to 30, and row 500 costs 400: more than any cap below alone)."""
    rng = np.random.default_rng(7)
    cost = rng.integers(0, 31, ROWS)
    cost[500] = 400
    start = 0
    for i, (rows, group) in enumerate([(400, 150), (3, 2), (600, 256)]):
        table = pa.table({"row": np.arange(start, start + rows, dtype=np.int64),
                          "cost": cost[start:start + rows].astype(np.int64)})
        pq.write_table(table, tmp_path / f"part-{i}.parquet", row_group_size=group)
        start += rows
    return tmp_path


def _cost_of(path: Path) -> np.ndarray:
    return pa.concat_tables(pq.read_table(f) for f in sorted(path.glob("*.parquet"))).column("cost").to_numpy()


def _input(path: Path, rank: int, world: int, workers: int, cap: int = 100, batch_size: int = 64,
           rows: list[tuple[int, int]] | None = None) -> RankInput:
    builder = BatchBuilder(feature_specs(FeaturesConfig(dense=(DenseFeatureConfig("row"),))), ["row"], None)
    return RankInput(ParquetReader(ParquetConfig()), str(path), batch_size, workers, ["row"], builder, rank, world,
                     rows=rows, cost=BatchCost(cap, "cost", column="cost"))


def _rows_of(batches) -> list[list[int]]:
    return [[int(v) for v in b.labels["row"][: b.num_rows].tolist()] for b in batches]


def test_greedy_bounds_keep_the_cap_and_the_batch_size_and_a_row_over_the_cap_is_alone():
    costs = np.array([3, 4, 2, 9, 1, 1, 1, 1, 0, 0, 12, 5], dtype=np.float64)
    bounds, alone = batch_bounds(costs, 9, 3)
    assert bounds.tolist() == [0, 3, 4, 7, 10, 11, 12]  # [3,4,2] (= the cap) [9] [1,1,1] [1,0,0] [12] [5]
    assert alone == 1
    assert batch_bounds(np.zeros(0), 9, 3)[0].tolist() == [0]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_never_pass_the_cap_and_two_ranks_run_the_same_steps_over_every_row(costed, workers, caplog):
    cost = _cost_of(costed)
    seen: list[int] = []
    lengths = []
    for rank in range(2):
        rank_input = _input(costed, rank, 2, workers)
        batches = list(rank_input.one_pass())
        lengths.append((rank_input.steps, len(batches)))
        for rows in _rows_of(batches):
            assert len(rows) <= 64
            assert cost[rows].sum() <= 100 or len(rows) == 1, rows  # a row over the cap alone is a batch alone
        seen.extend(r for b in _rows_of(batches) for r in b)
    assert sorted(seen) == list(range(ROWS))
    assert lengths[0] == lengths[1]  # both ranks run every step: the shorter one pads
    assert [r for r in caplog.records if "1 row(s) cost more than that alone" in r.getMessage()]
    fixed = _input(costed, 0, 2, workers, cap=10**9)  # a cap never reached: batches of batch_size
    assert [len(b) for b in _rows_of(fixed.one_pass())][:-1] == [64] * (fixed.split.num_batches - 1)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_a_cost_batched_pass_resumed_at_step_k_yields_what_the_whole_pass_yields_from_k(costed, workers):
    rank_input = _input(costed, 1, 2, workers, cap=300)
    whole = _rows_of(rank_input.one_pass())
    assert len(whole) > 12
    every = range(len(whole) + 1)
    for k in every if workers == 0 else [0, 1, 2, 5, len(whole) // 2, len(whole) - 1, len(whole)]:  # workers fork
        assert _rows_of(rank_input.one_pass(start=k)) == whole[k:], k
        consumed = rank_input.consumed(k)
        assert sorted(r for a, b in consumed for r in range(a, b)) == sorted(r for b in whole[:k] for r in b)


def test_the_rest_of_an_epoch_is_cost_batched_again_on_another_world_size(costed):
    from tzrun.data.dataset import merge_intervals, subtract_intervals

    consumed = [i for rank in range(2) for i in _input(costed, rank, 2, 0).consumed(4)]
    remaining = subtract_intervals(ROWS, merge_intervals(consumed))
    resumed = _input(costed, 0, 1, 0, rows=remaining)
    rows = _rows_of(resumed.one_pass())
    cost = _cost_of(costed)
    assert all(cost[b].sum() <= 100 or len(b) == 1 for b in rows)
    assert sorted([r for a, b in merge_intervals(consumed) for r in range(a, b)] + [r for b in rows for r in b]) == \
        list(range(ROWS))


def test_a_row_costs_its_sequence_lengths_truncated_plus_one():
    table = pa.table({
        "clicks": pa.array([[1, 2, 3, 4], [], None, [7]], pa.list_(pa.int64())),
        "brands": pa.array(["a;b;;c", "", None, "x;y;z;w;v;u"]),
    })
    cost = BatchCost(50, "sequence_length", sequences=(SequenceCost("clicks", 3), SequenceCost("brands", 5, ";")))
    assert cost.costs(table, "f").tolist() == [1 + 3 + 3, 1, 1, 1 + 1 + 5]
    assert cost.columns() == ["clicks", "brands"]


@pytest.mark.parametrize(("values", "says"), [
    (pa.array([1, None]), "holds a null, NaN or negative cost"),
    (pa.array([1.0, -2.0]), "holds a null, NaN or negative cost"),
    (pa.array(["a", "b"]), "holds string, not numbers"),
])
def test_a_bad_cost_column_names_the_file_and_the_column(values, says):
    with pytest.raises(DataError, match=rf"f\.parquet: column 'w' \(data\.sample_cost\) {says}"):
        BatchCost(9, "w", column="w").costs(pa.table({"w": values}), "f.parquet")


def test_the_layout_records_the_cost_so_a_changed_cap_does_not_continue_the_old_batches():
    from tzrun.runner.position import DataPosition, resume_layout_for

    costed_layout = Layout(2, 0, 64, batch_cost=(100, "sequence_length"))
    assert Layout.from_json(costed_layout.to_json()) == costed_layout
    assert Layout.from_json({"world_size": 2, "num_workers": 0, "batch_size": 64, "rows": None}).batch_cost is None
    saved = DataPosition(0, 3, costed_layout, ((0, 10),), ROWS)
    assert resume_layout_for(saved, costed_layout) == (costed_layout, 3)  # the same plan: continue exactly
    other = Layout(2, 0, 64, batch_cost=(50, "sequence_length"))
    layout, start = resume_layout_for(saved, other)
    assert start == 0 and layout.rows == ((10, ROWS),)  # another cap: the rest of the epoch, planned anew


@pytest.mark.parametrize(("extra", "problem"), [
    ("batch_cost_size = 100\nshuffle_buffer_rows = 4096",
     "data.batch_cost_size: cost-aware batches are planned in input order and not shuffled"),
    ("batch_cost_size = 100", "data.sample_cost: 'sequence_length' sums the row's [[features.sequence]] lengths, and "
                              "there are none"),
    ("batch_cost_size = 0", "data.batch_cost_size: must be positive, got 0"),
])
def test_config_checks_of_cost_aware_batches(extra, problem, tzrun_pm):
    from tzrun.errors import ConfigError
    from tzrun.testing import load_config_text

    text = f"""
model_dir = "runs/x"
[data]
train_input = "data/train"
labels = ["label"]
{extra}
[model]
type = "deepfm"
[[losses]]
type = "binary_cross_entropy"
[train]
num_steps = 1
sparse_optimizer = {{ type = "sgd", lr = 0.1 }}
dense_optimizer = {{ type = "sgd", lr = 0.1 }}
[[features.sparse]]
name = "c"
num_buckets = 10
embedding_dim = 4
"""
    with pytest.raises(ConfigError) as info:
        load_config_text(text, tzrun_pm)
    assert problem in str(info.value)
    assert load_config_text(text.replace(extra, 'batch_cost_size = 100\nsample_cost = "c"'), tzrun_pm)


def test_the_din_example_with_sequence_length_costs_keeps_each_batchs_sequence_ids_under_the_cap(tmp_path):
    """The whole chain on `data synth taobao` and the shipped DIN example: the run's cost is 1 +
    the row's click sequence (at most max_len = 50 ids), and the batches the run reads (their
    sequence KJT, as the model sees it) never pass the cap."""
    from tests.conftest import REPO
    from tzrun.runner.session import Session
    from tzrun_tools.synth_taobao import synth_taobao

    synth_taobao(tmp_path / "d", rows=1500, eval_rows=500, seed=3, rows_per_file=700, row_group_size=300)
    overrides = [f'data.train_input="{tmp_path / "d" / "train"}"', f'data.eval_input="{tmp_path / "d" / "eval"}"',
                 f'model_dir="{tmp_path / "run"}"', "data.batch_size=256", "data.batch_cost_size=2000",
                 "data.num_workers=0"]
    session = Session.from_config(REPO / "examples" / "din_taobao.toml", overrides)
    assert session.batch_cost == BatchCost(2000, "sequence_length", sequences=(SequenceCost("click_50_seq", 50),))
    from tzrun.runner.distributed import shutdown_distributed

    try:
        rank_input = session.start().train_data().input_for(session.whole_layout)
        batches = list(rank_input.one_pass())
    finally:
        shutdown_distributed()
    assert len(batches) > 1500 / 256 + 1  # the cap, not the row count, closes most batches
    seen = 0
    for batch in batches:
        lengths = batch.sequence.to_dict()["click_seq__adgroup_id"].lengths()
        assert int(lengths.max()) <= 50 and batch.num_rows + int(lengths.sum()) <= 2000
        seen += batch.num_rows
    assert seen == 1500
