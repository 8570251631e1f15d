"""A ``zch`` checkpoint loaded into more ranks than wrote it (1 -> 2, 2 -> 4): each held id goes
to the slice the row-wise lookup routes it to (``raw_id // ceil((2**63 - 1) / ranks)``), at a
row of that slice, with its weights and optimizer state; a slice that cannot hold all its ids
keeps those its eviction policy values most; the miss row keeps the old slice's. The table is
read under the checkpoint name it is given (``--init-from``'s renames)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.plugins.test_zch import managed, sharded, step
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries

EMPTY = 2**63 - 1
HALF = (EMPTY + 1) // 2  # the first raw id of slice 1 of 2


def _place(raw: list[int], rows: list[int], counts: list[int], rank: int, world_size: int, written_by: int = 1):
    from tzrun.runner.zch_reshard import place_slice

    counts_ = torch.tensor(counts, dtype=torch.int64)
    return place_slice(torch.tensor(raw, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64), {"counts": counts_},
                       counts_.double(), rank=rank, world_size=world_size, written_by=written_by)


def test_each_held_id_goes_to_the_slice_that_looks_it_up_with_its_old_row_as_source():
    # one slice of 8 rows: ids at rows 5, 0, 6, 2; row 7 the miss row
    raw, rows, counts = [3, 9, HALF + 1, HALF + 4, EMPTY, EMPTY, EMPTY, EMPTY], [5, 0, 6, 2, 1, 3, 4, 7], [4, 1, 2, 7, 0, 0, 0, 0]
    low, high = _place(raw, rows, counts, 0, 2), _place(raw, rows, counts, 1, 2)
    assert low.raw_ids.tolist() == [3, 9, EMPTY, EMPTY] and high.raw_ids.tolist() == [HALF + 1, HALF + 4, EMPTY, EMPTY]
    assert low.rows.tolist() == [0, 1, 2, 3] and high.rows.tolist() == [4, 5, 6, 7]  # each its own slice's rows
    assert low.sources.tolist() == [5, 0, -1, 7] and high.sources.tolist() == [6, 2, -1, 7]  # the miss row: the old one
    assert low.metadata["counts"].tolist() == [4, 1, 0, 0] and high.metadata["counts"].tolist() == [2, 7, 0, 0]
    assert low.dropped == high.dropped == 0


def test_a_slice_given_more_ids_than_rows_keeps_those_its_policy_values_most():
    raw, rows, counts = [1, 2, 3, 4, 5, HALF, EMPTY, EMPTY], [0, 1, 2, 3, 4, 5, 6, 7], [5, 9, 1, 9, 3, 1, 0, 0]
    low = _place(raw, rows, counts, 0, 2)  # 5 ids for 3 rows (one of 4 is the miss row)
    assert low.raw_ids.tolist() == [1, 2, 4, EMPTY] and low.sources.tolist() == [0, 1, 3, 7] and low.dropped == 2
    tie = _place([1, 2, 3, 4, EMPTY, EMPTY, EMPTY, EMPTY], list(range(8)), [2, 2, 2, 2, 0, 0, 0, 0], 0, 2)
    assert tie.raw_ids.tolist() == [1, 2, 3, EMPTY]  # equal scores: the lower raw ids


def test_two_to_four_takes_each_new_slices_ids_and_miss_row_from_the_old_slice_that_held_them():
    quarter = (EMPTY + 3) // 4
    # two old slices of 4 rows: slice 0 (rows 0-3) holds 1 and quarter + 1, slice 1 (rows 4-7) holds HALF + 2
    raw, rows = [1, quarter + 1, EMPTY, EMPTY, HALF + 2, EMPTY, EMPTY, EMPTY], [2, 0, 1, 3, 6, 4, 5, 7]
    slices = [_place(raw, rows, [1] * 8, r, 4, written_by=2) for r in range(4)]
    assert [s.raw_ids[0].item() for s in slices] == [1, quarter + 1, HALF + 2, EMPTY]
    assert [s.sources.tolist() for s in slices] == [[2, 3], [0, 3], [6, 7], [-1, 7]]  # miss rows: old 3, 3, 7, 7


def test_the_policy_keeps_the_ids_it_would_keep_at_an_eviction():
    from torchrec.modules.mc_modules import DistanceLFU_EvictionPolicy, LFU_EvictionPolicy, LRU_EvictionPolicy

    from tzrun.runner.zch_reshard import keep_scores

    counts, last = torch.tensor([8, 2, 4]), torch.tensor([1, 10, 9])
    assert keep_scores(LFU_EvictionPolicy(), {"counts": counts}, 10).argsort(descending=True).tolist() == [0, 2, 1]
    assert keep_scores(LRU_EvictionPolicy(), {"last_access_iter": last}, 10).argsort(descending=True).tolist() == [1, 2, 0]
    distance = keep_scores(DistanceLFU_EvictionPolicy(decay_exponent=1.0), {"counts": counts, "last_access_iter": last}, 10)
    assert distance.tolist() == [8 / 10, 2 / 1, 4 / 2]


@pytest.fixture(scope="module")
def one_rank_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny zch table (8 rows, lfu, row-wise adagrad) trained on one rank and checkpointed:
    it holds 1, 2, 3 and 4 (routed to slice 0 of 2, one more than its 3 rows for ids; 4 the
    least looked up) and HALF + 1, HALF + 2 (slice 1)."""
    from tzrun.runner.checkpoint import save_checkpoint
    from tzrun.runner.distributed import init_distributed, shutdown_distributed

    created = not dist.is_initialized()
    init_distributed()
    try:
        model = sharded(collect_registries(make_plugin_manager()), size=8, interval=2)
        for _ in range(4):
            step(model, [1, 1, 1, 2, 2, 3, 3, 4, HALF + 1, HALF + 2, HALF + 2])
        model_dir = tmp_path_factory.mktemp("zch_one_rank")
        return save_checkpoint(model_dir, 4, state={"model": model, "optimizer": model.fused_optimizer},
                               meta={"step": 4, "world_size": 1}, rank=0)
    finally:
        if created:
            shutdown_distributed()


