"""TDM's learnt tree: the items' codes from their embeddings, as TorchEasyRec's ``cluster_tree``.

After a first training on the initial tree, TorchEasyRec rebuilds the tree by clustering the
learnt item embeddings (``tzrec/tools/tdm/gen_tree/tree_cluster.py``), and training goes on with
the new tree. The split of ``m`` items under the node of code ``c`` (its ``_cluster``):

* ``m <= k`` items: they are its children, codes ``k * c + 1 .. k * c + m``;
* else k-means into ``k`` clusters; a cluster of more than ``m // k`` items keeps its ``m // k``
  nearest to its centre, the others go to a pool; cluster 0, 1, ... in turn, each short of
  ``m // k`` takes the pool's items nearest to its centre until it has ``m // k``; what is left
  (``m % k`` items) joins cluster 0. Cluster ``i`` becomes child ``k * c + i + 1``: split again
  when it has more than one item, a leaf when it has one.

Every leaf is then pulled down to the last level (``c <- k * c + 1``) and the node table is
written as ``init_tree``'s (:mod:`tzrun_tools.tdm_tree`).

The k-means is our own (TorchEasyRec calls scikit-learn's ``KMeans(random_state=0)``): k-means++
seeding from ``numpy.random.default_rng(0)``, then Lloyd's iterations until no item changes its
cluster (at most 300), in float64; a cluster left empty keeps its centre. The same embeddings give
the same tree, on any machine, whatever the order of the item table's rows (the items are
clustered in id order).

The embeddings come from a Parquet file (an item id column and a list column of numbers,
TorchEasyRec's ``--embedding_field``) or from a checkpoint of a tdm run: the rows of the item id
feature's embedding table, read through :func:`tzrun.open_checkpoint`.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

import numpy as np

from tzrun.errors import DataError

__all__ = ["cluster_codes", "balanced_split", "kmeans", "item_embeddings"]

#: the k-means seed (TorchEasyRec's ``random_state=0``) and its iterations' bound
SEED = 0
MAX_ITERATIONS = 300


def _sq_distances(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """``[n, k]`` squared distances (never negative)."""
    d: np.ndarray = (x * x).sum(1)[:, None] - 2.0 * x @ centres.T + (centres * centres).sum(1)[None, :]
    np.maximum(d, 0.0, out=d)
    return d


def _seed_centres(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++: the first centre uniform, each next one with probability ∝ squared distance."""
    centres = [x[rng.integers(x.shape[0])]]
    nearest = _sq_distances(x, centres[0][None, :])[:, 0]
    for _ in range(1, k):
        total = nearest.sum()
        pick = rng.integers(x.shape[0]) if total <= 0 else rng.choice(x.shape[0], p=nearest / total)
        centres.append(x[pick])
        nearest = np.minimum(nearest, _sq_distances(x, x[pick][None, :])[:, 0])
    return np.stack(centres)


