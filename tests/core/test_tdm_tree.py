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
    return TDMTreeOptions(items="items.parquet", item_id="item", cate_id="cate", out="nodes.parquet", **more)


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
