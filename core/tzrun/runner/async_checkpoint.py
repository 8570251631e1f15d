"""Checkpoints written behind training (``train.async_checkpoint = true``).

:meth:`BackgroundSaves.start` does on the training thread what must see the state of this step:
the checkpoint's directory (:func:`~tzrun.runner.checkpoint.begin_checkpoint`), each entry's
``state_dict()`` and DCP's copy of every tensor into CPU memory (``async_save``'s staging). DCP
then writes the copy on a thread of its own while training goes on, over a gloo process group
of its own (never the one training's collectives use), and a second thread finishes it as a
synchronous save does (:func:`~tzrun.runner.checkpoint.finish_checkpoint`): ``meta.json``, the
manifest, and last the completion marker. Until then the checkpoint is not complete, and
``--resume`` takes the one before it.

At most one save is in flight: the next :meth:`~BackgroundSaves.start` waits for the previous
one, and so do whoever reads the checkpoint from storage (retention, the best record, an
export) and the end of the run (:meth:`~BackgroundSaves.wait`). The checkpoint holds the same
bytes as a synchronous save of the same step.

The copy is bounded: before staging, the ranks agree (one all-reduce) on the largest rank's
bytes to copy; when this host's ranks together would copy more than the budget
(``train.async_checkpoint_budget_gb``, or the memory the host has available at that step), the
checkpoint is written synchronously instead (:func:`~tzrun.runner.checkpoint.save_checkpoint`,
no copy), and the log says so.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

from tzrun.runner.checkpoint import begin_checkpoint, checkpoint_dir, finish_checkpoint, save_checkpoint
from tzrun.runner.checkpoint_blobs import named_state
from tzrun.runner.dcp_storage import storage_writer
from tzrun.runner.host_memory import format_size, host_memory, staging_limit

__all__ = ["BackgroundSaves", "staged_bytes"]

log = logging.getLogger("tzrun")


def staged_bytes(state: Mapping[str, Any]) -> int:
    """The bytes an ``async_save`` of ``state`` copies on this rank: every tensor of each
    entry's ``state_dict()`` (of a sharded tensor, this rank's shards)."""
    return sum(_tensor_bytes(value.state_dict() if hasattr(value, "state_dict") else value) for value in state.values())


def _tensor_bytes(value: Any) -> int:
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(value, ShardedTensor):
        return sum(s.tensor.nbytes for s in value.local_shards())
    if isinstance(value, DTensor):
        return int(value.to_local().nbytes)
    if isinstance(value, torch.Tensor):
        return int(value.nbytes)
    if isinstance(value, Mapping):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class BackgroundSaves:
    """At most one checkpoint being written behind training, on every rank alike.


    Args:
        timeout_s: how long the saves' collectives wait for the other ranks
            (``train.collective_timeout_s``).
        budget_gb: the most host memory this host's ranks together may copy the state into
            (``train.async_checkpoint_budget_gb``; None: what the host has available at the save).
        local_world_size: the ranks on this host.
    """

    def __init__(self, timeout_s: float = 300.0, *, budget_gb: float | None = None, local_world_size: int = 1) -> None:
        self._timeout_s = timeout_s
        self._budget_gb = budget_gb
        self._local_world_size = local_world_size
        self.synchronous_saves = 0
        self._pending: Future[Path] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._group: Any = None

    def start(self, model_dir: Path, step: int, *, state: Mapping[str, Any], meta: Mapping[str, Any],
              rank: int) -> Path:
        """Start writing the checkpoint of ``step`` (collective), after the previous one
        finished; returns its directory, complete once :meth:`wait` returns. When its copy
        would not fit the budget, it is written here, synchronously (complete on return).

        Raises:
            Exception: what writing the previous checkpoint raised.
        """
        import torch.distributed.checkpoint as dcp

        self.wait()
        group = self._side_group()
        too_big = self._over_budget(state, group)
        if too_big is not None:
            self.synchronous_saves += 1
            if rank == 0:
                (log.warning if self.synchronous_saves == 1 else log.info)(f"checkpoint step-{step}: {too_big}")
            return save_checkpoint(model_dir, step, state=state, meta=meta, rank=rank)
        path = checkpoint_dir(model_dir, step)
        if not begin_checkpoint(path, rank):
            return path
        writer = storage_writer(path / "state")
        upload = dcp.async_save(named_state(state), storage_writer=writer, process_group=group)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="tzrun-checkpoint")
        self._pending = self._executor.submit(self._finish, upload, path, step, dict(meta), writer, rank, group)
        return path

    def _over_budget(self, state: Mapping[str, Any], group: Any) -> str | None:
        """Why this host's copy of ``state`` would not fit the budget (the same answer on
        every rank: the largest rank's copy and the smallest budget, agreed by an all-reduce
        over ``group``), or None when it fits."""
        import torch
        import torch.distributed as dist

        memory = host_memory() if self._budget_gb is None else None
        limit = staging_limit(self._budget_gb, memory.available if memory is not None else None)
        agreed = torch.tensor([staged_bytes(state), -(2**62 if limit is None else limit)], dtype=torch.int64)
        if group is not None:
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        need, limit = int(agreed[0]) * self._local_world_size, -int(agreed[1])
        if need <= limit:
            return None
        ranks = f"{self._local_world_size} ranks x {format_size(int(agreed[0]))}" if self._local_world_size > 1 else "1 rank"
        if self._budget_gb is not None:
            budget, fix = (f"train.async_checkpoint_budget_gb = {self._budget_gb:g}",
                           "Raise train.async_checkpoint_budget_gb if the host has the memory, or leave train.async_checkpoint off")
        else:
            budget, fix = (f"the {format_size(limit)} this host has available",
                           "Free memory on the host (other processes), or leave train.async_checkpoint off")
        return (f"copying it to write behind training would need {format_size(need)} on this host ({ranks}), more "
                f"than {budget}; written synchronously instead (training waited for it). {fix}")

    @staticmethod
    def _finish(upload: Future, path: Path, step: int, meta: dict[str, Any], writer: Any, rank: int,
                group: Any) -> Path:
        upload.result()
        return finish_checkpoint(path, step, meta=meta, hashed=writer.hashed, rank=rank, group=group)

    def wait(self) -> Path | None:
        """Wait for the checkpoint being written, if any; returns its directory.

        Raises:
            Exception: what writing it raised.
        """
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def close(self) -> None:
        """Wait for the checkpoint being written (its error, if any, is raised) and stop the thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _side_group(self) -> Any:
        """A gloo group of every rank for the saves' collectives, made once (collective)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        if self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self._timeout_s))
        return self._group
