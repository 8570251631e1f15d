"""What a training run tells its user and records in its model dir as it starts and goes."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch

from tzrun.data.batch import SkippedRows
from tzrun.data.reader_bad_rows import check_bad_row_fraction
from tzrun.interfaces import RunContext
from tzrun.runner.records import write_run_records
from tzrun.runner.session import Session
from tzrun.runner.stages import param_group_tables, seconds_since_process_start

__all__ = ["record_start", "log_param_groups", "log_time_to_first_step", "log_skipped", "warn_if_plugins_changed"]

log = logging.getLogger("tzrun")


def record_start(session: Session, run: RunContext, plugins: Sequence[Any]) -> None:
    """Rank 0 logs what the run will do and writes the run's records into the model dir."""
    if run.rank != 0:
        return
    session.model_dir.mkdir(parents=True, exist_ok=True)
    if session.malloc_tuning:
        log.info("glibc malloc keeps freed memory (train.tune_malloc): %s",
                 ", ".join(f"{k}={v >> 20} MiB" for k, v in session.malloc_tuning.items()))
    log.info("training %d steps (%d per epoch) on %d rank(s), %d rows per step; model_dir %s",
             run.total_steps - run.start_step, run.steps_per_epoch, run.world_size, run.global_batch_size,
             session.model_dir)
    env = write_run_records(session.model_dir, session.cfg, session.raw, world_size=run.world_size, plugins=plugins)
    for problem in env["stack_problems"]:
        log.warning("%s (tzrec-run env checks this)", problem)


def log_param_groups(optimizers: Mapping[str, Any], rank: int) -> None:
    """Rank 0 logs, once, what each learning-rate group the train log names holds (TorchRec's
    fused sparse optimizer has one group per embedding module: ``sparse/deep_ebc``, ...)."""
    if rank != 0:
        return
    for name, tables in param_group_tables(optimizers).items():
        shown = ", ".join(tables[:8]) + (f", ... ({len(tables)} in all)" if len(tables) > 8 else "")
        log.info("learning-rate group %s holds %s", name, shown or "unnamed parameters")


def log_time_to_first_step(rank: int) -> None:
    """Rank 0 logs how long the process took to its first training step."""
    since = seconds_since_process_start()
    if since is not None and rank == 0:
        log.info("first training step done %.1f s after the process started (imports, set-up, "
                 "sharding, data start and pipeline fill)", since)


def log_skipped(skipped: SkippedRows, rank: int, world_size: int, step: int, max_fraction: float | None = None) -> None:
    """Log the rows ``data.on_bad_row = "skip"`` left out so far, over all ranks (a
    collective at each boundary; counts include batches the pipeline had prefetched), and
    stop the run when they are more than ``max_fraction`` of the rows read.

    Raises:
        DataError: on every rank alike, above ``max_fraction`` (``data.max_bad_row_fraction``).
    """
    total = SkippedRows()
    if world_size > 1:
        parts: list[Any] = [None] * world_size
        torch.distributed.all_gather_object(parts, skipped.to_json())
        for part in parts:
            total.add(SkippedRows.from_json(part))
    else:
        total.add(skipped)
    if total and rank == 0:
        log.warning("bad rows left out of training so far (data.on_bad_row = \"skip\"), at step %d: %s", step, total)
    check_bad_row_fraction(total, max_fraction)


def warn_if_plugins_changed(meta: Mapping[str, Any], plugins: Sequence[Mapping[str, Any]], rank: int) -> None:
    """Warn (rank 0) when the plugin set differs from the one a checkpoint recorded."""
    def keys(infos: Sequence[Mapping[str, Any]]) -> set[tuple[Any, Any, Any]]:
        return {(p.get("name"), p.get("distribution"), p.get("version")) for p in infos}

    saved, now = keys(meta.get("plugins", [])), keys(plugins)
    if saved and saved != now and rank == 0:
        gone = sorted(f"{n} ({d} {v})" for n, d, v in saved - now)
        new = sorted(f"{n} ({d} {v})" for n, d, v in now - saved)
        log.warning("the plugin set changed since the checkpoint: removed or changed %s; added %s",
                    ", ".join(gone) or "none", ", ".join(new) or "none")
