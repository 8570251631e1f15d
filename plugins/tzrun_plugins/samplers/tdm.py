"""The ``tdm`` sampler: TDM's training rows from its tree, as TorchEasyRec's ``tdm_sampler``.

The tree is the node table ``tzrec-run tdm-tree`` writes (one Parquet file: the item id column,
``tree_level``, ``parent``, ``is_leaf`` and attribute columns; every leaf on the last level
``L - 1``). Each input row is a click on the item in its ``item_id`` column, a leaf of the
tree. A batch of ``B`` rows becomes, in this order:

* the ``B`` rows themselves, label 1 (the leaf);
* per row, its leaf's ancestors on levels ``1 .. L - 2``, label 1;
* per row and per level ``l`` in ``1 .. L - 1``, ``layer_num_sample[l]`` nodes of level ``l``
  drawn uniformly without replacement, never the row's own node of that level, label 0.

A sampled row is its input row with the node's columns: the item id column and every attribute
column of the tree (``attr_fields``; default all) that the input has are the node's, every other
column (the user's, the sequence, the sample weight, group keys) is the input row's, repeated.
With ``remain_ratio < 1`` each batch keeps ``round(remain_ratio * (L - 2))`` of the middle
levels, drawn with ``probability_type`` (the leaf level is always kept), for both positives and
negatives. The draws use the generator the core hands over, so a run resumed where it stopped
draws the same rows.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import attrs

from tzrun.errors import DataError

__all__ = ["TDMSamplerConfig", "TDMSampler", "build_tdm_sampler", "check_tdm_sampler", "level_problems"]

#: the node table's columns that are the tree's own, never a feature's
TREE_COLUMNS = ("tree_level", "tree_code", "parent", "is_leaf")


def _non_empty(instance: Any, attribute: Any, value: str) -> None:
    if not value:
        raise ValueError("must not be empty", attribute)


@attrs.frozen
class TDMSamplerConfig:
    """Options of the ``tdm`` sampler (``[data.sampler] type = "tdm"``).

    Attributes:
        tree: the node table of ``tzrec-run tdm-tree`` (TorchEasyRec's ``item_input_path`` and
            ``edge_input_path`` in one file).
        item_id: the item id column of the input and of the tree (``item_id_field``).
        layer_num_sample: negatives per level, root first (``layer_num_sample``): one entry per
            level of the tree, the root's 0.
        attr_fields: the tree's columns a sampled row takes from its node; empty: every column
            of the tree but ``tree_level``, ``tree_code``, ``parent`` and ``is_leaf``.
        remain_ratio: the share of the middle levels (1 .. L - 2) each batch trains on.
        probability_type: how those levels are drawn: ``uniform``; ``arithmetic`` (level ``l``
            in proportion to ``l``); ``reciprocal`` (to ``1 / (L - 1 - l)``).
    """

    tree: str = attrs.field(validator=_non_empty)
    item_id: str = attrs.field(validator=_non_empty)
    layer_num_sample: tuple[int, ...] = attrs.field()
    attr_fields: tuple[str, ...] = ()
    remain_ratio: float = attrs.field(default=1.0)
    probability_type: Literal["uniform", "arithmetic", "reciprocal"] = "uniform"

    @layer_num_sample.validator
    def _per_level(self, attribute: Any, value: tuple[int, ...]) -> None:
        if len(value) < 2:
            raise ValueError("needs one entry per tree level, root first (at least 2)", attribute)
        if value[0] != 0:
            raise ValueError(f"the root (entry 0) has no negatives: set it to 0, got {value[0]}", attribute)
        if min(value) < 0:
            raise ValueError(f"negatives per level must be >= 0, got {min(value)}", attribute)

    @remain_ratio.validator
    def _ratio(self, attribute: Any, value: float) -> None:
        if not 0.0 < value <= 1.0:
            raise ValueError(f"must be in (0, 1], got {value}", attribute)


class TDMSampler:
    """A TDM tree and the rows it makes of a batch (see the module docstring).

    Args:
        cfg: the sampler's options.

    Raises:
        DataError: naming the tree's file and the option, for a missing or unreadable file, a
            missing column, a null or repeated id, a leaf above the last level, or a level with
            fewer nodes than its ``layer_num_sample`` entry allows.
    """

    def __init__(self, cfg: TDMSamplerConfig) -> None:
        import numpy as np

        self.cfg = cfg
        nodes = _read_tree(cfg)
        ids = nodes.column(cfg.item_id).to_numpy()
        levels = nodes.column("tree_level").to_numpy().astype(np.int64)
        self.num_levels = int(levels.max()) + 1
        self._check_levels(nodes, levels)
        self.nodes = nodes
        self.attr_fields = _attr_fields(cfg, nodes)
        self.level_rows = [np.flatnonzero(levels == level) for level in range(self.num_levels)]
        self.position = np.zeros(len(ids), dtype=np.int64)  # a node's index within its level
        for rows in self.level_rows:
            self.position[rows] = np.arange(rows.size)
        leaves = self.level_rows[-1]
        order = np.argsort(ids[leaves], kind="stable")
        self.leaf_ids, self.leaf_rows = ids[leaves][order], leaves[order]
        self.paths = _paths(ids, nodes.column("parent"), self.leaf_rows, self.num_levels, cfg.tree)

    def _check_levels(self, nodes: Any, levels: Any) -> None:
        import numpy as np

        cfg = self.cfg
        leaf = nodes.column("is_leaf").to_numpy(zero_copy_only=False).astype(bool)
        if (levels[leaf] != self.num_levels - 1).any():
            raise DataError(f"{cfg.tree}: leaves above the last level {self.num_levels - 1}; TDM's sampler needs "
                            "every leaf on the last level (write the tree with tzrec-run tdm-tree)")
        counts = np.bincount(levels, minlength=self.num_levels)
        for key, message in level_problems(cfg, counts.tolist()):
            raise DataError(f"{cfg.tree}: data.sampler.{key}: {message}")

    @property
    def source(self) -> str:
        """The tree's file."""
        return self.cfg.tree

    def leaves_of(self, ids: Any) -> Any:
        """The leaf indices (rows of :attr:`paths`) of the item ids ``ids``.

        Raises:
            DataError: naming the first id that is not a leaf of the tree.
        """
        import numpy as np

        at = np.minimum(np.searchsorted(self.leaf_ids, ids), self.leaf_ids.size - 1)
        unknown = self.leaf_ids[at] != ids
        if unknown.any():
            raise DataError(f"{self.cfg.tree}: item id {ids[unknown][0]} (column '{self.cfg.item_id}') is not a leaf of "
                            f"the tree ({int(unknown.sum())} row(s) of this batch); rebuild the tree with every item")
        return at

    def levels(self, rng: Any) -> list[int]:
        """The levels of one batch: the kept middle levels (``remain_ratio``), then the leaves'."""
        import numpy as np

        middle = list(range(1, self.num_levels - 1))
        keep = int(round(self.cfg.remain_ratio * len(middle)))
        if keep < len(middle):
            weights = np.asarray(_level_weights(self.cfg.probability_type, len(middle)))
            middle = sorted(int(m) for m in rng.choice(middle, size=keep, replace=False, p=weights / weights.sum()))
        return middle + [self.num_levels - 1]

    def negatives(self, rng: Any, level: int, positives: Any) -> Any:
        """``layer_num_sample[level]`` node rows of ``level`` per positive node row, distinct
        within a row and never the positive: ``[len(positives), k]``."""
        import numpy as np

        k, rows = self.cfg.layer_num_sample[level], self.level_rows[level]
        if k == 0:
            return np.zeros((positives.size, 0), dtype=np.int64)
        n = rows.size - 1  # drawn among the level's nodes but the positive
        draws = rng.integers(0, n, size=(positives.size, k))
        ordered = np.sort(draws, axis=1)
        for r in np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1)):
            draws[r] = rng.choice(n, size=k, replace=False)
        own = self.position[positives][:, None]
        return rows[draws + (draws >= own)]

    def expand(self, rng: Any, table: Any, labels: Sequence[str]) -> Any:
        """The rows of one batch: each row's leaf and ancestors, label 1, then its negatives,
        label 0 (see the module docstring)."""
        import numpy as np
        import pyarrow as pa

        column = self.cfg.item_id
        if column not in table.column_names:
            raise DataError(f"{self.cfg.tree}: the input has no column '{column}' (data.sampler.item_id); make it a "
                            "feature's column")
        ids = table.column(column)
        if ids.null_count:
            raise DataError(f"{self.cfg.tree}: column '{column}' (data.sampler.item_id) has {ids.null_count} null id(s)")
        paths = self.paths[self.leaves_of(ids.to_numpy().astype(np.int64))]
        levels = self.levels(rng)
        b, middle = table.num_rows, levels[:-1]
        negatives = np.concatenate([self.negatives(rng, level, paths[:, level]) for level in levels], axis=1)
        users = np.concatenate([np.arange(b), np.repeat(np.arange(b), len(middle)),
                                np.repeat(np.arange(b), negatives.shape[1])])
        nodes = np.concatenate([paths[:, -1], paths[:, middle].ravel(), negatives.ravel()])
        out = table.take(pa.array(users))
        for name in [column, *self.attr_fields]:
            if name in out.column_names:
                values = self.nodes.column(name).take(pa.array(nodes))
                out = out.set_column(out.column_names.index(name), name, values.cast(table.schema.field(name).type))
        positive = b + b * len(middle)
        flags = np.concatenate([np.ones(positive), np.zeros(users.size - positive)])
        for name in labels:
            if name in out.column_names:
                out = out.set_column(out.column_names.index(name), name,
                                     pa.array(flags).cast(table.schema.field(name).type))
        return out


