"""What the ``embedding_deltas`` stage counts as changed in a ``zch`` table, on a sharded
managed-collision table driven step by step in this process: an id evicted and admitted again
is a changed row (with the raw id it holds now), whatever row it gets, as is the row it left."""

from __future__ import annotations

import torch

from tests.plugins.test_zch import process_group, registries, row_of, sharded, step  # noqa: F401 - fixtures
from tzrun_serving.zch_deltas import ZchTracking


def _tracking(model) -> ZchTracking:
    tracking = ZchTracking()
    tables: list[str] = []

    def add(name: str) -> int:
        tables.append(name)
        return len(tables) - 1

    tracking.attach(model, lambda path, tail: f"{path}.{tail}".lstrip("."), add)
    return tracking


def _fold(tracking: ZchTracking) -> tuple[set[int], dict[int, int]]:
    """The rows changed since the last fold, and the raw id each holds now."""
    ((_, rows),) = tracking.fold(lambda mine: [mine])
    (pieces,) = tracking.map_pieces({0: rows}).values()
    held = {r: raw for p in pieces for r, raw in zip(p["rows"].tolist(), p["raw_ids"].tolist())}
    return set(rows.tolist()), held


def test_an_id_evicted_and_admitted_again_is_a_changed_row_with_its_raw_id(registries):
    model = sharded(registries, size=4, interval=2, more=', eviction_policy = { type = "lru" }')  # 3 rows, one miss
    a, others = 11, [21, 22, 23]
    for _ in range(4):
        step(model, [a, a, 21])
    tracking = _tracking(model)  # the last dump: a holds a row
    old = row_of(model, a)
    assert old is not None
    model.eval()
    step(model, [a], backward=False)  # evaluation changes nothing
    model.train()
    assert _fold(tracking) == (set(), {})
    for _ in range(6):
        step(model, others * 3)  # a, the least recently seen, is evicted
    assert row_of(model, a) is None
    for _ in range(5):
        step(model, [a] * 3, backward=False)
        if row_of(model, a) is not None:
            break
    new = row_of(model, a)
    assert new is not None  # admitted again, maybe in its old row
    rows, held = _fold(tracking)
    assert {old, new, 3} <= rows  # its old row, its new row and the miss row
    assert held[new] == a and all(held[r] == (raw or 2**63 - 1) for r in rows for raw in [_raw_of(model, r)])
    step(model, others)
    assert a not in _fold(tracking)[1].values()  # not looked up since: not changed again


def _raw_of(model, row: int) -> int | None:
    from tests.plugins.test_zch import managed

    mch = managed(model)._managed_collision_collection._managed_collision_modules["user_emb"]
    hit = (mch._mch_remapped_ids_mapping == row).nonzero()
    raw = int(mch._mch_sorted_raw_ids[hit[0, 0]])
    return None if raw == 2**63 - 1 else raw
