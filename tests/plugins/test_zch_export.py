"""What an export of a ``zch`` run carries: the checkpoint keys of the tables the run's swap
moved (checked against the swap itself), and the id-to-row map looked up as the sharded run
looked it up, the miss row of an id's own slice included."""

from __future__ import annotations

import torch

from tzrun.data.ids import ZCH_ID_SPACE
from tzrun.testing import load_config_text

CONFIG = """
model_dir = "runs/x"

[data]
train_input = "data/train"

[[features.sparse]]
name = "user"
embedding_dim = 4
zch = { size = 8 }

[[features.sparse]]
name = "item"
embedding_dim = 4
num_buckets = 10

[model]
type = "deepfm"

[[losses]]
type = "binary_cross_entropy"

[train]
num_steps = 10
sparse_optimizer = { type = "rowwise_adagrad", lr = 0.5 }
dense_optimizer = { type = "adam", lr = 0.001 }
"""


class TwoTables(torch.nn.Module):
    """A model's bag collection of a zch table and a plain one."""

    def __init__(self) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

        tables = [EmbeddingBagConfig(name="user_emb", num_embeddings=8, embedding_dim=4, feature_names=["user"]),
                  EmbeddingBagConfig(name="item_emb", num_embeddings=10, embedding_dim=4, feature_names=["item"])]
        self.bags = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.head = torch.nn.Linear(8, 1, device=torch.device("meta"))


def test_the_keys_of_a_swapped_collection_are_those_the_swap_makes(tzrun_pm):
    from tzrun.runner.zch import swap_managed_collisions
    from tzrun.runner.zch_layout import managed_tables, swapped_keys

    cfg, registries = load_config_text(CONFIG, tzrun_pm)
    model = TwoTables()
    keys = swapped_keys(model, cfg)
    tables = managed_tables(model, cfg)
    assert swap_managed_collisions(model, cfg, registries, world_size=2) == 1
    swapped = set(model.state_dict())
    assert set(keys.values()) <= swapped
    assert keys["head.weight"] == "head.weight"  # nothing else moved
    assert [(t.collection, t.table, t.features) for t in tables] == [("bags", "user_emb", ("user",))]
    assert {tables[0].raw_ids_key, tables[0].rows_key} <= swapped


def test_init_from_finds_each_table_on_the_other_side_of_the_swap(tzrun_pm):
    from tzrun.runner.zch import swap_managed_collisions
    from tzrun.runner.zch_layout import moved_plain_name, zch_state_tables

    cfg, registries = load_config_text(CONFIG, tzrun_pm)
    model = TwoTables()
    unswapped = set(model.state_dict())
    swap_managed_collisions(model, cfg, registries, world_size=1)
    swapped = set(model.state_dict())
    assert moved_plain_name("bags.plain.embedding_bags.item_emb.weight") == "bags.embedding_bags.item_emb.weight"
    assert moved_plain_name("bags.embedding_bags.item_emb.weight") == "bags.plain.embedding_bags.item_emb.weight"
    assert {moved_plain_name(k) for k in swapped if "item_emb" in k} <= unswapped  # the plain table, both ways
    assert moved_plain_name("head.weight") is None
    assert moved_plain_name("bags.managed._embedding_module.embeddings.user_emb.weight") is None
    [table] = zch_state_tables(swapped)
    assert table.table == "user_emb" and table.weight in swapped
    assert {k for k in swapped if table.holds(k)} == {k for k in swapped if "user_emb" in k}  # rows and map
    assert zch_state_tables(unswapped) == []


def _slices(rows: int, buckets: int) -> list:
    """A table's managed slices as the row-wise sharder rebuilds them, one per rank."""
    from torchrec.modules.mc_modules import LFU_EvictionPolicy, MCHManagedCollisionModule

    whole = MCHManagedCollisionModule(zch_size=rows, device=torch.device("cpu"), eviction_policy=LFU_EvictionPolicy(),
                                      eviction_interval=1, input_hash_size=ZCH_ID_SPACE, buckets=buckets)
    size = rows // buckets
    segments = [r * size for r in range(buckets)] + [rows]
    return [whole.rebuild_with_output_id_range((r * size, (r + 1) * size), segments, torch.device("cpu"))
            for r in range(buckets)]


def _jagged(ids: list[int]) -> dict:
    from torchrec.sparse.jagged_tensor import JaggedTensor

    return {"t": JaggedTensor(values=torch.tensor(ids, dtype=torch.int64), lengths=torch.ones(len(ids), dtype=torch.int64))}


def test_the_exported_map_reads_each_ids_row_and_its_own_slices_miss_row():
    from tzrun.runner.zch_layout import ZchRemap

    block = 2**62  # ceil((2**63 - 1) / 2): slice 1 holds the raw ids from here
    seen = [[3, 5, 9, 3], [block + 4, block + 7, block + 4]]
    slices = _slices(rows=8, buckets=2)
    for mc, ids in zip(slices, seen):
        mc.train()
        for _ in range(2):
            mc(_jagged(ids))
        mc.eval()
    queries = [3, 5, 9, 11, block + 4, block + 7, block + 8, 2**63 - 2]
    looked_up = []  # what each id's slice answers, as the sharded lookup routes it
    for q in queries:
        looked_up.append(int(slices[q // block].remap(_jagged([q]))["t"].values()[0]))
    remap = ZchRemap(torch.cat([mc._mch_sorted_raw_ids for mc in slices]),
                     torch.cat([mc._mch_remapped_ids_mapping for mc in slices]), buckets=2)
    assert remap(torch.tensor(queries)).tolist() == looked_up
    assert looked_up[3] == 3 and looked_up[6] == looked_up[7] == 7  # unseen: the last row of its own slice
    assert len(set(looked_up[:3] + looked_up[4:6])) == 5 and remap.held() == 5


def test_the_exported_map_of_one_rank_reads_the_tables_last_row_for_a_miss():
    from tzrun.runner.zch_layout import ZchRemap

    (mc,) = _slices(rows=4, buckets=1)
    mc.train()
    mc(_jagged([10, 20, 10]))
    mc.eval()
    remap = ZchRemap(mc._mch_sorted_raw_ids, mc._mch_remapped_ids_mapping, buckets=1)
    queries = torch.tensor([10, 20, 30, 2**62 + 1])
    assert remap(queries).tolist() == mc.remap(_jagged(queries.tolist()))["t"].values().tolist()
    assert remap(queries).tolist()[2:] == [3, 3]