def _held_rows(checkpoint: Path) -> dict[int, tuple[torch.Tensor, float]]:
    """Each id the checkpoint's table holds: its weights and row-wise adagrad accumulator."""
    import tzrun

    view = tzrun.find_checkpoint(checkpoint.parent.parent, checkpoint.name)
    shapes, dtypes = view.tensor_shapes(), view.tensor_dtypes()
    state = {k: torch.empty(shape, dtype=dtypes[k]) for k, shape in shapes.items() if "user_emb" in k}
    view.load_state(state)
    get = lambda suffix: next(v for k, v in state.items() if k.endswith(suffix))  # noqa: E731
    raw, rows = get("_mch_sorted_raw_ids"), get("_mch_remapped_ids_mapping")
    weight, accumulator = get("user_emb.weight"), get("momentum1")
    held = {int(i): (weight[r].clone(), float(accumulator[r])) for i, r in zip(raw, rows) if i < EMPTY}
    held[EMPTY] = (weight[7].clone(), float(accumulator[7]))  # the miss row
    return held


def _slice_rows(model: Any, rank: int) -> dict[int, tuple[torch.Tensor, float]]:
    """Each id this rank's slice of 2 holds (and ``EMPTY``: its miss row): its weights and
    row-wise adagrad accumulator."""
    sharded_ = managed(model)
    mch = sharded_._managed_collision_collection._managed_collision_modules["user_emb"]
    tbe, logical = sharded_._table_to_tbe_and_index["user_emb"]
    weight = sharded_._embedding_module.embeddings.get_parameter("user_emb.weight")
    accumulator = tbe.split_optimizer_states()[int(logical[0])][0]
    rows = {int(i): int(r) - 4 * rank for i, r in zip(mch._mch_sorted_raw_ids, mch._mch_remapped_ids_mapping)}
    held = {i: (weight[r].detach().clone(), float(accumulator[r])) for i, r in rows.items() if i < EMPTY}
    held[EMPTY] = (weight[3].detach().clone(), float(accumulator[3]))  # this slice's miss row
    return held


