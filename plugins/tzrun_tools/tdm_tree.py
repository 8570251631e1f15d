"""``tzrec-run tdm-tree``: TDM's initial tree from an item table, as TorchEasyRec's ``init_tree``.

The items (one row each: an integer id, a category, optionally feature columns) are sorted by
category (as a string), then id, and laid out as a balanced ``branching``-ary tree: the range
of leaves is cut into ``branching`` near-equal parts (``int(start + i * n / branching)``), each
under its own child, recursively, child ``i`` of code ``c`` getting code
``branching * c + branching - i`` (TorchEasyRec's ``gen_code``); every leaf is then pulled down
to the last level (``c <- branching * c + 1`` until ``c`` is on level ``depth``, the smallest
with ``branching ** depth >= items``; TorchEasyRec's bound ``branching ** depth - 1`` is that
level's first code for a binary tree only, and leaves some leaves a level higher for
``branching > 2``). A non-leaf node exists where a leaf lies
below it; its id is ``max item id + code + 1``, its ``attr_fields`` columns the most common value of
the leaves below it (nulls left out; ties: the smallest value), its ``raw_attr_fields`` columns their
mean (rounded for integers).

The node table is one Parquet file, one row per node, root first, then level by level in code
order: the item id column (the node's id), ``tree_level`` (0: the root), ``tree_code``,
``parent`` (the parent's id; null for the root), ``is_leaf`` and the attribute columns, named
as in the item table (so a node's features are read like an item's).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import attrs
import numpy as np
import pyarrow as pa

from tzrun.errors import DataError, TzrunError

__all__ = ["TDMTreeOptions", "build_tree", "tdm_tree"]


def _at_least_two(instance: Any, attribute: Any, value: int) -> None:
    if value < 2:
        raise ValueError(f"a tree needs at least 2 children per node, got {value}", attribute)


@attrs.frozen(kw_only=True)
class TDMTreeOptions:
    """The options of ``tzrec-run tdm-tree``.

    Attributes:
        items: the item table, a Parquet file or a directory of them.
        item_id: its integer item id column (TorchEasyRec's ``--item_id_field``).
        cate_id: its category column (``--cate_id_field``): the initial tree's order.
        cluster_from: where the learnt item embeddings are (a checkpoint, a model dir, or a
            Parquet file): the tree is clustered from them (:mod:`tzrun_tools.tdm_cluster`).
        embedding_column: a Parquet ``cluster_from``'s embedding column (``--embedding_field``).
        attr_fields: columns a non-leaf node takes the most common value of (``--attr_fields``).
        raw_attr_fields: numeric columns a non-leaf node takes the mean of (``--raw_attr_fields``).
        branching: children per node (``--n_cluster``).
        out: the node table to write (a new Parquet file).
    """

    items: str = attrs.field(metadata={"positional": True, "metavar": "ITEMS",
                                       "help": "the item table: a Parquet file or a directory of them"})
    item_id: str = attrs.field(metadata={"metavar": "COLUMN", "help": "the integer item id column"})
    cate_id: str | None = attrs.field(default=None, metadata={
        "metavar": "COLUMN", "help": "the category column the leaves are sorted by (the initial tree)"})
    cluster_from: str | None = attrs.field(default=None, metadata={
        "metavar": "PATH", "help": "cluster the items by their learnt embeddings instead (TorchEasyRec's cluster_tree): "
                                  "a checkpoint of a tdm run (or its model dir: the latest) or a Parquet file of item ids "
                                  "and embeddings"})
    embedding_column: str = attrs.field(default="item_emb", metadata={
        "metavar": "COLUMN", "help": "the embedding column of a Parquet --cluster-from (default item_emb)"})
    attr_fields: tuple[str, ...] = attrs.field(default=(), metadata={
        "metavar": "COLUMN", "help": "a column a non-leaf node takes the most common value of (repeatable)"})
    raw_attr_fields: tuple[str, ...] = attrs.field(default=(), metadata={
        "metavar": "COLUMN", "help": "a numeric column a non-leaf node takes the mean of (repeatable)"})
    branching: int = attrs.field(default=2, validator=_at_least_two, metadata={
        "metavar": "K", "help": "children per node (default 2)"})
    out: str = attrs.field(metadata={"metavar": "FILE", "help": "the node table to write (a new Parquet file)"})

    def __attrs_post_init__(self) -> None:
        if (self.cate_id is None) == (self.cluster_from is None):
            raise ValueError("give --cate-id (the initial tree, items sorted by category) or --cluster-from (a tree "
                             "clustered from learnt embeddings), not both or neither")


def _codes(n: int, branching: int) -> np.ndarray:
    """The leaf codes of ``n`` sorted items (TorchEasyRec's ``gen_code``), not yet pulled down."""
    codes = np.zeros(n, dtype=np.int64)
    stack = [(0, n, 0)]
    while stack:
        start, end, code = stack.pop()
        if end <= start:
            continue
        if end == start + 1:
            codes[start] = code
            continue
        for i in range(branching):
            left = int(start + i * (end - start) / branching)
            right = int(start + (i + 1) * (end - start) / branching)
            stack.append((left, right, branching * code + branching - i))
    return codes


def _depth(n: int, branching: int) -> int:
    depth, width = 0, 1
    while width < n:
        depth, width = depth + 1, width * branching
    return depth


def _level(codes: np.ndarray, branching: int) -> np.ndarray:
    """Each code's level (0: the root)."""
    levels = np.zeros(codes.size, dtype=np.int32)
    current = codes.copy()
    while (current > 0).any():
        above = current > 0
        levels += above
        current = np.where(above, (current - 1) // branching, 0)
    return levels


def _mode(groups: np.ndarray, values: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Per group of ``groups`` (its sorted unique keys, returned), the most common non-null value
    of ``values`` (strings: non-empty; ties: the smallest); null for a group with none."""
    import pyarrow.compute as pc

    keys = np.unique(groups)
    text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    keep = pc.is_valid(values)
    if text:
        keep = pc.and_(keep, pc.fill_null(pc.not_equal(values, ""), False))
    kept = values.filter(keep)
    data = np.asarray(kept.to_pylist(), dtype=object) if text else kept.to_numpy(zero_copy_only=False)
    g = groups[np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool)]
    chosen: dict[int, Any] = {}
    if g.size:
        uniques, inverse = np.unique(data, return_inverse=True)
        pairs, counts = np.unique(np.stack([g, inverse.ravel()]), axis=1, return_counts=True)
        order = np.lexsort((pairs[1], -counts, pairs[0]))  # by group, most common first, then smallest
        grouped = pairs[0][order]
        first = order[np.r_[True, grouped[1:] != grouped[:-1]]]
        chosen = dict(zip(pairs[0][first].tolist(), uniques[pairs[1][first]].tolist()))
    return keys, pa.array([chosen.get(k) for k in keys.tolist()], type=values.type)


def _mean(groups: np.ndarray, values: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Per group, the mean of ``values`` (nulls left out; rounded for integers)."""
    import pyarrow.compute as pc

    keys, inverse = np.unique(groups, return_inverse=True)
    x = pc.fill_null(values.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
    ok = ~np.isnan(x)
    sums = np.bincount(inverse[ok], weights=x[ok], minlength=keys.size)
    counts = np.bincount(inverse[ok], minlength=keys.size)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    if pa.types.is_integer(values.type):
        means = np.round(means)
    return keys, pa.array(means, mask=counts == 0).cast(values.type, safe=False)


def _checked_items(table: pa.Table, options: TDMTreeOptions) -> pa.Table:
    source = options.items
    for flag, names in (("--item-id", [options.item_id]), ("--cate-id", [options.cate_id] if options.cate_id else []),
                        ("--attr-fields", options.attr_fields), ("--raw-attr-fields", options.raw_attr_fields)):
        for name in names:
            if name not in table.column_names:
                raise DataError(f"{source}: no column '{name}' ({flag}) in the item table "
                                f"(columns: {', '.join(table.column_names)}); fix {flag}")
    ids = table.column(options.item_id)
    if not pa.types.is_integer(ids.type):
        raise DataError(f"{source}: column '{options.item_id}' (--item-id) has type {ids.type}; TDM's node ids are "
                        "integers (hash string ids into integers first)")
    if ids.null_count:
        raise DataError(f"{source}: column '{options.item_id}' (--item-id) has {ids.null_count} null id(s)")
    if table.num_rows < 2:
        raise DataError(f"{source}: the item table has {table.num_rows} item(s); a tree needs at least 2")
    values = ids.to_numpy()
    unique, counts = np.unique(values, return_counts=True)
    if (counts > 1).any():
        raise DataError(f"{source}: column '{options.item_id}' (--item-id) lists {int((counts > 1).sum())} id(s) more "
                        f"than once (first: {unique[counts > 1][0]}); keep one row per item")
    if values.min() < 0:
        raise DataError(f"{source}: column '{options.item_id}' (--item-id) has negative ids (first: {values[values < 0][0]})")
    return table


def build_tree(items: pa.Table, options: TDMTreeOptions, embeddings: Optional[np.ndarray] = None) -> pa.Table:
    """The node table of ``items`` (see the module docstring); with ``embeddings`` (``[items, D]``,
    row ``i`` item ``i``'s), the tree clustered from them (:mod:`tzrun_tools.tdm_cluster`).

    Raises:
        DataError: naming the table and the option, for a missing column, an id that is not an
            integer, null, negative or listed twice, or fewer than 2 items.
    """
    import pyarrow.compute as pc

    from tzrun_tools.tdm_cluster import cluster_codes

    items = _checked_items(items, options)
    branching = options.branching
    ids = items.column(options.item_id).cast(pa.int64()).to_numpy()
    if embeddings is not None:  # in id order: the tree does not depend on the table's row order
        by_id = np.argsort(ids, kind="stable")
        codes = cluster_codes(embeddings[by_id], branching)
        return _node_table(items.take(pa.array(by_id)), ids[by_id], codes, options, int(_level(codes, branching).max()))
    cates = pc.fill_null(items.column(options.cate_id).cast(pa.string()), "").to_pylist()
    order = sorted(range(len(ids)), key=lambda r: (cates[r], ids[r]))
    return _node_table(items.take(pa.array(order)), ids[order], _codes(len(ids), branching), options,
                       _depth(len(ids), branching))


def _node_table(items: pa.Table, ids: np.ndarray, codes: np.ndarray, options: TDMTreeOptions, depth: int) -> pa.Table:
    """The node table of the leaves ``ids`` (rows of ``items``) at ``codes``, each pulled down to
    level ``depth``."""
    branching = options.branching
    floor = (branching ** depth - 1) // (branching - 1)  # the last level's first code
    while (codes < floor).any():
        codes = np.where(codes < floor, codes * branching + 1, codes)
    leaf_levels = _level(codes, branching)
    # every (ancestor, leaf row) pair, level by level up to the root
    rows, above = [], []
    current = codes
    for _ in range(int(leaf_levels.max())):
        current = (current - 1) // branching
        rows.append(np.arange(len(ids)))
        above.append(current)
    leaf_row, ancestor = np.concatenate(rows), np.concatenate(above)
    inner = np.unique(ancestor)
    all_codes = np.concatenate([inner, codes])
    node_ids = np.concatenate([ids.max() + inner + 1, ids])
    by_code = dict(zip(all_codes.tolist(), node_ids.tolist()))
    parents = [None if c == 0 else by_code[(c - 1) // branching] for c in all_codes.tolist()]
    columns: dict[str, Any] = {
        options.item_id: pa.array(node_ids, pa.int64()),
        "tree_level": pa.array(_level(all_codes, branching)),
        "tree_code": pa.array(all_codes, pa.int64()),
        "parent": pa.array(parents, pa.int64()),
        "is_leaf": pa.array([False] * inner.size + [True] * codes.size),
    }
    for names, reduce in ((options.attr_fields, _mode), (options.raw_attr_fields, _mean)):
        for name in names:
            values = items.column(name).combine_chunks()
            _, reduced = reduce(ancestor, values.take(pa.array(leaf_row)))
            columns[name] = pa.concat_arrays([reduced, values.cast(reduced.type)])
    table = pa.table(columns)
    return table.take(pa.array(np.lexsort((all_codes, columns["tree_level"].to_numpy()))))


def _read_items(path: str, columns: Sequence[str]) -> pa.Table:
    """The item table's ``columns``; of a node table (an ``is_leaf`` column), its leaves."""
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise DataError(f"{path}: the item table does not exist; fix the path")
    try:
        leaves = "is_leaf" in pq.read_schema(path).names if os.path.isfile(path) else False
        wanted = list(dict.fromkeys(c for c in columns if c))
        table = pq.read_table(path, columns=wanted + ["is_leaf"] * leaves)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read the item table as Parquet: {exc}") from None
    return table.filter(table.column("is_leaf")).select(wanted) if leaves else table


def tdm_tree(options: TDMTreeOptions) -> Optional[int]:
    """``tzrec-run tdm-tree``: read the items, build the tree, write the node table.

    Raises:
        DataError: for a bad item table (see :func:`build_tree`) or bad embeddings (see
            :func:`tzrun_tools.tdm_cluster.item_embeddings`).
        TzrunError: when ``out`` exists (it is never overwritten).
    """
    import io

    import pyarrow.parquet as pq

    from tzrun import write_atomic

    if os.path.exists(options.out):
        raise TzrunError(f"{options.out}: exists; tdm-tree writes a new file (remove it or choose another --out)")
    wanted = [options.item_id, options.cate_id or "", *options.attr_fields, *options.raw_attr_fields]
    items = _read_items(options.items, wanted)
    embeddings = None
    if options.cluster_from is not None:
        from tzrun_tools.tdm_cluster import item_embeddings

        ids = _checked_items(items, options).column(options.item_id).cast(pa.int64()).to_numpy()
        embeddings = item_embeddings(options.cluster_from, options.item_id, ids, options.embedding_column)
    nodes = build_tree(items, options, embeddings)
    buffer = io.BytesIO()
    pq.write_table(nodes, buffer)
    write_atomic(options.out, buffer.getvalue())
    leaves = int(pa.compute.sum(nodes.column("is_leaf").cast(pa.int64())).as_py())
    levels = int(pa.compute.max(nodes.column("tree_level")).as_py()) + 1
    how = f", clustered from the embeddings of {options.cluster_from}" if options.cluster_from else ""
    print(f"wrote {options.out}: {nodes.num_rows} nodes ({leaves} items) on {levels} levels, "
          f"{options.branching} children per node{how}")
    return 0
