"""Collision-free ids (``zch`` on an id feature, docs/zch.md): the embedding collections a model
built that hold a ``zch`` table are swapped, before sharding, for TorchRec's managed-collision
ones.

The route (measured, see docs/zch.md, Design notes): TorchRec offers no CPU sharding type for
a managed-collision *bag* collection (TorchRec issue 2958), but shards a managed-collision
``EmbeddingCollection`` row-wise on CPU as on CUDA. So a ``zch`` table is always looked up
unpooled by a ``ManagedCollisionEmbeddingCollection`` (``MCHManagedCollisionModule`` per
table, one slice per rank) and, where the model built an ``EmbeddingBagCollection``, pooled
after the lookup (:class:`ManagedBagCollection`, which answers as the bag collection did: a
``KeyedTensor`` of the same keys). The model's code does not change. A table is a ``zch`` table
when a feature it reads has ``zch`` (DeepFM's wide table of a ``zch`` feature is one too).

Eviction policies and admission filters are plugin components (``tzrun_register_eviction_
policies``, ``tzrun_register_admission_filters``), built here per table.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.fx
from torch import nn

from tzrun.config.schema import RunConfig, ZchConfig
from tzrun.config.sequences import id_features
from tzrun.data.ids import ZCH_ID_SPACE
from tzrun.errors import ConfigError, ConfigProblem
from tzrun.kernel.registry import Registries

__all__ = ["zch_features", "check_zch_world_size", "swap_managed_collisions", "ManagedBagCollection", "zch_window_state", "load_zch_window_state",
           "ManagedCollection", "zch_table_names", "zch_counters", "reshard_zch_windows"]


def zch_features(cfg: RunConfig) -> dict[str, tuple[str, ZchConfig]]:
    """``feature name -> (its TOML path, its zch block)`` of every collision-free id feature."""
    return {name: (path, f.zch) for name, (path, f) in id_features(cfg.features).items() if f.zch is not None}


def check_zch_world_size(cfg: RunConfig, world_size: int) -> None:
    """Each rank holds one row-wise slice of a ``zch`` table: its size must split evenly.

    Raises:
        ConfigError: naming each ``zch.size`` that ``world_size`` does not divide.
    """
    problems = []
    for name, (path, zch) in zch_features(cfg).items():
        if zch.size % world_size:
            lower = max(world_size, zch.size - zch.size % world_size)
            problems.append(ConfigProblem(
                f"{path}.zch.size", f"feature '{name}': {zch.size} rows do not split over {world_size} ranks "
                                    f"(each rank holds one slice); use {lower} or {lower + world_size}"))
    if problems:
        raise ConfigError("features", problems)


def _table_zch(config: Any, features: Mapping[str, tuple[str, ZchConfig]]) -> Optional[tuple[str, ZchConfig]]:
    """The zch block of the first of a table's features that has one (None: a plain table)."""
    return next((features[n] for n in config.feature_names if n in features), None)


def _managed_module(config: Any, zch: tuple[str, ZchConfig], registries: Registries, buckets: int) -> Any:
    """TorchRec's ``MCHManagedCollisionModule`` of one table, its policy and filter built by
    the plugins the config names."""
    path, block = zch
    admission = None
    if block.admission is not None:
        entry = registries["admission_filter"].get(block.admission.type, f"{path}.zch.admission.type")
        admission = entry.build(block.admission.config)
    policy_entry = registries["eviction_policy"].get(block.eviction_policy.type, f"{path}.zch.eviction_policy.type")
    policy = policy_entry.build(block.eviction_policy.config, admission)
    return _counted_module_type()(
        zch_size=config.num_embeddings, device=torch.device("meta"), eviction_policy=policy,
        eviction_interval=block.eviction_interval, input_hash_size=ZCH_ID_SPACE, buckets=buckets, name=config.name,
    )