def kmeans(x: np.ndarray, k: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """``k`` centres of the rows of ``x`` and each row's cluster (see the module docstring).

    Returns:
        ``(centres [k, D], labels [n])``.
    """
    rng = np.random.default_rng(seed)
    centres = _seed_centres(x, k, rng)
    labels = np.full(x.shape[0], -1)
    for _ in range(MAX_ITERATIONS):
        new = _sq_distances(x, centres).argmin(1)
        if np.array_equal(new, labels):
            break
        labels = new
        for i in range(k):
            members = labels == i
            if members.any():
                centres[i] = x[members].mean(0)
    return centres, labels


def balanced_split(data: np.ndarray, index: np.ndarray, k: int) -> list[np.ndarray]:
    """The items ``index`` (rows of ``data``, more than ``k``) in ``k`` clusters of ``m // k``
    items, cluster 0 with the ``m % k`` left over (TorchEasyRec's ``_cluster``)."""
    x = data[index]
    centres, labels = kmeans(x, k)
    distances = _sq_distances(x, centres)
    share = index.size // k
    parts: list[np.ndarray] = []
    pool: list[np.ndarray] = []
    for i in range(k):
        members = np.flatnonzero(labels == i)
        nearest = members[np.argsort(distances[members, i], kind="stable")]
        parts.append(nearest[:share])
        pool.append(nearest[share:])
    remain = np.concatenate(pool)
    for i in range(k):
        if not remain.size:
            break
        short = share - parts[i].size
        if short > 0:
            nearest = remain[np.argsort(distances[remain, i], kind="stable")]
            parts[i], remain = np.concatenate([parts[i], nearest[:short]]), nearest[short:]
    parts[0] = np.concatenate([parts[0], remain])
    return [index[p] for p in parts]


def cluster_codes(data: np.ndarray, k: int) -> np.ndarray:
    """Each item's code (a row of ``data``, its embedding) before the leaves are pulled down."""
    codes = np.zeros(data.shape[0], dtype=np.int64)
    queue = deque([(0, np.arange(data.shape[0]))])
    while queue:
        code, index = queue.popleft()
        if index.size <= k:
            codes[index] = k * code + 1 + np.arange(index.size)
            continue
        for i, part in enumerate(balanced_split(data, index, k)):
            if part.size > 1:
                queue.append((k * code + i + 1, part))
            else:
                codes[part] = k * code + i + 1
    return codes


def item_embeddings(source: str, item_id: str, ids: np.ndarray, column: str) -> np.ndarray:
    """``[len(ids), D]`` float64: each item's embedding, from a Parquet file of ``item_id`` and
    ``column`` or from a checkpoint (a checkpoint directory, or a model dir: its latest).

    Raises:
        DataError: one line naming ``source`` and the fix: a missing column, embeddings of
            different lengths, null or not finite, an item without one, a checkpoint without
            the item id's table.
    """
    if not os.path.exists(source):
        raise DataError(f"{source}: does not exist; give --cluster-from a checkpoint of a tdm run or a Parquet file of "
                        "item ids and embeddings")
    if os.path.isdir(source) and not source.rstrip("/").endswith(".parquet"):
        return _checkpoint_rows(source, item_id, ids)
    return _parquet_rows(source, item_id, ids, column)


def _parquet_rows(source: str, item_id: str, ids: np.ndarray, column: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(source).names
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{source}: cannot read the embeddings as Parquet: {exc}") from None
    for name, flag in ((item_id, "--item-id"), (column, "--embedding-column")):
        if name not in names:
            raise DataError(f"{source}: no column '{name}' ({flag}) in the embeddings (columns: {', '.join(names)}); "
                            f"fix {flag}")
    table = pq.read_table(source, columns=[item_id, column])
    values = table.column(column).combine_chunks()
    if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
            or pa.types.is_fixed_size_list(values.type)):
        raise DataError(f"{source}: column '{column}' (--embedding-column) has type {values.type}; an embedding is a "
                        "list of numbers")
    if values.null_count:
        raise DataError(f"{source}: column '{column}' (--embedding-column) has {values.null_count} null embedding(s)")
    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
    if lengths.size and (lengths != lengths[0]).any():
        row = int(np.flatnonzero(lengths != lengths[0])[0])
        raise DataError(f"{source}: embedding lengths differ in column '{column}': row {row} has {lengths[row]}, row 0 "
                        f"has {lengths[0]}; write one length for every item")
    flat = pc.list_flatten(values).cast(pa.float64()).to_numpy(zero_copy_only=False)
    vectors = flat.reshape(len(values), int(lengths[0]) if lengths.size else 0)
    ids_in = table.column(item_id)
    if ids_in.null_count:
        raise DataError(f"{source}: column '{item_id}' (--item-id) has {ids_in.null_count} null id(s)")
    known = ids_in.to_numpy()
    unique, counts = np.unique(known, return_counts=True)
    if (counts > 1).any():
        raise DataError(f"{source}: item id {unique[counts > 1][0]} has more than one embedding; write one row per item")
    order = np.argsort(known, kind="stable")
    at = np.searchsorted(known[order], ids).clip(0, max(known.size - 1, 0))
    missing = np.ones(ids.size, bool) if not known.size else known[order][at] != ids
    if missing.any():
        raise DataError(f"{source}: no embedding for item id {ids[missing][0]} ({int(missing.sum())} item(s) of the "
                        f"item table); write one row per item")
    return _finite(vectors[order[at]], source)


def _finite(vectors: np.ndarray, source: str) -> np.ndarray:
    if vectors.shape[1] == 0:
        raise DataError(f"{source}: the embeddings are empty; write them with at least one value")
    bad = ~np.isfinite(vectors).all(1)
    if bad.any():
        raise DataError(f"{source}: {int(bad.sum())} embedding(s) hold NaN or infinite values; retrain or fix them")
    return vectors


def _checkpoint_rows(source: str, item_id: str, ids: np.ndarray) -> np.ndarray:
    """The item id feature's table rows of ``ids`` (its ids are the rows: ``num_buckets``)."""
    import torch

    import tzrun
    from tzrun.errors import CheckpointError

    try:
        view = tzrun.open_checkpoint(source)
    except CheckpointError:
        if not os.path.isdir(os.path.join(source, "checkpoints")):
            raise
        view = tzrun.find_checkpoint(source, "latest")
    table, rows = _item_table(view, source, item_id)
    shapes = view.tensor_shapes()
    keys = sorted(key for key in shapes if key.startswith("model.") and key.endswith(f".{table}.weight")
                  and (".embedding_bags." in key or ".embeddings." in key))
    if not keys:
        raise DataError(f"{view.path}: holds no embedding table '{table}' (the table of '{item_id}'); give a "
                        "checkpoint of the tdm run, or a Parquet file of item ids and embeddings")
    if ids.max() >= shapes[keys[0]][0]:
        raise DataError(f"{view.path}: item id {ids[ids >= shapes[keys[0]][0]][0]} is outside table '{table}' of "
                        f"{shapes[keys[0]][0]} rows ({rows}); rebuild from this run's items")
    state = {keys[0]: torch.empty(shapes[keys[0]], dtype=torch.float32)}
    view.load_state(state)
    return _finite(state[keys[0]][torch.from_numpy(ids.astype(np.int64, copy=True))].double().numpy(), str(view.path))


def _item_table(view: Any, source: str, item_id: str) -> tuple[str, str]:
    """The table of the sparse feature reading ``item_id`` in the checkpoint's config, and where
    that feature is, for messages."""
    sparse = view.config.get("features", {}).get("sparse", [])
    for i, feature in enumerate(sparse):
        if feature.get("column", feature.get("name")) != item_id:
            continue
        where = f"features.sparse[{i}]"
        if "num_buckets" not in feature:
            raise DataError(f"{view.path}: {where} ('{feature.get('name')}') does not take the item ids as its rows "
                            "(no num_buckets); give a Parquet file of item ids and embeddings instead")
        return feature.get("table") or f"{feature['name']}_emb", where
    raise DataError(f"{view.path}: no [[features.sparse]] reads column '{item_id}' (--item-id) in the checkpoint's "
                    "config, so it has no item table; give a checkpoint of the tdm run or a Parquet file of embeddings")
