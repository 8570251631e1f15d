"""``tzrec-run tdm-tree``: TorchEasyRec's initial TDM tree (``init_tree``) from an item table.

The reference below restates TorchEasyRec's ``TreeGenerator._init_tree`` and
``TreeBuilder.build`` (``tzrec/tools/tdm/gen_tree/``) as written there: leaves sorted by
``(category as a string, id)``, the recursive ``gen_code``, leaves pulled to the last level
with ``code * k + 1``, non-leaf ids ``max id + code + 1``, a node's parent ``(code - 1) // k``.
"""

from __future__ import annotations

import importlib.metadata
import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.errors import DataError
from tzrun_tools.tdm_tree import TDMTreeOptions, build_tree


def _options(**more) -> TDMTreeOptions:
    return TDMTreeOptions(**{"items": "items.parquet", "item_id": "item", "cate_id": "cate", "out": "nodes.parquet", **more})


def torcheasyrec_codes(ids: list[int], cates: list[str], k: int) -> dict[int, int]:
    """TorchEasyRec's ``_init_tree`` and the pull-down of ``TreeBuilder.build``: item id -> code.

    Its bound ``k ** depth - 1`` is the last level's first code for ``k = 2`` only; for ``k > 2``
    it leaves some leaves a level higher, and tzrec-run pulls every leaf to the last level
    (``(k ** depth - 1) // (k - 1)``, docs/differences.md): the bound used here."""
    leaves = sorted(zip(cates, ids))
    codes = [-1] * len(leaves)

    def gen_code(start: int, end: int, code: int) -> None:
        if end <= start:
            return
        if end == start + 1:
            codes[start] = code
            return
        for i in range(k):
            left = int(start + i * (end - start) / k)
            right = int(start + (i + 1) * (end - start) / k)
            gen_code(left, right, k * code + k - i)

    gen_code(0, len(leaves), 0)
    depth = math.ceil(round(math.log(len(leaves), k), 9))
    min_code = k ** depth - 1 if k == 2 else (k ** depth - 1) // (k - 1)
    for i in range(len(codes)):
        while codes[i] < min_code:
            codes[i] = codes[i] * k + 1
    return {item: code for (_, item), code in zip(leaves, codes)}


def test_three_items_by_hand():
    items = pa.table({"item": [10, 20, 30], "cate": ["b", "a", "a"], "brand": [8, 7, 8], "price": [4.0, 1.0, 2.0]})
    nodes = build_tree(items, _options(attr_fields=("brand",), raw_attr_fields=("price",))).to_pydict()
    assert nodes["item"] == [31, 32, 33, 10, 30, 20]  # level by level, in code order
    assert nodes["tree_code"] == [0, 1, 2, 3, 4, 5]
    assert nodes["tree_level"] == [0, 1, 1, 2, 2, 2]
    assert nodes["parent"] == [None, 31, 31, 32, 32, 33]
    assert nodes["is_leaf"] == [False, False, False, True, True, True]
    assert nodes["brand"] == [8, 8, 7, 8, 8, 7]  # the most common brand below each node
    assert nodes["price"] == pytest.approx([7 / 3, 3.0, 1.0, 4.0, 2.0, 1.0])  # the mean price below


