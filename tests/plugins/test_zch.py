"""Collision-free ids through TorchRec's managed-collision modules, sharded on CPU in this
process: evictions run every ``eviction_interval`` steps, and an id evicted and seen again
gets a fresh row (initial weights, optimizer state zeroed) while its old row's training is gone."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.testing import load_config_text

CONFIG = """
model_dir = "runs/x"

[data]
train_input = "data/train"

[[features.sparse]]
name = "user"
embedding_dim = 4
zch = {{ size = {size}, eviction_interval = {interval}{more} }}

[model]
type = "deepfm"

[[losses]]
type = "binary_cross_entropy"

[train]
num_steps = 10
sparse_optimizer = {{ type = "rowwise_adagrad", lr = 0.5 }}
dense_optimizer = {{ type = "adam", lr = 0.001 }}
"""

#: the value every fresh row starts from (the table's initializer, as TorchRec resets it)
FRESH = 0.25


@pytest.fixture(scope="module", autouse=True)
def process_group():
    """A one-process gloo group (TorchRec's sharding needs one); left alone if one exists."""
    from tzrun.runner.distributed import init_distributed, shutdown_distributed

    created = not dist.is_initialized()
    init_distributed()
    yield
    if created:
        shutdown_distributed()


@pytest.fixture(scope="module")
def registries():
    return collect_registries(make_plugin_manager())


class Bags(torch.nn.Module):
    """A model's bag collection of the table ``user_emb`` (feature ``user``)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

        config = EmbeddingBagConfig(name="user_emb", num_embeddings=size, embedding_dim=4, feature_names=["user"],
                                    init_fn=lambda t: torch.nn.init.constant_(t, FRESH))
        self.bags = EmbeddingBagCollection(tables=[config], device=torch.device("meta"))

    def forward(self, kjt: Any) -> Any:
        return self.bags(kjt)


def sharded(registries: Any, size: int, interval: int, more: str = "", world_size: int = 1) -> Any:
    """``Bags`` with the run's zch swap, row-wise adagrad fused, sharded as a run shards it
    over ``world_size`` ranks (the default process group's)."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from tzrun.runner.model import embedding_modules, embedding_tables
    from tzrun.runner.sharding import fused_constraints
    from tzrun.runner.zch import swap_managed_collisions, zch_table_names
    from tzrun.runner.zch_sharding import with_zch_sharder

    cfg, _ = load_config_text(CONFIG.format(size=size, interval=interval, more=more))
    model = Bags(size)
    assert swap_managed_collisions(model, cfg, registries, world_size=world_size) == 1
    modules = embedding_modules(model)
    assert zch_table_names(list(model.modules())) == {"user_emb"}
    for module in modules:
        for _, weight in embedding_tables(module):
            apply_optimizer_in_backward(RowWiseAdagrad, [weight], {"lr": 0.5})
    constraints = fused_constraints(modules)
    for c in constraints.values():
        c.sharding_types = ["row_wise"]
    sharders = with_zch_sharder(get_default_sharders())
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"), constraints=constraints)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    return DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
                                    plan=plan, sharders=sharders, device=torch.device("cpu"))


def step(model: Any, ids: list[int], backward: bool = True) -> None:
    from torchrec import KeyedJaggedTensor

    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["user"], values=torch.tensor(ids, dtype=torch.int64),
                                              lengths=torch.ones(len(ids), dtype=torch.int32))
    pooled = model(kjt)
    if backward:
        (pooled.values() * torch.arange(1, 5, dtype=torch.float32)).sum().backward()


def managed(model: Any) -> Any:
    """The sharded managed-collision collection."""
    return model.module.bags.managed


def row_of(model: Any, raw_id: int) -> int | None:
    """The row ``raw_id`` holds (None: it reads the miss row)."""
    mch = managed(model)._managed_collision_collection._managed_collision_modules["user_emb"]
    hit = (mch._mch_sorted_raw_ids == raw_id).nonzero()
    return None if hit.numel() == 0 else int(mch._mch_remapped_ids_mapping[hit[0, 0]])


def row_state(model: Any, row: int) -> tuple[torch.Tensor, float]:
    """``(weights, row-wise adagrad accumulator)`` of one row."""
    sharded = managed(model)
    tbe, logical = sharded._table_to_tbe_and_index["user_emb"]
    weight = sharded._embedding_module.embeddings.get_parameter("user_emb.weight")
    return weight[row].detach().clone(), float(tbe.split_optimizer_states()[int(logical[0])][0][row])


