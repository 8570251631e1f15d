"""Cost-aware batches (``data.batch_cost_size``): a batch closes when its summed row cost would
pass the cap.

A row's cost is the value of a numeric column (``data.sample_cost = "<column>"``), or, with
``data.sample_cost = "sequence_length"`` (the default), 1 plus the lengths of its sequences
after truncation (each ``[[features.sequence]]`` group's length, at most its ``max_len``).
Batches still hold at most ``data.batch_size`` rows. A row whose cost alone passes the cap is a
batch of its own (a warning says how many there were).

The batches are planned before a pass from the cost columns only, for every rank's rows
(:func:`cost_split`): each rank knows every rank's batch count without a collective, ranks
with fewer batches feed padding batches as with fixed-size batches, and the plan depends only
on the input and the layout, so a resumed pass yields the same batches (exact resume).
Reading the cost columns is one extra pass over those columns per epoch layout (for
``sequence_length``: the first column of each sequence group) on every rank.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional, Sequence

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun.config.schema import SEQUENCE_LENGTH
from tzrun.errors import DataError

if TYPE_CHECKING:
    from tzrun.data.dataset import RankSplit
    from tzrun.interfaces import Reader, RowGroup

__all__ = ["SEQUENCE_LENGTH", "SequenceCost", "BatchCost", "batch_bounds", "cost_split"]

log = logging.getLogger(__name__)

#: ``data.sample_cost`` that makes a row's cost its total sequence length, + 1.


@attrs.frozen
class SequenceCost:
    """How one sequence group adds to a row's cost: the length of ``column`` (a list column, or
    a string column of ids split on ``separator``, empty pieces ignored), at most ``max_len``
    (what every ``keep`` rule leaves: a longer row under ``keep = "all"`` is a bad row)."""

    column: str
    max_len: int
    separator: Optional[str] = None


@attrs.frozen
class BatchCost:
    """``data.batch_cost_size`` with its ``data.sample_cost``, resolved.

    Attributes:
        cap: the most a batch's rows may cost together (a single row over it: a batch alone).
        sample_cost: ``"sequence_length"`` or a column name (as configured; it is part of the layout).
        column: the cost column (``None`` for ``sequence_length``).
        sequences: the sequence groups summed for ``sequence_length``.
    """

    cap: int
    sample_cost: str
    column: Optional[str] = None
    sequences: tuple[SequenceCost, ...] = ()

    def columns(self) -> list[str]:
        """The input columns the costs are read from."""
        return [self.column] if self.column is not None else list(dict.fromkeys(s.column for s in self.sequences))

    def costs(self, batch: pa.RecordBatch | pa.Table, source: str) -> np.ndarray:
        """The cost of each row of ``batch`` (float64).

        Raises:
            DataError: a cost column value is null, NaN or negative (naming the file and column).
        """
        if self.column is not None:
            values = batch.column(self.column)
            if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
                raise DataError(f"{source}: column '{self.column}' (data.sample_cost) holds {values.type}, not numbers; "
                                "name a numeric column")
            costs = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
            if values.null_count or np.isnan(costs).any() or (costs < 0).any():
                raise DataError(f"{source}: column '{self.column}' (data.sample_cost) holds a null, NaN or negative "
                                "cost; fill it with a non-negative number")
            return costs
        total = np.ones(batch.num_rows, dtype=np.float64)
        for seq in self.sequences:
            total += np.minimum(_lengths(batch.column(seq.column), seq.separator), seq.max_len)
        return total


def _lengths(column: Any, separator: Optional[str]) -> np.ndarray:
    """Ids per row of a sequence column (null: 0)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        pieces = pc.split_pattern(column, separator or ";")
        flat = pc.list_flatten(pieces)
        offsets = np.asarray(pieces.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        nonempty = np.concatenate([[0], np.cumsum(pc.not_equal(flat, "").to_numpy(zero_copy_only=False))])
        counts = nonempty[offsets[1:] - offsets[0]] - nonempty[offsets[:-1] - offsets[0]]
        return np.where(column.is_null().to_numpy(zero_copy_only=False), 0, counts)
    lengths = pc.list_value_length(column).fill_null(0)
    return np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)


def batch_bounds(costs: np.ndarray, cap: float, batch_size: int) -> tuple[np.ndarray, int]:
    """Greedy batches over rows of ``costs`` in order: a batch takes rows while it has fewer
    than ``batch_size`` and its summed cost stays at most ``cap``; a row costing more than
    ``cap`` alone is a batch of its own.

    Returns:
        ``(bounds, alone)``: the first row of each batch followed by the row count
        (``bounds[i]:bounds[i + 1]`` is batch ``i``), and how many rows were over the cap alone.
    """
    n = costs.size
    cumulative = np.concatenate([[0.0], np.cumsum(costs)])
    bounds = [0]
    start = 0
    while start < n:
        end = int(np.searchsorted(cumulative, cumulative[start] + cap, side="right")) - 1
        end = min(max(end, start + 1), start + batch_size, n)
        bounds.append(end)
        start = end
    alone = int((costs > cap).sum())
    return np.asarray(bounds, dtype=np.int64), alone


def _read_costs(reader: "Reader", whole: "RankSplit", cost: BatchCost) -> np.ndarray:
    """The cost of every row of ``whole`` (one split holding all the pass's rows), in order."""
    from tzrun.data.pieces import group_pieces, read_pieces

    parts: list[np.ndarray] = []
    for group, pieces in group_pieces(whole.segments, 0, whole.num_rows):
        for record_batch, path, _ in read_pieces(reader, group, pieces, cost.columns(), lambda *_: None):
            parts.append(cost.costs(record_batch, path))
    return np.concatenate(parts) if parts else np.zeros(0)


def cost_split(
    groups: Sequence["RowGroup"],
    rank: int,
    world_size: int,
    batch_size: int,
    rows: Sequence[tuple[int, int]] | None,
    reader: "Reader",
    cost: BatchCost,
) -> "RankSplit":
    """Rank ``rank``'s share of ``groups`` (as :func:`~tzrun.data.dataset.split_rows`: the same
    rows), cut into cost-aware batches; ``steps`` is the most batches any rank has."""
    from tzrun.data.dataset import split_rows

    costs = _read_costs(reader, split_rows(groups, 0, 1, batch_size, rows), cost)
    count = costs.size
    edges = [count * r // world_size for r in range(world_size + 1)]
    plans = [batch_bounds(costs[edges[r]:edges[r + 1]], cost.cap, batch_size) for r in range(world_size)]
    alone = sum(a for _, a in plans)
    if alone and rank == 0:
        log.warning("data.batch_cost_size = %s: %d row(s) cost more than that alone; each is a batch of its own",
                    cost.cap, alone)
    mine = split_rows(groups, rank, world_size, batch_size, rows)
    bounds = plans[rank][0]
    return attrs.evolve(mine, num_batches=len(bounds) - 1, steps=max(len(b) - 1 for b, _ in plans),
                        bounds=tuple(int(b) for b in bounds))
