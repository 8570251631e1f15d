"""The ``embedding_deltas`` stage: every ``every_n_steps`` steps, write only the embedding rows
changed since its previous dump, per table (format and applying: ``tzrun_serving.deltas``, written through :class:`tzrun_serving.deltas.DeltaDumps`).

Which rows changed is tracked from the ids each training step looks up (a forward pre-hook on
every sharded embedding collection, in training mode only): FBGEMM's fused optimizers update
exactly the rows a step looks up. A table kept data-parallel (updated by a torch optimizer,
which may change rows that were not looked up) is dumped whole. On a GPU the ids stay on the
device; they are de-duplicated every 64 steps (one device sync) and at each dump.

A dump is collective, issued from ``tzrun_after_train_step`` at the steps ``every_n_steps``
picks, which the hookspec allows: a step number alone decides it, and every rank runs every
step (a rank whose data ran out feeds padding batches), so every rank issues it at the same
step. The ranks' ids are all-gathered with the step each rank dumps (ranks that disagree stop
the run with an error naming both steps, not a mismatched collective), each rank writes the changed rows of the shards it
holds, and rank 0 writes the manifest and, last, the marker. The ids changed since the last
dump are part of the stage's state: each checkpoint saves every rank's, so a run resumed from
a checkpoint loses none; on resume, dumps after the checkpoint's step (a crashed run's) are
removed and written again. A run that starts at step 0 retires every dump it finds in its dir
(another run's, in a ``dir`` shared between runs); each dump names its run (``run_id``), and
``ckpt apply-deltas`` applies it only to that run's checkpoints. The last step of training is
always dumped.

A ``zch`` table (docs/zch.md) is tracked by :mod:`tzrun_serving.zch_deltas`: its changed rows
are those the raw ids looked up hold now, its slices' miss rows, and the rows whose id changed
(admitted, evicted); its dump also holds the raw id each of those rows holds now (a
``tzrun-deltas/2`` dump), so that applying the dumps gives the later map too.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

import tzrun
from tzrun_serving.deltas import DeltaDumps
from tzrun_serving.zch_deltas import ZchTracking

__all__ = ["EmbeddingDeltasConfig", "EmbeddingDeltasStage", "build_embedding_deltas", "embedding_deltas_outputs"]

log = logging.getLogger("tzrun.embedding_deltas")

_ID_BITS = 40  # ids below 2**40; the table's index in the bits above


@attrs.frozen
class EmbeddingDeltasConfig:
    """Options of the ``embedding_deltas`` stage.

    Attributes:
        every_n_steps: dump every this many steps (and at the last step).
        dir: where the dumps go, relative to the model dir (or a path or URL).
    """

    every_n_steps: int = attrs.field(validator=attrs.validators.gt(0))
    dir: str = "embedding_deltas"


def embedding_deltas_outputs(cfg: EmbeddingDeltasConfig) -> list[str]:
    """What the stage writes into the model dir (removed by ``train --overwrite``)."""
    return [cfg.dir]


class EmbeddingDeltasStage:
    """Tracks the ids each step looks up, and dumps their rows every ``every_n_steps`` steps."""

    def __init__(self, cfg: EmbeddingDeltasConfig) -> None:
        self.cfg = cfg
        self.last_dump = 0
        self.names: list[str] = []  # table FQNs (state-dict keys), in a fixed order
        self.pending: list[Any] = []  # encoded ids (table index << 40 | id) since the last dump
        self.restored: dict[str, Any] = {}
        self.handles: list[Any] = []
        self.step = 0
        self.zch = ZchTracking()

    # -- tracking --------------------------------------------------------------------------------

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        keys = set(run.model.state_dict().keys())
        managed = self.zch.attach(run.model, lambda path, tail: _state_key(keys, path, tail), self._add_table)
        for path, module in run.model.named_modules():
            configs = getattr(module, "_embedding_bag_configs", None) or getattr(module, "_embedding_configs", None)
            if configs is None or not hasattr(module, "module_sharding_plan") or id(module) in managed:
                continue
            attr = "embedding_bags" if hasattr(module, "_embedding_bag_configs") else "embeddings"
            table_of: dict[str, int] = {}
            for table in configs:
                self.names.append(_state_key(keys, path, f"{attr}.{table.name}.weight"))
                for feature in table.feature_names:
                    table_of[feature] = len(self.names) - 1
            self.handles.append(module.register_forward_pre_hook(_Recorder(self, table_of)))
        for name, ids in self.restored.items():
            if name in self.names:
                self.pending.append(ids.long() | (self.names.index(name) << _ID_BITS))
        self.restored = {}
        if run.is_rank0 and run.start_step == 0:
            self._retire(run)
        if not self.names:
            log.warning("embedding_deltas: the model has no sharded embedding collection; nothing to dump")

    def _add_table(self, name: str) -> int:
        self.names.append(name)
        return len(self.names) - 1

    def _retire(self, run: tzrun.RunContext) -> None:
        """Remove the dumps a run starting at step 0 finds in its dir (an earlier run's, in a
        ``dir`` shared between runs, or an earlier attempt's): they apply to no checkpoint of this run."""
        root = tzrun.under(run.model_dir, self.cfg.dir)
        removed, left = DeltaDumps(root).retire()
        if removed:
            runs = sorted({run_id or "unknown" for _, run_id in removed})
            log.info("embedding_deltas: run %s starts at step 0: retired %d dump(s) left in %s by run(s) %s (%s)",
                     run.run_id, len(removed), root, ", ".join(runs), ", ".join(path.name for path, _ in removed))
        for path in left:
            log.warning("embedding_deltas: %s: left in place: not a dump (it holds other files); a dump of that step "
                        "replaces it", path)

    def record(self, encoded: Any) -> None:
        """Add one step's encoded ids (called by the pre-hooks)."""
        self.pending.append(encoded)
        if len(self.pending) >= 64:
            self.pending = [self._unique()]

    def _unique(self) -> Any:
        import torch

        if not self.pending:
            return torch.zeros(0, dtype=torch.int64)
        return torch.unique(torch.cat([p.to(self.pending[0].device) for p in self.pending]))

    # -- dumping ---------------------------------------------------------------------------------

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run: tzrun.RunContext, step: tzrun.StepInfo) -> None:
        self.step = step.step
        if step.step % self.cfg.every_n_steps == 0:
            self.dump(run, step.step)

    @tzrun.hookimpl
    def tzrun_after_train(self, run: tzrun.RunContext, step: int) -> None:
        if step > self.last_dump:
            self.dump(run, step)
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.zch.remove_hooks()

    def _gather(self, run: tzrun.RunContext, step: int, why: str, mine: Any) -> list[Any]:
        """Every rank's ``mine`` (collective; this rank's alone on one rank).

        Raises:
            RuntimeError: when the ranks are not all at ``step`` for ``why`` (a rank skipped
                one: its collectives would pair with another step's).
        """
        import torch.distributed as dist

        if run.world_size == 1 or not dist.is_initialized():
            return [mine]
        everyone: list[Any] = [None] * run.world_size
        dist.all_gather_object(everyone, (step, why, mine))
        others = {(s, w) for s, w, _ in everyone}
        if len(others) > 1:
            at = ", ".join(f"rank {r}: {w} at step {s}" for r, (s, w, _) in enumerate(everyone))
            raise RuntimeError(f"embedding_deltas: the ranks gather their changed ids at different points ({at}); "
                               "every rank must run every training step and its hooks")
        return [payload for _, _, payload in everyone]

    def _everyone(self, run: tzrun.RunContext, step: int, why: str) -> Any:
        """The ids changed since the last dump on any rank (collective), on the CPU; the zch
        tables' rows changed since the last fold are added first (:meth:`ZchTracking.fold`)."""
        import numpy as np
        import torch

        if self.zch.tables:
            folded = self.zch.fold(lambda ids: self._gather(run, step, f"{why} (zch ids)", ids))
            self.pending += [rows.long() | (index << _ID_BITS) for index, rows in folded]
        mine = self._unique().cpu()
        return torch.from_numpy(np.unique(np.concatenate(self._gather(run, step, why, mine.numpy()))))

    def dump(self, run: tzrun.RunContext, step: int) -> None:
        """Write the rows changed since the last dump (collective)."""
        changed = self._everyone(run, step, "a dump")
        which, ids = changed >> _ID_BITS, changed & ((1 << _ID_BITS) - 1)
        state = run.model.state_dict()
        tables: dict[str, list[dict[str, Any]]] = {}
        full: dict[str, Any] = {}
        shapes = {}
        for i, name in enumerate(self.names):
            value = state[name]
            shapes[name] = list(value.shape)
            mine = ids[which == i]
            if hasattr(value, "local_shards"):
                tables[name] = [piece for shard in value.local_shards() if (piece := _rows(shard, mine)) is not None]
            elif run.is_rank0:  # replicated (data-parallel): whole
                full[name] = value.detach().cpu().clone()
        maps = self.zch.map_pieces({t.index: ids[which == t.index] for t in self.zch.tables}) if self.zch.tables else None
        dumps = DeltaDumps(tzrun.under(run.model_dir, self.cfg.dir))
        if run.is_rank0:
            dumps.clear(step)  # what a crashed run left of this step's dump
        _barrier(run)
        dumps.write_part(step, run.rank, tables, full, maps)
        _barrier(run)
        if run.is_rank0:
            dumps.publish(step, self.last_dump, run.world_size, shapes, run_id=run.run_id,
                          maps=self.zch.maps() if self.zch.tables else None)
        self.last_dump = step
        self.pending = []

    # -- state -----------------------------------------------------------------------------------

    @tzrun.hookimpl
    def tzrun_before_checkpoint_save(self, run: tzrun.RunContext, step: int, state: dict[str, Any]) -> None:
        # the checkpoint keeps rank 0's state: give it every rank's ids
        self.pending = [self._everyone(run, step, "a checkpoint")]

    @tzrun.hookimpl
    def tzrun_after_checkpoint_load(self, run: tzrun.RunContext, step: int, state: dict[str, Any]) -> None:
        if run.is_rank0:
            removed = DeltaDumps(tzrun.under(run.model_dir, self.cfg.dir)).remove_after(step)
            if removed:
                log.info("embedding_deltas: removed %d dump(s) after step %d (written again)", len(removed), step)

    def state_dict(self) -> dict[str, Any]:
        """The step of the last dump, and each table's ids changed since (every rank's)."""
        changed = self._unique().cpu()
        which, ids = changed >> _ID_BITS, changed & ((1 << _ID_BITS) - 1)
        return {"last_dump": self.last_dump, "changed": {name: ids[which == i].clone() for i, name in enumerate(self.names)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.last_dump = int(state["last_dump"])
        self.restored = dict(state["changed"])


class _Recorder:
    """A forward pre-hook on one embedding collection: records the ids of the tables it looks up."""

    def __init__(self, stage: EmbeddingDeltasStage, table_of: dict[str, int]) -> None:
        self.stage = stage
        self.table_of = table_of
        self.index: dict[tuple[str, ...], Any] = {}

    def __call__(self, module: Any, args: tuple[Any, ...]) -> None:
        import torch

        if not module.training or not args:
            return
        kjt = args[0]
        keys = tuple(kjt.keys())
        values = kjt.values()
        if not keys or values.numel() == 0:
            return
        tables = self.index.get(keys)
        if tables is None:  # -1: a key of another collection (a zch stand-in passes all its keys to both)
            tables = self.index[keys] = torch.tensor([self.table_of.get(k, -1) for k in keys], dtype=torch.int64)
        per_key = kjt.lengths().view(len(keys), -1).sum(1)
        which = torch.repeat_interleave(tables.to(values.device), per_key, output_size=values.numel())
        encoded = (which << _ID_BITS) | values.long()
        self.stage.record(encoded[which >= 0] if bool((tables < 0).any()) else encoded)  # (tables: on the CPU)


def _state_key(keys: set[str], path: str, tail: str) -> str:
    """The state-dict key of ``tail`` of the module at ``path`` (DMP's and DDP's wrappers, which
    the state dict leaves out, dropped from the front of the path)."""
    parts = path.split(".") if path else []
    for i in range(len(parts) + 1):
        key = ".".join([*parts[i:], tail])
        if key in keys:
            return key
    raise RuntimeError(f"embedding_deltas: {tail} of {path} is not in the model's state dict")


def _rows(shard: Any, ids: Any) -> dict[str, Any] | None:
    """The rows ``ids`` (global) that ``shard`` holds, or None."""
    r0, c0 = (int(x) for x in shard.metadata.shard_offsets[:2])
    n = shard.tensor.shape[0]
    inside = ids[(ids >= r0) & (ids < r0 + n)]
    if inside.numel() == 0:
        return None
    local = shard.tensor
    return {"ids": inside.clone(), "col_offset": c0, "rows": local[(inside - r0).to(local.device)].detach().cpu().clone()}


def _barrier(run: tzrun.RunContext) -> None:
    import torch.distributed as dist

    if run.world_size > 1 and dist.is_initialized():
        dist.barrier()


def build_embedding_deltas(cfg: EmbeddingDeltasConfig) -> EmbeddingDeltasStage:
    """An embedding_deltas stage for one run."""
    return EmbeddingDeltasStage(cfg)
