"""``tzrec-run tdm-retrieve``: beam search through a TDM tree, on trees where the answer is known
(a scorer whose node score is the best score of the leaves below it finds the exact top k; a beam
of 1 follows the greedy path), what it writes, and its errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.errors import DataError, TzrunError
from tzrun_tools.tdm_retrieve import NodeTree, TDMRetrieveOptions, beam_search, tdm_retrieve
from tzrun_tools.tdm_tree import TDMTreeOptions, build_tree


def _tree(n: int = 27, branching: int = 3) -> pa.Table:
    items = pa.table({"item": np.arange(1, n + 1), "cate": ["a"] * n, "brand": np.arange(1, n + 1) % 4})
    return build_tree(items, TDMTreeOptions(items="i", item_id="item", cate_id="cate", attr_fields=("brand",),
                                            branching=branching, out="o"))


def _leaves_below(nodes: pa.Table) -> dict[int, list[int]]:
    """Node id -> the item ids of the leaves below it (itself for a leaf)."""
    rows = nodes.to_pylist()
    below: dict[int, list[int]] = {r["item"]: [] for r in rows}
    parent = {r["item"]: r["parent"] for r in rows}
    for r in rows:
        if r["is_leaf"]:
            at = r["item"]
            while at is not None:
                below[at].append(r["item"])
                at = parent[at]
    return below


class HeapScorer:
    """Each user's random score per leaf; a node scores the best of its leaves (a max-heap tree,
    where beam search is exact). Reads the ``user`` and ``item`` columns only."""

    def __init__(self, nodes: pa.Table, users: int, seed: int = 0) -> None:
        self.below = _leaves_below(nodes)
        self.leaf_scores = np.random.default_rng(seed).random((users, max(self.below) + 1))
        self.calls: list[int] = []

    def __call__(self, rows: pa.Table) -> np.ndarray:
        self.calls.append(rows.num_rows)
        users, items = rows.column("user").to_pylist(), rows.column("item").to_pylist()
        return np.array([self.leaf_scores[u, self.below[i]].max() for u, i in zip(users, items)])

    def top(self, user: int, k: int) -> list[int]:
        leaves = [i for i, b in self.below.items() if b == [i]]
        return sorted(leaves, key=lambda i: (-self.leaf_scores[user, i], i))[:k]


def test_a_max_heap_scorer_finds_each_users_exact_top_k():
    nodes = _tree()
    users = pa.table({"user": [0, 1, 2, 3]})
    scorer = HeapScorer(nodes, users=4)
    found = beam_search(scorer, users, NodeTree(nodes, "item", "nodes"), top_k=4, beam=4)
    assert found.tolist() == [scorer.top(u, 4) for u in range(4)]
    # start at level 2 (9 nodes > beam 4), then 4 x 3 children on level 3: never every leaf
    assert scorer.calls == [4 * 9, 4 * 12]


def test_a_beam_of_one_follows_the_greedy_path():
    nodes = _tree()
    tree = NodeTree(nodes, "item", "nodes")
    rng = np.random.default_rng(3)
    noise = {i: rng.random() for i in nodes.column("item").to_pylist()}  # no heap: the path matters

    def score(rows: pa.Table) -> np.ndarray:
        return np.array([noise[i] for i in rows.column("item").to_pylist()])

    found = beam_search(score, pa.table({"user": [0]}), tree, top_k=3, beam=1, start_level=1)
    parent = dict(zip(nodes.column("item").to_pylist(), nodes.column("parent").to_pylist()))
    level = dict(zip(nodes.column("item").to_pylist(), nodes.column("tree_level").to_pylist()))
    best = max((i for i in noise if level[i] == 1), key=noise.get)
    while level[best] < 2:
        best = max((i for i in noise if parent[i] == best), key=noise.get)
    leaves = sorted((i for i in noise if parent[i] == best), key=lambda i: -noise[i])
    assert found.tolist() == [leaves]  # the 3 children of the greedy level-2 node, best first


def test_rows_that_reach_fewer_leaves_than_top_k_are_padded_and_nodes_columns_reach_the_scorer():
    nodes = _tree(n=8, branching=2)
    seen = []

    def score(rows: pa.Table) -> np.ndarray:
        seen.append(rows)
        return -rows.column("item").to_numpy().astype(float)  # lower ids first

    found = beam_search(score, pa.table({"user": [7, 8], "brand": [-1, -1]}), NodeTree(nodes, "item", "nodes"),
                        top_k=4, beam=1, start_level=1)
    first = seen[0].to_pydict()
    assert first["user"] == [7, 7, 8, 8] and first["brand"] != [-1] * 4  # the node's brand, the user's user
    assert found.shape == (2, 4) and (found[:, 2:] == -1).all() and (found[:, :2] > 0).all()


def test_the_command_writes_recall_ids_and_the_kept_columns_and_prints_recall(tmp_path, capsys):
    nodes = _tree()
    pq.write_table(nodes, tmp_path / "nodes.parquet")
    scorer = HeapScorer(nodes, users=3, seed=1)
    truth = [scorer.top(0, 1)[0], scorer.top(1, 5)[4], 999]  # the first, the fifth, none
    pq.write_table(pa.table({"user": [0, 1, 2], "item": truth, "uid": ["a", "b", "c"]}), tmp_path / "users.parquet")
    options = TDMRetrieveOptions(export="unused", tree=str(tmp_path / "nodes.parquet"), input=str(tmp_path / "users.parquet"),
                                 item_id="item", top_k=2, keep_column=("uid",), out=str(tmp_path / "recall.parquet"))
    assert tdm_retrieve(options, score=scorer) == 0
    written = pq.read_table(tmp_path / "recall.parquet").to_pydict()
    assert written == {"uid": ["a", "b", "c"], "recall_ids": [scorer.top(u, 2) for u in range(3)]}
    assert "recall@2 of the input's item: 0.3333" in capsys.readouterr().out
    with pytest.raises(TzrunError, match="recall.parquet: exists; tdm-retrieve writes a new file"):
        tdm_retrieve(options, score=scorer)


def test_a_bad_tree_or_option_is_named(tmp_path):
    nodes = _tree()
    with pytest.raises(DataError, match="nodes: no column 'adgroup_id' in the tree .*fix --item-id"):
        NodeTree(nodes, "adgroup_id", "nodes")
    with pytest.raises(DataError, match="a node's parent is not a node of the tree"):
        NodeTree(nodes.filter(pa.compute.not_equal(nodes.column("tree_level"), 1)), "item", "nodes")
    pq.write_table(nodes, tmp_path / "nodes.parquet")
    pq.write_table(pa.table({"user": [0]}), tmp_path / "users.parquet")
    base = dict(export="unused", tree=str(tmp_path / "nodes.parquet"), input=str(tmp_path / "users.parquet"),
                item_id="item", out=str(tmp_path / "out.parquet"))
    with pytest.raises(DataError, match="no column 'uid' \\(--keep-column\\) in the input"):
        tdm_retrieve(TDMRetrieveOptions(**base, keep_column=("uid",)), score=HeapScorer(nodes, 1))
    with pytest.raises(TzrunError, match="--start-level 9: the tree has levels 0 to 3"):
        tdm_retrieve(TDMRetrieveOptions(**base, start_level=9), score=HeapScorer(nodes, 1))
    with pytest.raises(ValueError, match="must be at least 1, got 0"):
        TDMRetrieveOptions(**base, top_k=0)