@functools.cache
def _counted_module_type() -> type:
    """TorchRec's ``MCHManagedCollisionModule``, counting what a user watches (the sharder
    rebuilds each rank's slice with ``type(module)``, so every slice counts)."""
    from torchrec.modules.mc_modules import MCHManagedCollisionModule

    class CountedManagedCollision(MCHManagedCollisionModule):
        """One slice's managed collision, counting in training the ids it looked up, those of
        them that read its miss row (not admitted yet, or evicted), and at its evictions the
        ids newly given a row and those that lost theirs; :meth:`take_counts` reads them (no
        sync until then)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)  # (not "_evicted": TorchRec's own flag)
            self._window_lookups, self._window_admitted, self._window_evicted = 0, 0, 0
            self._window_misses = torch.zeros((), dtype=torch.int64)

        def remap(self, features: Any, mutate_miss_lengths: bool = True, write_weights: Any = None) -> Any:
            remapped = super().remap(features, mutate_miss_lengths, write_weights)
            if self.training:
                miss_row = self._output_global_offset + self._zch_size - 1
                for jagged in remapped.values():
                    values = jagged.values()
                    self._window_lookups += values.numel()
                    self._window_misses = self._window_misses.to(values.device) + (values == miss_row).sum()
            return remapped

        def _update_and_evict(self, *args: Any, **kwargs: Any) -> None:
            before = self._held_ids()
            super()._update_and_evict(*args, **kwargs)
            after = self._held_ids()
            self._window_admitted += int((~torch.isin(after, before)).sum())
            self._window_evicted += int((~torch.isin(before, after)).sum())

        def _held_ids(self) -> torch.Tensor:
            ids = self._mch_sorted_raw_ids
            return ids[ids < ZCH_ID_SPACE].clone()

        def take_counts(self) -> dict[str, float]:
            """This slice's counts since the previous call, and its rows in use now."""
            missed, used = int(self._window_misses), int((self._mch_sorted_raw_ids < ZCH_ID_SPACE).sum())
            counts = {"ids_seen": self._window_lookups, "misses": missed, "miss_share": missed / max(self._window_lookups, 1),
                      "admitted": self._window_admitted, "evicted": self._window_evicted, "rows_in_use": used,
                      "occupancy": used / self._zch_size}
            self._window_lookups, self._window_admitted, self._window_evicted = 0, 0, 0
            self._window_misses = torch.zeros_like(self._window_misses)
            return counts

    return CountedManagedCollision


def zch_counters(model: nn.Module) -> dict[str, dict[str, float]]:
    """Per ``zch`` table, what this rank's slice of it counted since the previous call (a train
    log's window): ``ids_seen`` (ids looked up in training, repeats counted), ``misses`` (of
    them, those that read the miss row: not admitted yet, or evicted), ``miss_share``,
    ``admitted`` (ids the evictions gave a row that held none before them), ``evicted`` (ids
    that held a row before an eviction and none after it), and now: ``rows_in_use`` (rows
    holding an id) and ``occupancy`` (``rows_in_use`` over the slice's rows). Empty without
    ``zch``."""
    return {m._name: m.take_counts() for m in _managed_modules(model).values() if hasattr(m, "take_counts")}


def _managed_collection(configs: Sequence[Any], features: Mapping[str, tuple[str, ZchConfig]],
                        registries: Registries, buckets: int) -> nn.Module:
    """A ``ManagedCollisionEmbeddingCollection`` over ``configs`` (unpooled ``EmbeddingConfig`` s)."""
    from torchrec import EmbeddingCollection
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection
    from torchrec.modules.mc_modules import ManagedCollisionCollection

    modules = {c.name: _managed_module(c, _table_zch(c, features), registries, buckets) for c in configs}  # type: ignore[arg-type]
    collection = EmbeddingCollection(tables=list(configs), device=torch.device("meta"))
    return ManagedCollisionEmbeddingCollection(
        collection, ManagedCollisionCollection(modules, list(configs)), return_remapped_features=False,
    )


def _unpooled(config: Any) -> Any:
    """The ``EmbeddingConfig`` of a bag table (same rows, width, features and initializer)."""
    from torchrec import EmbeddingConfig

    return EmbeddingConfig(
        name=config.name, num_embeddings=config.num_embeddings, embedding_dim=config.embedding_dim,
        feature_names=list(config.feature_names), weight_init_min=config.weight_init_min,
        weight_init_max=config.weight_init_max, init_fn=config.init_fn, data_type=config.data_type,
    )


