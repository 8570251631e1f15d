"""Where a ``zch`` run's checkpoint keeps its tables, and the id-to-row map as one lookup, for
what reads a checkpoint without the run's sharded model (``tzrec-run export``).

A run swaps each embedding collection holding a ``zch`` table for a stand-in
(:func:`tzrun.runner.zch.swap_managed_collisions`) whose tables sit under other keys: a ``zch``
table under ``<collection>.managed._embedding_module.embeddings.<table>``, a plain table of the
same collection under ``<collection>.plain.<embedding_bags|embeddings>.<table>``, and the
table's map (TorchRec's ``MCHManagedCollisionModule`` buffers, one slice per rank, saved as
one tensor of the whole table) under
``<collection>.managed._managed_collision_collection._managed_collision_modules.<table>``.
:func:`swapped_keys` and :func:`managed_tables` say so for the user's model as its plugin builds
it; :class:`ZchRemap` looks raw ids up in the saved map as the sharded run did.
:func:`zch_state_tables` and :func:`moved_plain_name` read the same layout from state names
alone, for ``--init-from`` across runs with and without ``zch``.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Optional

import attrs
import torch
from torch import nn

from tzrun.config.schema import RunConfig, ZchConfig
from tzrun.data.ids import ZCH_ID_SPACE
from tzrun.runner.zch import zch_features

__all__ = ["ManagedTable", "swapped_keys", "managed_tables", "ZchRemap", "ZchStateTable", "zch_state_tables",
           "moved_plain_name"]

_MAP = "managed._managed_collision_collection._managed_collision_modules"


@attrs.frozen
class ManagedTable:
    """One ``zch`` table of the user's model, and where a checkpoint holds its map.

    Attributes:
        collection: the embedding collection's module name in the user's model.
        table: the table's name.
        features: the features it looks up.
        raw_ids_key: the state key of the raw ids the table's slices hold
            (``_mch_sorted_raw_ids``: each slice sorted, an empty slot ``2**63 - 1``).
        rows_key: the state key of the row each of them holds (``_mch_remapped_ids_mapping``).
    """

    collection: str
    table: str
    features: tuple[str, ...]
    raw_ids_key: str
    rows_key: str


def _key(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _swapped_tables(model: nn.Module, features: Mapping[str, tuple[str, ZchConfig]]) -> Iterator[tuple[str, str, Any, bool]]:
    """``(collection name, its tables' attribute, table config, is zch)`` of every table of
    each collection the swap replaces (one holding a ``zch`` table)."""
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    for name, module in model.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            kind, configs = "embedding_bags", list(module.embedding_bag_configs())
        elif isinstance(module, EmbeddingCollection):
            kind, configs = "embeddings", list(module.embedding_configs())
        else:
            continue
        zch = [any(f in features for f in c.feature_names) for c in configs]
        if any(zch):
            yield from ((name, kind, c, z) for c, z in zip(configs, zch))


def swapped_keys(model: nn.Module, cfg: RunConfig) -> dict[str, str]:
    """Each state key of ``model`` (the user's model as built, not swapped) -> the key the
    run's swapped model holds it under (the same key where the swap moved nothing)."""
    keys = {k: k for k in model.state_dict()}
    for name, kind, config, zch in _swapped_tables(model, zch_features(cfg)):
        where = _key(name, "managed._embedding_module.embeddings") if zch else _key(name, "plain", kind)
        keys[_key(name, kind, config.name, "weight")] = _key(where, config.name, "weight")
    return keys


def managed_tables(model: nn.Module, cfg: RunConfig) -> list[ManagedTable]:
    """The ``zch`` tables of ``model`` (the user's model as built), in module order."""
    return [ManagedTable(name, config.name, tuple(config.feature_names),
                         _key(name, _MAP, config.name, "_mch_sorted_raw_ids"),
                         _key(name, _MAP, config.name, "_mch_remapped_ids_mapping"))
            for name, _, config, zch in _swapped_tables(model, zch_features(cfg)) if zch]


@attrs.frozen
class ZchStateTable:
    """One ``zch`` table as a set of state names (a model's or a checkpoint's) shows it.

    Attributes:
        table: the table's name.
        weight: the state name of its rows.
        map_prefix: the prefix (ending in ``.``) of the state names of its id-to-row map and
            its policy's per-row values (``_mch_sorted_raw_ids``, ``_mch_counts``, ...).
    """

    table: str
    weight: str
    map_prefix: str

    def holds(self, name: str) -> bool:
        """Whether ``name`` is one of this table's state names (its rows or its map)."""
        return name == self.weight or name.startswith(self.map_prefix)


def zch_state_tables(names: Iterable[str]) -> list[ZchStateTable]:
    """The ``zch`` tables among state ``names`` (those of a swapped model, without the
    ``model.`` of a checkpoint entry): each table whose id-to-row map is there."""
    suffix = "._mch_sorted_raw_ids"
    out = []
    for name in names:
        collection, marker, rest = f".{name}".partition(f".{_MAP}.")
        if not marker or not name.endswith(suffix) or "." in rest.removesuffix(suffix):
            continue
        table, collection = rest.removesuffix(suffix), collection[1:]
        out.append(ZchStateTable(table, _key(collection, "managed._embedding_module.embeddings", table, "weight"),
                                 _key(collection, _MAP, table) + "."))
    return out


def moved_plain_name(name: str) -> Optional[str]:
    """The state name a plain table's rows have on the other side of the swap: in a collection
    the swap replaced (``<collection>.plain.embedding_bags.<table>.weight``), the name they have
    where it did not (``<collection>.embedding_bags.<table>.weight``), and the reverse; None for
    a name that is no table's rows (or a ``zch`` table's)."""
    parts = name.split(".")
    if len(parts) < 3 or parts[-1] != "weight" or parts[-3] not in ("embedding_bags", "embeddings") or (
            "_embedding_module" in parts):
        return None
    plain = len(parts) > 3 and parts[-4] == "plain"
    return ".".join([*parts[:-4]] + parts[-3:] if plain else [*parts[:-3], "plain", *parts[-3:]])


class ZchRemap(nn.Module):
    """One ``zch`` table's id-to-row map in plain torch (``torch.export`` traces it to aten
    operators): ``forward(raw_ids)`` returns each id's row, the row its slice gave it, or, for
    an id the table does not hold (never admitted, or evicted), the miss row of the slice the
    run looked it up in: the last row of slice ``raw_id // ceil((2**63 - 1) / buckets)``, as
    TorchRec's row-wise managed-collision lookup reads it.

    Args:
        raw_ids: the raw ids of the whole table, slice after slice (a checkpoint's
            :attr:`ManagedTable.raw_ids_key`), ``2**63 - 1`` in an empty slot.
        rows: the row each of them holds (:attr:`ManagedTable.rows_key`).
        buckets: the slices (the ranks the run that saved them had).
    """

    raw_ids: torch.Tensor
    rows: torch.Tensor

    def __init__(self, raw_ids: torch.Tensor, rows: torch.Tensor, buckets: int) -> None:
        super().__init__()
        order = torch.argsort(raw_ids, stable=True)
        self.register_buffer("raw_ids", raw_ids[order].to(torch.int64).contiguous())
        self.register_buffer("rows", rows[order].to(torch.int64).contiguous())
        self.slice_rows = raw_ids.numel() // buckets
        self.block = (ZCH_ID_SPACE + buckets - 1) // buckets

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        at = torch.searchsorted(self.raw_ids, ids).clamp(max=self.raw_ids.numel() - 1)
        held = self.raw_ids[at] == ids
        miss = (torch.div(ids, self.block, rounding_mode="floor") + 1) * self.slice_rows - 1
        return torch.where(held, self.rows[at], miss)

    def held(self) -> int:
        """How many ids hold a row."""
        return int((self.raw_ids < ZCH_ID_SPACE).sum())
