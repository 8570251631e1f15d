"""The ``profiler`` stage: ``torch.profiler`` over a few training steps, traces written with
TensorBoard's trace handler (``torch.profiler.tensorboard_trace_handler``), readable in
TensorBoard's profiler plugin, Perfetto or ``chrome://tracing``.

The schedule is torch's: skip ``skip_first`` steps, then ``repeat`` cycles of ``wait`` idle,
``warmup`` traced-but-discarded and ``active`` recorded steps. Each cycle writes one
``<worker>.<time>.pt.trace.json`` file per profiled rank.

With a model dir (or ``dir``) on an object store, traces are written into a local temporary
directory and uploaded through fsspec as each one is ready (see :mod:`._staging`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import attrs

import tzrun
from tzrun_plugins.stages._closing import ClosedAtTheEnd
from tzrun_plugins.stages._staging import StagedDir

__all__ = ["ProfilerConfig", "ProfilerStage", "build_profiler"]

log = logging.getLogger("tzrun.profiler")



@attrs.frozen
class ProfilerConfig:
    """Options of the ``profiler`` stage.

    Attributes:
        wait, warmup, active: steps of each cycle (torch.profiler.schedule).
        repeat: cycles to record (0: until training ends).
        skip_first: steps to skip before the first cycle.
        ranks: the ranks that profile (default: rank 0 only).
        record_shapes, profile_memory, with_stack: torch.profiler's options.
        dir: where traces go (default ``<model_dir>/profiler``); relative to the model dir.
    """

    wait: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    warmup: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    active: int = attrs.field(default=3, validator=attrs.validators.gt(0))
    repeat: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    skip_first: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    ranks: tuple[int, ...] = (0,)
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    dir: Optional[str] = None


class ProfilerStage(ClosedAtTheEnd):
    """Runs ``torch.profiler.profile`` across training steps on the chosen ranks."""

    def __init__(self, cfg: ProfilerConfig) -> None:
        self.cfg = cfg
        self.profiler: Any = None
        self.trace_dir: Path | None = None
        self.staged: StagedDir | None = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if run.rank not in self.cfg.ranks:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        c = self.cfg
        path = c.dir or "profiler"
        self.trace_dir = tzrun.under(run.model_dir, path)
        self.staged = staged = StagedDir(self.trace_dir, "profiler")
        write_trace = tensorboard_trace_handler(str(staged.local), worker_name=f"rank{run.rank}")

        def on_trace_ready(prof: Any) -> None:
            write_trace(prof)
            staged.upload()

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=c.wait, warmup=c.warmup, active=c.active, repeat=c.repeat, skip_first=c.skip_first),
            on_trace_ready=on_trace_ready,
            record_shapes=c.record_shapes,
            profile_memory=c.profile_memory,
            with_stack=c.with_stack,
        )
        self.profiler.start()
        log.info("profiling steps on rank %d into %s", run.rank, self.trace_dir)

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run: tzrun.RunContext, step: tzrun.StepInfo) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None
        if self.staged is not None:
            self.staged.close()
            self.staged = None


def profiler_outputs(cfg: ProfilerConfig) -> list[str]:
    """What the stage writes in the model dir (``--overwrite`` removes it)."""
    return [cfg.dir or "profiler"]


def build_profiler(cfg: ProfilerConfig) -> ProfilerStage:
    """A profiler stage for one run."""
    return ProfilerStage(cfg)
