"""``tzrec-run tdm-retrieve``: TDM's retrieval by beam search through its tree, as TorchEasyRec's
``tzrec/tools/tdm/retrieval.py``.

For each user row of the input, the search starts with every node of the start level (default:
the first level with more than ``beam`` nodes, as TorchEasyRec starts at a level of about
``2 * k * top_k`` nodes), scores each (user, node) pair with the exported model (the user's
columns, the node's item id and attribute columns from the tree, as in training), keeps the
``beam`` best nodes and goes on with their children, level by level; on the leaf level it keeps
the ``top_k`` best leaves. Ties go to the node listed first in the tree. A node whose children
are all of the next level is required: every leaf on the last level (``tzrec-run tdm-tree``).

It writes one Parquet file: the ``--keep-column`` columns of each input row and ``recall_ids``
(the ``top_k`` item ids, best first); when the input has the item id column, it prints the
share of rows whose item is among them (TorchEasyRec's recall).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import attrs
import numpy as np
import pyarrow as pa

from tzrun.errors import DataError, TzrunError

__all__ = ["TDMRetrieveOptions", "NodeTree", "beam_search", "tdm_retrieve"]

#: the node table's columns that describe the tree, never a feature's
TREE_COLUMNS = ("tree_level", "tree_code", "parent", "is_leaf")
#: ``score(rows) -> one score per row``: the model, as the search sees it
Scorer = Callable[[pa.Table], np.ndarray]


def _positive(instance: Any, attribute: Any, value: int) -> None:
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}", attribute)


@attrs.frozen(kw_only=True)
class TDMRetrieveOptions:
    """The options of ``tzrec-run tdm-retrieve``.

    Attributes:
        export: the exported TDM model (``tzrec-run export --out``).
        tree: the node table of ``tzrec-run tdm-tree``.
        input: the user rows, a Parquet file or a directory of them.
        item_id: the item id column of the tree (and of the input, for recall).
        top_k: item ids retrieved per row (TorchEasyRec's ``--recall_num``).
        beam: nodes kept per level; default ``2 * top_k`` (as TorchEasyRec).
        start_level: the first level scored; default the first with more than ``beam`` nodes.
        output: the model output that scores a pair.
        keep_column: input columns written beside ``recall_ids`` (TorchEasyRec's ``--reserved_columns``).
        batch_size: user rows scored together.
        out: the Parquet file to write (a new file).
    """

    export: str = attrs.field(metadata={"positional": True, "metavar": "EXPORT", "help": "the exported TDM model"})
    tree: str = attrs.field(metadata={"metavar": "FILE", "help": "the node table of tzrec-run tdm-tree"})
    input: str = attrs.field(metadata={"metavar": "PATH", "help": "the user rows: a Parquet file or a directory of them"})
    item_id: str = attrs.field(metadata={"metavar": "COLUMN", "help": "the item id column of the tree"})
    top_k: int = attrs.field(default=200, validator=_positive, metadata={
        "metavar": "K", "help": "item ids retrieved per row (default 200)"})
    beam: int | None = attrs.field(default=None, metadata={
        "metavar": "N", "help": "nodes kept per level (default 2 * top-k)"})
    start_level: int | None = attrs.field(default=None, metadata={
        "metavar": "L", "help": "the first level scored (default: the first with more than beam nodes)"})
    output: str = attrs.field(default="probs", metadata={"metavar": "NAME", "help": "the model output that scores a pair"})
    keep_column: tuple[str, ...] = attrs.field(default=(), metadata={
        "metavar": "COLUMN", "help": "an input column written beside recall_ids (repeatable)"})
    batch_size: int = attrs.field(default=256, validator=_positive, metadata={
        "metavar": "N", "help": "user rows scored together (default 256)"})
    out: str = attrs.field(metadata={"metavar": "FILE", "help": "the Parquet file to write (a new file)"})

    @beam.validator
    def _beam(self, attribute: Any, value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"must be at least 1, got {value}", attribute)


class NodeTree:
    """The node table of ``tzrec-run tdm-tree`` as a search needs it.

    Args:
        nodes: the node table.
        item_id: its item id column.
        source: its file, named in errors.

    Raises:
        DataError: for a missing column, a null or repeated id, a parent that is not a node, or
            a leaf above the last level.
    """

    def __init__(self, nodes: pa.Table, item_id: str, source: str) -> None:
        import pyarrow.compute as pc

        for name in (item_id, "tree_level", "parent", "is_leaf"):
            if name not in nodes.column_names:
                raise DataError(f"{source}: no column '{name}' in the tree (columns: {', '.join(nodes.column_names)}); "
                                "write it with tzrec-run tdm-tree" + (" or fix --item-id" if name == item_id else ""))
        ids = nodes.column(item_id)
        if ids.null_count or not pa.types.is_integer(ids.type):
            raise DataError(f"{source}: column '{item_id}' (--item-id) must hold an integer id per node")
        self.nodes, self.item_id = nodes.combine_chunks(), item_id
        self.ids = ids.to_numpy().astype(np.int64)
        if np.unique(self.ids).size != self.ids.size:
            raise DataError(f"{source}: a node id is listed more than once")
        self.levels = nodes.column("tree_level").to_numpy().astype(np.int64)
        self.num_levels = int(self.levels.max()) + 1
        leaf = nodes.column("is_leaf").to_numpy(zero_copy_only=False).astype(bool)
        if (self.levels[leaf] != self.num_levels - 1).any():
            raise DataError(f"{source}: leaves above the last level; write the tree with tzrec-run tdm-tree")
        order = np.argsort(self.ids, kind="stable")
        parents = pc.fill_null(nodes.column("parent"), -1).to_numpy().astype(np.int64)
        at = np.minimum(np.searchsorted(self.ids[order], parents), self.ids.size - 1)
        parent_row = np.where(self.ids[order][at] == parents, order[at], -1)
        if ((parent_row < 0) & (parents >= 0)).any():
            raise DataError(f"{source}: a node's parent is not a node of the tree")
        # children of each node, in the tree's order: rows [offsets[p], offsets[p + 1]) of children
        has_parent = parent_row >= 0
        self.children = np.flatnonzero(has_parent)[np.argsort(parent_row[has_parent], kind="stable")]
        self.offsets = np.zeros(self.ids.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(parent_row[has_parent], minlength=self.ids.size), out=self.offsets[1:])
        self.features = [c for c in nodes.column_names if c not in TREE_COLUMNS]

    def level(self, level: int) -> np.ndarray:
        """The rows of the nodes of ``level``, in the tree's order."""
        return np.flatnonzero(self.levels == level)

    def children_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The children of the node rows ``rows``: ``(children, index into rows of each one's parent)``."""
        counts = self.offsets[rows + 1] - self.offsets[rows]
        starts = np.repeat(self.offsets[rows] - (np.cumsum(counts) - counts), counts)
        return self.children[starts + np.arange(int(counts.sum()))], np.repeat(np.arange(rows.size), counts)

    def start_level(self, beam: int) -> int:
        """The first level with more than ``beam`` nodes (the last level when none has)."""
        counts = np.bincount(self.levels, minlength=self.num_levels)
        return next((level for level, n in enumerate(counts.tolist()) if n > beam), self.num_levels - 1)

    def pairs(self, users: pa.Table, user_index: np.ndarray, node_rows: np.ndarray) -> pa.Table:
        """The rows ``users[user_index]`` with the columns of the nodes ``node_rows``."""
        out = users.take(pa.array(user_index))
        for name in self.features:
            values = self.nodes.column(name).take(pa.array(node_rows))
            if name in out.column_names:
                out = out.set_column(out.column_names.index(name), name, values.cast(out.schema.field(name).type))
            else:
                out = out.append_column(name, values)
        return out


def beam_search(score: Scorer, users: pa.Table, tree: NodeTree, top_k: int, beam: int,
                start_level: Optional[int] = None) -> np.ndarray:
    """The ``top_k`` item ids of each row of ``users`` (see the module docstring): ``[rows, top_k]``
    int64, best first, ``-1`` past the leaves a row reached."""
    level = tree.start_level(beam) if start_level is None else start_level
    first = tree.level(level)
    rows = np.tile(first, users.num_rows)
    owner = np.repeat(np.arange(users.num_rows), first.size)
    while True:
        last = level == tree.num_levels - 1
        scores = np.asarray(score(tree.pairs(users, owner, rows)), dtype=np.float64).reshape(-1)
        rows, owner = _best(rows, owner, scores, top_k if last else beam)
        if last:
            break
        rows, parent = tree.children_of(rows)
        owner, level = owner[parent], level + 1
    out = np.full((users.num_rows, top_k), -1, dtype=np.int64)
    rank = np.arange(owner.size) - np.searchsorted(owner, owner)
    out[owner, rank] = tree.ids[rows]
    return out


def _best(rows: np.ndarray, owner: np.ndarray, scores: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Per owner (ascending), its ``keep`` best rows, best first (ties: the earlier row)."""
    order = np.lexsort((np.arange(rows.size), -scores, owner))
    owner = owner[order]
    rank = np.arange(owner.size) - np.searchsorted(owner, owner)
    kept = order[rank < keep]
    return rows[kept], owner[rank < keep]


def _predictor_scorer(export: str, output: str) -> Scorer:
    from tzrun_serving import Predictor

    predictor = Predictor(export)
    if output not in predictor.per_row_outputs():
        raise TzrunError(f"{export}: no output '{output}' of one score per row (outputs: "
                         f"{', '.join(predictor.per_row_outputs())}); fix --output")
    return lambda rows: predictor.predict(rows)[output]


def _read(path: str, what: str) -> pa.Table:
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise DataError(f"{path}: {what} does not exist; fix the path")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read {what} as Parquet: {exc}") from None


def tdm_retrieve(options: TDMRetrieveOptions, score: Optional[Scorer] = None) -> int:
    """``tzrec-run tdm-retrieve``: search the tree for each input row and write ``recall_ids``.

    Args:
        options: the command's options.
        score: scores (user, node) rows; default the exported model's ``output``.

    Raises:
        DataError: for a bad tree or input (naming the file and column).
        TzrunError: when ``out`` exists, or the export has no such output.
    """
    import io

    import pyarrow.parquet as pq

    from tzrun import write_atomic

    if os.path.exists(options.out):
        raise TzrunError(f"{options.out}: exists; tdm-retrieve writes a new file (remove it or choose another --out)")
    tree = NodeTree(_read(options.tree, "the tree"), options.item_id, options.tree)
    users = _read(options.input, "the input")
    missing = [c for c in options.keep_column if c not in users.column_names]
    if missing:
        raise DataError(f"{options.input}: no column '{missing[0]}' (--keep-column) in the input")
    beam = options.beam or 2 * options.top_k
    if options.start_level is not None and not 0 <= options.start_level < tree.num_levels:
        raise TzrunError(f"--start-level {options.start_level}: the tree has levels 0 to {tree.num_levels - 1}")
    score = score or _predictor_scorer(options.export, options.output)
    found = [beam_search(score, users.slice(s, options.batch_size), tree, options.top_k, beam, options.start_level)
             for s in range(0, users.num_rows, options.batch_size)]
    ids = np.concatenate(found) if found else np.zeros((0, options.top_k), np.int64)
    columns = {c: users.column(c) for c in options.keep_column}
    columns["recall_ids"] = pa.array([r[r >= 0].tolist() for r in ids], pa.list_(pa.int64()))
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    write_atomic(options.out, buffer.getvalue())
    line = f"wrote {options.out}: {options.top_k} item ids for each of {users.num_rows} rows (beam {beam})"
    if options.item_id in users.column_names and users.num_rows:
        truth = users.column(options.item_id).to_numpy(zero_copy_only=False)
        hit = (ids == truth.astype(np.int64)[:, None]).any(axis=1)
        line += f"; recall@{options.top_k} of the input's {options.item_id}: {hit.mean():.4f}"
    print(line)
    return 0
