"""The trainer's checkpoints: what one holds (:meth:`TrainerCheckpoints.state`, one dict of
``Stateful`` objects saved by one ``torch.distributed.checkpoint`` call and loaded by one),
saving it at a boundary (synchronously, or behind training with ``train.async_checkpoint``),
waiting for it, and resuming from it. A part of :class:`~tzrun.runner.trainer.Trainer`, which
owns the loop and the attributes these methods read (``session``, ``built``, ``stages``,
``step``, ``saves``, ...)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from tzrun.io.write_errors import named_save_error
from tzrun.kernel.plugins import call_lifecycle
from tzrun.runner.boundary_eval import PENDING_KEY
from tzrun.runner.checkpoint import load_checkpoint, read_meta, save_checkpoint, sharding_summary, verify_checkpoint
from tzrun.runner.checkpoint_blobs import Blob
from tzrun.runner.manifest import verify_hashes_by_default
from tzrun.runner.position import DataPosition, ResumePoint
from tzrun.runner.run_log import warn_if_plugins_changed
from tzrun.runner.session import rng_state, set_rng_state
from tzrun.runner.zch import load_zch_window_state, reshard_zch_windows, zch_window_state
from tzrun.runner.zch_reshard import ZchGrowth, grows_zch_slices
from tzrun.runner.stages import check_stage_states

__all__ = ["TrainerCheckpoints"]

log = logging.getLogger("tzrun")


class TrainerCheckpoints:
    """Saving, waiting for and loading the trainer's checkpoints (a base of the Trainer)."""

    session: Any
    built: Any
    info: Any

    def state(self, *, loading: bool = False) -> dict[str, Any]:
        """Everything a checkpoint holds, as ``Stateful`` objects: the sharded model and
        optimizers, and (from rank 0, read by every rank) the loop position, schedules, update
        path, train metrics and stage states; and this rank's own RNG and metric windows."""
        built, rank = self.built, self.info.rank
        state: dict[str, Any] = {"model": built.model, "optimizer": built.optimizer}
        if loading or rank == 0:
            state.update(
                loop=Blob(self._loop_state, self._loaded_loop.update),
                schedules=Blob(lambda: {k: s.state_dict() for k, s in built.schedulers.items()}, self._load_schedules),
                update=Blob(built.update.state_dict, built.update.load_state_dict),
                train_metrics=Blob(self.train_metrics.state_dict, self.train_metrics.load_state_dict),
                stages=Blob(lambda: self._stage_state, self._load_stages),
            )
        state[f"rank.{rank}"] = Blob(
            lambda: {"rng": rng_state(), "train_metric_windows": self.train_metrics.window_state(),
                     "zch_windows": zch_window_state(built.model)}, self._load_rank)
        return state

    def save(self, *, evaluation_pending: bool = False) -> None:
        """Checkpoint the current step (collective); ``evaluation_pending`` at a boundary,
        whose evaluation follows. Old checkpoints are pruned once per boundary (rank 0): here,
        unless the evaluation that follows records the best checkpoint (:meth:`record_best`
        prunes then, once the best is known)."""
        self._evaluation_pending = evaluation_pending and self.step > 0
        self._stage_state = self.stages.state_dict()
        call_lifecycle(self.pm, "tzrun_before_checkpoint_save", run=self.run, step=self.step, state=self._stage_state)
        check_stage_states(self._stage_state)
        self._position = self.data.position(self.step, self._gather) if self.step > 0 else None
        write = save_checkpoint if self.saves is None else self.saves.start  # start: after the previous one ended
        with self._naming_save_errors(f"checkpoint step-{self.step}"):
            self.last_checkpoint = write(self.session.model_dir, self.step, state=self.state(), meta=self._meta(),
                                         rank=self.info.rank)
        if not (evaluation_pending and self._records_best()):
            self.prune()

    @contextlib.contextmanager
    def _naming_save_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except BaseException as error:  # DCP's CheckpointException too; a full disk, a store gone away: exit 73
            named = named_save_error(error, self.session.model_dir, what)
            if named is None:
                raise
            raise named from None

    def wait_for_saves(self, *, prune: bool = False) -> None:
        """Wait for the checkpoint being written behind training (``train.async_checkpoint``),
        and then ``prune``; nothing to wait for with synchronous saves."""
        if self.saves is None:
            return
        pending = self.last_checkpoint.name if self.last_checkpoint is not None else "checkpoint"
        with self._naming_save_errors(f"checkpoint {pending}"):
            self.saves.wait()
        if prune:
            self.prune()

    def close_saves(self, *, quietly: bool = False) -> None:
        """Finish the checkpoint being written and stop the saving thread; ``quietly`` (a run
        that already failed), its error is a warning."""
        if self.saves is None:
            return
        try:
            self.saves.close()
        except BaseException as error:
            if not quietly:
                raise
            log.warning("the checkpoint being written when the run failed did not complete (%s: %s); --resume "
                        "takes the one before it", type(error).__name__, " ".join(str(error).split())[:200])

    def load(self, path: Path) -> ResumePoint:
        """Resume from the checkpoint at ``path`` (collective); returns where the data continues."""
        hashes = verify_hashes_by_default()
        verify_checkpoint(path, state_while_reading=hashes)  # state/'s hashes: as the load reads it
        self._resharded_windows: list[Any] = []
        self._zch_growth: ZchGrowth | None = None
        meta = load_checkpoint(path, self._state_to_load(path), verify=False, verify_reads=hashes)
        if self._zch_growth is not None:
            self._zch_growth.place(path, verify_reads=hashes)
        if self._resharded_windows:
            load_zch_window_state(self.built.model,
                                  reshard_zch_windows(self._resharded_windows, self.info.rank, self.info.world_size))
        step = int(self._loaded_loop.get("step", meta["step"]))
        position = DataPosition.from_json(self._loaded_loop.get("data", meta["data"]))
        start = ResumePoint.after(step, position, self.session.whole_layout)
        self.stages.load_state_dict(self._stage_state)
        warn_if_plugins_changed(meta, self.plugins, self.info.rank)
        how = "exactly where it stopped" if start.layout == position.layout else (
            f"on a new layout: the {sum(b - a for a, b in start.layout.rows or ())} rows of epoch "
            f"{start.epoch} not consumed yet are shared out across {self.info.world_size} rank(s)")
        self._log0("resuming from %s (step %d, epoch %d), %s", path, step, start.epoch, how)
        if self.init_from is not None:
            self._log0("resuming: --init-from %s is not applied (the checkpoint being resumed already holds the run)",
                       self.init_from.checkpoint)
        return start

    def _state_to_load(self, path: Path) -> dict[str, Any]:
        """:meth:`state`, without this rank's own part when the checkpoint was written by
        another number of ranks (the RNG streams and metric windows do not carry over): then
        every old rank's ``zch`` windows are read instead, and this rank's share of them loaded
        (:func:`~tzrun.runner.zch.reshard_zch_windows`); written by fewer ranks, the ``zch``
        tables are left to :class:`~tzrun.runner.zch_reshard.ZchGrowth`."""
        state = self.state(loading=True)
        written_by: Any = read_meta(path).get("world_size")
        if written_by != self.info.world_size:
            if grows_zch_slices(self.built.model, written_by, self.info.world_size):
                self._zch_growth = ZchGrowth(self.built.model, self.built.optimizer, int(written_by), self.info.rank,
                                             self.info.world_size)
                state["model"] = self._zch_growth.model_state()
            del state[f"rank.{self.info.rank}"]
            if zch_window_state(self.built.model) and isinstance(written_by, int):
                windows: list[Any] = [{} for _ in range(written_by)]
                for r in range(written_by):
                    state[f"rank.{r}"] = Blob(dict, _put_windows(windows, r))
                self._resharded_windows = windows
        return state

    def _gather(self, intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if self.info.world_size == 1:
            return intervals
        everyone: list[Any] = [None] * self.info.world_size
        torch.distributed.all_gather_object(everyone, intervals)
        return [tuple(i) for part in everyone for i in part]

    def _loop_state(self) -> dict[str, Any]:
        position = self._position
        return {"step": self.step, "epoch": position.epoch if position is not None else 0,
                "data": position.to_json() if position is not None else None, PENDING_KEY: self._evaluation_pending}

    def _meta(self) -> dict[str, Any]:
        """The checkpoint's readable record (``meta.json``)."""
        built, s, loop = self.built, self.session, self._loop_state()
        return {
            "run_id": self.run_id, "world_size": self.info.world_size, "plugins": self.plugins, "config": dict(s.raw.data),
            "config_source": s.raw.source, "steps_per_epoch": self.run.steps_per_epoch, **loop,
            "stages": self._stage_state,
            "learning_rates": {k: g[0]["lr"] for k, o in built.optimizers.items() if (g := o.param_groups)},
            "plan": str(built.plan), "sharding": sharding_summary(built.plan),
        }

    def _load_schedules(self, saved: dict[str, Any]) -> None:
        for key, scheduler in self.built.schedulers.items():
            if key not in saved:
                raise KeyError(f"no saved state for the lr schedule of '{key}' (saved: {', '.join(saved)})")
            scheduler.load_state_dict(saved[key])

    def _load_stages(self, saved: dict[str, Any]) -> None:
        self._stage_state = dict(saved)

    def _load_rank(self, saved: dict[str, Any]) -> None:
        set_rng_state(saved["rng"])
        self.train_metrics.load_window_state(saved.get("train_metric_windows", {}))
        load_zch_window_state(self.built.model, saved.get("zch_windows", {}))


def _put_windows(windows: list[Any], rank: int) -> Callable[[dict[str, Any]], None]:
    """Receives the saved entry of ``rank`` and keeps its ``zch`` windows in ``windows[rank]``."""
    def put(saved: dict[str, Any]) -> None:
        windows[rank] = saved.get("zch_windows", {})

    return put
