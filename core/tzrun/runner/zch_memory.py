"""The memory of a ``zch`` table's managed state, as ``tzrec-run plan`` and ``check``'s host-memory
check count it (docs/zch.md, Memory).

Each rank's slice of a ``zch`` table is one TorchRec ``MCHManagedCollisionModule``, which holds,
beside the table's rows:

* per row, one ``int64`` each: the sorted raw ids (``_mch_sorted_raw_ids``), the row each holds
  (``_mch_remapped_ids_mapping``) and every per-row value its eviction policy keeps
  (``_mch_<name>`` for each of the policy's ``metadata_info`` with ``is_mch_metadata``: ``lfu``
  its counts, ``lru`` its last lookup's step, ``distance_lfu`` both);
* per slice, a fixed ``int64[1025]`` (``_output_segments_tensor``, TorchRec's 1,024-shard limit)
  and three ``int64[1]`` (``_current_iter_tensor``, ``_mch_slots``, ``_delimiter``);
* from its first training step, the window of ids seen since the last eviction: one ``int64``
  per id (``_history_accumulator``) and one per id for each history value of the policy
  (``_history_<name>``), ``int(ids in the first batch x eviction_interval x 1.25)`` ids long
  (TorchRec's sizing). The plan estimates the ids of a batch as the planner does: batch size
  times the pooling factor of each feature reading the table (1.0 unless constrained).

The managed state lives on the compute device (HBM on CUDA, host memory on CPU), whatever
kernel holds the rows.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
from torch import nn

__all__ = ["ManagedState", "managed_states", "managed_bytes", "SLICE_FIXED_BYTES"]

_INT64 = 8
#: ``_output_segments_tensor`` (1,025 values) and ``_current_iter_tensor``, ``_mch_slots``, ``_delimiter``
SLICE_FIXED_BYTES = (1025 + 3) * _INT64


@attrs.frozen
class ManagedState:
    """One ``zch`` table's managed state, per slice (one slice per rank).

    Attributes:
        table: the table's name.
        per_row: bytes per row of the slice (raw id, its row, the policy's per-row values).
        per_window_id: bytes per id of the window (the id and the policy's history values).
        eviction_interval: steps between evictions (the window's length).
    """

    table: str
    per_row: int
    per_window_id: int
    eviction_interval: int

    def window_ids(self, ids_per_step: float) -> int:
        """The window's length in ids, for a first batch of ``ids_per_step`` ids of the slice."""
        return int(int(ids_per_step) * self.eviction_interval * 1.25)

    def slice_bytes(self, rows: int, ids_per_step: float = 0) -> int:
        """Bytes of one slice of ``rows`` rows, its window sized for ``ids_per_step`` ids a step
        (0: the slice as built, before its first training step)."""
        return rows * self.per_row + SLICE_FIXED_BYTES + self.window_ids(ids_per_step) * self.per_window_id


def managed_states(model: nn.Module) -> dict[str, ManagedState]:
    """The managed state of every ``zch`` table of ``model`` (swapped for managed collision,
    sharded or not), by table name: read from its ``MCHManagedCollisionModule`` s' eviction
    policies. Empty without ``zch``."""
    from torchrec.modules.mc_modules import MCHManagedCollisionModule

    out = {}
    for module in model.modules():
        if isinstance(module, MCHManagedCollisionModule):
            out[str(module._name)] = _state(module)
    return out


def _state(module: Any) -> ManagedState:
    info = list(module._eviction_policy.metadata_info)
    per_row = (2 + sum(1 for m in info if m.is_mch_metadata)) * _INT64
    per_window_id = (1 + sum(1 for m in info if m.is_history_metadata)) * _INT64
    return ManagedState(str(module._name), per_row, per_window_id, int(module._eviction_interval))


def managed_bytes(states: Mapping[str, ManagedState], table: str, rows: int, ids_per_step: float) -> int:
    """Bytes of one slice of ``table`` (0 for a table without ``zch``)."""
    state = states.get(table)
    return 0 if state is None else state.slice_bytes(rows, ids_per_step)