@torch.fx.wrap
def _pool(embeddings: Mapping[str, Any], keys: list[str], means: list[bool], plain: Any) -> Any:
    """A ``KeyedTensor`` of ``keys``: the pooled rows of each feature's unpooled lookup (``mean``
    where ``means`` says so), or its column of ``plain`` (a bag collection's ``KeyedTensor``)."""
    from torchrec import KeyedTensor

    embeddings = dict(embeddings.items())  # a sharded lookup's answer is awaitable
    tensors = []
    for key, mean in zip(keys, means):
        if key not in embeddings:
            tensors.append(plain[key])
            continue
        jagged = embeddings[key]
        lengths = jagged.lengths()
        rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
        values = jagged.values()
        pooled = torch.zeros(lengths.numel(), values.shape[1], dtype=values.dtype, device=values.device)
        pooled = pooled.index_add(0, rows, values)
        if mean:
            pooled = pooled / lengths.clamp_min(1).unsqueeze(1).to(values.dtype)
        tensors.append(pooled)
    return KeyedTensor.from_tensor_list(keys, tensors)


class ManagedBagCollection(nn.Module):
    """What stands in for an ``EmbeddingBagCollection`` holding ``zch`` tables: its plain tables
    in a bag collection, its ``zch`` tables in a managed-collision ``EmbeddingCollection``
    pooled after the lookup. ``forward(kjt)`` returns a ``KeyedTensor`` of the bag collection's
    keys, in its order."""

    def __init__(self, bags: Any, features: Mapping[str, tuple[str, ZchConfig]], registries: Registries, buckets: int) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, PoolingType

        configs = bags.embedding_bag_configs()
        plain = [c for c in configs if _table_zch(c, features) is None]
        managed = [c for c in configs if _table_zch(c, features) is not None]
        self.plain = EmbeddingBagCollection(tables=plain, is_weighted=bags.is_weighted(), device=torch.device("meta")) if plain else None
        self.managed = _managed_collection([_unpooled(c) for c in managed], features, registries, buckets)
        self.keys = [name for c in configs for name in c.feature_names]
        self.means = [c.pooling == PoolingType.MEAN for c in configs for _ in c.feature_names]

    def forward(self, features: Any) -> Any:
        plain = self.plain(features) if self.plain is not None else None
        embeddings, _ = self.managed(features)
        return _pool(embeddings, self.keys, self.means, plain)


@torch.fx.wrap
def _merged(first: Any, second: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(first.items()) if first is not None else {}
    out.update(dict(second.items()))
    return out


class ManagedCollection(nn.Module):
    """What stands in for an ``EmbeddingCollection`` holding ``zch`` tables: ``forward(kjt)``
    returns the same ``{feature: JaggedTensor}``, the ``zch`` tables' rows looked up through a
    managed-collision collection."""

    def __init__(self, collection: Any, features: Mapping[str, tuple[str, ZchConfig]], registries: Registries, buckets: int) -> None:
        super().__init__()
        from torchrec import EmbeddingCollection

        configs = collection.embedding_configs()
        plain = [c for c in configs if _table_zch(c, features) is None]
        self.plain = EmbeddingCollection(tables=plain, device=torch.device("meta")) if plain else None
        self.managed = _managed_collection([c for c in configs if _table_zch(c, features) is not None], features, registries, buckets)

    def forward(self, features: Any) -> Any:
        plain = self.plain(features) if self.plain is not None else None
        embeddings, _ = self.managed(features)
        return _merged(plain, embeddings)


def swap_managed_collisions(model: nn.Module, cfg: RunConfig, registries: Registries, world_size: int) -> int:
    """Replace, in place, every embedding collection of ``model`` that holds a ``zch`` table by
    its managed-collision stand-in (built on the meta device, like the model's).

    Args:
        model: the user's model (or the module wrapping it).
        cfg: the run's config (which features have ``zch``).
        registries: the run's registries (eviction policies, admission filters).
        world_size: ranks the tables are sharded over (each ``zch`` table gets that many
            buckets of raw ids, one slice per rank).

    Returns:
        How many collections were replaced.

    Raises:
        ConfigError: for a weighted run (``weight_column``): a ``zch`` table is looked up
            unpooled, and TorchRec's managed-collision lookup takes no per-id weights.
    """
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    features = zch_features(cfg)
    if not features:
        return 0
    weighted = [f"features.sparse[{i}].weight_column" for i, f in enumerate(cfg.features.sparse) if f.weight_column]
    if weighted:
        raise ConfigError("features", [ConfigProblem(p, "zch features take no per-id weights (TorchRec's managed-collision "
                                                        "lookup has none); remove weight_column or zch") for p in weighted])
    swaps: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            if any(_table_zch(c, features) for c in module.embedding_bag_configs()):
                swaps.append((name, ManagedBagCollection(module, features, registries, world_size)))
        elif isinstance(module, EmbeddingCollection) and any(_table_zch(c, features) for c in module.embedding_configs()):
            swaps.append((name, ManagedCollection(module, features, registries, world_size)))
    for name, replacement in swaps:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, replacement)
    return len(swaps)


