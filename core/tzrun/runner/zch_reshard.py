"""Loading a ``zch`` checkpoint into more ranks than wrote it (1 -> 2, 2 -> 4; docs/zch.md,
Checkpoints and resume).

On fewer ranks each new slice is whole old slices, and DCP's row-wise resharding places every
map and row where it belongs. On more ranks it cannot: a slice of the new table manages the raw
ids ``raw_id // ceil((2**63 - 1) / ranks) == rank``, which the old slices held at rows of their
own anywhere in the table. So the load goes in two parts:

1. everything but the ``zch`` tables' maps and weights loads as usual (the model through
   :meth:`ZchGrowth.model_state`, which leaves those keys out: DCP would place them by
   position, and TorchRec's check of the loaded output ranges would refuse them);
2. :meth:`ZchGrowth.place` reads each ``zch`` table whole with DCP into plain tensors (its map:
   the sorted raw ids, the row each holds, the policy's per-id counts or times; its weights and
   every sparse optimizer state of its rows), and each rank builds its own slice from them
   (:func:`place_slice`): the ids routed to it, at rows of its slice, each row's weights and
   optimizer state copied from the row the id held; the slice's miss row from the miss row of
   the old slice that managed the new slice's ids. A slice that would receive more ids than it
   has rows (``rows - 1``: one is the miss row) keeps those its policy values most
   (:func:`keep_scores`); the others read the miss row, as if evicted.

``--init-from`` (:mod:`tzrun.runner.init_from`) loads the same way, with its own name
matching: ``sources`` says under which checkpoint name each live state key of a ``zch`` table
is saved (a renamed table), and which tables to place at all (one started fresh is left as it
is).

Cost: every rank reads every ``zch`` table whole (weights, optimizer states and map) once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import attrs
import torch
from torch import nn

from tzrun.data.ids import ZCH_ID_SPACE
from tzrun.errors import CheckpointError
from tzrun.io.storage import as_path
from tzrun.runner.checkpoint import load_checkpoint

__all__ = ["grows_zch_slices", "keep_scores", "SlicePlacement", "place_slice", "ZchGrowth"]

log = logging.getLogger("tzrun")

_MAPS = "._managed_collision_collection._managed_collision_modules."
#: the map's replicated buffer that TorchRec checks against the live slice's output range
_SEGMENTS = "_output_segments_tensor"


def grows_zch_slices(model: nn.Module, written_by: Any, world_size: int) -> bool:
    """Whether ``model`` holds ``zch`` tables and loads a checkpoint written by a number of
    ranks that ``world_size`` does not divide (1 -> 2, 2 -> 4): its maps must then be split by
    raw id (:class:`ZchGrowth`), not by position."""
    from tzrun.runner.zch import _managed_modules

    return isinstance(written_by, int) and written_by % world_size != 0 and bool(_managed_modules(model))


def keep_scores(policy: Any, metadata: Mapping[str, torch.Tensor], current_iter: int) -> torch.Tensor:
    """How much ``policy`` values each held id, from the per-id state it keeps (``metadata``,
    its ``_mch_<name>`` buffers): ``counts / (current_iter - last_access_iter + 1) **
    decay_exponent`` for ``distance_lfu``, ``counts`` for ``lfu``, ``last_access_iter`` for
    ``lru`` (higher is kept first), as TorchRec's policies score them at an eviction. A policy
    keeping neither (a third party's) values all ids alike: the lowest raw ids are kept."""
    counts, last = metadata.get("counts"), metadata.get("last_access_iter")
    if counts is not None and last is not None:
        distance = (current_iter - last + 1).clamp_min(1).double() ** float(getattr(policy, "_decay_exponent", 1.0))
        return counts.double() / distance
    if counts is not None:
        return counts.double()
    if last is not None:
        return last.double()
    size = next(iter(metadata.values())).numel() if metadata else 0
    return torch.zeros(size, dtype=torch.float64)


@attrs.frozen
class SlicePlacement:
    """One new slice of a ``zch`` table, built from the old table's whole map.

    Attributes:
        raw_ids: the slice's sorted raw ids (``2**63 - 1`` in an empty slot; the last slot is
            always empty: its row is the miss row).
        rows: the (global) row each slot holds: the slice's rows in order.
        metadata: the policy's per-slot state, by name (zero in an empty slot).
        sources: per row of the slice, the old global row whose weights and optimizer state
            it takes (-1: none, an empty row).
        dropped: ids routed to this slice that did not fit (they read the miss row).
    """

    raw_ids: torch.Tensor
    rows: torch.Tensor
    metadata: dict[str, torch.Tensor]
    sources: torch.Tensor
    dropped: int


def place_slice(raw_ids: torch.Tensor, rows: torch.Tensor, metadata: Mapping[str, torch.Tensor], scores: torch.Tensor,
                *, rank: int, world_size: int, written_by: int) -> SlicePlacement:
    """Slice ``rank`` of ``world_size`` of a ``zch`` table whose whole map (``raw_ids``, the
    ``rows`` they hold, the policy's ``metadata``; as saved by ``written_by`` ranks, slice after
    slice) is given: the held ids the row-wise lookup routes to it (``raw_id // ceil((2**63 - 1)
    / world_size) == rank``), as many as fit by descending ``scores`` (ties: lower raw id),
    at the slice's first rows in raw id order; its miss row (last) from the miss row of the old
    slice that managed the raw id the new slice starts at."""
    total = raw_ids.numel()
    size, old_size = total // world_size, total // written_by
    block, old_block = (ZCH_ID_SPACE + world_size - 1) // world_size, (ZCH_ID_SPACE + written_by - 1) // written_by
    mine = torch.nonzero((raw_ids < ZCH_ID_SPACE) & (torch.div(raw_ids, block, rounding_mode="floor") == rank)).flatten()
    mine = mine[torch.argsort(raw_ids[mine], stable=True)]
    dropped = max(mine.numel() - (size - 1), 0)
    if dropped:
        best = mine[torch.argsort(scores[mine], descending=True, stable=True)[: size - 1]]
        mine = best[torch.argsort(raw_ids[best], stable=True)]
    empty = size - mine.numel()
    old_miss = (rank * block // old_block) * old_size + old_size - 1
    return SlicePlacement(
        raw_ids=torch.cat([raw_ids[mine], torch.full((empty,), ZCH_ID_SPACE, dtype=raw_ids.dtype)]),
        rows=torch.arange(rank * size, (rank + 1) * size, dtype=rows.dtype),
        metadata={k: torch.cat([v[mine], torch.zeros(empty, dtype=v.dtype)]) for k, v in metadata.items()},
        sources=torch.cat([rows[mine].long(), torch.full((empty - 1,), -1, dtype=torch.long), torch.tensor([old_miss])]),
        dropped=dropped,
    )


def _saved_tensors(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Each tensor of the checkpoint at ``path``: its whole shape and dtype (DCP's metadata, read safely)."""
    from tzrun.runner.dcp_metadata import read_metadata

    name = as_path(path) / "state" / ".metadata"
    with name.open("rb") as f:
        entries = read_metadata(f, str(name)).state_dict_metadata
    return {k: (tuple(e.size), e.properties.dtype) for k, e in entries.items() if hasattr(e, "size")}


def _local(value: Any) -> tuple[torch.Tensor, int]:
    """A live state value's local rows (a view, written in place) and the first global row."""
    shards = value.local_shards() if hasattr(value, "local_shards") else None
    if shards is None:
        return value, 0
    return shards[0].tensor, int(shards[0].metadata.shard_offsets[0])


@attrs.define
class _Table:
    """One ``zch`` table of the live model: its map module, state keys and optimizer state keys."""

    name: str
    module: Any
    map_keys: dict[str, str]  # buffer name -> model state key
    weight_key: str
    optimizer_keys: list[str]  # flat DCP keys under ``optimizer.state``
    saved: dict[str, str]  # each DCP key above (``model.<key>`` for the model's) -> the checkpoint's key


class _ModelWithoutMaps:
    """The run's model as a ``Stateful`` for DCP, without the keys :meth:`ZchGrowth.place`
    loads itself: they keep their live values through ``load_state_dict``."""

    def __init__(self, model: nn.Module, keys: set[str]) -> None:
        self.model, self.keys = model, keys

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.model.state_dict().items() if k not in self.keys}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        live = self.model.state_dict()
        self.model.load_state_dict({**state, **{k: live[k] for k in self.keys}})


class ZchGrowth:
    """Loads the ``zch`` tables of a checkpoint written by fewer ranks (module docstring).

    Args:
        model: the run's sharded model.
        optimizer: its optimizer (None: weights only, ``evaluate`` and ``predict --checkpoint``).
        written_by: the number of ranks that wrote the checkpoint.
        rank: this rank.
        world_size: the ranks now.
        sources: ``{model state key: checkpoint state key}`` (both as ``model.state_dict()``
            names them) of the keys to load (``--init-from``'s matching: renames included): a
            ``zch`` table whose weights are not among them is left as it is, a map buffer not
            among them keeps its live values. None: every table, each key under its own name
            (``--resume``, ``evaluate``, ``predict --checkpoint``).
    """

    def __init__(self, model: nn.Module, optimizer: Any, written_by: int, rank: int, world_size: int, *,
                 sources: Mapping[str, str] | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        self.written_by, self.rank, self.world_size = written_by, rank, world_size
        self.tables = self._tables(sources)
        self.dropped: dict[str, int] = {}

    def _tables(self, sources: Mapping[str, str] | None) -> list[_Table]:
        from tzrun.runner.zch import _managed_modules

        state = self.model.state_dict()
        named = sources if sources is not None else {k: k for k in state}
        modules = {m._mch_sorted_raw_ids.data_ptr(): m for m in _managed_modules(self.model).values()}
        optimizer_keys = self._optimizer_keys()
        tables = []
        for key in [k for k in state if k.endswith("._mch_sorted_raw_ids")]:
            prefix = key[: -len("._mch_sorted_raw_ids")]
            collection, _, table = prefix.rpartition(_MAPS)
            weight = f"{collection}._embedding_module.embeddings.{table}.weight"
            if weight not in named:
                continue
            maps = {k[len(prefix) + 1:]: k for k in state if k.startswith(prefix + ".") and k in named
                    and (hasattr(state[k], "local_shards") or k.endswith(_SEGMENTS))}
            module = modules[_local(state[key])[0].data_ptr()]
            optimizer = [k for k in optimizer_keys if f".{weight}." in k]
            saved = {f"model.{k}": f"model.{named[k]}" for k in (weight, *maps.values())}
            saved.update({k: k.replace(f".{weight}.", f".{named[weight]}.") for k in optimizer})
            tables.append(_Table(table, module, maps, weight, optimizer, saved))
        return tables

    def _optimizer_keys(self) -> list[str]:
        if self.optimizer is None:
            return []
        return [f"optimizer.state.{param}.{name}" for param, states in self.optimizer.state_dict()["state"].items()
                for name, value in states.items() if hasattr(value, "local_shards")]

    def model_keys(self) -> set[str]:
        """The model state keys :meth:`place` loads (the ``zch`` tables' maps and weights):
        the load of everything else leaves them out."""
        return {k for t in self.tables for k in (t.weight_key, *t.map_keys.values())}

    def model_state(self) -> Any:
        """The ``"model"`` entry to load in place of the model: all of it but
        :meth:`model_keys`."""
        return _ModelWithoutMaps(self.model, self.model_keys())

    def place(self, path: Path, *, verify_reads: bool) -> dict[str, int]:
        """After the load of everything else: read the ``zch`` tables whole from the
        checkpoint at ``path`` (collective; ``verify_reads`` as :func:`load_checkpoint`) and
        build this rank's slice of each. Returns, per table, the ids routed to this slice that
        did not fit (a warning names them).

        Raises:
            CheckpointError: when the checkpoint does not hold one of the tables.
        """
        saved = _saved_tensors(path)
        for t in self.tables:  # a state of one value per table (not per row) loaded as it was saved
            rows = saved.get(t.saved[f"model.{t.weight_key}"], ((0,), torch.float32))[0][:1]
            t.optimizer_keys = [k for k in t.optimizer_keys
                                if t.saved[k] not in saved or saved[t.saved[k]][0][:1] == rows]
        missing = [k for k in self._whole_keys() if k not in saved]
        if missing:
            raise CheckpointError(f"{path}: does not hold {missing[0]} (written by another kind of run); use the "
                                  "config it was trained with")
        whole = {key: torch.empty(saved[key][0], dtype=saved[key][1]) for key in self._whole_keys()}
        load_checkpoint(path, whole, verify=False, verify_reads=verify_reads)
        live_model = self.model.state_dict()
        live_optimizer = self._live_optimizer()
        for table in self.tables:
            self.dropped[table.name] = dropped = self._place_table(table, whole, live_model, live_optimizer)
            if dropped:
                log.warning("zch table %s: %d id(s) the checkpoint held do not fit slice %d of %d (%d rows): those "
                            "its eviction policy values least read the miss row, as if evicted", table.name, dropped,
                            self.rank, self.world_size, table.module._zch_size)
        return self.dropped

    def _whole_keys(self) -> list[str]:
        """The checkpoint keys :meth:`place` reads whole."""
        keys = []
        for t in self.tables:
            live = [f"model.{k}" for n, k in t.map_keys.items() if n != _SEGMENTS]
            keys += [t.saved[k] for k in (*live, f"model.{t.weight_key}", *t.optimizer_keys)]
        return keys

    def _live_optimizer(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {}
        return {f"optimizer.state.{param}.{name}": value for param, states in self.optimizer.state_dict()["state"].items()
                for name, value in states.items()}

    @torch.no_grad()
    def _place_table(self, table: _Table, whole: Mapping[str, torch.Tensor], live_model: Mapping[str, Any],
                     live_optimizer: Mapping[str, Any]) -> int:
        saved = {name: whole[table.saved[f"model.{key}"]] for name, key in table.map_keys.items() if name != _SEGMENTS}
        metadata = {name[len("_mch_"):]: value for name, value in saved.items()
                    if name.startswith("_mch_") and name not in ("_mch_sorted_raw_ids", "_mch_remapped_ids_mapping")}
        module = table.module
        scores = keep_scores(module._eviction_policy, metadata, int(module._current_iter_tensor.item()))
        slice_ = place_slice(saved["_mch_sorted_raw_ids"], saved["_mch_remapped_ids_mapping"], metadata, scores,
                             rank=self.rank, world_size=self.world_size, written_by=self.written_by)
        module._mch_sorted_raw_ids.copy_(slice_.raw_ids)
        module._mch_remapped_ids_mapping.copy_(slice_.rows)
        for name, value in slice_.metadata.items():
            getattr(module, f"_mch_{name}").copy_(value)
        sources = slice_.sources
        taken = sources >= 0
        rows = [(live_model[table.weight_key], whole[table.saved[f"model.{table.weight_key}"]], False)]
        rows += [(live_optimizer[k], whole[table.saved[k]], True) for k in table.optimizer_keys]
        for live, old, zero_empty in rows:
            local, first = _local(live)
            if first != int(slice_.rows[0]) or local.shape[0] != sources.numel():
                raise CheckpointError(f"zch table {table.name}: rank {self.rank} holds rows {first}-{first + local.shape[0]} "
                                      f"of its table, not slice {self.rank} of {self.world_size}: the plan does not shard "
                                      "it row-wise in rank order (report this)")
            local[taken] = old[sources[taken]].to(local.dtype)
            if zero_empty:
                local[~taken] = 0
        return slice_.dropped
