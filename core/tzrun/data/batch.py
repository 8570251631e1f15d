"""The batch type every model receives: dense floats, a KeyedJaggedTensor of ids, labels, weights."""

from __future__ import annotations

from typing import Mapping

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

__all__ = ["Batch"]


class Batch(Pipelineable):
    """One batch of rows on one rank; TorchRec's train pipelines move it between devices.

    Attributes:
        dense: ``[rows, num_dense_features]`` float32, in ``features.dense`` order.
        sparse: the id features, one key per ``features.sparse`` entry.
        labels: each label column as ``[rows]`` float32.
        weights: ``[rows]`` float32 sample weights; 0 marks padding rows, which every loss and
            metric must ignore.
        num_rows: rows that are real data (not padding).
        groups: group-key columns (``group_by`` of losses and metrics) as ``[rows]`` int64;
            strings are FNV-1a 64 hashes.
    """

    def __init__(
        self,
        dense: torch.Tensor,
        sparse: KeyedJaggedTensor,
        labels: Mapping[str, torch.Tensor],
        weights: torch.Tensor,
        num_rows: int,
        groups: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.dense = dense
        self.sparse = sparse
        self.labels = dict(labels)
        self.weights = weights
        self.num_rows = num_rows
        self.groups = dict(groups or {})

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        """This batch on ``device``."""
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.labels.items()},
            self.weights.to(device, non_blocking=non_blocking),
            self.num_rows,
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.groups.items()},
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

    def pin_memory(self) -> "Batch":
        """This batch in pinned host memory."""
        return Batch(
            self.dense.pin_memory(),
            self.sparse.pin_memory(),
            {k: v.pin_memory() for k, v in self.labels.items()},
            self.weights.pin_memory(),
            self.num_rows,
            {k: v.pin_memory() for k, v in self.groups.items()},
        )

    @property
    def batch_size(self) -> int:
        """Rows in this batch, padding included."""
        return int(self.weights.shape[0])
