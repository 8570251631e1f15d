"""Sampled negatives: the ``negative`` sampler's distributions and item-table errors, and the data
path that looks the sampled items' features up and appends them to each batch, deterministically."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig, SparseFeatureConfig
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.data.sampling import NegativesBuilder
from tzrun.errors import DataError
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader
from tzrun_plugins.samplers.negative import NegativeSampler, NegativeSamplerConfig

NUM_ITEMS = 20
FEATURES = FeaturesConfig(
    dense=(DenseFeatureConfig("price", log1p=True), DenseFeatureConfig("user_pv")),
    sparse=(
        SparseFeatureConfig("user_id", num_buckets=100, embedding_dim=4),
        SparseFeatureConfig("item_id", num_buckets=NUM_ITEMS, embedding_dim=4),
        SparseFeatureConfig("brand", hash_bucket_size=7, embedding_dim=4),
        SparseFeatureConfig("tags", num_buckets=50, embedding_dim=4),
    ),
)


def _items(**replace: pa.Array) -> pa.Table:
    """20 items: an id, a hashed brand string, a list of tags (0 to 2), a price, a popularity."""
    ids = np.arange(NUM_ITEMS, dtype=np.int64)
    columns = {
        "item_id": pa.array(ids),
        "brand": pa.array([f"b{i % 3}" for i in ids]),
        "tags": pa.array([[int(i), int(i) + 1][: i % 3] for i in ids], type=pa.list_(pa.int64())),
        "price": pa.array((ids * 1.5).astype(np.float32)),
        "popularity": pa.array((ids + 1).astype(np.float64)),  # item i drawn with P = (i + 1) / 210
    }
    columns.update(replace)
    return pa.table(columns)


def _write(tmp_path: Path, table: pa.Table, name: str = "items.parquet") -> str:
    path = tmp_path / name
    pq.write_table(table, path)
    return str(path)


def _sampler(tmp_path: Path, table: pa.Table | None = None, **options) -> NegativeSampler:
    path = _write(tmp_path, _items() if table is None else table)
    return NegativeSampler(NegativeSamplerConfig(**{"item_table": path, "item_id": "item_id", "num_negatives": 8, **options}))


def _counts(sampler: NegativeSampler, batches: int = 4000) -> np.ndarray:
    rng = np.random.default_rng(0)
    draws = np.concatenate([sampler.sample(rng, pa.table({})) for _ in range(batches)])
    return np.bincount(draws, minlength=sampler.items.num_rows)


def _chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = counts.sum() * p
    return float(((counts - expected) ** 2 / expected).sum())


# 19 degrees of freedom: P(chi2 > 60) is about 3e-6, so a correct sampler with a fixed seed passes
# with room to spare, and the other distribution (statistic in the thousands) cannot.
LOOSE = 60.0


def test_uniform_and_weighted_sampling_follow_their_distributions(tmp_path):
    uniform, weighted = _sampler(tmp_path), _sampler(tmp_path, weight="popularity")
    flat = np.full(NUM_ITEMS, 1 / NUM_ITEMS)
    popular = np.arange(1, NUM_ITEMS + 1) / 210
    np.testing.assert_allclose(weighted.probabilities(), popular)
    assert _chi_square(_counts(uniform), flat) < LOOSE < _chi_square(_counts(uniform), popular)
    assert _chi_square(_counts(weighted), popular) < LOOSE < _chi_square(_counts(weighted), flat)


def test_weight_power_and_zero_weights(tmp_path):
    weights = np.arange(NUM_ITEMS, dtype=np.float64) ** 2  # item 0 has weight 0
    sampler = _sampler(tmp_path, _items(popularity=pa.array(weights)), weight="popularity", weight_power=0.5)
    p = np.arange(NUM_ITEMS) / np.arange(NUM_ITEMS).sum()
    np.testing.assert_allclose(sampler.probabilities(), p)
    counts = _counts(sampler)
    assert counts[0] == 0
    assert _chi_square(counts[1:], p[1:]) < LOOSE


def test_weight_by_count_weights_items_by_their_rows_and_keeps_the_first(tmp_path):
    log = pa.table({"item_id": pa.array([5, 3, 5, 5, 9, 3]), "price": pa.array([1.0, 2.0, 7.0, 7.0, 3.0, 2.0])})
    sampler = _sampler(tmp_path, log, weight_by_count=True)
    assert sampler.items.column("item_id").to_pylist() == [5, 3, 9]
    assert sampler.items.column("price").to_pylist() == [1.0, 2.0, 3.0]  # each id's first row
    np.testing.assert_allclose(sampler.probabilities(), [3 / 6, 2 / 6, 1 / 6])


def test_a_csv_item_table_reads_like_parquet(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("item_id,price,popularity\n" + "".join(f"{i},{i * 1.5},{i + 1}\n" for i in range(NUM_ITEMS)))
    sampler = NegativeSampler(NegativeSamplerConfig(str(path), "item_id", 8, weight="popularity",
                                                    column_types={"price": "float32"}))
    assert sampler.items.schema.field("price").type == pa.float32()
    np.testing.assert_allclose(sampler.probabilities(), np.arange(1, NUM_ITEMS + 1) / 210)


@pytest.mark.parametrize(("table", "options", "message"), [
    (_items().drop_columns(["item_id"]), {}, r"items\.parquet: column 'item_id' \(data\.sampler\.item_id\) is missing from the item table \(columns: brand, tags"),
    (_items(), {"weight": "clicks"}, r"items\.parquet: column 'clicks' \(data\.sampler\.weight\) is missing"),
    (_items(popularity=pa.array(["a"] * NUM_ITEMS)), {"weight": "popularity"}, r"column 'popularity' \(data\.sampler\.weight\) has type string; expected numbers"),
    (_items(popularity=pa.array([1.0] * 19 + [-2.0])), {"weight": "popularity"}, r"column 'popularity' .* 1 null, negative, NaN or infinite weight\(s\) \(first: -2\.0\)"),
    (_items(popularity=pa.array([1.0] * 18 + [None, None], type=pa.float64())), {"weight": "popularity"}, r"has 2 null, negative, NaN or infinite weight\(s\) \(first: null\)"),
    (_items(popularity=pa.array([0.0] * NUM_ITEMS)), {"weight": "popularity"}, r"is 0 for every item"),
    (_items(item_id=pa.array([1, 1] + list(range(2, 20)))), {}, r"column 'item_id' \(data\.sampler\.item_id\) lists 1 id\(s\) more than once \(first: 1\).*weight_by_count"),
    (_items(item_id=pa.array([None] + list(range(1, 20)), type=pa.int64())), {}, r"column 'item_id' .* has 1 null id"),
])
def test_a_bad_item_table_is_named_with_its_column(tmp_path, table, options, message):
    with pytest.raises(DataError, match=message):
        _sampler(tmp_path, table, **options)


def test_a_missing_or_unreadable_item_table_is_named(tmp_path):
    with pytest.raises(DataError, match=r"nowhere\.parquet: the item table \(data\.sampler\.item_table\) does not exist"):
        NegativeSampler(NegativeSamplerConfig(str(tmp_path / "nowhere.parquet"), "item_id", 4))
    garbage = tmp_path / "items.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"items\.parquet: cannot read the item table as PARQUET"):
        NegativeSampler(NegativeSamplerConfig(str(garbage), "item_id", 4))


def _queries(rows: int = 5) -> pa.Table:
    """Training rows: a user, the clicked item and its features, a label."""
    item = np.arange(rows, dtype=np.int64) % 15 + 3
    return pa.table({
        "user_id": pa.array(np.arange(rows, dtype=np.int64) % 50 + 40),
        "item_id": pa.array(item),
        "brand": pa.array([f"b{i % 3}" for i in item]),
        "tags": pa.array([[int(i)] for i in item], type=pa.list_(pa.int64())),
        "price": pa.array(np.ones(rows, dtype=np.float32)),
        "user_pv": pa.array(np.full(rows, 9.0, dtype=np.float32)),
        "label": pa.array(np.ones(rows, dtype=np.float32)),
    })


def _jagged(batch, name):
    jt = batch.sparse[name]
    return jt.lengths().tolist(), jt.values().tolist()


def test_sampled_items_carry_their_looked_up_features_after_the_batch(tmp_path):
    specs = feature_specs(FEATURES)
    plain = BatchBuilder(specs, ["label"], None)
    sampler = _sampler(tmp_path, weight="popularity")
    builder = NegativesBuilder(plain, sampler, seed=3, rank=0)
    batch = builder.build_at(_queries(), "train.parquet", epoch=0, index=4)
    own = plain(_queries(), "train.parquet")
    rows = sampler.sample(builder.rng(0, 4), _queries())
    # the sampled items, encoded as if they were rows of the input, without the user's features
    expected = BatchBuilder(specs, [], None)(
        _items().take(pa.array(rows)).append_column("user_id", pa.nulls(8, pa.int64()))
        .append_column("user_pv", pa.nulls(8, pa.float32())), "items")

    assert batch.weights.shape == (5,) and batch.labels["label"].shape == (5,) and batch.num_rows == 5
    assert batch.dense.shape == (5 + 8, 2) and batch.sparse.stride() == 5 + 8
    torch.testing.assert_close(batch.dense[:5], own.dense)
    torch.testing.assert_close(batch.dense[5:, 0], expected.dense[:, 0])  # log1p(price), looked up
    assert batch.dense[5:, 1].eq(0).all()  # user_pv is not in the item table
    for name in ("user_id", "item_id", "brand", "tags"):
        lengths, values = _jagged(batch, name)
        own_lengths, own_values = _jagged(own, name)
        item_lengths, item_values = _jagged(expected, name)
        assert lengths == own_lengths + item_lengths and values == own_values + item_values, name
    assert _jagged(batch, "user_id")[0][5:] == [0] * 8
    assert _jagged(batch, "item_id")[1][5:] == rows.tolist()


def test_the_draw_depends_on_rank_pass_and_step_only(tmp_path):
    plain = BatchBuilder(feature_specs(FEATURES), ["label"], None)
    sampler = _sampler(tmp_path)
    a, b = NegativesBuilder(plain, sampler, seed=3, rank=0), NegativesBuilder(plain, sampler, seed=3, rank=1)

    def items(builder, epoch, index):
        return _jagged(builder.build_at(_queries(), "f", epoch, index), "item_id")[1][5:]

    assert items(a, 0, 2) == items(a, 0, 2)
    assert items(a, 0, 2) != items(a, 0, 3) and items(a, 0, 2) != items(a, 1, 2) and items(a, 0, 2) != items(b, 0, 2)
    padding = a.padding()
    assert padding.weights.tolist() == [0.0] and padding.sparse.stride() == 1 + 8


def test_a_bad_value_in_the_item_table_names_the_table_and_column(tmp_path):
    sampler = _sampler(tmp_path, _items(tags=pa.array([[70]] * NUM_ITEMS)))
    with pytest.raises(DataError, match=r"items\.parquet: column 'tags' \(feature 'tags'\): id 70 is outside \[0, 50\).*"
                                        r"\(in the item table of data\.sampler; fix the table\)") as error:
        NegativesBuilder(BatchBuilder(feature_specs(FEATURES), ["label"], None), sampler, 0, 0)
    assert "on_bad_row" not in str(error.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_and_their_negatives_are_the_same_read_whole_or_resumed(tmp_path, workers):
    rows = 300
    pq.write_table(pa.concat_tables([_queries(rows // 2)] * 2), tmp_path / "train.parquet", row_group_size=70)
    plain = BatchBuilder(feature_specs(FEATURES), ["label"], None)
    builder = NegativesBuilder(plain, _sampler(tmp_path), seed=11, rank=0)

    def read(num_workers: int, start: int = 0, epoch: int = 0, shuffle: int = 64) -> list[list[int]]:
        rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path / "train.parquet"), 32, num_workers,
                               list(_queries().column_names), builder, 0, 1, shuffle_buffer_rows=shuffle, seed=11)
        return [b.sparse["item_id"].values().tolist() for b in rank_input.one_pass(start=start, epoch=epoch)]

    whole = read(workers)
    assert len(whole) == 10 and len({tuple(b[-8:]) for b in whole}) == 10  # each step its own negatives
    assert read(workers, start=4) == whole[4:]
    assert read(workers, epoch=1) != whole
    # a batch's negatives belong to the batch: workers change the order batches arrive in, not them
    assert sorted(read(workers, shuffle=0)) == sorted(read(0, shuffle=0))


def test_the_batch_items_are_left_out_and_the_rest_keep_their_proportions(tmp_path):
    weighted = _sampler(tmp_path, weight="popularity")
    batch = pa.table({"item_id": pa.array([0, 4, 4, 19, 77])})  # 77 is no item of the table
    rng = np.random.default_rng(0)
    draws = np.concatenate([weighted.sample(rng, batch) for _ in range(4000)])
    counts = np.bincount(draws, minlength=NUM_ITEMS)
    assert counts[[0, 4, 19]].sum() == 0
    rest = np.setdiff1d(np.arange(NUM_ITEMS), [0, 4, 19])
    p = np.arange(1, NUM_ITEMS + 1)[rest] / np.arange(1, NUM_ITEMS + 1)[rest].sum()
    assert _chi_square(counts[rest], p) < LOOSE
    kept = _sampler(tmp_path, weight="popularity", exclude_batch_items=False)
    assert np.isin(np.concatenate([kept.sample(rng, batch) for _ in range(100)]), [0, 4, 19]).any()
    with pytest.raises(DataError, match=r"exclude_batch_items needs the input column 'item_id' \(data\.sampler\.item_id\)"):
        weighted.sample(rng, pa.table({"other": pa.array([1])}))


def test_only_rows_of_positive_weight_count_as_the_batch_items(tmp_path):
    builder = NegativesBuilder(BatchBuilder(feature_specs(FEATURES), ["label"], "w"), _sampler(tmp_path), seed=0, rank=0)
    rows = _queries(2).append_column("w", pa.array([1.0, 0.0], type=pa.float32()))  # items 3 (clicked) and 4
    drawn = np.concatenate([_jagged(builder.build_at(rows, "f", 0, i), "item_id")[1][2:] for i in range(200)])
    assert 3 not in drawn and 4 in drawn


def test_id_weights_of_sampled_items_come_from_the_table_in_a_weighted_run(tmp_path):
    features = attrs.evolve(FEATURES, sparse=(
        *FEATURES.sparse[:3], attrs.evolve(FEATURES.sparse[3], weight_column="tag_w")))
    specs = feature_specs(features)
    tag_w = pa.array([[0.5, 2.0][: i % 3] for i in range(NUM_ITEMS)], type=pa.list_(pa.float32()))
    sampler = _sampler(tmp_path, _items().append_column("tag_w", tag_w), exclude_batch_items=False)
    queries = _queries().append_column("tag_w", pa.array([[1.5]] * 5, type=pa.list_(pa.float32())))
    batch = NegativesBuilder(BatchBuilder(specs, ["label"], None), sampler, 0, 0).build_at(queries, "f", 0, 0)
    rows = sampler.sample(np.random.Generator(np.random.PCG64([0, 0, 0, 0])), queries)
    tags = batch.sparse["tags"]
    expected = [w for r in rows for w in [0.5, 2.0][: r % 3]]
    assert tags.weights().tolist() == [1.5] * 5 + expected
    assert batch.sparse["item_id"].weights().tolist() == [1.0] * (5 + 8)  # unweighted features weigh 1
    with pytest.raises(DataError, match=r"column 'tag_w' \(the weight_column of feature 'tags'\) is missing from the item table"):
        NegativesBuilder(BatchBuilder(specs, ["label"], None), _sampler(tmp_path), 0, 0)


def test_the_synthetic_taobao_item_table_matches_its_rows(tmp_path):
    from tzrun_tools.synth_taobao import synth_taobao

    synth_taobao(tmp_path, rows=20_000, eval_rows=1000, seed=3)
    items = pq.read_table(tmp_path / "items.parquet")
    assert items.column("adgroup_id").to_pylist() == list(range(items.num_rows))
    popularity = items.column("popularity").to_numpy()
    assert (popularity >= 0).all() and popularity.sum() == pytest.approx(1.0)
    train = pq.read_table(tmp_path / "train")
    ads = train.column("adgroup_id").to_numpy()
    for name in ("cate_id", "campaign_id", "customer", "brand", "price", "item_ctr_7d"):
        np.testing.assert_array_equal(items.column(name).to_numpy()[ads], train.column(name).to_numpy(), err_msg=name)
    shown = np.bincount(ads, minlength=items.num_rows) / ads.size
    assert np.corrcoef(shown, popularity)[0, 1] > 0.9  # popularity is the share of impressions
