"""The ``tdm`` sampler (``[data.sampler] type = "tdm"``): each input row expanded into its item's
leaf and ancestors (label 1) and ``layer_num_sample`` negatives of every level (label 0), the
user's columns repeated; its errors; and the core's row-expanding path that encodes those rows,
drawing the same rows for a batch read whole, resumed or by workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.config.schema import FeaturesConfig, SparseFeatureConfig
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.data.sampling import ExpandingBuilder, batch_rng
from tzrun.errors import ConfigError, DataError
from tzrun.testing import load_config_text
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader
from tzrun_plugins.samplers.tdm import TDMSampler, TDMSamplerConfig
from tzrun_tools.tdm_tree import TDMTreeOptions, build_tree

#: 8 items in 4 brands: a binary tree of 4 levels (root, 2, 4, 8 nodes); non-leaf ids 9 .. 15
ITEMS = pa.table({"item": list(range(1, 9)), "cate": ["a"] * 8, "brand": [1, 1, 2, 2, 3, 3, 4, 4]})


def _tree(tmp_path: Path, items: pa.Table = ITEMS, branching: int = 2) -> str:
    options = TDMTreeOptions(items="items", item_id="item", cate_id="cate", attr_fields=("brand",),
                             branching=branching, out="nodes")
    path = tmp_path / "nodes.parquet"
    pq.write_table(build_tree(items, options), path)
    return str(path)


def _sampler(tmp_path: Path, layers=(0, 1, 2, 3), **options) -> TDMSampler:
    return TDMSampler(TDMSamplerConfig(tree=_tree(tmp_path), item_id="item", layer_num_sample=tuple(layers), **options))


def _batch(items=(3, 8)) -> pa.Table:
    n = len(items)
    return pa.table({"user": [100 * (i + 1) for i in range(n)], "item": list(items), "brand": [0] * n,
                     "click": pa.array([1.0] * n, pa.float32())})


def _nodes(path: str) -> dict[int, dict]:
    nodes = pq.read_table(path).to_pylist()
    return {n["item"]: n for n in nodes}


def _ancestors(nodes: dict[int, dict], item: int) -> list[int]:
    """The ids above ``item``, level 1 first (the root left out)."""
    out, at = [], nodes[item]["parent"]
    while at is not None and nodes[at]["parent"] is not None:
        out.append(at)
        at = nodes[at]["parent"]
    return out[::-1]


def test_each_row_becomes_its_leaf_its_ancestors_and_per_level_negatives(tmp_path):
    sampler = _sampler(tmp_path)
    nodes = _nodes(sampler.source)
    out = sampler.expand(np.random.default_rng(0), _batch(), ["click"]).to_pydict()
    # 2 leaves, 2 x 2 ancestors (levels 1 and 2), 2 x (1 + 2 + 3) negatives
    assert len(out["user"]) == 2 + 4 + 12
    assert out["click"] == [1.0] * 6 + [0.0] * 12 and isinstance(out["click"][0], float)
    assert out["user"][:2] == [100, 200] and out["item"][:2] == [3, 8]
    assert out["user"][2:6] == [100, 100, 200, 200]
    assert out["item"][2:6] == _ancestors(nodes, 3) + _ancestors(nodes, 8)
    for r, item in enumerate((3, 8)):
        rows = slice(6 + 6 * r, 12 + 6 * r)
        assert out["user"][rows] == [100 * (r + 1)] * 6  # the user's columns, repeated
        negatives = out["item"][rows]
        levels = [nodes[n]["tree_level"] for n in negatives]
        assert levels == [1, 2, 2, 3, 3, 3]
        own = {1: _ancestors(nodes, item)[0], 2: _ancestors(nodes, item)[1], 3: item}
        assert all(n != own[level] for n, level in zip(negatives, levels))  # never the row's own node
        assert len(set(negatives)) == 6  # distinct within a row
    # the node's attribute columns are the node's: a non-leaf node's brand is the tree's
    assert out["brand"] == [nodes[n]["brand"] for n in out["item"]]


def test_negatives_cover_their_level_evenly(tmp_path):
    sampler = _sampler(tmp_path, layers=(0, 0, 0, 1))
    rng = np.random.default_rng(1)
    counts = {}
    for _ in range(700):
        out = sampler.expand(rng, _batch(items=(3,)), ["click"]).to_pydict()
        negative = out["item"][-1]
        counts[negative] = counts.get(negative, 0) + 1
    assert sorted(counts) == [1, 2, 4, 5, 6, 7, 8]  # every leaf but item 3
    assert min(counts.values()) > 60  # 100 each expected


def test_remain_ratio_keeps_a_share_of_the_middle_levels(tmp_path):
    items = pa.table({"item": list(range(1, 33)), "cate": ["a"] * 32, "brand": [1] * 32})  # 6 levels
    sampler = TDMSampler(TDMSamplerConfig(tree=_tree(tmp_path, items), item_id="item", layer_num_sample=(0, 1, 1, 1, 1, 1),
                                          remain_ratio=0.5, probability_type="arithmetic"))
    nodes = _nodes(sampler.source)
    seen = set()
    for seed in range(20):
        out = sampler.expand(np.random.default_rng(seed), _batch(items=(5,)), ["click"]).to_pydict()
        levels = [nodes[n]["tree_level"] for n in out["item"]]
        assert len(levels) == 1 + 2 + 3 and levels[0] == 5  # the leaf, round(0.5 * 4) ancestors, their negatives
        assert levels[1:3] == levels[3:5] and levels[5] == 5
        seen.add(tuple(levels[1:3]))
    assert len(seen) > 2


def test_the_draw_is_the_generators(tmp_path):
    sampler = _sampler(tmp_path)
    a = sampler.expand(batch_rng(7, 0, 0, 3), _batch(), ["click"])
    assert sampler.expand(batch_rng(7, 0, 0, 3), _batch(), ["click"]).equals(a)
    assert not sampler.expand(batch_rng(7, 1, 0, 3), _batch(), ["click"]).equals(a)  # another rank
    assert not sampler.expand(batch_rng(7, 0, 1, 3), _batch(), ["click"]).equals(a)  # another pass


@pytest.mark.parametrize(("layers", "batch", "message"), [
    ((0, 1, 2), _batch(), "data.sampler.layer_num_sample: the tree has 4 levels but layer_num_sample has 3 entries; give 4"),
    ((0, 2, 2, 3), _batch(), r"data.sampler.layer_num_sample\[1\]: is 2, but level 1 of the tree has 2 node\(s\), so at most 1"),
    ((0, 1, 2, 3), _batch(items=(3, 42)), "item id 42 \\(column 'item'\\) is not a leaf of the tree"),
    ((0, 1, 2, 3), _batch(items=(3, 12)), "item id 12 .* is not a leaf"),
    ((0, 1, 2, 3), _batch().drop_columns(["item"]), "the input has no column 'item' \\(data.sampler.item_id\\)"),
])
def test_a_mismatched_tree_or_input_is_named(tmp_path, layers, batch, message):
    with pytest.raises(DataError, match=message):
        _sampler(tmp_path, layers).expand(np.random.default_rng(0), batch, ["click"])


def test_a_missing_tree_or_column_is_named(tmp_path):
    with pytest.raises(DataError, match="nodes.parquet: the tree \\(data.sampler.tree\\) does not exist; write it with tzrec-run tdm-tree"):
        TDMSampler(TDMSamplerConfig(tree=str(tmp_path / "nodes.parquet"), item_id="item", layer_num_sample=(0, 1)))
    tree = _tree(tmp_path)
    with pytest.raises(DataError, match="no column 'adgroup_id' \\(data.sampler.item_id\\) in the tree"):
        TDMSampler(TDMSamplerConfig(tree=tree, item_id="adgroup_id", layer_num_sample=(0, 1, 2, 3)))
    with pytest.raises(DataError, match="no column 'price' \\(data.sampler.attr_fields\\)"):
        TDMSampler(TDMSamplerConfig(tree=tree, item_id="item", layer_num_sample=(0, 1, 2, 3), attr_fields=("price",)))


SAMPLER = '{ type = "tdm", tree = "nodes.parquet", item_id = "item", layer_num_sample = [0, 1, 2, 3] }'
CONFIG = f"""
model_dir = "runs/x"
[data]
train_input = "train.parquet"
batch_size = 4
labels = ["click"]
sampler = {SAMPLER}
[model]
type = "tdm"
[[losses]]
type = "binary_cross_entropy"
[train]
num_steps = 1
sparse_optimizer = {{ type = "rowwise_adagrad", lr = 0.1 }}
dense_optimizer = {{ type = "adam", lr = 0.001 }}
[[features.sparse]]
name = "item"
num_buckets = 16
table = "item_emb"
[[features.sequence]]
name = "history"
max_len = 3
query = ["item"]
[[features.sequence.features]]
name = "history__item"
column = "history"
table = "item_emb"
"""


@pytest.mark.parametrize(("override", "message"), [
    ("data.sampler.layer_num_sample=[1, 2]", "data.sampler.layer_num_sample: the root (entry 0) has no negatives: set it to 0, got 1"),
    ("data.sampler.layer_num_sample=[0]", "data.sampler.layer_num_sample: needs one entry per tree level"),
    ("data.sampler.remain_ratio=0.0", "data.sampler.remain_ratio: must be in (0, 1], got 0.0"),
    ('data.sampler.probability_type="linear"', "data.sampler.probability_type"),
])
def test_option_errors_name_the_toml_path(override, message):
    with pytest.raises(ConfigError) as excinfo:
        load_config_text(CONFIG, overrides=[override])
    assert message in str(excinfo.value)


def test_check_takes_a_row_sampler_for_a_model_without_sampled_outputs(tmp_path):
    """The appended-items rules (a two-tower model, no unpooled features) are not a row sampler's:
    TDM's query feature is looked up unpooled and its model makes no sampled output."""
    from tests.conftest import cli

    path = tmp_path / "tdm.toml"
    path.write_text(CONFIG)
    proc = cli(["check", str(path)])
    assert proc.returncode == 0, proc.stderr
    negative = '{ type = "negative", item_table = "items.parquet", item_id = "item", num_negatives = 2 }'
    path.write_text(CONFIG.replace(SAMPLER, negative))
    proc = cli(["check", str(path)])
    assert "data.sampler: model tdm does not use sampled negatives" in proc.stderr


