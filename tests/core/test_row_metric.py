"""``tzrun.RowMetric``, the public base of a metric that keeps rows: what an author gets
without writing it (ids that ``set_dtype`` never rounds, ranks without rows that still gather
tensors of each state's dtype)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import tzrun


class KeyedSum(tzrun.RowMetric):
    """Rows of (int64 key, value in the metric's dtype); compute returns the keys' sum."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_rows_state("key", torch.int64)
        self.add_rows_state("value")

    def update(self, key: Tensor, value: Tensor) -> None:
        self.append_rows("key", key)
        self.append_rows("value", value)

    def compute(self) -> Tensor:
        return self.rows("key").sum()


BIG = 2**53 + 1  # not a float64, let alone a float16


def test_set_dtype_rounds_no_key_and_converts_the_values():
    metric = KeyedSum()
    metric.update(torch.tensor([BIG, 3]), torch.tensor([0.5, 1.5], dtype=torch.float64))
    metric.set_dtype(torch.float16)
    assert metric.rows("key").dtype == torch.int64
    assert metric.rows("key").tolist() == [BIG, 3]
    assert metric.rows("value").dtype == torch.float16
    metric.update(torch.tensor([BIG]), torch.tensor([2.0]))
    assert metric.rows("key").tolist() == [BIG, 3, BIG]
    assert metric.rows("value").dtype == torch.float16


def test_no_rows_reads_as_an_empty_tensor_of_the_state_dtype():
    metric = KeyedSum()
    assert metric.rows("key").dtype == torch.int64 and metric.rows("key").numel() == 0
    assert metric.rows("value").dtype == metric.dtype and metric.rows("value").numel() == 0


def test_a_rank_without_rows_gathers_tensors_of_each_state_dtype():
    gathered: dict[torch.dtype, int] = {}

    def two_ranks(tensor: Tensor, group: Any = None) -> list[Tensor]:  # this rank, and one with rows
        gathered[tensor.dtype] = gathered.get(tensor.dtype, 0) + 1
        return [tensor, torch.ones(2, dtype=tensor.dtype)]

    metric = KeyedSum()
    metric.sync(dist_sync_fn=two_ranks, distributed_available=lambda: True)
    assert gathered == {torch.int64: 1, metric.dtype: 1}
    assert metric.rows("key").dtype == torch.int64 and metric.rows("key").tolist() == [1, 1]
    metric.unsync()
    assert metric.rows("key").numel() == 0
