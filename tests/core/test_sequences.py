"""``[[features.sequence]]``: the TOML and its checks, the data path (truncation, empty
sequences, shared tables, misaligned rows) and the lookups of :mod:`tzrun.sequence`, by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import tzrun
from tzrun.config.checks import check_run_config
from tzrun.config.load import load_config, parse_config
from tzrun.data.batch import SkippedRows, tally_skipped
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.loader import RankInput
from tzrun.errors import BadRowError, ConfigError, DataError
from tzrun.interfaces import ModelContext
from tzrun.kernel.registry import collect_registries
from tzrun.sequence import SequenceEmbeddings
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

CONFIG = """
model_dir = "/tmp/unused"
[data]
train_input = "/tmp/unused"
labels = ["label"]
[model]
type = "deepfm"
[[losses]]
type = "binary_cross_entropy"
[train]
num_steps = 1
sparse_optimizer = { type = "sgd", lr = 0.1 }
dense_optimizer = { type = "sgd", lr = 0.1 }
[[features.sparse]]
name = "adgroup_id"
num_buckets = 10
embedding_dim = 4
table = "adgroup"
[[features.sparse]]
name = "cate_id"
hash_bucket_size = 6
embedding_dim = 8
[[features.sparse]]
name = "user"
num_buckets = 5
embedding_dim = 4
[[features.sequence]]
name = "click_seq"
max_len = 3
separator = ";"
query = ["adgroup_id", "cate_id"]
[[features.sequence.features]]
name = "click_seq__adgroup_id"
column = "seq_ad"
table = "adgroup"
[[features.sequence.features]]
name = "click_seq__cate_id"
column = "seq_cate"
hash_bucket_size = 6
embedding_dim = 8
table = "cate_id_emb"
"""


def _config(tzrun_pm, *overrides: str, text: str = CONFIG):
    registries = collect_registries(tzrun_pm)
    return load_config(parse_config(text, "<test>", list(overrides)), registries)


def _table(seq_ad=None, seq_cate=None) -> pa.Table:
    """Four rows: a long sequence (truncated to its last 3), an empty one, a null one, one of 2."""
    return pa.table({
        "adgroup_id": pa.array([1, 2, 3, 4]),
        "cate_id": pa.array(["a", "b", None, "d"]),
        "user": pa.array([0, 1, 2, 3]),
        "label": pa.array([1.0, 0.0, 1.0, 0.0], pa.float32()),
        "seq_ad": seq_ad if seq_ad is not None else pa.array([[1, 2, 3, 4, 5], [], None, [7, 8]], pa.list_(pa.int64())),
        "seq_cate": seq_cate if seq_cate is not None else pa.array(["x;y;z;x;y", "", None, "z;;x"]),
    })


def _builder(cfg, on_bad_row: str = "error") -> BatchBuilder:
    return BatchBuilder(feature_specs(cfg.features), ["label"], None, on_bad_row=on_bad_row)


def test_the_schema_resolves_shared_tables_and_queries(tzrun_pm):
    cfg = _config(tzrun_pm)
    assert check_run_config(cfg) == []
    specs = feature_specs(cfg.features)
    assert [t.name for t in specs.tables] == ["user_emb"]  # pooled: only what no sequence or query reads
    assert {t.name: t.feature_names for t in specs.sequence_tables} == {
        "adgroup": ("click_seq__adgroup_id", "adgroup_id"), "cate_id_emb": ("click_seq__cate_id", "cate_id")}
    group = specs.sequence_groups[0]
    assert (group.name, group.max_len, group.query) == ("click_seq", 3, ("adgroup_id", "cate_id"))
    shared = group.features[0]  # takes the owner's id source and width
    assert (shared.num_buckets, shared.table, shared.column) == (10, "adgroup", "seq_ad")
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), ("label",),
                       specs.sequence_groups, specs.sequence_tables)
    assert ctx.unpooled_sparse_features() == ("adgroup_id", "cate_id")
    assert [(c.name, c.embedding_dim, c.feature_names) for c in ctx.embedding_configs()] == [
        ("adgroup", 4, ["click_seq__adgroup_id", "adgroup_id"]), ("cate_id_emb", 8, ["click_seq__cate_id", "cate_id"])]
    assert isinstance(group, tzrun.SequenceGroup) and "SequenceGroup" in tzrun.__all__


@pytest.mark.parametrize(("overrides", "path", "match"), [
    (["features.sequence[0].features[0].embedding_dim=8"], "features.sequence[0].features[0].embedding_dim",
     "shares table 'adgroup' with features.sparse[0] ('adgroup_id'), whose embedding_dim differs"),
    (["features.sequence[0].features[0].hash_bucket_size=10"], "features.sequence[0].features[0].hash_bucket_size",
     "maps its values to ids otherwise"),
    (['features.sequence[0].query=["adgroup_id"]'], "features.sequence[0].query", "one query feature per sequence"),
    (['features.sequence[0].query=["adgroup_id", "nope"]'], "features.sequence[0].query", "'nope' is not a"),
    (['features.sequence[0].query=["adgroup_id", "user"]'], "features.sequence[0].query", "embedding_dim 4 but"),
    (["features.sequence[0].max_len=0"], "features.sequence[0].max_len", "at least 1"),
    (['features.sequence[0].features[1].name="user"'], "features.sequence[0].features[1].name", "already the name"),
    (['features.sequence[0].features[1].table="own"', "features.sequence[0].features[1].embedding_dim=6",
      "features.sequence[0].query=[]"], "features.sequence[0].features[1].embedding_dim", "multiple of 4"),
    (['features.sparse[0].weight_column="w"'], "features.sparse[0].weight_column", "unpooled lookups take no weights"),
])
def test_sequence_problems_name_their_toml_path(tzrun_pm, overrides, path, match):
    with pytest.raises(ConfigError) as info:
        _config(tzrun_pm, *overrides)
    problems = info.value.problems
    assert [p.path for p in problems] == [path], problems  # one problem, one line, at its path
    assert match in problems[0].message and "\n" not in problems[0].message


def test_a_sequence_s_own_optimizer_is_a_component(tzrun_pm):
    own = ('features.sequence[0].features[1].table="own"', "features.sequence[0].query=[]")
    cfg = _config(tzrun_pm, *own, 'features.sequence[0].features[1].sparse_optimizer={type = "adagrad", lr = 0.5}')
    assert cfg.features.sequence[0].features[1].sparse_optimizer.config.lr == 0.5
    with pytest.raises(ConfigError, match=r"features\.sequence\[0\]\.features\[1\]\.sparse_optimizer\.type"):
        _config(tzrun_pm, *own, 'features.sequence[0].features[1].sparse_optimizer={type = "adagard"}')


def test_sequences_keep_their_last_ids_and_shared_tables_go_to_batch_sequence(tzrun_pm):
    cfg = _config(tzrun_pm)
    batch = _builder(cfg)(_table(), "t.parquet")
    assert batch.sparse.keys() == ["user"]
    seq = batch.sequence.to_dict()
    assert batch.sequence.keys() == ["click_seq__adgroup_id", "click_seq__cate_id", "adgroup_id", "cate_id"]
    # the end of a list is the most recent: a row of 5 keeps its last 3; empty and null rows have none
    assert seq["click_seq__adgroup_id"].lengths().tolist() == [3, 0, 0, 2]
    assert seq["click_seq__adgroup_id"].values().tolist() == [3, 4, 5, 7, 8]
    hashed = {s: feature_specs(cfg.features).sparse[1] for s in "xyz"}
    from tzrun.data.hashing import hash_to_buckets

    buckets = dict(zip("xyz", hash_to_buckets(pa.array(list("xyz")), hashed["x"].hash_bucket_size).tolist()))
    assert seq["click_seq__cate_id"].lengths().tolist() == [3, 0, 0, 2]  # "z;;x": the empty piece is no id
    assert seq["click_seq__cate_id"].values().tolist() == [buckets[c] for c in "zxyzx"]
    assert seq["adgroup_id"].values().tolist() == [1, 2, 3, 4]
    assert seq["cate_id"].lengths().tolist() == [1, 1, 0, 1]
    padding = _builder(cfg).padding()
    assert padding.sequence.keys() == batch.sequence.keys() and padding.sequence.stride() == 1


def test_a_run_without_sequences_has_an_empty_sequence_batch(tzrun_pm):
    text = CONFIG.split("[[features.sequence]]")[0]
    batch = _builder(_config(tzrun_pm, text=text))(_table(), "t.parquet")
    assert batch.sequence.keys() == [] and batch.sequence.stride() == 4
    assert batch.sparse.keys() == ["adgroup_id", "cate_id", "user"]


MISALIGNED = {"seq_cate": pa.array(["x;y;z;x;y", "", None, "z"])}  # row 3: 1 id against 2


def test_misaligned_sequences_are_a_bad_row_naming_both_columns(tzrun_pm):
    with pytest.raises(BadRowError, match=r"t\.parquet: column 'seq_cate' \(sequence 'click_seq__cate_id' of group "
                                          r"'click_seq'\) has 1 id\(s\) where column 'seq_ad' has 2") as info:
        _builder(_config(tzrun_pm))(_table(**MISALIGNED), "t.parquet")
    assert info.value.batch_row == 3 and 'on_bad_row = "skip"' in str(info.value)


def test_misaligned_sequences_are_skipped_and_counted(tzrun_pm):
    batch = _builder(_config(tzrun_pm), "skip")(_table(**MISALIGNED), "t.parquet")
    assert batch.skipped == SkippedRows(1, {"click_seq: sequences of different lengths": 1})
    assert batch.num_rows == 3 and batch.sequence.stride() == 3
    seq = batch.sequence.to_dict()
    assert seq["click_seq__adgroup_id"].lengths().tolist() == [3, 0, 0]
    assert seq["adgroup_id"].values().tolist() == [1, 2, 3]


def test_a_misaligned_row_in_a_file_is_named_by_file_and_row(tzrun_pm, tmp_path: Path):
    table = _table(**MISALIGNED)
    pq.write_table(table, tmp_path / "part-0.parquet")
    columns = feature_specs(_config(tzrun_pm).features).columns(["label"], None)
    rank_input = RankInput(ParquetReader(ParquetConfig()), str(tmp_path), 4, 0, columns, _builder(_config(tzrun_pm)), 0, 1)
    with pytest.raises(DataError, match=r"part-0\.parquet: row 3 \(counting from 0\): column 'seq_cate' \(sequence"):
        list(rank_input.one_pass())
    skipping = RankInput(ParquetReader(ParquetConfig()), str(tmp_path), 4, 0, columns,
                         _builder(_config(tzrun_pm), "skip"), 0, 1)
    total = SkippedRows()
    assert sum(b.num_rows for b in tally_skipped(skipping.one_pass(), total)) == 3
    assert total == SkippedRows(1, {"click_seq: sequences of different lengths": 1})


def _filled(module: SequenceEmbeddings) -> dict[str, torch.Tensor]:
    """Give every table row ``r`` of table ``t`` the values ``100 * t + r + [0, 0.1, 0.2, ...]``."""
    tables = {}
    for collection in module.collections.values():
        for name, emb in collection.embeddings.items():
            rows, dim = emb.weight.shape
            t = len(tables) + 1
            with torch.no_grad():
                emb.weight.copy_(100 * t + torch.arange(rows).unsqueeze(1) + 0.1 * torch.arange(dim).unsqueeze(0))
            tables[name] = emb.weight.detach().clone()
    return tables


def test_lookups_equal_a_hand_computation(tzrun_pm):
    cfg = _config(tzrun_pm)
    specs = feature_specs(cfg.features)
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), ("label",),
                       specs.sequence_groups, specs.sequence_tables)
    module = SequenceEmbeddings(ctx)
    assert sorted(module.collections) == ["dim_4", "dim_8"]  # TorchRec wants one width per collection
    tables = _filled(module)
    batch = _builder(cfg)(_table(), "t.parquet")
    out = module(batch)
    seq, mask = out.sequence("click_seq")
    assert seq.shape == (4, 3, 12) and mask.tolist() == [[True] * 3, [False] * 3, [False] * 3, [True, True, False]]
    ids = batch.sequence.to_dict()
    ad, cate = ids["click_seq__adgroup_id"].values().tolist(), ids["click_seq__cate_id"].values().tolist()
    expected = torch.zeros(4, 3, 12)
    for row, start, n in ((0, 0, 3), (3, 3, 2)):
        for k in range(n):
            expected[row, k] = torch.cat([tables["adgroup"][ad[start + k]], tables["cate_id_emb"][cate[start + k]]])
    assert torch.equal(seq, expected)
    # the query: the candidate's own ids in the shared tables, concatenated; a row without an id is zeros
    cand_cate = ids["cate_id"].values().tolist()
    q = out.query("click_seq")
    assert q.shape == (4, 12)
    assert torch.equal(q[0], torch.cat([tables["adgroup"][1], tables["cate_id_emb"][cand_cate[0]]]))
    assert torch.equal(q[2], torch.cat([tables["adgroup"][3], torch.zeros(8)]))
    assert torch.equal(out.pooled("adgroup_id"), tables["adgroup"][[1, 2, 3, 4]])
    with pytest.raises(KeyError, match="not a sparse feature looked up unpooled"):
        out.pooled("user")
    with pytest.raises(KeyError, match="not a sequence group"):
        out.sequence("nope")


def test_padded_sequences_take_gradients_only_at_real_ids(tzrun_pm):
    cfg = _config(tzrun_pm)
    specs = feature_specs(cfg.features)
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), ("label",),
                       specs.sequence_groups, specs.sequence_tables)
    module = SequenceEmbeddings(ctx)
    batch = _builder(cfg)(_table(), "t.parquet")
    seq, _ = module(batch).sequence("click_seq")
    seq.sum().backward()
    grad = module.collections["dim_4"].embeddings["adgroup"].weight.grad
    counts = np.bincount([3, 4, 5, 7, 8], minlength=10)
    assert grad[:, 0].tolist() == counts.astype(float).tolist()


def test_check_reads_the_sequence_columns_types(tzrun_pm, tmp_path: Path):
    from tzrun.data.input_check import check_inputs, column_uses

    cfg = _config(tzrun_pm, text=CONFIG.replace('separator = ";"\n', ""))
    specs = feature_specs(cfg.features)
    uses = {u.what: u for u in column_uses(specs, cfg.data, (), ())}
    use = uses["sequence 'click_seq__adgroup_id' of group 'click_seq' (num_buckets)"]
    assert (use.column, use.lists, use.accepts) == ("seq_ad", True, frozenset({"int"}))
    pq.write_table(_table(seq_ad=pa.array([[1.5], [], None, [2.0]], pa.list_(pa.float64()))), tmp_path / "part-0.parquet")
    reader = ParquetReader(ParquetConfig())
    report = check_inputs(reader, {"data.train_input": str(tmp_path)}, specs.columns(["label"], None), list(uses.values()))
    assert any("seq_ad" in p and "click_seq__adgroup_id" in p for p in report.problems), report.problems


def test_an_unpooled_feature_is_pooled_as_configured(tzrun_pm):
    cfg = _config(tzrun_pm, 'features.sparse[1].pooling="mean"')
    specs = feature_specs(cfg.features)
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), ("label",),
                       specs.sequence_groups, specs.sequence_tables)
    module = SequenceEmbeddings(ctx)
    tables = _filled(module)
    table = _table().set_column(1, "cate_id", pa.array([["a", "b"], ["b"], None, []]))
    batch = _builder(cfg)(table, "t.parquet")
    ids = batch.sequence.to_dict()["cate_id"].values().tolist()
    pooled = module(batch).pooled("cate_id")
    emb = tables["cate_id_emb"]
    assert torch.allclose(pooled[0], (emb[ids[0]] + emb[ids[1]]) / 2) and torch.equal(pooled[1], emb[ids[2]])
    assert torch.equal(pooled[2:], torch.zeros(2, 8))  # no id: zeros, not NaN