FEATURES = FeaturesConfig(sparse=(SparseFeatureConfig("user", num_buckets=1000, embedding_dim=4),
                                  SparseFeatureConfig("item", num_buckets=16, embedding_dim=4)))


def test_the_expanded_rows_are_encoded_as_the_batch(tmp_path):
    builder = ExpandingBuilder(BatchBuilder(feature_specs(FEATURES), ["click"], None), _sampler(tmp_path), seed=3, rank=0)
    batch = builder.build_at(_batch(), "train.parquet", 0, 0)
    expected = _sampler(tmp_path).expand(batch_rng(3, 0, 0, 0), _batch(), ["click"]).to_pydict()
    assert batch.weights.shape == (18,) and batch.labels["click"].tolist() == expected["click"]
    assert batch.sparse["item"].values().tolist() == expected["item"]
    assert batch.sparse["user"].values().tolist() == expected["user"]
    assert builder.padding().weights.tolist() == [0.0]  # padding is not expanded


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_expands_the_same_read_whole_or_resumed(tmp_path, workers):
    rng = np.random.default_rng(0)
    rows = 96
    table = pa.table({"user": rng.integers(0, 1000, rows), "item": rng.integers(1, 9, rows),
                      "click": pa.array(np.ones(rows), pa.float32())})
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=40)
    builder = ExpandingBuilder(BatchBuilder(feature_specs(FEATURES), ["click"], None), _sampler(tmp_path), seed=11, rank=0)

    def read(start: int = 0, epoch: int = 0, shuffle: int = 32) -> list[list[int]]:
        rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path / "train.parquet"), 16, workers,
                               ["user", "item", "click"], builder, 0, 1, shuffle_buffer_rows=shuffle, seed=11)
        return [b.sparse["item"].values().tolist() for b in rank_input.one_pass(start=start, epoch=epoch)]

    whole = read()
    assert len(whole) == 6 and all(len(b) == 16 * (1 + 2 + 6) for b in whole)
    assert read(start=2) == whole[2:]
    assert read(epoch=1) != whole


