"""Registers the first-party loop stages."""

from __future__ import annotations

import tzrun
from tzrun_plugins.stages import progress


@tzrun.hookimpl
def tzrun_register_stages(register: tzrun.Register) -> None:
    register("progress", config=progress.ProgressConfig, build=progress.build_progress,
             description="periodic lines: step, loss, learning rates, samples/s (rank 0)")