def test_evictions_run_every_eviction_interval_steps(registries):
    model = sharded(registries, size=16, interval=3)
    counts = []
    for i in range(10):
        step(model, [i, i + 100, 7])
        counts.append(managed(model).evictions.get("user_emb", 0))
    assert counts == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]


def test_an_id_evicted_and_seen_again_gets_a_fresh_row(registries):
    model = sharded(registries, size=4, interval=2, more=', eviction_policy = { type = "lru" }')  # 3 rows for ids, one miss
    a, others = 11, [21, 22, 23]
    for _ in range(4):
        step(model, [a, a, 21])
    old = row_of(model, a)
    assert old is not None
    weights, accumulator = row_state(model, old)
    assert accumulator > 0 and not torch.allclose(weights, torch.full((4,), FRESH))  # trained
    for _ in range(6):
        step(model, others * 3)  # a is the least recently seen
    assert row_of(model, a) is None  # evicted: a reads the miss row
    for _ in range(5):  # a comes back, the most recent id now
        step(model, [a] * 3, backward=False)
        if row_of(model, a) is not None:
            break
    new = row_of(model, a)
    assert new is not None
    weights, accumulator = row_state(model, new)
    assert accumulator == 0.0 and torch.equal(weights, torch.full((4,), FRESH))  # not its old row's training


def test_an_admission_threshold_keeps_rare_ids_out(registries):
    from tzrun.runner.zch import zch_counters

    model = sharded(registries, size=16, interval=2, more=', admission = { type = "threshold", min_count = 3 }')
    for _ in range(2):
        step(model, [1, 1, 2, 5])  # over the window: 1 four times, 2 and 5 twice
    assert row_of(model, 1) is not None
    assert row_of(model, 2) is None and row_of(model, 5) is None
    counts = zch_counters(model)["user_emb"]
    assert counts["admitted"] == 1 < 3 == len({1, 2, 5})  # of the window's 3 new ids, 1 had room and enough lookups


def test_the_counters_of_a_window_are_its_lookups_misses_admissions_evictions_and_rows_in_use(registries):
    from tzrun.runner.zch import zch_counters

    model = sharded(registries, size=4, interval=2)  # 3 rows for ids, one miss row
    step(model, [1, 2, 1])  # before the first eviction: every id reads the miss row
    step(model, [1, 2, 9])  # the eviction at this step gives 1, 2 and 9 a row each, into empty rows
    counts = zch_counters(model)["user_emb"]
    assert counts == {"ids_seen": 6, "misses": 3, "miss_share": 0.5, "admitted": 3, "evicted": 0, "rows_in_use": 3,
                      "occupancy": 0.75}
    assert counts["admitted"] == managed(model).evicted_rows["user_emb"]  # the rows reset for new ids
    step(model, [1, 5, 6])
    assert zch_counters(model)["user_emb"] == {"ids_seen": 3, "misses": 2, "miss_share": 2 / 3, "admitted": 0,
                                               "evicted": 0, "rows_in_use": 3, "occupancy": 0.75}  # a new window
    step(model, [5, 6, 5, 6])  # lfu: 5 and 6 (3 lookups each) push out 2 (2) and 9 (1); 1 (4) stays
    counts = zch_counters(model)["user_emb"]
    assert (counts["admitted"], counts["evicted"], counts["rows_in_use"]) == (2, 2, 3)
    assert row_of(model, 1) is not None and row_of(model, 2) is None and row_of(model, 9) is None
    model.eval()
    step(model, [7, 8], backward=False)
    assert zch_counters(model)["user_emb"]["ids_seen"] == 0  # evaluation is not counted


def _window(history: list[int], size: int = 8) -> dict[str, Any]:
    ids = torch.tensor(history, dtype=torch.int64)
    return {"buffer_size": size, "last_eviction_iter": 4, "current_iter": 5, "history": ids,
            "metadata": {"last_access_iter": torch.full_like(ids, 5)}}


