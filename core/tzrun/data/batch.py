"""The batch type every model receives: dense floats, a KeyedJaggedTensor of ids, labels, weights."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import attrs
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

__all__ = ["Batch", "SkippedRows", "tally_skipped"]


@attrs.define
class SkippedRows:
    """Input rows dropped for bad values (``data.on_bad_row = "skip"``), and why.

    A batch carries the counts of its own rows, so they travel with it out of DataLoader
    workers and across devices; add the batches' counts up to get a pass's or a run's.

    Attributes:
        rows: rows dropped.
        problems: rows per problem, keyed ``"<column>: <problem>"``, e.g.
            ``"cat_3: id outside [0, 1000)"``, ``"label: NaN"``, ``"weight: negative"``. A row
            with several problems counts under each, so these can add up to more than ``rows``.
        read: input rows read in all, the dropped ones included (counted by
            :func:`tally_skipped`; not compared by ``==``). 0 in a batch's own counts, but for
            a batch a row sampler expanded (its input rows: :mod:`tzrun.data.sampling`).
    """

    rows: int = 0
    problems: dict[str, int] = attrs.field(factory=dict)
    read: int = attrs.field(default=0, eq=False)

    def add(self, other: "SkippedRows") -> None:
        """Add ``other``'s counts to these (``other`` is left as it is)."""
        self.rows += other.rows
        self.read += other.read
        for problem, count in other.problems.items():
            self.problems[problem] = self.problems.get(problem, 0) + count

    def __bool__(self) -> bool:
        return self.rows > 0

    def __str__(self) -> str:
        """``"15 rows (cat_3: id outside [0, 1000): 12, label: NaN: 4)"``, most frequent problem first."""
        parts = ", ".join(f"{p}: {n}" for p, n in sorted(self.problems.items(), key=lambda item: (-item[1], item[0])))
        return f"{self.rows} row{'' if self.rows == 1 else 's'}" + (f" ({parts})" if parts else "")

    def to_json(self) -> dict[str, Any]:
        """Plain data, for ``all_gather_object`` or a checkpoint's metadata."""
        return {"rows": self.rows, "problems": dict(self.problems), "read": self.read}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SkippedRows":
        """The inverse of :meth:`to_json`."""
        return cls(int(data["rows"]), {str(k): int(v) for k, v in data["problems"].items()}, int(data.get("read", 0)))


def tally_skipped(batches: Iterable["Batch"], into: SkippedRows) -> Iterator["Batch"]:
    """``batches``, unchanged, adding each one's :attr:`Batch.skipped` to ``into`` as it is taken,
    and its rows, real and skipped, to ``into.read``.

    A train pipeline takes a batch or two ahead of the step it trains, so ``into`` can run
    ahead of the steps done by that much.
    """
    for batch in batches:
        into.add(batch.skipped)  # a batch a sampler expanded records its input rows as read
        if not batch.skipped.read:
            into.read += batch.num_rows + batch.skipped.rows
        yield batch


class Batch(Pipelineable):
    """One batch of rows on one rank; TorchRec's train pipelines move it between devices.

    Attributes:
        dense: ``[rows, num_dense_features]`` float32, in ``features.dense`` order. With
            ``[data.sampler]``, ``dense`` and ``sparse`` have ``num_negatives`` more rows than
            ``weights``: the sampled items, after the batch's own rows
            (:mod:`tzrun.data.sampling`).
        sparse: the id features, one key per ``features.sparse`` entry.
        labels: each label column as ``[rows]`` float32.
        weights: ``[rows]`` float32 sample weights; 0 marks padding rows, which every loss and
            metric must ignore.
        num_rows: rows that are real data (not padding).
        groups: group-key columns (``group_by`` of losses and metrics) as ``[rows]`` int64;
            strings are FNV-1a 64 hashes.
        skipped: input rows left out of this batch for bad values (none unless
            ``data.on_bad_row = "skip"``); not counted in ``num_rows``.
        sequence: the ids looked up unpooled, one key per sequence of every
            ``[[features.sequence]]`` group (at most ``max_len`` ids a row, as its ``keep`` says),
            then one per sparse feature of ``ModelContext.unpooled_sparse_features()``; one row
            per row of ``weights``. An empty KeyedJaggedTensor when the run has no sequences.
            :class:`tzrun.sequence.SequenceEmbeddings` looks it up.
        sequence_dense: per ``[[features.sequence]]`` group with ``[[features.sequence.dense]]``
            sequences, ``[rows, max_len, k]`` float32: its ``k`` numeric sequences, normalised,
            each row left-aligned with the group's ids and zeros after them (one row per row of
            ``weights``). Empty without dense sequences.
    """

    def __init__(
        self,
        dense: torch.Tensor,
        sparse: KeyedJaggedTensor,
        labels: Mapping[str, torch.Tensor],
        weights: torch.Tensor,
        num_rows: int,
        groups: Mapping[str, torch.Tensor] | None = None,
        skipped: SkippedRows | None = None,
        sequence: KeyedJaggedTensor | None = None,
        sequence_dense: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.dense = dense
        self.sparse = sparse
        self.labels = dict(labels)
        self.weights = weights
        self.num_rows = num_rows
        self.groups = dict(groups or {})
        self.skipped = skipped if skipped is not None else SkippedRows()
        self.sequence = sequence if sequence is not None else _no_sequences(int(weights.shape[0]), weights.device)
        self.sequence_dense = dict(sequence_dense or {})

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        """This batch on ``device``."""
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.labels.items()},
            self.weights.to(device, non_blocking=non_blocking),
            self.num_rows,
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.groups.items()},
            self.skipped,
            self.sequence.to(device, non_blocking=non_blocking),
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.sequence_dense.items()},
        )

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as used on ``stream`` (CUDA pipelines)."""
        self.dense.record_stream(stream)
        self.sparse.record_stream(stream)
        for v in self.labels.values():
            v.record_stream(stream)
        self.weights.record_stream(stream)
        for v in self.groups.values():
            v.record_stream(stream)
        self.sequence.record_stream(stream)
        for v in self.sequence_dense.values():
            v.record_stream(stream)

    def pin_memory(self) -> "Batch":
        """This batch in pinned host memory."""
        return Batch(
            self.dense.pin_memory(),
            self.sparse.pin_memory(),
            {k: v.pin_memory() for k, v in self.labels.items()},
            self.weights.pin_memory(),
            self.num_rows,
            {k: v.pin_memory() for k, v in self.groups.items()},
            self.skipped,
            self.sequence.pin_memory(),
            {k: v.pin_memory() for k, v in self.sequence_dense.items()},
        )

    @property
    def batch_size(self) -> int:
        """Rows in this batch, padding included."""
        return int(self.weights.shape[0])


def _no_sequences(rows: int, device: torch.device) -> KeyedJaggedTensor:
    """The ``sequence`` of a batch without sequences: no keys, ``rows`` rows."""
    return KeyedJaggedTensor(
        keys=[],
        values=torch.zeros(0, dtype=torch.int64, device=device),
        lengths=torch.zeros(0, dtype=torch.int32, device=device),
        stride=rows,
    )