def test_check_refuses_a_tree_of_other_levels_than_layer_num_sample(tmp_path):
    """``tzrec-run check`` reads the tree's levels (one line: the TOML path, the file, both
    numbers, the fix); a tree not written yet is left to the run."""
    from tests.conftest import cli

    tree = _tree(tmp_path)  # 4 levels
    path = tmp_path / "tdm.toml"
    path.write_text(CONFIG.replace('tree = "nodes.parquet"', f'tree = "{tree}"').replace("[0, 1, 2, 3]", "[0, 1, 2]"))
    proc = cli(["check", str(path)])
    assert proc.returncode != 0
    assert (f"  data.sampler.layer_num_sample: {tree}: the tree has 4 levels but layer_num_sample has 3 entries; "
            "give 4, one per level, root (0) first\n") in proc.stderr
    proc = cli(["check", str(path), "--set", "data.sampler.layer_num_sample=[0, 2, 2, 3]"])
    assert proc.returncode != 0
    assert (f"  data.sampler.layer_num_sample[1]: {tree}: is 2, but level 1 of the tree has 2 node(s), so at most 1 "
            "negatives besides the positive; lower it\n") in proc.stderr
    proc = cli(["check", str(path), "--set", f'data.sampler.tree="{tmp_path / "later.parquet"}"'])
    assert proc.returncode == 0, proc.stderr


def test_skipped_rows_count_input_rows_not_their_copies(tmp_path):
    """An input row with a bad user id is left out with all its 9 rows and counted once, and the
    rows read are the input's, so data.max_bad_row_fraction is a share of input rows."""
    from tzrun.data.batch import SkippedRows, tally_skipped

    builder = ExpandingBuilder(BatchBuilder(feature_specs(FEATURES), ["click"], None, on_bad_row="skip"),
                               _sampler(tmp_path), seed=3, rank=0)
    bad = _batch(items=(3, 8, 5)).set_column(0, "user", pa.array([100, 5000, 300]))
    batch = builder.build_at(bad, "train.parquet", 0, 0)
    assert batch.weights.shape == (2 * 9,)
    assert batch.sparse["user"].values().tolist().count(300) == 9 and 5000 not in batch.sparse["user"].values().tolist()
    assert batch.skipped == SkippedRows(1, {"user: id outside [0, 1000)": 1})
    total = SkippedRows()
    list(tally_skipped([batch, builder.build_at(_batch(), "train.parquet", 0, 1)], total))
    assert (total.rows, total.read) == (1, 3 + 2)