def test_the_ids_seen_since_the_last_eviction_go_to_the_rank_whose_slice_holds_them_now():
    from tzrun.runner.zch import reshard_zch_windows

    upper = 2**62 + 3  # in the upper half of the raw ids: rank 1's slice of 2
    two = [{"m": _window([3, 5, 3])}, {"m": _window([upper, upper + 1])}]
    merged = reshard_zch_windows(two, rank=0, world_size=1)["m"]
    assert merged["history"].tolist() == [3, 5, 3, upper, upper + 1] and merged["buffer_size"] == 16
    assert merged["metadata"]["last_access_iter"].tolist() == [5] * 5
    assert (merged["last_eviction_iter"], merged["current_iter"]) == (4, 5)  # the next eviction at the same step
    one = [{"m": _window([3, upper, 5])}]
    assert reshard_zch_windows(one, rank=0, world_size=2)["m"]["history"].tolist() == [3, 5]
    assert reshard_zch_windows(one, rank=1, world_size=2)["m"]["history"].tolist() == [upper]


def test_a_zch_checkpoint_is_split_by_raw_id_only_when_it_loads_into_more_ranks(registries):
    from tzrun.runner.zch_reshard import grows_zch_slices

    model = sharded(registries, size=4, interval=2)
    assert not grows_zch_slices(model, 2, 1) and not grows_zch_slices(model, 4, 2)  # whole old slices: by position
    assert not grows_zch_slices(model, 1, 1)
    assert grows_zch_slices(model, 1, 2) and grows_zch_slices(model, 2, 4)
    assert not grows_zch_slices(torch.nn.Linear(2, 2), 1, 2)  # without zch, DCP reshards as any table


def _held_bytes(model: Any) -> int:
    """Bytes of everything the table's managed-collision slice holds: its buffers and the
    window of ids (``_history_accumulator``, a plain attribute once the first step ran)."""
    mch = managed(model)._managed_collision_collection._managed_collision_modules["user_emb"]
    held = sum(b.numel() * b.element_size() for b in mch.buffers())
    window = getattr(mch, "_history_accumulator", None)
    return held + (window.numel() * window.element_size() if window is not None else 0)


@pytest.mark.parametrize("policy", ["lfu", "lru", "distance_lfu"])
def test_plan_and_check_count_the_managed_state_a_trained_zch_table_holds(registries, tmp_path, capsys, policy):
    import json

    from tzrun.cli.main import main
    from tzrun.runner.host_memory import table_bytes
    from tzrun.runner.model import embedding_modules
    from tzrun.runner.zch import swap_managed_collisions
    from tzrun.runner.zch_memory import managed_states

    more = f', eviction_policy = {{ type = "{policy}" }}'
    config = tmp_path / "zch.toml"
    config.write_text(CONFIG.format(size=16, interval=3, more=more))
    assert main(["plan", str(config), "--world-size", "1", "--device", "cpu", "--batch-size", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    tables = {t["table"]: t for t in report["tables"]}
    model = sharded(registries, size=16, interval=3, more=more)
    built = _held_bytes(model)
    assert managed_states(model)["user_emb"].slice_bytes(16) == built  # before the first step: no window yet
    step(model, [1, 2, 3, 4])  # a batch of 4 rows, one id each, as the plan assumes: TorchRec sizes the window from it
    assert built < _held_bytes(model) == tables["user_emb"]["managed"] == tables["user_emb"]["shards"][0]["managed"]
    assert report["ranks"][0]["ddr"]["managed"] == tables["user_emb"]["managed"] + tables["user_emb_wide"]["managed"]
    hashed = tmp_path / "hashed.toml"
    hashed.write_text(config.read_text().replace(f"zch = {{ size = 16, eviction_interval = 3{more} }}", "num_buckets = 16"))
    assert main(["plan", str(hashed), "--world-size", "1", "--device", "cpu", "--batch-size", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dense"] == report["dense"]  # the dense part does not count the map again

    cfg, _ = load_config_text(CONFIG.format(size=16, interval=3, more=more))
    bags = Bags(16)
    swap_managed_collisions(bags, cfg, registries, world_size=1)
    plain, _, _ = table_bytes(embedding_modules(bags), {}, 1)
    counted, _, _ = table_bytes(embedding_modules(bags), {}, 1, managed=managed_states(bags), batch_size=4)
    assert counted - plain == _held_bytes(model)  # check's host-memory figure: the same bytes
