"""Feature transforms against hand-computed values: vocabularies, boundaries, standardization,
multi-value and sequence ids, per-id weights and their pooling, and the config checks."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.core.test_config import MINIMAL, problems_of
from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig, SparseFeatureConfig
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.hashing import hash_to_buckets
from tzrun.errors import DataError
from tzrun.interfaces import ModelContext
from tzrun.testing import load_config_text


def _batch(features: FeaturesConfig, **columns: pa.Array):
    rows = len(next(iter(columns.values())))
    table = pa.table({**columns, "label": pa.array([0.0] * rows, pa.float32())})
    return BatchBuilder(feature_specs(features), ["label"], None)(table, "f.parquet")


def _jagged(batch, key: str) -> tuple[list[int], list]:
    jt = batch.sparse.to_dict()[key]
    return jt.lengths().tolist(), jt.values().tolist()


def test_vocab_maps_tokens_to_one_based_ids_and_the_rest_to_zero(tmp_path):
    vocab_file = tmp_path / "colors.txt"
    vocab_file.write_text("red\r\ngreen\n\nblue\n", encoding="utf-8")  # CRLF and an empty line
    features = FeaturesConfig(sparse=(
        SparseFeatureConfig("inline", column="color", vocab=("red", "green", "blue")),
        SparseFeatureConfig("filed", column="color", vocab_file=str(vocab_file)),
        SparseFeatureConfig("ints", column="code", vocab=("7", "42")),
    ))
    specs = feature_specs(features)
    assert [t.num_embeddings for t in specs.tables] == [4, 4, 3]
    batch = _batch(
        features,
        color=pa.array(["blue", "pink", None, "red", ""]),
        code=pa.array([42, 7, 8, None, 42], pa.int64()),
    )
    for key in ("inline", "filed"):
        assert _jagged(batch, key) == ([1, 1, 0, 1, 1], [3, 0, 1, 0]), key  # null: no id; "pink", "": OOV 0
    assert _jagged(batch, "ints") == ([1, 1, 1, 0, 1], [2, 1, 0, 2])


def test_boundaries_count_the_boundaries_at_or_below_x():
    features = FeaturesConfig(sparse=(SparseFeatureConfig("price_bucket", column="price", boundaries=(0.0, 10.0, 100.0)),))
    assert feature_specs(features).tables[0].num_embeddings == 4
    price = pa.array([-5.0, 0.0, 9.99, 10.0, 50.0, 100.0, 1e9, None, math.nan, -math.inf, math.inf], pa.float64())
    lengths, ids = _jagged(_batch(features, price=price), "price_bucket")
    assert lengths == [1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1]  # null and NaN: no id
    assert ids == [0, 1, 1, 2, 2, 3, 3, 0, 3]
    assert ids == np.searchsorted([0.0, 10.0, 100.0], [-5, 0, 9.99, 10, 50, 100, 1e9, -np.inf, np.inf], side="right").tolist()
    ints = _jagged(_batch(features, price=pa.array([3, 10, 250], pa.int32())), "price_bucket")
    assert ints == ([1, 1, 1], [1, 2, 3])


def test_standardization_follows_fill_and_log1p():
    features = FeaturesConfig(dense=(
        DenseFeatureConfig("a", fill_value=2.0, mean=1.0, std=4.0),
        DenseFeatureConfig("b", log1p=True, mean=0.5, std=2.0),
    ))
    batch = _batch(features, a=pa.array([9.0, None, -3.0], pa.float32()), b=pa.array([0, 3, None], pa.int64()))
    expected = [
        [(9 - 1) / 4, (math.log1p(0) - 0.5) / 2],
        [(2 - 1) / 4, (math.log1p(3) - 0.5) / 2],
        [(-3 - 1) / 4, (math.log1p(0) - 0.5) / 2],
    ]
    assert torch.allclose(batch.dense, torch.tensor(expected, dtype=torch.float32))


SEQUENCES = FeaturesConfig(sparse=(
    SparseFeatureConfig("hist_hash", column="hist", separator="|", hash_bucket_size=1000),
    SparseFeatureConfig("hist_ids", column="hist_num", separator="|", num_buckets=10, pooling="mean"),
    SparseFeatureConfig("tags", column="tag_list", vocab=("a", "b"), pooling="mean"),
))


def test_delimited_strings_and_list_columns_are_jagged():
    batch = _batch(
        SEQUENCES,
        hist=pa.array(["x|yy|x", "", None, "z||"]),
        hist_num=pa.array(["1|2|3", "9", None, " 4 |"]),
        tag_list=pa.array([["a", "c"], [], None, ["b", None, "b"]], pa.list_(pa.string())),
    )
    x, yy, z = hash_to_buckets(pa.array(["x", "yy", "z"]), 1000).tolist()
    assert _jagged(batch, "hist_hash") == ([3, 0, 0, 1], [x, yy, x, z])  # empty pieces give no id
    assert _jagged(batch, "hist_ids") == ([3, 1, 0, 1], [1, 2, 3, 9, 4])
    assert _jagged(batch, "tags") == ([2, 0, 0, 2], [1, 0, 2, 2])


def test_a_piece_that_is_not_an_id_names_file_column_and_value():
    with pytest.raises(DataError, match=r"f\.parquet: column 'hist_num' \(feature 'hist_ids'\): value 'seven' is not an integer id"):
        _batch(SEQUENCES, hist=pa.array(["x"]), hist_num=pa.array(["1|seven"]), tag_list=pa.array([["a"]]))


def _pooled(features: FeaturesConfig, weights_by_table: dict[str, torch.Tensor], **columns: pa.Array) -> dict[str, torch.Tensor]:
    """The pooled embeddings of a batch through an EmbeddingBagCollection built the way models
    build theirs (``ctx.embedding_bag_configs()``, ``is_weighted=ctx.is_weighted``)."""
    from torchrec import EmbeddingBagCollection

    specs = feature_specs(features)
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), ("label",))
    ebc = EmbeddingBagCollection(tables=ctx.embedding_bag_configs(), is_weighted=ctx.is_weighted, device=torch.device("cpu"))
    with torch.no_grad():
        for name, weight in weights_by_table.items():
            ebc.embedding_bags[name].weight.copy_(weight)
    return ebc(_batch(features, **columns).sparse).to_dict()


TABLE = torch.arange(40, dtype=torch.float32).reshape(10, 4)  # row i = [4i, 4i+1, 4i+2, 4i+3]


def test_sum_and_mean_pooling_match_hand_computed_values():
    features = FeaturesConfig(sparse=(
        SparseFeatureConfig("seq_sum", column="seq", separator="|", num_buckets=10, embedding_dim=4, table="sum_table"),
        SparseFeatureConfig("seq_mean", column="seq", separator="|", num_buckets=10, embedding_dim=4, table="mean_table", pooling="mean"),
    ))
    pooled = _pooled(features, {"sum_table": TABLE, "mean_table": TABLE}, seq=pa.array(["1|2|2", "7", None]))
    assert torch.equal(pooled["seq_sum"], torch.stack([TABLE[1] + 2 * TABLE[2], TABLE[7], torch.zeros(4)]))
    assert torch.allclose(pooled["seq_mean"], torch.stack([(TABLE[1] + 2 * TABLE[2]) / 3, TABLE[7], torch.zeros(4)]))


def test_weighted_ids_pool_to_weighted_sums_and_means():
    features = FeaturesConfig(sparse=(
        SparseFeatureConfig("clicks", column="items", num_buckets=10, embedding_dim=4, weight_column="counts"),
        SparseFeatureConfig("views", column="viewed", separator="|", num_buckets=10, embedding_dim=4,
                            weight_column="view_weights", pooling="mean"),
        SparseFeatureConfig("plain", column="cat", num_buckets=10, embedding_dim=4, pooling="mean"),
    ))
    specs = feature_specs(features)
    assert all(t.weighted and t.pooling == "sum" for t in specs.tables)
    pooled = _pooled(
        features,
        {"clicks_emb": TABLE, "views_emb": TABLE, "plain_emb": TABLE},
        items=pa.array([[1, 3], [], [2, None]], pa.list_(pa.int64())),
        counts=pa.array([[2.0, 0.5], [], [3.0, None]], pa.list_(pa.float32())),
        viewed=pa.array(["4|5", None, "6"]),
        view_weights=pa.array(["1|3", None, "2"]),
        cat=pa.array([1, 2, None], pa.int64()),
    )
    zero = torch.zeros(4)
    assert torch.allclose(pooled["clicks"], torch.stack([2 * TABLE[1] + 0.5 * TABLE[3], zero, 3 * TABLE[2]]))
    assert torch.allclose(pooled["views"], torch.stack([(TABLE[4] + 3 * TABLE[5]) / 2, zero, 2 * TABLE[6]]))
    assert torch.allclose(pooled["plain"], torch.stack([TABLE[1], TABLE[2], zero]))


def test_weights_that_do_not_match_the_ids_name_file_and_columns():
    features = FeaturesConfig(sparse=(SparseFeatureConfig("clicks", column="items", num_buckets=10, weight_column="counts"),))
    with pytest.raises(DataError, match=r"f\.parquet: column 'counts' \(weights of feature 'clicks'\): row 1 of this batch has 1 weight"):
        _batch(
            features,
            items=pa.array([[1], [2, 3]], pa.list_(pa.int64())),
            counts=pa.array([[1.0], [1.0]], pa.list_(pa.float32())),
        )
    with pytest.raises(DataError, match=r"f\.parquet: column 'counts' is missing"):
        _batch(features, items=pa.array([[1]], pa.list_(pa.int64())))


def test_features_sharing_a_table_look_up_the_same_rows():
    features = FeaturesConfig(sparse=(
        SparseFeatureConfig("user_item", column="a", vocab=("p", "q"), table="item_table", embedding_dim=4),
        SparseFeatureConfig("seq_item", column="b", vocab=("p", "q"), separator=",", table="item_table", embedding_dim=4),
    ))
    specs = feature_specs(features)
    assert [(t.name, t.num_embeddings, t.feature_names) for t in specs.tables] == [("item_table", 3, ("user_item", "seq_item"))]
    pooled = _pooled(features, {"item_table": TABLE[:3]}, a=pa.array(["q"]), b=pa.array(["p,q,r"]))
    assert torch.equal(pooled["user_item"][0], TABLE[2])
    assert torch.equal(pooled["seq_item"][0], TABLE[0] + TABLE[1] + TABLE[2])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (['features.sparse[0].vocab=["a", "b"]'], "features.sparse[0]: feature 'c0': set exactly one of"),
        (["features.sparse[0].boundaries=[1.0, 2.0]"], "features.sparse[0]: feature 'c0': set exactly one of"),
        (['features.sparse[0].separator=""'], "features.sparse[0].separator: must not be empty"),
        (["features.dense[0].std=0.0"], "features.dense[0].std: must be positive, got 0.0"),
        (["data.shuffle_buffer_rows=-1"], "data.shuffle_buffer_rows: must be 0 or more, got -1"),
    ],
)
def test_bad_feature_keys_are_named(tzrun_pm, overrides, expected):
    problems = problems_of(MINIMAL, *overrides, pm=tzrun_pm)
    assert any(p.startswith(expected) for p in problems), problems


def _sparse_only(**keys: str) -> list[str]:
    """``features.sparse[0]`` with ``num_buckets`` replaced by ``keys`` (TOML literals)."""
    text = MINIMAL.replace("num_buckets = 100", "\n".join(f"{k} = {v}" for k, v in keys.items()))
    return text


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"vocab": '["a", "b", "a"]'}, "features.sparse[0].vocab: feature 'c0': token 'a' appears twice"),
        ({"vocab": "[]"}, "features.sparse[0].vocab: feature 'c0': the vocabulary has no tokens"),
        ({"vocab_file": '"no/such/vocab.txt"'}, "features.sparse[0].vocab_file: cannot read no/such/vocab.txt"),
        ({"boundaries": "[1.0, 1.0]"}, "features.sparse[0].boundaries: must be strictly increasing, got [1.0, 1.0]"),
        ({"boundaries": "[]"}, "features.sparse[0].boundaries: give at least one boundary"),
        ({"boundaries": "[1, 2]", "weight_column": '"c0"'}, "features.sparse[0].weight_column: must be another column"),
    ],
)
def test_bad_vocab_and_boundaries_are_config_errors(tzrun_pm, keys, expected):
    problems = problems_of(_sparse_only(**keys), pm=tzrun_pm)
    assert any(p.startswith(expected) for p in problems), problems


def test_new_feature_keys_structure(tzrun_pm, tmp_path):
    vocab = tmp_path / "v.txt"
    vocab.write_text("a\nb\n")
    text = MINIMAL.replace("num_buckets = 100", f'vocab_file = "{vocab}"\nseparator = "|"\nweight_column = "w"')
    text = text.replace('name = "d0"', 'name = "d0"\nmean = 2\nstd = 0.5')
    cfg, _ = load_config_text(text, tzrun_pm)
    specs = feature_specs(cfg.features)
    assert specs.sparse[0].vocab == ("a", "b") and specs.tables[0].num_embeddings == 3 and specs.tables[0].weighted
    assert (specs.dense[0].mean, specs.dense[0].std) == (2.0, 0.5)
    assert specs.columns(["label"], None) == ["d0", "c0", "w", "label"]


def test_features_sharing_a_table_must_agree_on_pooling(tzrun_pm):
    text = MINIMAL + '\n[[features.sparse]]\nname = "c1"\nnum_buckets = 100\ntable = "c0_emb"\npooling = "mean"\n'
    problems = problems_of(text, pm=tzrun_pm)
    assert any(p.startswith("features.sparse[1].pooling: features sharing table 'c0_emb'") for p in problems), problems
