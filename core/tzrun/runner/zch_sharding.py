"""The sharder of collision-free tables: TorchRec's ``ManagedCollisionEmbeddingCollectionSharder``
whose sharded module resets an evicted row's weights *and* its optimizer state on every device.

TorchRec resets them with ``fbgemm::reset_weight_momentum``, which has no CPU kernel (and which
it calls for ``rowwise_adagrad`` only: under ``adagrad`` an evicted row kept its old
accumulator). Here the rows TorchRec reports evicted get the table's initializer and every
optimizer state of theirs is zeroed, through FBGEMM's own views of the state
(``split_optimizer_states``), so that a new id starts like a new table's row.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["zch_sharder", "with_zch_sharder"]


def _reset_rows(sharded: Any, evictions: dict[str, Optional[torch.Tensor]]) -> None:
    """Give the evicted rows of each table their initial weights and zero optimizer state, and
    count, per table, the evictions (``sharded.evictions``) and rows evicted (``sharded.evicted_rows``)."""
    module = sharded._embedding_module
    for table, rows in evictions.items():
        if rows is None:
            continue
        sharded.evictions[table] = sharded.evictions.get(table, 0) + 1
        sharded.evicted_rows[table] = sharded.evicted_rows.get(table, 0) + int(rows.numel())
        if rows.numel() == 0:
            continue
        rows = rows.long()
        tbe, logical_ids = sharded._table_to_tbe_and_index[table]
        states = tbe.split_optimizer_states()  # one list per table; none at all under sgd
        with torch.no_grad():
            for state in states[int(logical_ids[0])] if states else ():
                state[rows] = 0
            weight = module.embeddings.get_parameter(f"{table}.weight")
            init_fn = module._table_name_to_config[table].init_fn
            weight.data[rows] = init_fn(weight[rows].clone())


def zch_sharder(**kwargs: Any) -> Any:
    """A managed-collision ``EmbeddingCollection`` sharder whose sharded collection resets
    evicted rows with :func:`_reset_rows` (``kwargs``: TorchRec's sharder's)."""
    from torchrec.distributed.mc_embedding import (
        ManagedCollisionEmbeddingCollectionSharder,
        ShardedManagedCollisionEmbeddingCollection,
    )

    class ShardedZchCollection(ShardedManagedCollisionEmbeddingCollection):
        """TorchRec's sharded managed-collision collection, evicting on every device.

        Attributes:
            evictions: per table, the evictions this rank's slice ran (one per
                ``eviction_interval`` steps).
            evicted_rows: per table, the rows those evictions gave to new ids.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.evictions: dict[str, int] = {}
            self.evicted_rows: dict[str, int] = {}

        def _evict(self, evictions_per_table: dict[str, Optional[torch.Tensor]]) -> None:
            _reset_rows(self, evictions_per_table)

    class ZchCollectionSharder(ManagedCollisionEmbeddingCollectionSharder):
        """TorchRec's sharder, building :class:`ShardedZchCollection`."""

        def shard(self, module: Any, params: Any, env: Any, device: Any = None, module_fqn: Any = None) -> Any:
            return ShardedZchCollection(module, params, ec_sharder=self._e_sharder, mc_sharder=self._mc_sharder,
                                        env=env, device=device if device is not None else torch.device("cpu"))

        @property
        def sharded_module_type(self) -> Any:
            return ShardedZchCollection

    return ZchCollectionSharder(**kwargs)


def with_zch_sharder(sharders: list[Any]) -> list[Any]:
    """``sharders`` with TorchRec's managed-collision ``EmbeddingCollection`` sharder replaced
    by :func:`zch_sharder`."""
    from torchrec.distributed.mc_embedding import ManagedCollisionEmbeddingCollectionSharder

    return [s for s in sharders if type(s) is not ManagedCollisionEmbeddingCollectionSharder] + [zch_sharder()]
