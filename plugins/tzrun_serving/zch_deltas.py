"""What the ``embedding_deltas`` stage tracks of ``zch`` tables (docs/zch.md): the rows that
changed since the last dump, and the raw id each of them holds now.

A ``zch`` table is looked up by TorchRec's sharded managed-collision collection: the ids a
step looks up are raw ids, remapped to rows on the rank whose slice manages them, and every
``eviction_interval`` steps an eviction gives rows to new ids (their weights reset). So a row
changed since the last dump is one that

* a raw id looked up since then holds now, or the slice's miss row (the ids it does not hold
  read that row), or
* holds another raw id than at the last dump (an id admitted, evicted, or both).

That is all of them: a row looked up for an id that no longer holds it holds another id now,
or holds again the id of the last dump, which was then evicted and admitted again, and an id
is admitted only from the ids looked up in the window before the eviction, after the last dump.

Each rank records the raw ids its batches look up (a forward pre-hook on each sharded
managed-collision collection, training only) and keeps its slice's raw id by row as of the last
dump. :meth:`ZchTracking.fold` (collective) gathers every rank's raw ids and turns them, with
the slice's changes, into changed rows, as the stage records rows of other tables; the stage
folds at every dump and before every checkpoint, so a resumed run, whose snapshot is the
checkpoint's map, loses nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs

__all__ = ["ZchTable", "ZchTracking"]

_EMPTY = 2**63 - 1


@attrs.define
class ZchTable:
    """One ``zch`` table this rank holds a slice of.

    Attributes:
        index: the table's index among the stage's tables.
        table: the table's weight FQN (its key in the model's state dict).
        map: its map's FQN (the managed-collision module's key: ``<map>._mch_sorted_raw_ids``).
        slice: this rank's ``MCHManagedCollisionModule`` of it.
        snapshot: the raw id each row of the slice held at the last dump.
    """

    index: int
    table: str
    map: str
    slice: Any
    snapshot: Any = None

    def by_row(self) -> Any:
        """The raw id each row of the slice holds now (``2**63 - 1`` where none)."""
        import torch

        m = self.slice
        out = torch.full((int(m._zch_size),), _EMPTY, dtype=torch.int64, device=m._mch_sorted_raw_ids.device)
        out[m._mch_remapped_ids_mapping - int(m._output_global_offset)] = m._mch_sorted_raw_ids
        return out.cpu()

    def changed_rows(self, raw_ids: Any) -> Any:
        """Global rows of this slice changed since the snapshot, given every rank's raw ids
        looked up since (and the snapshot moves to now)."""
        import torch

        now, offset = self.by_row(), int(self.slice._output_global_offset)
        rows = [torch.nonzero(now != self.snapshot).flatten()]
        if raw_ids.numel():
            order = torch.argsort(now)
            at = torch.searchsorted(now[order], raw_ids).clamp(max=now.numel() - 1)
            rows.append(order[at][now[order][at] == raw_ids])
            rows.append(torch.tensor([now.numel() - 1]))  # the miss row
        self.snapshot = now
        return torch.unique(torch.cat(rows)) + offset

    def map_piece(self, rows: Any) -> dict[str, Any]:
        """The raw id each of ``rows`` (global rows of this slice) holds, as a dump holds it."""
        offset = int(self.slice._output_global_offset)
        return {"rows": rows.clone(), "raw_ids": self.snapshot[rows - offset].clone()}


class ZchTracking:
    """The ``zch`` tables of a model and the raw ids its training steps looked up since the last fold."""

    def __init__(self) -> None:
        self.tables: list[ZchTable] = []
        self.seen: list[tuple[Any, Any]] = []  # (table index of each id, -1: none; raw ids)
        self.handles: list[Any] = []

    def attach(self, model: Any, state_key: Callable[[str, str], str], add_table: Callable[[str], int]) -> set[int]:
        """Find the sharded managed-collision collections of ``model``, record the raw ids each
        looks up in training, and snapshot their slices; ``state_key(path, tail)`` names a state
        entry, ``add_table(fqn)`` adds a table to the stage and returns its index.

        Returns:
            The ``id()`` of each collection's inner embedding collection (the stage does not
            track those as plain tables).
        """
        from torchrec.distributed.mc_embedding_modules import BaseShardedManagedCollisionEmbeddingCollection

        inner = set()
        for path, module in model.named_modules():
            if not isinstance(module, BaseShardedManagedCollisionEmbeddingCollection):
                continue
            inner.add(id(module._embedding_module))
            slices = module._managed_collision_collection._managed_collision_modules
            table_of: dict[str, int] = {}
            for config in module._embedding_module._embedding_configs:
                weight = state_key(path, f"_embedding_module.embeddings.{config.name}.weight")
                raw = state_key(path, f"_managed_collision_collection._managed_collision_modules.{config.name}._mch_sorted_raw_ids")
                table = ZchTable(add_table(weight), weight, raw.removesuffix("._mch_sorted_raw_ids"), slices[config.name])
                table.snapshot = table.by_row()
                self.tables.append(table)
                table_of.update(dict.fromkeys(config.feature_names, table.index))
            self.handles.append(module.register_forward_pre_hook(self._recorder(table_of)))
        return inner

    def _recorder(self, table_of: dict[str, int]) -> Callable[[Any, tuple[Any, ...]], None]:
        index: dict[tuple[str, ...], Any] = {}

        def record(module: Any, args: tuple[Any, ...]) -> None:
            import torch

            if not module.training or not args:
                return
            kjt = args[0]
            keys, values = tuple(kjt.keys()), kjt.values()
            if not keys or values.numel() == 0:
                return
            tables = index.get(keys)
            if tables is None:  # -1: a key of no zch table
                tables = index[keys] = torch.tensor([table_of.get(k, -1) for k in keys], dtype=torch.int64)
            per_key = kjt.lengths().view(len(keys), -1).sum(1)
            which = torch.repeat_interleave(tables.to(values.device), per_key, output_size=values.numel())
            self._add(which, values.long())  # no device sync: split by table at the fold
        return record

    def _add(self, which: Any, raw_ids: Any) -> None:
        self.seen.append((which, raw_ids))
        if len(self.seen) >= 64:
            self.seen = [self._unique()]

    def _unique(self) -> tuple[Any, Any]:
        """The ``(table index, raw id)`` pairs seen since the last fold, each once."""
        import torch

        device = self.seen[0][1].device
        which = torch.cat([w.to(device) for w, _ in self.seen])
        raw = torch.cat([r.to(device) for _, r in self.seen])
        keep = which >= 0
        pairs = torch.unique(torch.stack([which[keep], raw[keep]]), dim=1)
        return pairs[0], pairs[1]

    def fold(self, gather: Callable[[dict[int, Any]], Sequence[dict[int, Any]]]) -> list[tuple[int, Any]]:
        """This rank's changed rows of each ``zch`` table since the last fold: ``(table index,
        global rows)``; ``gather`` (collective) returns every rank's raw ids by table index."""
        import numpy as np
        import torch

        mine: dict[int, Any] = {}
        if self.seen:
            which, raw = (t.cpu() for t in self._unique())
            mine = {int(i): raw[which == i].numpy() for i in torch.unique(which)}
        everyone = gather(mine)
        self.seen = []
        out = []
        for table in self.tables:
            found = [ids[table.index] for ids in everyone if table.index in ids]
            raw_ids = torch.from_numpy(np.unique(np.concatenate(found))) if found else torch.zeros(0, dtype=torch.int64)
            out.append((table.index, table.changed_rows(raw_ids)))
        return out

    def maps(self) -> dict[str, str]:
        """Each map's FQN -> its table's FQN."""
        return {t.map: t.table for t in self.tables}

    def map_pieces(self, changed: dict[int, Any]) -> dict[str, list[dict[str, Any]]]:
        """The raw id each changed row of this rank's slices holds now (``changed``: global
        rows by table index, of any rank: those of this rank's slice are kept)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for table in self.tables:
            rows = changed.get(table.index)
            offset, size = int(table.slice._output_global_offset), int(table.slice._zch_size)
            mine = rows[(rows >= offset) & (rows < offset + size)] if rows is not None else None
            out[table.map] = [table.map_piece(mine)] if mine is not None and mine.numel() else []
        return out

    def remove_hooks(self) -> None:
        """Stop recording."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