def _resharded_worker(rank: int, init_file: str, checkpoint: str, out_dir: str) -> None:
    from tzrun.runner.checkpoint import load_checkpoint
    from tzrun.runner.zch_reshard import ZchGrowth

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = sharded(collect_registries(make_plugin_manager()), size=8, interval=2, world_size=2)
        growth = ZchGrowth(model, model.fused_optimizer, written_by=1, rank=rank, world_size=2)
        load_checkpoint(Path(checkpoint), {"model": growth.model_state(), "optimizer": model.fused_optimizer})
        dropped = growth.place(Path(checkpoint), verify_reads=True)
        torch.save({"held": _slice_rows(model, rank), "dropped": dropped["user_emb"]}, Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
def test_a_one_rank_checkpoint_loads_into_two_ranks_each_id_with_its_weights_and_optimizer_state(one_rank_checkpoint,
                                                                                                   tmp_path):
    from tests.warm_ranks import warm_spawn

    before = _held_rows(one_rank_checkpoint)
    assert set(before) == {1, 2, 3, 4, HALF + 1, HALF + 2, EMPTY} and all(a > 0 for _, a in before.values())
    warm_spawn(_resharded_worker, (str(tmp_path / "store"), str(one_rank_checkpoint), str(tmp_path)), timeout=240)
    low, high = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert set(low["held"]) == {1, 2, 3, EMPTY} and low["dropped"] == 1  # 4, the least looked up, does not fit
    assert set(high["held"]) == {HALF + 1, HALF + 2, EMPTY} and high["dropped"] == 0
    for after in (low["held"], high["held"]):
        for raw_id, (weights, accumulator) in after.items():
            assert torch.equal(weights, before[raw_id][0]), raw_id  # the miss row too: an unheld id reads the same
            assert accumulator == before[raw_id][1], raw_id


#: the one-rank checkpoint's table saved as ``old_emb`` (its rows, map and optimizer rows)
RENAMED = {"embeddings.user_emb.weight": "embeddings.old_emb.weight",
           "_managed_collision_modules.user_emb.": "_managed_collision_modules.old_emb."}


def _renamed(key: str) -> str:
    for old, new in RENAMED.items():
        key = key.replace(old, new)
    return key


def _renamed_worker(rank: int, init_file: str, checkpoint: str, out_dir: str) -> None:
    from tzrun.runner.zch_reshard import ZchGrowth

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = sharded(collect_registries(make_plugin_manager()), size=8, interval=2, world_size=2)
        keys = list(model.state_dict())
        without_rows = {k: k for k in keys if "weight" not in k}  # a table started fresh: left as it is
        assert ZchGrowth(model, model.fused_optimizer, 1, rank, 2, sources=without_rows).tables == []
        growth = ZchGrowth(model, model.fused_optimizer, 1, rank, 2, sources={k: _renamed(k) for k in keys})
        dropped = growth.place(Path(checkpoint), verify_reads=True)
        torch.save({"held": _slice_rows(model, rank), "dropped": dropped["user_emb"]}, Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
def test_growth_reads_each_table_under_the_checkpoint_name_it_is_given_and_leaves_a_table_without_one(
        one_rank_checkpoint, tmp_path):
    """--init-from's renames: the live table ``user_emb`` loads from the checkpoint's ``old_emb``."""
    from tests.checkpoint_entries import saved_tensors
    from tests.warm_ranks import warm_spawn
    from tzrun.runner.checkpoint import save_checkpoint
    from tzrun.runner.distributed import init_distributed, shutdown_distributed

    before = _held_rows(one_rank_checkpoint)
    renamed = {_renamed(k): v for k, v in saved_tensors(one_rank_checkpoint).items()}
    assert not any("user_emb.weight" in k or "modules.user_emb." in k for k in renamed)
    created = not dist.is_initialized()
    init_distributed()
    try:
        checkpoint = save_checkpoint(tmp_path / "renamed", 4, state=renamed, meta={"step": 4, "world_size": 1}, rank=0)
    finally:
        if created:
            shutdown_distributed()
    warm_spawn(_renamed_worker, (str(tmp_path / "store"), str(checkpoint), str(tmp_path)), timeout=240)
    low, high = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert set(low["held"]) == {1, 2, 3, EMPTY} and low["dropped"] == 1
    assert set(high["held"]) == {HALF + 1, HALF + 2, EMPTY}
    for after in (low["held"], high["held"]):
        for raw_id, (weights, accumulator) in after.items():
            assert torch.equal(weights, before[raw_id][0]) and accumulator == before[raw_id][1], raw_id