@pytest.mark.parametrize("n, k", [(2, 2), (7, 2), (8, 2), (9, 3), (50, 4), (27, 3)])
def test_codes_equal_torcheasyrecs_init_tree(n, k):
    rng = random.Random(n * k)
    ids = rng.sample(range(1, 1000), n)
    cates = [str(rng.randrange(5)) for _ in ids]
    nodes = build_tree(pa.table({"item": ids, "cate": cates}), _options(branching=k)).to_pydict()
    leaves = {i: c for i, c, leaf in zip(nodes["item"], nodes["tree_code"], nodes["is_leaf"]) if leaf}
    assert leaves == torcheasyrec_codes(ids, cates, k)
    by_code = dict(zip(nodes["tree_code"], nodes["item"]))
    ancestors = {(c - 1) // k for c in leaves.values()}
    while ancestors:  # every ancestor of a leaf is a node, with TorchEasyRec's id, and nothing else is
        code = ancestors.pop()
        assert by_code[code] == max(ids) + code + 1
        if code:
            ancestors.add((code - 1) // k)
    depth = max(nodes["tree_level"])
    assert {lvl for lvl, leaf in zip(nodes["tree_level"], nodes["is_leaf"]) if leaf} == {depth}
    for node, parent, code in zip(nodes["item"], nodes["parent"], nodes["tree_code"]):
        assert parent == (None if code == 0 else by_code[(code - 1) // k])


def test_a_string_attribute_takes_the_most_common_non_empty_value_ties_to_the_smallest():
    items = pa.table({"item": [1, 2, 3, 4], "cate": ["a", "a", "a", "a"], "shop": ["y", "x", "", None]})
    nodes = build_tree(items, _options(attr_fields=("shop",))).to_pydict()
    shop = dict(zip(nodes["tree_code"], nodes["shop"]))
    assert shop[0] == "x"  # x and y once each, '' and null left out
    assert shop[2] == "x"  # over items 1 and 2 (codes 6 and 5)
    assert shop[1] is None  # over items 3 and 4: nothing to take


@pytest.mark.parametrize("table, options, message", [
    ({"item": [1, 2], "cat": ["a", "b"]}, {}, "no column 'cate' (--cate-id)"),
    ({"item": [1, 2], "cate": ["a", "b"]}, {"attr_fields": ("brand",)}, "no column 'brand' (--attr-fields)"),
    ({"item": ["1", "2"], "cate": ["a", "b"]}, {}, "'item' (--item-id) has type string"),
    ({"item": [1, 1, 2], "cate": ["a", "b", "c"]}, {}, "lists 1 id(s) more than once (first: 1)"),
    ({"item": [1, None], "cate": ["a", "b"]}, {}, "1 null id(s)"),
    ({"item": [5], "cate": ["a"]}, {}, "a tree needs at least 2"),
])
def test_a_bad_item_table_is_named_with_the_option(table, options, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_tree(pa.table(table), _options(**options))


def test_branching_below_two_is_refused():
    with pytest.raises(ValueError, match="at least 2 children"):
        _options(branching=1)


def _site(tmp_path):
    """A site that installs the tools' entry point when this environment predates it (the
    editable install's metadata is written at install time), else None."""
    from tests.plugin_kit.dists import write_distribution

    if any(ep.value == "tzrun_tools.hooks" for ep in importlib.metadata.entry_points(group="tzrun")):
        return None
    site = tmp_path / "site"
    write_distribution(site, "tzrun-tools-entry", entry_points={"tzrun_tools": "tzrun_tools.hooks"})
    return site


def test_the_command_writes_the_node_table_and_never_overwrites(tmp_path):
    from tests.plugin_kit.dists import tzrun_cli

    pq.write_table(pa.table({"item": [10, 20, 30], "cate": ["b", "a", "a"], "brand": [8, 7, 8]}), tmp_path / "items.parquet")
    out = tmp_path / "nodes.parquet"
    args = ["tdm-tree", str(tmp_path / "items.parquet"), "--item-id", "item", "--cate-id", "cate",
            "--attr-fields", "brand", "--out", str(out)]
    site = _site(tmp_path)
    done = tzrun_cli(args, site)
    assert done.returncode == 0, done.stderr
    assert "6 nodes (3 items) on 3 levels" in done.stdout
    assert pq.read_table(out).column("item").to_pylist() == [31, 32, 33, 10, 30, 20]
    again = tzrun_cli(args, site)
    assert again.returncode != 0 and "exists" in again.stderr
    missing = tzrun_cli(["tdm-tree", str(tmp_path / "none.parquet"), "--item-id", "item", "--cate-id", "cate",
                         "--out", str(tmp_path / "x.parquet")], site)
    assert missing.returncode != 0 and "the item table does not exist" in missing.stderr


# -- the clustered tree (--cluster-from) ---------------------------------------------------------


def _leaves_below(nodes: dict) -> dict[int, frozenset]:
    """Each node id -> the item ids of the leaves below it (a leaf: itself)."""
    below: dict[int, set] = {i: set() for i in nodes["item"]}
    parent = dict(zip(nodes["item"], nodes["parent"]))
    for item, leaf in zip(nodes["item"], nodes["is_leaf"]):
        at = item if leaf else None
        while at is not None:
            below[at].add(item)
            at = parent[at]
    return {i: frozenset(s) for i, s in below.items()}


def torcheasyrec_clusters(data, k: int) -> set[frozenset]:
    """TorchEasyRec's ``TreeCluster._cluster`` and ``_mini_batch`` with scikit-learn's KMeans, as
    written there: every node's set of rows (the leaf sets of the tree it builds)."""
    import numpy as np
    from sklearn.cluster import KMeans

    def split(index):
        x = data[index]
        kmeans = KMeans(n_clusters=k, random_state=0).fit(x)
        labels, ave, subs, remain = kmeans.labels_, int(len(index) / k), [], []
        for i in range(k):
            sub_i = np.where(labels == i)[0]
            if len(sub_i) <= ave:
                subs.append(index[sub_i])
            else:
                ordered = index[sub_i][np.argsort(kmeans.transform(x[sub_i])[:, i])]
                subs.append(ordered[:ave])
                remain.extend(ordered[ave:])
        remain, idx = np.array(remain, dtype=int), 0
        while idx < k and len(remain) > 0:
            if len(subs[idx]) < ave:
                diff = min(len(remain), ave - len(subs[idx]))
                ordered = remain[np.argsort(kmeans.transform(data[remain])[:, idx])]
                subs[idx], remain = np.append(subs[idx], ordered[:diff]), ordered[diff:]
            idx += 1
        if len(remain) > 0:
            subs[0] = np.append(subs[0], remain)
        return subs

    out, queue = set(), [np.arange(len(data))]
    while queue:
        index = queue.pop()
        out.add(frozenset(index.tolist()))
        if len(index) > k:
            queue.extend(s for s in split(index) if len(s) > 0)
        elif len(index) > 1:
            out.update(frozenset([i]) for i in index.tolist())
    return out


def _planted(levels: int = 5, seed: int = 0):
    """``2 ** levels`` items whose embeddings nest in halves (each split 10 times wider than the
    next), their ids shuffled: every binary split of them is unambiguous."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = 2 ** levels
    bits = (np.arange(n)[:, None] >> np.arange(levels)[None, ::-1]) & 1
    data = (2 * bits - 1) * 10.0 ** np.arange(levels, 0, -1)[None, :] + rng.normal(0, 0.01, (n, levels))
    ids = rng.permutation(n) + 100
    return ids, data


def test_planted_clusters_share_a_subtree_as_in_torcheasyrecs_cluster_tree():
    ids, data = _planted()
    items = pa.table({"item": ids, "brand": ids % 3})
    nodes = build_tree(items, _options(cate_id=None, cluster_from="x.parquet", attr_fields=("brand",)), data).to_pydict()
    ours = {s for s in _leaves_below(nodes).values()}
    by_row = {int(i): r for r, i in enumerate(ids)}
    assert {frozenset(by_row[i] for i in s) for s in ours} == torcheasyrec_clusters(data, 2)
    for group in range(4):  # the 4 planted clusters of 8 items each (the first 2 splits)
        assert frozenset(range(8 * group, 8 * group + 8)) in {frozenset(by_row[i] for i in s) for s in ours}
    assert set(nodes["tree_level"][i] for i, leaf in enumerate(nodes["is_leaf"]) if leaf) == {5}


@pytest.mark.parametrize(("n", "k"), [(37, 3), (100, 4), (23, 2)])
def test_each_split_is_balanced_as_torcheasyrecs_the_remainder_in_the_first_child(n, k):
    import numpy as np

    data = np.random.default_rng(n).normal(size=(n, 6))
    items = pa.table({"item": np.arange(n) * 7})
    nodes = build_tree(items, _options(cate_id=None, cluster_from="x.parquet", branching=k), data).to_pydict()
    below = _leaves_below(nodes)
    code = dict(zip(nodes["item"], nodes["tree_code"]))
    children: dict = {}
    for item, parent in zip(nodes["item"], nodes["parent"]):
        if parent is not None:
            children.setdefault(parent, []).append(item)
    for parent, kids in children.items():
        m = len(below[parent])
        sizes = [len(below[c]) for c in sorted(kids, key=code.get)]
        assert sizes == ([1] * m if m <= k else [m // k + m % k] + [m // k] * (k - 1)), (parent, m, sizes)
    levels = [lv for lv, leaf in zip(nodes["tree_level"], nodes["is_leaf"]) if leaf]
    assert len(levels) == n and len(set(levels)) == 1  # every leaf on the last level
    again = build_tree(items, _options(cate_id=None, cluster_from="x.parquet", branching=k), data)
    assert again.to_pydict() == nodes  # deterministic


def test_the_command_clusters_from_a_parquet_file_of_embeddings(tmp_path):
    from tzrun_tools.tdm_tree import tdm_tree

    ids, data = _planted(levels=3)
    pq.write_table(pa.table({"item": ids, "brand": ids % 2}), tmp_path / "items.parquet")
    pq.write_table(pa.table({"item": ids[::-1], "item_emb": data[::-1].tolist()}), tmp_path / "emb.parquet")
    out = tmp_path / "nodes.parquet"
    tdm_tree(TDMTreeOptions(items=str(tmp_path / "items.parquet"), item_id="item", cluster_from=str(tmp_path / "emb.parquet"),
                            attr_fields=("brand",), out=str(out)))
    nodes = pq.read_table(out).to_pydict()
    assert nodes["tree_level"] == [0, 1, 1, 2, 2, 2, 2] + [3] * 8 and sorted(nodes["item"][7:]) == sorted(ids.tolist())
    by_row = {int(i): r for r, i in enumerate(ids)}
    halves = {frozenset(by_row[i] for i in s) for s in _leaves_below(nodes).values()}
    assert frozenset(range(4)) in halves and frozenset(range(4, 8)) in halves
    # a new tree from an old tree: its leaves are the items
    again = tmp_path / "again.parquet"
    tdm_tree(TDMTreeOptions(items=str(out), item_id="item", cluster_from=str(tmp_path / "emb.parquet"),
                            attr_fields=("brand",), out=str(again)))
    assert pq.read_table(again).equals(pq.read_table(out))


@pytest.mark.parametrize(("embeddings", "message"), [
    ({"item": [1, 2], "vec": [[1.0], [2.0]]}, "no column 'item_emb' (--embedding-column) in the embeddings (columns: item, vec); fix --embedding-column"),
    ({"id": [1, 2], "item_emb": [[1.0], [2.0]]}, "no column 'item' (--item-id) in the embeddings"),
    ({"item": [1, 2], "item_emb": [[1.0, 2.0], [2.0]]}, "embedding lengths differ in column 'item_emb': row 1 has 1, row 0 has 2"),
    ({"item": [1, 3], "item_emb": [[1.0], [2.0]]}, "no embedding for item id 2 (1 item(s) of the item table)"),
    ({"item": [1, 2], "item_emb": [[1.0], None]}, "1 null embedding(s)"),
    ({"item": [1, 2], "item_emb": ["a", "b"]}, "has type string; an embedding is a list of numbers"),
])
def test_bad_embeddings_are_one_line_naming_the_file(tmp_path, embeddings, message):
    from tzrun_tools.tdm_tree import tdm_tree

    pq.write_table(pa.table({"item": [1, 2]}), tmp_path / "items.parquet")
    pq.write_table(pa.table(embeddings), tmp_path / "emb.parquet")
    with pytest.raises(DataError) as excinfo:
        tdm_tree(TDMTreeOptions(items=str(tmp_path / "items.parquet"), item_id="item",
                                cluster_from=str(tmp_path / "emb.parquet"), out=str(tmp_path / "nodes.parquet")))
    assert str(excinfo.value).startswith(f"{tmp_path / 'emb.parquet'}: ") and message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_cate_id_or_cluster_from():
    with pytest.raises(ValueError, match="give --cate-id .* or --cluster-from"):
        _options(cate_id=None)
    with pytest.raises(ValueError, match="not both"):
        _options(cluster_from="emb.parquet")