def level_problems(cfg: TDMSamplerConfig, counts: Sequence[int]) -> list[tuple[str, str]]:
    """What is wrong with ``layer_num_sample`` for a tree of ``counts[l]`` nodes on level ``l``:
    ``(key, message)`` pairs, ``key`` under ``[data.sampler]`` (the sampler and ``check`` both
    report them)."""
    wanted = cfg.layer_num_sample
    if len(wanted) != len(counts):
        return [("layer_num_sample", f"the tree has {len(counts)} levels but layer_num_sample has {len(wanted)} "
                                     f"entries; give {len(counts)}, one per level, root (0) first")]
    return [(f"layer_num_sample[{level}]", f"is {k}, but level {level} of the tree has {have} node(s), so at most "
                                           f"{have - 1} negatives besides the positive; lower it")
            for level, (k, have) in enumerate(zip(wanted, counts)) if level and k > have - 1]


def check_tdm_sampler(cfg: TDMSamplerConfig) -> list[tuple[str, str]]:
    """``tzrec-run check``'s look at the tree: :func:`level_problems` from its ``tree_level``
    column; nothing when the file cannot be read (the sampler names it when the run starts)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        levels = pq.read_table(cfg.tree, columns=["tree_level"]).column("tree_level").to_numpy()
    except (pa.ArrowException, OSError, KeyError):
        return []
    if levels.size == 0 or levels.min() < 0:
        return []
    counts = np.bincount(levels.astype(np.int64)).tolist()
    return [(key, f"{cfg.tree}: {message}") for key, message in level_problems(cfg, counts)]


def _level_weights(kind: str, count: int) -> list[float]:
    """Middle levels' weights for ``remain_ratio`` (TorchEasyRec's ``probability_type``)."""
    if kind == "arithmetic":
        return [float(level) for level in range(1, count + 1)]
    if kind == "reciprocal":
        return [1.0 / (count + 1 - level) for level in range(1, count + 1)]
    return [1.0] * count


def _read_tree(cfg: TDMSamplerConfig) -> Any:
    """The node table, checked: the columns TDM needs, ids present and unique."""
    import os

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.exists(cfg.tree):
        raise DataError(f"{cfg.tree}: the tree (data.sampler.tree) does not exist; write it with tzrec-run tdm-tree")
    try:
        nodes = pq.read_table(cfg.tree)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{cfg.tree}: cannot read the tree as Parquet: {exc}") from None
    for name, what in ((cfg.item_id, "data.sampler.item_id"), ("tree_level", "tdm-tree's"), ("parent", "tdm-tree's"),
                       ("is_leaf", "tdm-tree's")):
        if name not in nodes.column_names:
            raise DataError(f"{cfg.tree}: no column '{name}' ({what}) in the tree (columns: "
                            f"{', '.join(nodes.column_names)}); write it with tzrec-run tdm-tree")
    ids = nodes.column(cfg.item_id)
    if ids.null_count or not pa.types.is_integer(ids.type):
        raise DataError(f"{cfg.tree}: column '{cfg.item_id}' (data.sampler.item_id) must hold an integer id per node")
    unique, counts = np.unique(ids.to_numpy(), return_counts=True)
    if (counts > 1).any():
        raise DataError(f"{cfg.tree}: node id {unique[counts > 1][0]} is listed more than once")
    return nodes.combine_chunks()


def _attr_fields(cfg: TDMSamplerConfig, nodes: Any) -> list[str]:
    """The tree's columns a sampled row takes from its node (``attr_fields``, checked)."""
    if not cfg.attr_fields:
        return [c for c in nodes.column_names if c not in (cfg.item_id, *TREE_COLUMNS)]
    missing = [c for c in cfg.attr_fields if c not in nodes.column_names]
    if missing:
        raise DataError(f"{cfg.tree}: no column '{missing[0]}' (data.sampler.attr_fields) in the tree (columns: "
                        f"{', '.join(nodes.column_names)})")
    return [c for c in cfg.attr_fields if c != cfg.item_id]


def _paths(ids: Any, parents: Any, leaf_rows: Any, num_levels: int, source: str) -> Any:
    """``[leaves, num_levels]`` node rows from the root to each leaf (through ``parent``)."""
    import numpy as np
    import pyarrow.compute as pc

    order = np.argsort(ids, kind="stable")
    known = ids[order].astype(np.int64)
    wanted = pc.fill_null(parents, -1).to_numpy().astype(np.int64)
    at = np.minimum(np.searchsorted(known, wanted), ids.size - 1)
    parent_row = np.where(known[at] == wanted, order[at], -1)
    paths = np.zeros((leaf_rows.size, num_levels), dtype=np.int64)
    paths[:, -1] = leaf_rows
    for level in range(num_levels - 2, -1, -1):
        paths[:, level] = parent_row[paths[:, level + 1]]
        if (paths[:, level] < 0).any():
            raise DataError(f"{source}: a node's parent is missing from the tree; write it with tzrec-run tdm-tree")
    return paths


def build_tdm_sampler(cfg: TDMSamplerConfig) -> TDMSampler:
    """Read and check the tree (see :class:`TDMSampler`)."""
    return TDMSampler(cfg)
