"""One input of a run on one rank: its split, and passes over it as batches."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from tzrun.data.dataset import BatchStream, padded, split_rows
from tzrun.data.features import BatchBuilder
from tzrun.interfaces import Reader

__all__ = ["RankInput"]


def _single_threaded_worker(worker_id: int) -> None:
    """Data workers build batches with a single intra-op thread: a forked worker inherits the
    trainer's thread count, and two OpenMP pools spinning on the same cores stall training
    (measured: 63k -> 6k samples/s with one worker on 2 cores)."""
    import torch

    torch.set_num_threads(1)


class RankInput:
    """This rank's share of an input.

    Args:
        reader: the run's reader.
        input_path: the input (file, directory or glob).
        batch_size: rows per batch on this rank.
        num_workers: DataLoader workers (0: read in this process).
        columns: columns to read.
        builder: Arrow -> Batch conversion.
        rank, world_size: this process in the job.

    Raises:
        DataError: when the input has no files or rows.
    """

    def __init__(
        self,
        reader: Reader,
        input_path: str,
        batch_size: int,
        num_workers: int,
        columns: Sequence[str],
        builder: BatchBuilder,
        rank: int,
        world_size: int,
    ) -> None:
        from tzrun.errors import DataError

        groups = reader.row_groups(input_path)
        self.total_rows = sum(g.num_rows for g in groups)
        if self.total_rows == 0:
            raise DataError(f"{input_path}: the input has no rows")
        self.split = split_rows(groups, rank, world_size, batch_size)
        self.stream = BatchStream(reader, self.split, batch_size, columns, builder)
        self.builder = builder
        self.num_workers = num_workers

    @property
    def steps(self) -> int:
        """Steps of one pass, the same on every rank."""
        return self.split.steps

    def one_pass(self, max_steps: int | None = None) -> Iterator[Any]:
        """One pass as exactly ``min(steps, max_steps)`` batches: this rank's rows, then
        weight-0 padding batches if other ranks have more."""
        from torch.utils.data import DataLoader

        steps = self.steps if max_steps is None else min(self.steps, max_steps)
        if self.num_workers == 0:
            batches = self.stream.iter_worker(0, 1)
        else:
            batches = iter(
                DataLoader(
                    self.stream.torch_dataset(),
                    batch_size=None,
                    num_workers=min(self.num_workers, max(1, self.split.num_batches)),
                    worker_init_fn=_single_threaded_worker,
                )
            )
        return padded(batches, steps, self.builder.padding)