def zch_table_names(modules: Sequence[nn.Module]) -> set[str]:
    """The tables of ``modules`` (embedding collections) that a managed-collision collection holds."""
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection

    return {c.name for m in modules if isinstance(m, ManagedCollisionEmbeddingCollection)
            for c in m._embedding_module.embedding_configs()}


def _managed_modules(model: nn.Module) -> dict[str, Any]:
    """This rank's ``MCHManagedCollisionModule`` s of ``model`` (sharded or not), by module name."""
    from torchrec.modules.mc_modules import MCHManagedCollisionModule

    return {name: m for name, m in model.named_modules() if isinstance(m, MCHManagedCollisionModule)}


def zch_window_state(model: nn.Module) -> dict[str, Any]:
    """What TorchRec's managed-collision modules keep outside their state dict, by module name:
    the ids seen since the last eviction (and the policy's history of them), and the step of
    that eviction. Saved per rank, so that a resumed run evicts at the same steps with the same
    candidates as an uninterrupted one."""
    out = {}
    for name, m in _managed_modules(model).items():
        size, used = m._input_history_buffer_size, m._current_history_buffer_offset
        out[name] = {
            "buffer_size": size, "last_eviction_iter": m._last_eviction_iter, "current_iter": m._current_iter,
            "history": m._history_accumulator[:used].clone() if size > 0 else torch.zeros(0, dtype=torch.int64),
            "metadata": {k: v[:used].clone() for k, v in m._history_metadata.items()},
        }
    return out


def load_zch_window_state(model: nn.Module, saved: Mapping[str, Any]) -> None:
    """Restore :func:`zch_window_state` into ``model``'s managed-collision modules."""
    for name, m in _managed_modules(model).items():
        state = saved.get(name)
        if state is None:
            continue
        size, history = int(state["buffer_size"]), state["history"]
        m._current_iter, m._last_eviction_iter = int(state["current_iter"]), int(state["last_eviction_iter"])
        if size <= 0:
            continue
        m._input_history_buffer_size = size
        m._history_accumulator = torch.empty(size, dtype=torch.int64, device=m.device)
        m._history_accumulator[: history.numel()] = history
        for info in m._eviction_policy.metadata_info:
            if info.is_history_metadata:
                buffer = torch.zeros(size, dtype=torch.int64, device=m.device)
                buffer[: history.numel()] = state["metadata"][info.metadata_name]
                m.register_buffer("_history_" + info.metadata_name, buffer, persistent=False)
                m._history_metadata[info.metadata_name] = buffer
        m._current_history_buffer_offset = history.numel()


def reshard_zch_windows(saved: Sequence[Mapping[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
    """This rank's :func:`zch_window_state` from those of a checkpoint written by another number
    of ranks (``saved``: one per rank that wrote it): per managed module, the ids every old
    slice saw since the last eviction whose raw id falls in this rank's slice now (the slice
    ``raw_id // ceil((2**63 - 1) / world_size)``, as the row-wise lookup routes it), with the
    policy's history of them, in old-rank order; the eviction step as saved."""
    block = (ZCH_ID_SPACE + world_size - 1) // world_size
    out: dict[str, Any] = {}
    for name in dict.fromkeys(n for windows in saved for n in windows):
        states = [windows[name] for windows in saved if name in windows]
        history = torch.cat([s["history"] for s in states])
        mine = torch.div(history, block, rounding_mode="floor") == rank
        metadata = {k: torch.cat([s["metadata"][k] for s in states])[mine] for k in states[0]["metadata"]}
        out[name] = {"buffer_size": sum(max(int(s["buffer_size"]), 0) for s in states) or -1,
                     "last_eviction_iter": states[0]["last_eviction_iter"], "current_iter": states[0]["current_iter"],
                     "history": history[mine], "metadata": metadata}
    return out
