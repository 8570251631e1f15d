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
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

from tzrun.runner.checkpoint import begin_checkpoint, checkpoint_dir, finish_checkpoint
from tzrun.runner.checkpoint_blobs import named_state
from tzrun.runner.dcp_storage import storage_writer

__all__ = ["BackgroundSaves"]


class BackgroundSaves:
    """At most one checkpoint being written behind training, on every rank alike.


    Args:
        timeout_s: how long the saves' collectives wait for the other ranks
            (``train.collective_timeout_s``).
    """

    def __init__(self, timeout_s: float = 300.0) -> None:
        self._timeout_s = timeout_s
        self._pending: Future[Path] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._group: Any = None

    def start(self, model_dir: Path, step: int, *, state: Mapping[str, Any], meta: Mapping[str, Any],
              rank: int) -> Path:
        """Start writing the checkpoint of ``step`` (collective), after the previous one
        finished; returns its directory, complete once :meth:`wait` returns.

        Raises:
            Exception: what writing the previous checkpoint raised.
        """
        import torch.distributed.checkpoint as dcp

        self.wait()
        path = checkpoint_dir(model_dir, step)
        if not begin_checkpoint(path, rank):
            return path
        group = self._side_group()
        writer = storage_writer(path / "state")
        upload = dcp.async_save(named_state(state), storage_writer=writer, process_group=group)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="tzrun-checkpoint")
        self._pending = self._executor.submit(self._finish, upload, path, step, dict(meta), writer, rank, group)
        return path

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
